//===- ContextParallel.cuh - Ring and all-to-all attention's kernels -*- CUDA
//-*-===//
//
// The kernels around the blockwise attention kernels (Attention.cuh) that
// context parallelism's attention needs on the GPU (ContextAttention.cpp):
//
//   copyBox         Dst[i0, i1, i2, i3] = Src[i0, i1, i2, i3] for a box of
//                   elements of 2 or 4 bytes, each side with its own
//                   strides (the innermost axis contiguous): the all-to-all's
//                   packing of heads and its placing of positions;
//   ringNegligible  *Flag = 0 unless every row of a query run has a
//                   log-sum-exp above Fill + max(0, the key run's padding
//                   bias) + 104 (Attention.cuh's skipAbove, in float): the
//                   rule by which the kernels skip a key block above the
//                   causal diagonal, for a whole (query run, key run) pair,
//                   whose calls then do nothing (AttentionGeometry::SkipIf);
//   ringMerge       the forward's partial output and log-sum-exp of one pair
//                   merged into the running ones (float32):
//                     l = max(l1, l2) + log1p(exp(min - max)),
//                     O = exp(l1 - l) O + exp(l2 - l) O_p
//                   (a partial row of log-sum-exp -inf carries no weight;
//                   the first partial of a row is taken as it is);
//   ringAccumulate  Acc += Part over a window's rows (the backward's dq, and
//                   a block's dk, dv), in float32.
//
// Each element has one writer and one order of operations, so the results
// are the same bits on every run. Included after Attention.cuh (in
// AttentionKernels.cu), whose ldAny, biasMax and AThreads it uses.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"

namespace sp::cuda {
namespace {

template <typename Word>
__global__ void copyBoxKernel(Word *Dst, const Word *Src, ContextBox B,
                              int64_t N) {
  SP_GRID_LOOP(E, N) {
    int64_t Rest = E;
    const int64_t I3 = Rest % B.Dims[3];
    Rest /= B.Dims[3];
    const int64_t I2 = Rest % B.Dims[2];
    Rest /= B.Dims[2];
    const int64_t I1 = Rest % B.Dims[1], I0 = Rest / B.Dims[1];
    Dst[B.DstBase + I0 * B.Dst[0] + I1 * B.Dst[1] + I2 * B.Dst[2] + I3] =
        Src[B.SrcBase + I0 * B.Src[0] + I1 * B.Src[1] + I2 * B.Src[2] + I3];
  }
}

/// One block: for each batch row b, the threshold from the key run's bias
/// (Bias [Batch, Keys], or null), then every row (b, a, i) of the run.
__global__ void ringNegligibleKernel(int *Flag, Elems Lse, ContextRows R,
                                     const float *Bias, int64_t Keys,
                                     float Fill) {
  __shared__ int Live;
  if (threadIdx.x == 0)
    Live = 0;
  for (int64_t B = 0; B < R.Batch; ++B) {
    const float Top = biasMax(Bias ? Bias + B * Keys : nullptr, Keys);
    const float Skip = __fadd_rn(__fadd_rn(Fill, Top), 104.0f);
    for (int64_t E = threadIdx.x; E < R.Heads * R.Rows; E += AThreads) {
      const int64_t A = E / R.Rows, I = E % R.Rows;
      if (!(ldAny(Lse, R.Base + B * R.Stride[0] + A * R.Stride[1] +
                           I * R.Stride[2]) > Skip))
        Live = 1; // every writer writes 1
    }
  }
  __syncthreads();
  if (threadIdx.x == 0)
    *Flag = Live ? 0 : 1;
}

template <Storage ST, Storage LT>
__global__ void ringMergeKernel(float *RunO, float *RunL, Elems Op, Elems Lp,
                                ContextRows O, ContextRows L, int64_t D,
                                bool First, const int *Skip) {
  if (Skip && *Skip)
    return;
  const float NegInf = -__int_as_float(0x7f800000);
  SP_GRID_LOOP(Row, O.Batch * O.Heads * O.Rows) {
    const int64_t I = Row % O.Rows, A = Row / O.Rows % O.Heads,
                  B = Row / (O.Rows * O.Heads);
    const int64_t Li =
        L.Base + B * L.Stride[0] + A * L.Stride[1] + I * L.Stride[2];
    const int64_t Oi =
        O.Base + B * O.Stride[0] + A * O.Stride[1] + I * O.Stride[2];
    const float L2 = ldAs<LT>(Lp, Li);
    if (First) { // nothing merged yet: the partial as it is
      for (int64_t X = 0; X < D; ++X)
        RunO[Oi + X] = L2 == NegInf ? 0.0f : ldAs<ST>(Op, Oi + X);
      RunL[Li] = L2;
      continue;
    }
    if (L2 == NegInf)
      continue; // every score -inf: no weight
    const float L1 = RunL[Li];
    const float Hi = L1 < L2 ? L2 : L1, Lo = L1 < L2 ? L1 : L2;
    const float New = __fadd_rn(Hi, log1pf(expf(__fadd_rn(Lo, -Hi))));
    const float W1 = expf(__fadd_rn(L1, -New)), W2 = expf(__fadd_rn(L2, -New));
    for (int64_t X = 0; X < D; ++X)
      RunO[Oi + X] = __fadd_rn(__fmul_rn(W1, RunO[Oi + X]),
                               __fmul_rn(W2, ldAs<ST>(Op, Oi + X)));
    RunL[Li] = New;
  }
}

template <Storage ST>
__global__ void ringAccumulateKernel(float *Acc, Elems Part, ContextRows R,
                                     int64_t D, const int *Skip) {
  if (Skip && *Skip)
    return;
  SP_GRID_LOOP(E, R.Batch * R.Heads * R.Rows * D) {
    const int64_t X = E % D, Row = E / D;
    const int64_t I = Row % R.Rows, A = Row / R.Rows % R.Heads,
                  B = Row / (R.Rows * R.Heads);
    const int64_t At =
        R.Base + B * R.Stride[0] + A * R.Stride[1] + I * R.Stride[2] + X;
    Acc[At] = __fadd_rn(Acc[At], ldAs<ST>(Part, At));
  }
}

} // namespace

void copyBox(void *Dst, const void *Src, int ElementBytes, const ContextBox &B,
             cudaStream_t S) {
  const int64_t N = B.Dims[0] * B.Dims[1] * B.Dims[2] * B.Dims[3];
  if (Launch L = elementwiseLaunch(N); L.Blocks) {
    if (ElementBytes == 2)
      SP_LAUNCH(copyBoxKernel<uint16_t>, L.Blocks, L.Threads, 0, S,
                static_cast<uint16_t *>(Dst),
                static_cast<const uint16_t *>(Src), B, N);
    else
      SP_LAUNCH(copyBoxKernel<uint32_t>, L.Blocks, L.Threads, 0, S,
                static_cast<uint32_t *>(Dst),
                static_cast<const uint32_t *>(Src), B, N);
  }
}

void ringNegligible(int *Flag, Elems Lse, const ContextRows &R,
                    const float *Bias, int64_t Keys, float Fill,
                    cudaStream_t S) {
  SP_LAUNCH(ringNegligibleKernel, 1, AThreads, 0, S, Flag, Lse, R, Bias, Keys,
            Fill);
}

void ringMerge(float *RunO, float *RunL, Elems Op, Elems Lp,
               const ContextRows &O, const ContextRows &L, int64_t D,
               bool First, const int *Skip, cudaStream_t S) {
  if (Launch Ln = elementwiseLaunch(O.Batch * O.Heads * O.Rows); Ln.Blocks)
    withStorage(Op.Kind, [&](auto ST) {
      withStorage(Lp.Kind, [&](auto LT) {
        SP_LAUNCH((ringMergeKernel<decltype(ST)::value, decltype(LT)::value>),
                  Ln.Blocks, Ln.Threads, 0, S, RunO, RunL, Op, Lp, O, L, D,
                  First, Skip);
      });
    });
}

void ringAccumulate(float *Acc, Elems Part, const ContextRows &R, int64_t D,
                    const int *Skip, cudaStream_t S) {
  if (Launch L = elementwiseLaunch(R.Batch * R.Heads * R.Rows * D); L.Blocks)
    withStorage(Part.Kind, [&](auto ST) {
      SP_LAUNCH(ringAccumulateKernel<decltype(ST)::value>, L.Blocks, L.Threads,
                0, S, Acc, Part, R, D, Skip);
    });
}

} // namespace sp::cuda
