//===- Common.cuh - Shared device helpers of the CUDA kernels ---*- CUDA -*-===//
//
// Grid-stride loops, the 8-lane row reduction that reproduces the CPU's
// laneSum bit for bit (LaunchGeometry.h), the loads and stores of an
// operand in its storage, and the scalar math of runtime/Numerics.h (the
// double-precision exp, normal CDF, 1 + tanh, GELU, activations and 16-bit
// conversions), which the CPU kernels call too: one definition, so the
// elements get the CPU's bits. With nvcc's -fmad=false
// (runtime/cuda/CMakeLists.txt) every a * b + c rounds twice, as the CPU
// library's -ffp-contract=off; tests/gpu checks the kernels built on them
// against the CPU kernels.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_KERNELS_COMMON_CUH
#define SP_RUNTIME_CUDA_KERNELS_COMMON_CUH

#include "runtime/Numerics.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/LaunchGeometry.h"
#include <cstdint>
#include <type_traits>

// A kernel's dynamic shared memory and a launch, as macros so that
// tests/gpu/CudaEmulator.h can run the same source on the CPU (there they
// expand to its block's buffer and its scheduler).
#ifndef SP_DYNAMIC_SHARED
#define SP_DYNAMIC_SHARED(T, Name) extern __shared__ T Name[]
#endif
#ifndef SP_LAUNCH
#define SP_LAUNCH(Kernel, Grid, Block, Shared, Stream, ...)                    \
  Kernel<<<Grid, Block, Shared, Stream>>>(__VA_ARGS__)
#endif

namespace sp::cuda {
namespace {

// The shared scalar math (runtime/Numerics.h), by its plain names.
using numerics::expD;
using numerics::narrowBits;
using numerics::widenBits;

__device__ inline int64_t globalThread() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t gridThreads() {
  return int64_t(gridDim.x) * blockDim.x;
}

#define SP_GRID_LOOP(I, N)                                                     \
  for (int64_t I = globalThread(); I < (N); I += gridThreads())

/// Rows handled by groups of RowLanes threads: Row is this group's first
/// row, Lane its thread's lane; rows advance by the grid's row count.
__device__ inline int64_t laneRow() { return globalThread() / RowLanes; }
__device__ inline int laneOf() { return int(threadIdx.x % RowLanes); }
__device__ inline int64_t laneRowStride() { return gridThreads() / RowLanes; }

/// Fn(R, Active, RR) for each row R = laneRow() + k laneRowStride() of this
/// thread's group, Active = R < Rows. Every thread of a warp runs Fn while
/// any row of the warp is live (the shuffles of laneSum and laneMax need
/// the whole warp), so R may be past the end; RR is R where Active, else 0:
/// a row that exists, for the loads of an inactive group.
template <typename F>
__device__ inline void forLaneRows(int64_t Rows, F &&Fn) {
  int64_t Stride = laneRowStride();
  int64_t Iters = (Rows + Stride - 1) / Stride;
  for (int64_t It = 0; It < Iters; ++It) {
    int64_t R = laneRow() + It * Stride;
    bool Active = R < Rows;
    Fn(R, Active, Active ? R : int64_t(0));
  }
}

/// Each lane evaluates LaneBatch terms before adding them, in order: the
/// same additions as one term at a time, with LaneBatch loads in flight
/// instead of one (the sums are memory-bound; measured on an H200, a
/// LayerNorm backward over [8192, 6144] took 4.4 ms one term at a time).
constexpr int LaneBatch = 8;

/// This lane's fold of Fn(j), j = laneOf() (mod RowLanes), j < N, in order:
/// Acc = Combine(Acc, Fn(j)) from Init (Init alone where !Active), LaneBatch
/// terms evaluated before they are combined.
template <typename T, typename F, typename Op>
__device__ inline T laneFold(int64_t N, bool Active, T Init, F &&Fn,
                             Op Combine) {
  T Acc = Init;
  if (Active) {
    int64_t J = laneOf();
    for (; J + (LaneBatch - 1) * RowLanes < N; J += LaneBatch * RowLanes) {
      T V[LaneBatch];
#pragma unroll
      for (int K = 0; K < LaneBatch; ++K)
        V[K] = Fn(J + K * RowLanes);
#pragma unroll
      for (int K = 0; K < LaneBatch; ++K)
        Acc = Combine(Acc, V[K]);
    }
    for (; J < N; J += RowLanes)
      Acc = Combine(Acc, Fn(J));
  }
  return Acc;
}

/// P[k] = lane k's V, for the RowLanes lanes of this thread's group. Every
/// thread of the warp must call it (shuffles).
template <typename T>
__device__ inline void laneValues(T V, T (&P)[RowLanes]) {
#pragma unroll
  for (int K = 0; K < RowLanes; ++K)
    P[K] = __shfl_sync(0xffffffffu, V, K, RowLanes);
}

/// The CPU's laneSum: lane k holds the sum of Fn(j), j = k (mod 8), in
/// order; the eight are combined ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)). Every
/// thread of the warp must call it (shuffles), Active false for lanes whose
/// row is past the end (they contribute nothing and get garbage).
template <typename F>
__device__ inline double laneSum(int64_t N, bool Active, F &&Fn) {
  double S = laneFold(N, Active, 0.0, Fn,
                      [](double A, double B) { return A + B; });
  double P[RowLanes];
  laneValues(S, P);
  return ((P[0] + P[1]) + (P[2] + P[3])) + ((P[4] + P[5]) + (P[6] + P[7]));
}

/// A column's sum over rows 0..Rows-1 of Fn(R), in double and in row order
/// (the CPU's column blocks), ColumnBatch terms evaluated before they are
/// added: one thread per column has few loads in flight otherwise (an
/// H200 took 0.95 ms for a bias gradient over 8192 rows, 2300 to 6144
/// columns).
constexpr int ColumnBatch = 16;

template <typename F>
__device__ inline double columnSum(int64_t Rows, F &&Fn) {
  double S = 0;
  int64_t R = 0;
  for (; R + ColumnBatch <= Rows; R += ColumnBatch) {
    double V[ColumnBatch];
#pragma unroll
    for (int K = 0; K < ColumnBatch; ++K)
      V[K] = Fn(R + K);
#pragma unroll
    for (int K = 0; K < ColumnBatch; ++K)
      S += V[K];
  }
  for (; R < Rows; ++R)
    S += Fn(R);
  return S;
}

/// Block K of a column's sum over Rows rows in the CPU's column-sum order
/// (LaunchGeometry.h, ColumnRows): Term(R) over rows [K ColumnRows, ...),
/// in order from 0.
template <typename F>
__device__ inline double columnPart(int64_t K, int64_t Rows, F &&Term) {
  int64_t R0 = K * ColumnRows;
  int64_t N = Rows - R0 < ColumnRows ? Rows - R0 : ColumnRows;
  return columnSum(N, [&](int64_t R) { return Term(R0 + R); });
}

/// Out[j] += float(the column's block sums Part[k W + j], k in order).
__global__ void columnPartsSumKernel(float *Out, const double *Part,
                                     int64_t Parts, int64_t W) {
  SP_GRID_LOOP(J, W)
  Out[J] += float(columnSum(Parts, [&](int64_t K) { return Part[K * W + J]; }));
}

inline void columnPartsSum(float *Out, const double *Part, int64_t Parts,
                           int64_t W, cudaStream_t S) {
  if (Launch L = columnsLaunch(W); L.Blocks)
    SP_LAUNCH(columnPartsSumKernel, L.Blocks, L.Threads, 0, S, Out, Part,
              Parts, W);
}

/// The CPU's rowMax of Fn(j), j < N: lane partial maxima with
/// `m < x ? x : m`, combined in lane order (the same NaN behaviour). Every
/// thread of the warp must call it, as laneSum.
template <typename F>
__device__ inline float laneMax(int64_t N, bool Active, F &&Fn) {
  auto Max = [](float M, float X) { return M < X ? X : M; };
  float P[RowLanes];
  laneValues(laneFold(N, Active, -__int_as_float(0x7f800000), Fn, Max), P);
  float All = P[0];
#pragma unroll
  for (int K = 1; K < RowLanes; ++K)
    All = Max(All, P[K]);
  return All;
}

/// Records the first data error (later ones are dropped).
__device__ inline void reportError(DeviceError *Err, int Code, int64_t Index,
                                   int64_t Value) {
  if (atomicCAS(&Err->Code, 0, Code) == 0) {
    Err->Index = Index;
    Err->Value = Value;
  }
}

/// Element I of E (Elems: CudaKernels.h) as float32, and V stored as
/// element I rounded once to E's storage. The kernels taking Elems are
/// templated on the one storage of their tensors (launched through
/// withStorage), not branching on it per element: the reductions batch
/// their loads (LaneBatch, ColumnBatch), which such a branch defeats (on an
/// H200 a LayerNorm backward over [8192, 6144] took 7 ms instead of 2).
template <Storage K> __device__ inline float ldAs(Elems E, int64_t I) {
  if constexpr (K == Storage::F32)
    return static_cast<const float *>(E.Data)[I];
  else
    return widenBits(static_cast<const uint16_t *>(E.Data)[I],
                     K == Storage::BF16);
}

template <Storage K> __device__ inline void stAs(Elems E, int64_t I, float V) {
  if constexpr (K == Storage::F32)
    static_cast<float *>(E.Data)[I] = V;
  else
    static_cast<uint16_t *>(E.Data)[I] = narrowBits(V, K == Storage::BF16);
}

/// Calls Fn with K as a compile-time constant (a std::integral_constant),
/// for launching a kernel templated on an operand's storage.
template <typename F> inline void withStorage(Storage K, F &&Fn) {
  switch (K) {
  case Storage::F32:
    return Fn(std::integral_constant<Storage, Storage::F32>());
  case Storage::BF16:
    return Fn(std::integral_constant<Storage, Storage::BF16>());
  case Storage::F16:
    return Fn(std::integral_constant<Storage, Storage::F16>());
  }
}

} // namespace
} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_KERNELS_COMMON_CUH
