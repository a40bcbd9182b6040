//===- Gelu.cpp - GELU, erf and tanh forms, forward and backward ----------===//
//
// Kernels.h, "5. GELU", and the linear layer fused with it. float computes
// in double through runtime/Numerics.h's GELU forms (Phi and 1 + tanh from
// IEEE operations, no libm call, so the loops vectorise: the activations'
// unaryRange) and rounds once, as the CUDA kernels
// (runtime/cuda/kernels/Gelu.cuh) do with the same functions. double (the
// finite-difference tests) keeps libm's erf and tanh.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/kernels/Common.h"

#include "runtime/Numerics.h"

#include <cmath>
#include <type_traits>

namespace sp::cpu {

using namespace detail;
using numerics::GeluCoef;
using numerics::InvSqrt2;
using numerics::InvSqrt2Pi;
using numerics::Sqrt2OverPi;

template <typename T>
void gelu(T *Y, const T *X, int64_t N, GeluApprox Approx) {
  checkSizes({N});
  const T Half = T(0.5), One = T(1);
  parallelFor(N, 1 << 13, [&](int64_t I0, int64_t I1) {
    if constexpr (std::is_same_v<T, float>) {
      if (Approx == GeluApprox::None)
        unaryRange<numerics::GeluErf>(Y + I0, X + I0, I1 - I0);
      else
        unaryRange<numerics::GeluTanh>(Y + I0, X + I0, I1 - I0);
    } else if (Approx == GeluApprox::None) {
      for (int64_t I = I0; I < I1; ++I) {
        T X0 = X[I];
        Y[I] = Half * X0 * (One + std::erf(X0 * T(InvSqrt2)));
      }
    } else {
      for (int64_t I = I0; I < I1; ++I) {
        T X0 = X[I];
        T U = T(Sqrt2OverPi) * (X0 + T(GeluCoef) * X0 * X0 * X0);
        Y[I] = Half * X0 * (One + std::tanh(U));
      }
    }
  });
}

template <typename T>
void geluBackward(T *DX, const T *X, const T *DY, int64_t N,
                  GeluApprox Approx) {
  checkSizes({N});
  const T Half = T(0.5), One = T(1);
  parallelFor(N, 1 << 13, [&](int64_t I0, int64_t I1) {
    if constexpr (std::is_same_v<T, float>) {
      if (Approx == GeluApprox::None)
        unaryGradRange<numerics::GeluErf>(DX + I0, X + I0, DY + I0, I1 - I0);
      else
        unaryGradRange<numerics::GeluTanh>(DX + I0, X + I0, DY + I0, I1 - I0);
    } else if (Approx == GeluApprox::None) {
      for (int64_t I = I0; I < I1; ++I) {
        T X0 = X[I];
        T Cdf = Half * (One + std::erf(X0 * T(InvSqrt2)));
        T Pdf = T(InvSqrt2Pi) * std::exp(-Half * X0 * X0);
        DX[I] = DY[I] * (Cdf + X0 * Pdf);
      }
    } else {
      for (int64_t I = I0; I < I1; ++I) {
        T X0 = X[I];
        T U = T(Sqrt2OverPi) * (X0 + T(GeluCoef) * X0 * X0 * X0);
        T Th = std::tanh(U);
        T DU = T(Sqrt2OverPi) * (One + T(3 * GeluCoef) * X0 * X0);
        DX[I] = DY[I] * (Half * (One + Th) + Half * X0 * (One - Th * Th) * DU);
      }
    }
  });
}

template <typename T>
void linearGelu(T *Z, T *Y, const T *X, const T *W, const T *Bias,
                int64_t Rows, int64_t In, int64_t Out, bool TransW,
                GeluApprox Approx) {
  linear(Z, X, W, Bias, Rows, In, Out, TransW);
  gelu(Y, Z, Rows * Out, Approx);
}

template <typename T>
void linearGeluBackward(T *DX, const T *DY, const T *W, const T *Z,
                        int64_t Rows, int64_t In, int64_t Out, bool TransW,
                        GeluApprox Approx) {
  // The linear input gradient into DX, then the GELU's gradient of it in
  // place.
  linear(DX, DY, W, static_cast<const T *>(nullptr), Rows, In, Out, TransW);
  geluBackward(DX, Z, DX, Rows * Out, Approx);
}

#define SP_INSTANTIATE(T)                                                      \
  template void gelu<T>(T *, const T *, int64_t, GeluApprox);                  \
  template void geluBackward<T>(T *, const T *, const T *, int64_t,            \
                                GeluApprox);                                   \
  template void linearGelu<T>(T *, T *, const T *, const T *, const T *,       \
                              int64_t, int64_t, int64_t, bool, GeluApprox);    \
  template void linearGeluBackward<T>(T *, const T *, const T *, const T *,    \
                                      int64_t, int64_t, int64_t, bool,         \
                                      GeluApprox);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
