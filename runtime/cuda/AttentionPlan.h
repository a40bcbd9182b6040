//===- AttentionPlan.h - How the GPU runs the attention core --*- C++ -*-===//
//
// The fused attention core (`attention`, `attention_grad`;
// runtime/cpu/Attention.h) runs on the GPU in one of two ways, decided here
// on the host from the instruction and its buffers:
//
// 1. Blockwise (runsBlockwise, planBlockwise): the kernels of
//    kernels/Attention.cuh, which store no scores, read and write the
//    instruction's tensors where they are (16-bit ones too) and take heads
//    of up to AttentionMaxHeadDim. planBlockwise gives their geometry: the
//    strides of the packed [b, s, 3, a, d] and merged [b, s, a, d] layouts,
//    where each operand is, and the padding mask's operand.
//
// 2. Otherwise (larger heads) as the unfused ops the fuse-attention pass
//    replaced, each with its tested kernel, on score-sized tensors in a
//    per-stream workspace outside the plan's arena (the plan stores none of
//    them), in float32 (a 16-bit instruction on float32 copies):
//
//   forward:  q, k, v = split_heads(qkv)           (packed = 1)
//             kr, vr = repeat_heads(k, v)          (grouped-query heads)
//             s = batch_matmul(q, kr^T); scale; causal_mask and
//                 padding_mask (in the op's order)
//             lse = log-sum-exp of s's rows        (rowLogSumExp)
//             p = softmax(s); p = dropout(p)       (the op's Philox key)
//             o = batch_matmul(p, vr)              (merge_heads when merged)
//   backward: s, p and the dropout mask again, then
//             dv = p^T do; dp = do vr^T; dropout_grad; softmax_grad with the
//             scale and the causal mask; dq = ds kr; dk = ds^T q (summed over
//             a group's heads by repeat_heads_grad); packed, dqkv =
//             split_heads_grad(dq, dk, dv)
//
// These are the ops whose results fused and unfused plans already agree
// on (tests/e2e, FusedAttention.*), so the results are the fused CPU
// kernel's up to the order of float additions; the dropout draws the same
// words (the probabilities' global index comes from q's sharding and the
// op's microbatch attributes, as the dropout op computes it).
//
// The expansion is host logic: tests/gpu/HostLogicTest.cpp runs it on the
// CPU backend against the fused CPU kernel.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_ATTENTIONPLAN_H
#define SP_RUNTIME_CUDA_ATTENTIONPLAN_H

#include "plan/Program.h"
#include "runtime/cuda/AttentionGeometry.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <optional>
#include <vector>

namespace sp::cuda {

struct AttentionPlan {
  /// The unfused instructions, over Local's buffers.
  Program Local;
  /// Local buffer K is the attention instruction's buffer Outer[K], or -1
  /// for a workspace tensor at Local.Buffers[K].Offset in the workspace.
  std::vector<int> Outer;
  int64_t WorkspaceBytes = 0;
  /// Forward: after instruction LseAfter, the log-sum-exp of the rows of
  /// Local buffer Scores (the masked scores, [B, A, Sq, Sk]) is written to
  /// Local buffer Lse ([B, A, Sq], or [B, Sq, A] when merged). -1: none.
  int LseAfter = -1, Scores = -1, Lse = -1;
  bool LseMerged = false;
  int64_t Batch = 0, Heads = 0, Sq = 0, Sk = 0;
};

/// The expansion of an attention or attention_grad instruction over the
/// program's buffers. Workspace tensors are float32 (the fused kernel
/// computes its scores and probabilities in float32 in every plan).
llvm::Expected<AttentionPlan>
planAttention(const Instruction &I, const std::vector<ProgramBuffer> &Buffers);

/// An operand of the blockwise kernels: buffer Id from element Offset on
/// (packed q, k and v are one buffer at three offsets).
struct BlockwiseOperand {
  int Id = -1;
  int64_t Offset = 0;
};

struct BlockwisePlan {
  bool Forward = true;
  /// The geometry but for the dropout's key, ratio and block, which
  /// depend on the step and the rank (CudaBackend fills them, with
  /// probsBlock).
  AttentionGeometry G;
  BlockwiseOperand Q, K, V, O, Lse, DO, DQ, DK, DV;
  /// The padding mask's keep operand (-1: none), its fill and form
  /// (padding_mask's fill and where).
  int Keep = -1;
  double PadFill = 0;
  bool PadWhere = false;
  bool Dropout = false;
};

/// cuda::paddingMask's code of a keep mask's element type (0 int64, 1
/// int32, 2 bool, 3 float32), or none for a type it does not take.
std::optional<int> paddingKeepCode(DType T);

/// Whether the blockwise kernels run I: an attention or attention_grad
/// with heads of at most AttentionMaxHeadDim, its q, k, v, o and their
/// gradients of one float type (float32, bf16 or fp16), its log-sum-exp of
/// any, its keep mask of a type padding_mask takes, and a grid the device
/// launches.
bool runsBlockwise(const Instruction &I,
                   const std::vector<ProgramBuffer> &Buffers);

/// The blockwise kernels' plan of I (an error where runsBlockwise is
/// false or the shapes disagree).
llvm::Expected<BlockwisePlan>
planBlockwise(const Instruction &I, const std::vector<ProgramBuffer> &Buffers);

/// The [Batch, Heads, Sq, Sk] probabilities' block in the whole tensor
/// (the dropout's global index, as runtime/cpu/CpuBackend.cpp finds it):
/// heads split over the tensor group as q is (TensorRank), microbatch mb of
/// the instruction's microbatches, of data-parallel replica DataRank of
/// DataSize. Errors where q is split along another dimension.
llvm::Error probsBlock(const Instruction &I,
                       const std::vector<ProgramBuffer> &Buffers,
                       int TensorRank, int DataRank, int DataSize,
                       AttentionGeometry &G);

/// P's dropout for one run of its instruction I (when the op drops out):
/// the ratio (0 when not Training; else Dropout, or the op's), the Philox
/// key (Seed, the op's layer and site, Step) and the probabilities' block
/// (probsBlock). Errors on a plan without a key or a ratio outside [0, 1].
llvm::Error setBlockwiseDropout(BlockwisePlan &P, const Instruction &I,
                                const std::vector<ProgramBuffer> &Buffers,
                                bool Training, std::optional<double> Dropout,
                                uint64_t Seed, int64_t Step, int TensorRank,
                                int DataRank, int DataSize);

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_ATTENTIONPLAN_H
