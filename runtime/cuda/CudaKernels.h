//===- CudaKernels.h - Launchers of the CUDA backend's kernels ---*- C++ -*-===//
//
// Host functions that enqueue one kernel of runtime/cuda/kernels/ on a
// stream (float32; those taking Elems also bfloat16 and half in place). Each
// matches the CPU kernel of the same name in runtime/cpu/Kernels.h: same
// arguments, same accumulation rule (parameter gradients accumulate,
// everything else is overwritten), same arithmetic in the same order where
// the CPU's order is fixed (see LaunchGeometry.h). The plain reference of
// each is in its kernels/*.cuh file.
//
// Launchers do not check for launch errors; the caller checks
// cudaGetLastError() after each (CudaBackend::issue, SP_CUDA_TRY). Data
// errors the CPU returns as a Status (an id or target out of range) are
// written to a DeviceError in device memory, first one wins, and reported by
// the backend at its next synchronize().
//
// This header is plain C++ (no CUDA syntax): the backend's host code
// (CudaBackendImpl.h) is compiled by the host compiler, the kernels by nvcc.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_CUDAKERNELS_H
#define SP_RUNTIME_CUDA_CUDAKERNELS_H

#include "runtime/Numerics.h"
#include "runtime/cuda/AttentionGeometry.h"
#include "runtime/cuda/NumericsMode.h"
#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace sp::cuda {

/// A data error found by a kernel (Code 0: none).
struct DeviceError {
  int Code = 0;
  int Pad = 0;
  long long Index = 0, Value = 0;
};
enum DeviceErrorCode : int {
  EmbeddingIdOutOfRange = 1,
  CrossEntropyTargetOutOfRange = 2,
};

/// How a kernel operand is stored: float32, or the bits of bfloat16 or
/// IEEE half.
enum class Storage : uint8_t { F32, BF16, F16 };

/// A kernel operand of any Storage. The kernels that take Elems load each
/// element widened to float32 (exact) and round each float32 result once to
/// nearest even where they store it (kernels/Convert.cuh's rules), so a
/// 16-bit buffer is read and written where it is, with the bits that
/// widening it, running the float32 kernel and narrowing the result give
/// (CudaBackend's dispatchMixed), without the float32 copies. A float
/// pointer converts to F32 Elems.
struct Elems {
  void *Data = nullptr;
  Storage Kind = Storage::F32;
  Elems() = default;
  Elems(std::nullptr_t) {}
  Elems(float *P) : Data(P) {}
  Elems(const float *P) : Data(const_cast<float *>(P)) {}
  Elems(void *P, Storage K) : Data(P), Kind(K) {}
  explicit operator bool() const { return Data != nullptr; }
};

/// E from its element Offset on (a row of a matrix, a column block of a
/// packed tensor), on the host or the device.
SP_HOST_DEVICE inline Elems at(Elems E, int64_t Offset) {
  E.Data =
      static_cast<char *>(E.Data) + Offset * (E.Kind == Storage::F32 ? 4 : 2);
  return E;
}

constexpr int MaxRank = 6;
/// A shape of rank <= MaxRank passed by value to a kernel.
struct DevShape {
  int Rank = 0;
  int64_t Dim[MaxRank] = {};
};

// Embedding (kernels/Embedding.cuh). Ids are global; Offset is subtracted
// (the vocabulary-parallel shard's first row). OutsideIsZero: an id outside
// [0, V) after the offset gives a zero row (vocabulary-parallel) instead of
// an error.
void embedding(float *Y, const float *Table, const int64_t *Ids, int64_t N,
               int64_t V, int64_t H, int64_t Offset, bool OutsideIsZero,
               DeviceError *Err, cudaStream_t S);
/// DTable[id - Offset] += DY rows (DTable zeroed by the caller), rows in
/// order per column; ids outside the shard are skipped when OutsideIsZero.
void embeddingBackward(float *DTable, const float *DY, const int64_t *Ids,
                       int64_t N, int64_t V, int64_t H, int64_t Offset,
                       bool OutsideIsZero, DeviceError *Err, cudaStream_t S);

// Elementwise (kernels/Elementwise.cuh).
void add(Elems Y, Elems A, Elems B, int64_t N, cudaStream_t S);
void mul(Elems Y, Elems A, Elems B, int64_t N, cudaStream_t S);
void scale(float *Y, const float *X, int64_t N, double Alpha, cudaStream_t S);
/// Y = A + B (or A * B when Multiply) under numpy broadcasting; the shapes
/// are checked by the caller (broadcastStrides in Dispatch.cpp).
void broadcastBinary(float *Y, DevShape YShape, const float *A,
                     DevShape AStrides, const float *B, DevShape BStrides,
                     bool Multiply, cudaStream_t S);
/// DX = DY summed over the broadcast axes (kept and reduced dimensions
/// prepared by the caller, as reduceToShape splits them).
void reduceTo(float *DX, const float *DY, DevShape KeptDims,
              DevShape KeptSX, DevShape KeptSY, DevShape RedDims,
              DevShape RedSY, int64_t NX, cudaStream_t S);
/// Strided chunk copy: Outer blocks of Chunk floats from Src + o * SrcPitch
/// to Dst + o * DstPitch (the SP split and the gather reorders).
void chunkCopy(float *Dst, int64_t DstPitch, const float *Src,
               int64_t SrcPitch, int64_t Chunk, int64_t Outer,
               cudaStream_t S);

// Activations (kernels/Activations.cuh): one enumerator per SP_UNARY_OP
// line of ir/Ops.def, its kernel the device struct of the same name, as
// the CPU's cpu::Activation.
enum class Activation : uint8_t {
#define SP_OP(Enum, Name)
#define SP_UNARY_OP(Enum, Name, OnnxName) Enum,
#include "ir/Ops.def"
};
/// Y = f(X), in double rounded once.
void activation(Activation F, float *Y, const float *X, int64_t N,
                cudaStream_t S);
/// DX = DY f'(X), in double rounded once.
void activationBackward(Activation F, float *DX, const float *X,
                        const float *DY, int64_t N, cudaStream_t S);

// GELU (kernels/Gelu.cuh): Tanh selects the tanh form; Num: Exact, the
// CPU's bits (double, rounded once), or Fast (float32, vectorised).
void gelu(Elems Y, Elems X, int64_t N, bool Tanh, Numerics Num, cudaStream_t S);
void geluBackward(Elems DX, Elems X, Elems DY, int64_t N, bool Tanh,
                  Numerics Num, cudaStream_t S);

// Norms (kernels/LayerNorm.cuh, kernels/RmsNorm.cuh).
/// N: Exact, the CPU's bits; Fast, float32 tree sums (NumericsMode.h).
void layerNorm(Elems Y, float *Mean, float *Rstd, Elems X, Elems Gamma,
               Elems Beta, int64_t Rows, int64_t H, double Eps, Numerics N,
               cudaStream_t S);
/// The parameter gradients stay float32 (the plans' gradients are), and
/// are added into DGamma and DBeta. Scratch: 2 columnParts(Rows) H doubles
/// (LaunchGeometry.h; the Fast form uses them as 2 ceil(Rows / 32) H
/// floats).
void layerNormBackward(Elems DX, float *DGamma, float *DBeta, Elems DY, Elems X,
                       Elems Gamma, const float *Mean, const float *Rstd,
                       int64_t Rows, int64_t H, double *Scratch, Numerics N,
                       cudaStream_t S);
void rmsNorm(float *Y, float *Rstd, const float *X, const float *Gamma,
             int64_t Rows, int64_t H, double Eps, Numerics N, cudaStream_t S);
/// Scratch: columnParts(Rows) H doubles (the Fast form: ceil(Rows / 32) H
/// floats in them).
void rmsNormBackward(float *DX, float *DGamma, const float *DY, const float *X,
                     const float *Gamma, const float *Rstd, int64_t Rows,
                     int64_t H, double *Scratch, Numerics N, cudaStream_t S);
/// DBias[j] += sum over rows of DY[r, j] in double, in the CPU's column-sum
/// order. Scratch: columnParts(Rows) Out doubles.
void biasBackward(float *DBias, Elems DY, int64_t Rows, int64_t Out,
                  double *Scratch, cudaStream_t S);
/// Y[r, :] = Bias (the start of a linear with bias), one storage.
void broadcastRows(Elems Y, Elems Bias, int64_t Rows, int64_t Out,
                   cudaStream_t S);

// Head layouts (kernels/Heads.cuh).
// PerHead: GPT-NeoX's [Heads, 3, D] columns instead of q | k | v blocks.
// Split and merge move elements of any storage (all operands one).
void splitHeads(Elems Q, Elems K, Elems V, Elems QKV, int64_t B, int64_t Sq,
                int64_t Heads, int64_t D, bool PerHead, cudaStream_t S);
void splitHeadsBackward(Elems DQKV, Elems DQ, Elems DK, Elems DV, int64_t B,
                        int64_t Sq, int64_t Heads, int64_t D, bool PerHead,
                        cudaStream_t S);
void mergeHeads(Elems Y, Elems X, int64_t B, int64_t Sq, int64_t Heads,
                int64_t D, cudaStream_t S);
void mergeHeadsBackward(Elems DX, Elems DY, int64_t B, int64_t Sq,
                        int64_t Heads, int64_t D, cudaStream_t S);
void repeatHeads(float *Y, const float *X, int64_t B, int64_t G, int64_t R,
                 int64_t Sq, int64_t D, cudaStream_t S);
void repeatHeadsBackward(float *DX, const float *DY, int64_t B, int64_t G,
                         int64_t R, int64_t Sq, int64_t D, cudaStream_t S);
// Rot: the rotated dims (the tables' width, at most D; the rest copied).
void rope(float *Y, const float *X, const float *Cos, const float *Sin,
          int64_t B, int64_t A, int64_t Sq, int64_t D, int64_t CB,
          bool Interleaved, bool Backward, int64_t Rot, cudaStream_t S);

// The attention core (kernels/AttentionSoftmax.cuh).
void causalMask(float *Y, const float *X, int64_t Batch, int64_t Sq,
                int64_t Sk, double Fill, cudaStream_t S);
/// Mask[r, j] = 0 for keys j > i (query i = r mod Sq): dropout {causal}'s
/// mask above the diagonal, after the ordinary draw (lower/CausalProducts.h).
void causalMaskBytes(uint8_t *Mask, int64_t Batch, int64_t Sq, int64_t Sk,
                     cudaStream_t S);
/// Y = X + bias(keep) per (batch, key); KeepType: 0 i64, 1 i32, 2 bool,
/// 3 f32.
void paddingMask(float *Y, const float *X, const void *Keep, int KeepType,
                 int64_t B, int64_t Inner, int64_t K, double Fill, bool Where,
                 cudaStream_t S);
/// Y = softmax(causal(Alpha * X)) over rows of N: Alpha = 1 and Causal =
/// false is the plain softmax op; the fused form is scale + causal_mask +
/// softmax in one pass (each rounding as the three CPU kernels round).
/// Num: Exact, the CPU's bits; Fast, float32 with a warp or a block per
/// row (kernels/AttentionSoftmax.cuh), same semantics, for both.
void softmax(Elems Y, Elems X, int64_t Rows, int64_t N, double Alpha,
             bool Causal, int64_t Sq, double Fill, Numerics Num,
             cudaStream_t S);
/// DX = Alpha * causal(float(Y * (DY - sum_j DY_j Y_j))) (the fill where
/// Causal masks): softmax_grad, causal_mask and scale in one pass, each
/// rounding as the CPU kernels round; Alpha = 1 and Causal = false is the
/// plain softmax_grad op.
void softmaxBackward(Elems DX, Elems Y, Elems DY, int64_t Rows, int64_t N,
                     double Alpha, bool Causal, int64_t Sq, double Fill,
                     Numerics Num, cudaStream_t S);

/// Lse = the log-sum-exp of each row of X [Rows, N] (rows (b, a, i) of
/// [B, Heads, Sq], written [B, Sq, Heads] when Merged): the fused attention
/// core's statistic, for its unfused expansion (AttentionPlan.h).
void rowLogSumExp(float *Lse, const float *X, int64_t Rows, int64_t N,
                  int64_t Heads, int64_t Sq, bool Merged, cudaStream_t S);

// The fused attention core, blockwise (kernels/Attention.cuh): the CPU's
// attentionForward and attentionBackward (runtime/cpu/Attention.h), the
// scores never stored. Q, K, V, O, DO, DQ, DK, DV share one storage, Lse
// any; G.D <= AttentionMaxHeadDim. KeyBias: the padding bias [Batch, Sk] in
// float32, or null.
void attentionForward(Elems O, Elems Lse, Elems Q, Elems K, Elems V,
                      const float *KeyBias, const AttentionGeometry &G,
                      cudaStream_t S);
/// DQ, DK, DV overwritten. Delta: Batch Heads Sq floats of scratch.
void attentionBackward(Elems DQ, Elems DK, Elems DV, Elems DO, Elems Q, Elems K,
                       Elems V, Elems O, Elems Lse, const float *KeyBias,
                       float *Delta, const AttentionGeometry &G,
                       cudaStream_t S);

// Context parallelism's attention (kernels/ContextParallel.cuh; used by
// ContextAttention.cpp).
/// A box of Dims[0] x .. x Dims[3] elements, at element Base of each side,
/// with strides for its first three axes (the last is contiguous).
struct ContextBox {
  int64_t Dims[4] = {1, 1, 1, 1};
  int64_t DstBase = 0, SrcBase = 0;
  int64_t Dst[3] = {}, Src[3] = {};
};
/// Rows (b, a, i) of a [Batch, Heads, Rows] set of rows: row (b, a, i)
/// starts at element Base + b Stride[0] + a Stride[1] + i Stride[2].
struct ContextRows {
  int64_t Batch = 0, Heads = 0, Rows = 0, Base = 0;
  int64_t Stride[3] = {};
};
/// Dst's box = Src's, elements of ElementBytes (2 or 4).
void copyBox(void *Dst, const void *Src, int ElementBytes, const ContextBox &B,
             cudaStream_t S);
/// *Flag = 1 when every row R of Lse (any storage) exceeds Fill + max(0,
/// Bias[b, :]) + 104 (Bias [Batch, Keys] or null), else 0.
void ringNegligible(int *Flag, Elems Lse, const ContextRows &R,
                    const float *Bias, int64_t Keys, float Fill,
                    cudaStream_t S);
/// The partial rows O (D elements each, of Op) and L (of Lp) merged into
/// RunO and RunL at the same places (First: RunO and RunL hold nothing yet,
/// they become the partial), unless *Skip.
void ringMerge(float *RunO, float *RunL, Elems Op, Elems Lp,
               const ContextRows &O, const ContextRows &L, int64_t D,
               bool First, const int *Skip, cudaStream_t S);
/// Acc += Part over rows R (D elements each), unless *Skip.
void ringAccumulate(float *Acc, Elems Part, const ContextRows &R, int64_t D,
                    const int *Skip, cudaStream_t S);

// Dropout (kernels/Dropout.cuh): Philox-4x32-10 of runtime/cpu/Philox.h.
/// The local tensor is the block [Offset, Offset + Local) of Global.
/// Context parallelism: along an axis D with Seam.Dim[D] > 0, local
/// indices from Seam.Dim[D] on are Jump.Dim[D] further in Global (a zigzag
/// block's two runs; runtime/TensorLayout.h's GlobalBlock).
void dropout(Elems Y, uint8_t *Mask, Elems X, double Ratio, uint64_t Seed,
             uint32_t Layer, uint32_t Site, uint32_t Stream, DevShape Global,
             DevShape Local, DevShape Offset, cudaStream_t S,
             DevShape Seam = {}, DevShape Jump = {});
void dropoutBackward(Elems DX, Elems DY, const uint8_t *Mask, int64_t N,
                     double Ratio, cudaStream_t S);

// Cross entropy (kernels/CrossEntropy.cuh). Scratch: N doubles.
/// Ignore < 0 with HasIgnore false: every row counts.
void crossEntropy(float *Loss, const float *Logits, const int64_t *Targets,
                  int64_t N, int64_t V, int64_t ValidV, bool HasIgnore,
                  int64_t Ignore, double *Scratch, DeviceError *Err,
                  cudaStream_t S);
/// DLoss is read from device memory (the dloss buffer). Scratch: 1 double.
void crossEntropyBackward(float *DLogits, const float *Logits,
                          const int64_t *Targets, const float *DLoss,
                          int64_t N, int64_t V, int64_t ValidV, bool HasIgnore,
                          int64_t Ignore, double *Scratch, DeviceError *Err,
                          cudaStream_t S);

// The vocabulary-parallel loss (kernels/CrossEntropy.cuh), in the CPU's
// three phases around the group reductions Dispatch.cpp makes: this
// rank holds columns [Start, Start + V) of which the first Mine are real.
/// Max[n] = max over this rank's real columns (float); checks the targets.
void vocabParallelMax(float *Max, const float *Logits, const int64_t *Targets,
                      int64_t N, int64_t V, int64_t Mine, int64_t Valid,
                      bool HasIgnore, int64_t Ignore, DeviceError *Err,
                      cudaStream_t S);
/// Sum[n] = float(sum_j exp(l - Max[n])) over this rank's real columns;
/// Target[n] = the target's logit if this rank holds it, else 0.
void vocabParallelSums(float *Sum, float *Target, const float *Logits,
                       const float *Max, const int64_t *Targets, int64_t N,
                       int64_t V, int64_t Mine, int64_t Start, bool HasIgnore,
                       int64_t Ignore, cudaStream_t S);
void vocabParallelLoss(float *Loss, const float *Sum, const float *Max,
                       const float *Target, const int64_t *Targets, int64_t N,
                       bool HasIgnore, int64_t Ignore, cudaStream_t S);
/// Scratch: 1 double.
void vocabParallelGrad(float *DLogits, const float *Logits, const float *Max,
                       const float *Sum, const int64_t *Targets,
                       const float *DLoss, int64_t N, int64_t V, int64_t Mine,
                       int64_t Start, bool HasIgnore, int64_t Ignore,
                       double *Scratch, cudaStream_t S);

// Optimizer (kernels/AdamW.cuh).
/// Partials[0..SumBlocks) = block sums of G^2 in double (fixed grid), then
/// *Sum (double) = their sum in block order, added to *Sum when Accumulate.
void sumSquares(double *Sum, const float *G, int64_t N, double *Partials,
                bool Accumulate, cudaStream_t S);
/// *Out = float(Split) for the tensor-group all-reduce.
void doubleToFloat(float *Out, const double *In, cudaStream_t S);
/// *Norm = float(sqrt(Total)), Total = (SplitF ? *SplitF : *SplitD) + *Whole
/// (CpuBackend's GradNorm reduces the split part in double: SplitF null).
void gradNormTotal(double *Total, const double *SplitD, const float *SplitF,
                   const double *Whole, cudaStream_t S);
/// *Norm = float(sqrt(Total * Scale^2)): Scale the optimizer's gradient scale
/// (1 / the loss scale, a power of two), so the norm is the unscaled one.
void gradNormFinish(float *Norm, const double *Total, const float *TotalF,
                    double Scale, cudaStream_t S);
/// One AdamW step, reading the grad norm, lr and step from device memory
/// (the plan's buffers) and computing torch's scalars on the device; the
/// gradients are multiplied by the clip coefficient times GradScale (1 / the
/// loss scale), in float, as the CPU's.
void adamw(float *P, const float *G, float *M, float *V, int64_t N,
           const float *GradNorm, const float *Lr, const float *Step,
           double Beta1, double Beta2, double Eps, double WeightDecay,
           double MaxNorm, float GradScale, cudaStream_t S);
/// One tensor of a multi-tensor AdamW step.
struct AdamwTensor {
  float *P;
  const float *G;
  float *M, *V;
  int64_t N;
  double WeightDecay;
};
/// adamw over Count tensors sharing the grad norm, lr, step and the other
/// hyperparameters, in launches of many tensors (MultiTensor.h); each
/// element's arithmetic is adamw's.
void adamwMultiTensor(const AdamwTensor *Tensors, int Count,
                      const float *GradNorm, const float *Lr,
                      const float *Step, double Beta1, double Beta2,
                      double Eps, double MaxNorm, float GradScale,
                      cudaStream_t S);

// Mixed precision (kernels/Convert.cuh): 16-bit bits (bfloat16 when Bf16,
// else IEEE half) to float32 and back, rounded to nearest even, as the CPU's
// widen16 and narrow16.
void widen16(float *Y, const uint16_t *X, int64_t N, bool Bf16,
             cudaStream_t S);
void narrow16(uint16_t *Y, const float *X, int64_t N, bool Bf16,
              cudaStream_t S);

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_CUDAKERNELS_H
