//===- Convert.cpp - float32 to and from bfloat16 and half ----------------===//
//
// Kernels.h, "19. 16-bit storage": widen16 and narrow16 over the kernel
// threads, each element through runtime/Numerics.h's widenBits and
// narrowBits (ir/Float16.h's rules without branches, so that the loops
// vectorise), which the CUDA kernels (runtime/cuda/kernels/Convert.cuh and
// every kernel reading 16-bit storage) call too.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/kernels/Common.h"

#include "runtime/Numerics.h"

namespace sp::cpu {

using namespace detail;

namespace {

SP_SIMD void widenRange(float *Y, const uint16_t *X, int64_t N, bool Bf16) {
  // The storage's branch out of the loop: each loop one case.
  if (Bf16)
    for (int64_t I = 0; I < N; ++I)
      Y[I] = numerics::widenBits(X[I], true);
  else
    for (int64_t I = 0; I < N; ++I)
      Y[I] = numerics::widenBits(X[I], false);
}

SP_SIMD void narrowRange(uint16_t *Y, const float *X, int64_t N, bool Bf16) {
  if (Bf16)
    for (int64_t I = 0; I < N; ++I)
      Y[I] = numerics::narrowBits(X[I], true);
  else
    for (int64_t I = 0; I < N; ++I)
      Y[I] = numerics::narrowBits(X[I], false);
}

} // namespace

void widen16(float *Y, const uint16_t *X, int64_t N, bool Bf16) {
  checkSizes({N});
  parallelFor(N, 1 << 15, [&](int64_t I0, int64_t I1) {
    widenRange(Y + I0, X + I0, I1 - I0, Bf16);
  });
}

void narrow16(uint16_t *Y, const float *X, int64_t N, bool Bf16) {
  checkSizes({N});
  parallelFor(N, 1 << 15, [&](int64_t I0, int64_t I1) {
    narrowRange(Y + I0, X + I0, I1 - I0, Bf16);
  });
}

} // namespace sp::cpu
