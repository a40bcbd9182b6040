//===- Simd.h - Vectorisable building blocks of the CPU kernels -*- C++ -*-===//
//
// The hot elementwise loops are written so that the compiler vectorises them:
// no calls into libm, no branches (selects only), no reductions whose order
// would depend on the vector width (sums use a fixed number of partial sums,
// Lanes, combined in a fixed order). On x86-64 Linux the loops marked
// SP_SIMD are also compiled for AVX-512F and for AVX2 and the widest the CPU
// runs is picked at load time (GCC's target_clones); the build stays
// portable. The AVX-512 copy halves the float GELUs' time (they compute in
// double, 8 lanes instead of 4): 186 -> 103 ms of gpt2s's 3.6 s step on a
// Zen 4, where sp-run --dump gave bitwise the same gradients and weights
// with the AVX-512, AVX2 and default copies (README, "Training step
// time"). FMA is not enabled in the clones
// and the library is compiled with -ffp-contract=off, so every clone rounds
// exactly the same IEEE operations: results do not depend on the machine's
// vector width, the thread count, or the clone picked.
//
// The kernel files (runtime/cpu/kernels/) and Attention.cpp share these;
// they are internal to the CPU backend (namespace sp::cpu::simd). The
// per-element math they build on (expD) is runtime/Numerics.h's, shared
// with the CUDA kernels.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CPU_SIMD_H
#define SP_RUNTIME_CPU_SIMD_H

#include "runtime/Numerics.h"

#include <cstdint>
#include <limits>

// Sanitizer builds (SP_NO_TARGET_CLONES) have one clone: an ifunc resolver
// runs before the sanitizer's runtime is set up, and its instrumentation
// crashes there. Clang (14) has one too: it does not clone function
// templates, and the kernels' SP_SIMD loops are templates over T.
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) &&          \
    !defined(__clang__) && defined(__has_attribute) &&                         \
    !defined(SP_NO_TARGET_CLONES)
#if __has_attribute(target_clones)
#define SP_SIMD __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef SP_SIMD
#define SP_SIMD
#endif
#define SP_INLINE inline __attribute__((always_inline))

namespace sp::cpu::simd {

/// Accumulator type of every reduction.
using Acc = double;

/// Partial sums of the reductions that are vectorised.
constexpr int Lanes = 8;

/// The sum of Lanes partial sums, in a fixed order.
SP_INLINE Acc sumLanes(const Acc *S) {
  return ((S[0] + S[1]) + (S[2] + S[3])) + ((S[4] + S[5]) + (S[6] + S[7]));
}

// The scalar math shared with the CUDA kernels (runtime/Numerics.h): exp in
// double and the bit casts.
using numerics::bitCast;
using numerics::expD;

/// S[J mod Lanes] += Fn(J) for J < N, in increasing J: laneSum's partial
/// sums.
template <typename F> SP_INLINE void addLanes(Acc *S, int64_t N, F &&Fn) {
  int64_t J = 0;
  for (; J + Lanes <= N; J += Lanes)
    for (int K = 0; K < Lanes; ++K)
      S[K] += Fn(J + K);
  for (int K = 0; J + K < N; ++K)
    S[K] += Fn(J + K);
}
/// sum_{J < N} Fn(J) in double as Lanes partial sums (J mod Lanes) combined
/// in a fixed order, so that the loop vectorises; the result depends only
/// on N and the values.
template <typename F> SP_INLINE Acc laneSum(int64_t N, F &&Fn) {
  Acc S[Lanes] = {};
  addLanes(S, N, Fn);
  return sumLanes(S);
}

/// laneSum(N, Fn) for an Fn dear enough to want the widest vectors (an
/// exp): Fn runs over chunks of the range in a plain loop, which the
/// vectoriser turns into whole-register code (with AVX-512, 8 doubles at a
/// time, where laneSum's lanes get 4-wide halves), into a buffer that is
/// then summed in laneSum's order. Bitwise laneSum's result.
template <typename F> SP_INLINE Acc laneSumBuffered(int64_t N, F &&Fn) {
  constexpr int64_t Chunk = 256; // a multiple of Lanes
  Acc E[Chunk];
  Acc S[Lanes] = {};
  for (int64_t C0 = 0; C0 < N; C0 += Chunk) {
    int64_t Len = N - C0 < Chunk ? N - C0 : Chunk;
    for (int64_t J = 0; J < Len; ++J)
      E[J] = Fn(C0 + J);
    // Each chunk starts at lane 0: J mod Lanes is (C0 + J) mod Lanes.
    addLanes(S, Len, [&](int64_t J) { return E[J]; });
  }
  return sumLanes(S);
}

/// Y[j] = exp(X[j] - Shift) rounded to T, j < N (Y may be X), through
/// expD; returns the sum of the unrounded values in laneSum's order: the
/// numerator and denominator of a softmax row (kernels/AttentionSoftmax.cpp) and of a fused
/// attention block (Attention.cpp).
template <typename T>
SP_INLINE Acc expShiftedSum(T *Y, const T *X, int64_t N, T Shift) {
  return laneSumBuffered(N, [&](int64_t J) {
    Acc E = expD(Acc(X[J]) - Acc(Shift));
    Y[J] = T(E);
    return E;
  });
}

/// Row max, as Lanes partial maxima (max is exact in any order).
template <typename T> SP_INLINE T rowMax(const T *XR, int64_t N) {
  T M[Lanes];
  for (int K = 0; K < Lanes; ++K)
    M[K] = -std::numeric_limits<T>::infinity();
  int64_t J = 0;
  for (; J + Lanes <= N; J += Lanes)
    for (int K = 0; K < Lanes; ++K)
      M[K] = M[K] < XR[J + K] ? XR[J + K] : M[K];
  for (int K = 0; J + K < N; ++K)
    M[K] = M[K] < XR[J + K] ? XR[J + K] : M[K];
  T Max = M[0];
  for (int K = 1; K < Lanes; ++K)
    Max = Max < M[K] ? M[K] : Max;
  return Max;
}

} // namespace sp::cpu::simd

#endif // SP_RUNTIME_CPU_SIMD_H
