//===- AttentionGeometry.h - The blockwise kernels' view ----*- C++ -*-===//
//
// What the CUDA backend's blockwise attention kernels (kernels/Attention.cuh)
// are told about one attention or attention_grad instruction: the sizes,
// each tensor's layout as element strides, and the core's arithmetic
// (runtime/cpu/Attention.h's AttentionShape and AttentionCore). Plain C++
// (no CUDA headers), so that the host logic that fills it
// (AttentionPlan.h, planBlockwise) is built and unit-tested without a
// device.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_ATTENTIONGEOMETRY_H
#define SP_RUNTIME_CUDA_ATTENTIONGEOMETRY_H

#include <cstdint>

namespace sp::cuda {

/// The largest head size the blockwise kernels take (their tiles of 64
/// rows by the head size live in shared memory); larger heads run as the
/// expansion of AttentionPlan.h.
constexpr int64_t AttentionMaxHeadDim = 128;
/// Query rows and keys of one block (runtime/cpu/Attention.cpp's Br, Bc).
constexpr int64_t AttentionBlock = 64;

struct AttentionGeometry {
  int64_t Batch = 0, Heads = 0, KvHeads = 0, Sq = 0, Sk = 0, D = 0;
  /// Element strides of (batch, head, row) in Q and DQ; K, V, DK and DV;
  /// O and DO; Lse. Element d of a row is d further on.
  int64_t Q[3] = {}, K[3] = {}, O[3] = {}, L[3] = {};
  float Scale = 1, Fill = -10000;
  bool Causal = false, PadFirst = false;
  int64_t Query0 = 0, Key0 = 0; // global positions of row 0 and key 0
  /// Dropout of the probabilities (Ratio 0: none): the Philox key, and the
  /// [Batch, Heads, Sq, Sk] probabilities as the block at ProbOffset of a
  /// ProbGlobal tensor (runtime/cpu/Philox.h's global index).
  double Ratio = 0;
  uint64_t Seed = 0;
  uint32_t Layer = 0, Site = 0, Stream = 0;
  int64_t ProbGlobal[4] = {}, ProbOffset[4] = {};
  /// Device memory (or null): when it holds a non-zero int as the kernels
  /// start, they do nothing (ring attention's key block whose probabilities
  /// are all negligible, decided on the device: ContextParallel.cuh).
  const int *SkipIf = nullptr;
};

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_ATTENTIONGEOMETRY_H
