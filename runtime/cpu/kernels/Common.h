//===- Common.h - Helpers shared by the CPU kernel files --------*- C++ -*-===//
//
// What several of runtime/cpu/kernels/*.cpp need and no caller of the
// kernels should see: the check on a caller's misuse, the shape helpers of
// the broadcasting and dropout kernels, the row and column loops over the
// kernel threads (the column sums' order is the CUDA kernels' too:
// Kernels.h, ColumnRows), and the vectorised elementwise loops over
// runtime/Numerics.h's activation structs (the activations, the GELU). The CUDA
// counterpart is runtime/cuda/kernels/Common.cuh; the scalar math both
// backends share is runtime/Numerics.h, the vectorisable reductions
// runtime/cpu/Simd.h.
//
// Internal to the CPU backend (namespace sp::cpu::detail).
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CPU_KERNELS_COMMON_H
#define SP_RUNTIME_CPU_KERNELS_COMMON_H

#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Parallel.h"
#include "runtime/cpu/Simd.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>

/// A check on the caller's use of a kernel (a bug, not bad data): prints
/// file:line, the condition and a hint, then aborts.
#define SP_CPU_CHECK(Cond, Hint)                                               \
  do {                                                                         \
    if (!(Cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: sp::cpu check failed: %s (%s)\n", __FILE__, \
                   __LINE__, #Cond, Hint);                                     \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

namespace sp::cpu::detail {

using simd::Acc;

inline void checkSizes(std::initializer_list<int64_t> Sizes) {
  for (int64_t S : Sizes)
    SP_CPU_CHECK(S >= 0, "sizes must be non-negative");
}

//===----------------------------------------------------------------------===//
// Shape helpers
//===----------------------------------------------------------------------===//

/// Calls Fn(Idx) for every multi-index of Dims[0..R) in row-major order (once
/// with no index when R == 0, never when a dimension is 0).
template <typename F> void forEachIndex(int R, const int64_t *Dims, F &&Fn) {
  for (int D = 0; D < R; ++D)
    if (Dims[D] == 0)
      return;
  int64_t Idx[MaxRank] = {};
  while (true) {
    Fn(static_cast<const int64_t *>(Idx));
    int D = R - 1;
    while (D >= 0 && ++Idx[D] == Dims[D])
      Idx[D--] = 0;
    if (D < 0)
      return;
  }
}

/// Idx = the multi-index of row-major position Flat in Dims (R dimensions).
inline void unflatten(int64_t Flat, int R, const int64_t *Dims, int64_t *Idx) {
  for (int D = R - 1; D >= 0; --D) {
    Idx[D] = Flat % Dims[D];
    Flat /= Dims[D];
  }
}

inline int64_t dot(int R, const int64_t *Idx, const int64_t *Strides) {
  int64_t Off = 0;
  for (int D = 0; D < R; ++D)
    Off += Idx[D] * Strides[D];
  return Off;
}

/// Row-major strides of Dims[0..R).
inline void rowMajorStrides(int R, const int64_t *Dims, int64_t *Strides) {
  int64_t S = 1;
  for (int D = R - 1; D >= 0; --D) {
    Strides[D] = S;
    S *= Dims[D];
  }
}

/// The strides with which an input of shape In is read at the multi-indices
/// of Out under numpy broadcasting (0 along broadcast dimensions).
inline Status broadcastStrides(Shape In, Shape Out, int64_t *Strides) {
  int R = int(Out.size());
  if (R > MaxRank)
    return Status::error("broadcast: rank above MaxRank");
  if (In.size() > Out.size())
    return Status::error("broadcast: input rank above output rank");
  int64_t InStrides[MaxRank];
  rowMajorStrides(int(In.size()), In.data(), InStrides);
  int Lead = R - int(In.size());
  for (int D = 0; D < R; ++D) {
    if (Out[D] < 0)
      return Status::error("broadcast: negative dimension", D, Out[D]);
    int DI = D - Lead;
    if (DI < 0)
      Strides[D] = 0;
    else if (In[DI] == Out[D])
      Strides[D] = InStrides[DI];
    else if (In[DI] == 1)
      Strides[D] = 0;
    else
      return Status::error("broadcast: shapes do not broadcast", D, In[DI]);
  }
  return Status::success();
}

//===----------------------------------------------------------------------===//
// Rows and columns over the kernel threads
//===----------------------------------------------------------------------===//

/// Calls Fn(R) for every row R < Rows, the rows over the kernel threads in
/// runs of about Grain elements (a row has Width of them). Each row is
/// computed by one thread, so the split changes nothing.
template <typename F>
void forEachRow(int64_t Rows, int64_t Width, F &&Fn,
                int64_t Grain = int64_t(1) << 13) {
  parallelFor(Rows, std::max<int64_t>(1, Grain / std::max<int64_t>(Width, 1)),
              [&](int64_t R0, int64_t R1) {
                for (int64_t R = R0; R < R1; ++R)
                  Fn(R);
              });
}

/// Columns per block of the column sums (layerNormBackward, biasBackward,
/// rmsNormBackward): a block's double accumulators stay in L1.
constexpr int64_t ColumnBlock = 256;

/// N sums per column J < Width over the rows, in the column sums' order
/// (Kernels.h, ColumnRows): for each column, the rows in blocks of
/// ColumnRows, each block summed in order from 0 in double, the blocks'
/// sums added in order. The columns go over the kernel threads in blocks of
/// at most ColumnBlock, [JB, JE): AddRow(R, JB, JE, Part) adds row R's N
/// terms of each column J to Part[k][J - JB]; Store(JB, JE, Sums) then gets
/// the block's totals, Sums[k][J - JB]. The CUDA kernels sum the row blocks
/// in parallel in this order.
template <int N, typename AddRowF, typename StoreF>
void columnSums(int64_t Rows, int64_t Width, AddRowF &&AddRow,
                StoreF &&Store) {
  parallelFor(Width, 64, [&](int64_t J0, int64_t J1) {
    for (int64_t JB = J0; JB < J1; JB += ColumnBlock) {
      int64_t JE = std::min(J1, JB + ColumnBlock);
      Acc Sums[N][ColumnBlock] = {};
      for (int64_t R0 = 0; R0 < Rows; R0 += ColumnRows) {
        Acc Part[N][ColumnBlock] = {};
        for (int64_t R = R0, RE = std::min(Rows, R0 + ColumnRows); R < RE; ++R)
          AddRow(R, JB, JE, Part);
        for (int K = 0; K < N; ++K)
          for (int64_t J = 0; J < JE - JB; ++J)
            Sums[K][J] += Part[K][J];
      }
      Store(JB, JE, Sums);
    }
  });
}

//===----------------------------------------------------------------------===//
// Elementwise functions
//===----------------------------------------------------------------------===//

// Internal linkage: each kernel file has its own clones and resolver.
namespace {

/// Y = F::value(X) and DX = DY F::grad(X), elementwise, for a struct F of
/// runtime/Numerics.h (an activation, a GELU form): computed in double and
/// rounded once to T, in loops that vectorise (SP_SIMD).
template <typename F, typename T>
SP_SIMD void unaryRange(T *Y, const T *X, int64_t N) {
  for (int64_t I = 0; I < N; ++I)
    Y[I] = T(F::value(X[I]));
}

template <typename F, typename T>
SP_SIMD void unaryGradRange(T *DX, const T *X, const T *DY, int64_t N) {
  for (int64_t I = 0; I < N; ++I)
    DX[I] = T(double(DY[I]) * F::grad(X[I]));
}

} // namespace

} // namespace sp::cpu::detail

#endif // SP_RUNTIME_CPU_KERNELS_COMMON_H
