//===- Gelu.cuh - GELU, erf and tanh forms, forward and backward -*- CUDA
//-*-===//
//
// Reference (runtime/cpu/kernels/Gelu.cpp, the float path): in double,
// rounded once,
//   erf:  y = x Phi(x);            dy/dx = Phi(x) + x exp(-x^2/2) / sqrt(2 pi)
//   tanh: u = sqrt(2/pi) (x + 0.044715 x^3), y = 0.5 x (1 + tanh u)
//         dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi)
//                 (1 + 3 * 0.044715 x^2)
//   DX = float(double(DY) * dy/dx)
// by the functions of runtime/Numerics.h that the CPU kernels call (Phi and
// 1 + tanh from IEEE operations), so the results are the CPU's bits. That
// is the Exact form (Numerics::Exact).
//
// The Fast form (Numerics::Fast): float32, 16-byte vectors (FastVectors.cuh)
// when every pointer is aligned (a scalar tail past the last whole vector),
// with identities that avoid the cancellation of 1 + tanh and 1 + erf in
// the left tail:
//   erf:  Phi = 0.5 erfcf(-x / sqrt 2), y = x Phi,
//         dy/dx = Phi + x (expf(-x^2 / 2) / sqrt(2 pi))
//   tanh: u = sqrt(2/pi) (x + 0.044715 x^3), e = expf(-2u),
//         s = 1 / (1 + e) = (1 + tanh u) / 2, r = e s = 1 - s (1 when e is
//         inf), y = x s, dy/dx = s + x s r 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//   DX = DY dy/dx
// (CUDA's expf within 2 ulp, erfcf within 4; the bounds are derived in
// tests/gpu/KernelTest.cpp, FastSoftmaxAndGeluAreWithinFloat32RoundingOfExact.)
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"
#include "runtime/cuda/kernels/FastVectors.cuh"

namespace sp::cuda {
namespace {

__device__ inline double geluD(double X, bool Tanh) {
  return Tanh ? numerics::geluTanh(X) : numerics::geluErf(X);
}

__device__ inline double geluGradD(double X, bool Tanh) {
  return Tanh ? numerics::geluTanhGrad(X) : numerics::geluErfGrad(X);
}

template <Storage ST>
__global__ void geluKernel(Elems Y, Elems X, int64_t N, bool Tanh) {
  SP_GRID_LOOP(I, N) stAs<ST>(Y, I, float(geluD(ldAs<ST>(X, I), Tanh)));
}

template <Storage ST>
__global__ void geluBackwardKernel(Elems DX, Elems X, Elems DY, int64_t N,
                                   bool Tanh) {
  SP_GRID_LOOP(I, N)
  stAs<ST>(DX, I,
          float(double(ldAs<ST>(DY, I)) * geluGradD(ldAs<ST>(X, I), Tanh)));
}

constexpr float GeluSqrtHalf = 0.70710678118654752f;    // 1 / sqrt 2
constexpr float GeluRsqrt2Pi = 0.39894228040143268f;    // 1 / sqrt(2 pi)
constexpr float GeluSqrt2OverPi = 0.79788456080286536f; // sqrt(2 / pi)
constexpr float GeluCubic = 0.044715f;

/// The tanh form's s = (1 + tanh u) / 2 and r = 1 - s.
__device__ inline void geluTanhHalves(float X, float &S, float &R) {
  float U = GeluSqrt2OverPi * (X + GeluCubic * X * X * X);
  float E = expf(-2.0f * U);
  S = 1.0f / (1.0f + E);
  R = E == __int_as_float(0x7f800000) ? 1.0f : E * S;
}

template <bool Tanh> __device__ inline float fastGelu(float X) {
  if constexpr (Tanh) {
    float S, R;
    geluTanhHalves(X, S, R);
    return X * S;
  } else {
    return X * (0.5f * erfcf(-X * GeluSqrtHalf));
  }
}

template <bool Tanh> __device__ inline float fastGeluGrad(float X) {
  if constexpr (Tanh) {
    float S, R;
    geluTanhHalves(X, S, R);
    return S + X * (S * R) *
                   (2.0f * GeluSqrt2OverPi * (1.0f + 3.0f * GeluCubic * X * X));
  } else {
    float Phi = 0.5f * erfcf(-X * GeluSqrtHalf);
    return Phi + X * (expf(-0.5f * X * X) * GeluRsqrt2Pi);
  }
}

template <Storage ST, int Vec, bool Tanh>
__global__ void fastGeluKernel(Elems Y, Elems X, int64_t N) {
  int64_t NV = N / Vec;
  SP_GRID_LOOP(V, NV) {
    float A[Vec];
    loadVec<ST, Vec>(X, V, A);
#pragma unroll
    for (int E = 0; E < Vec; ++E)
      A[E] = fastGelu<Tanh>(A[E]);
    storeVec<ST, Vec>(Y, V, A);
  }
  for (int64_t I = NV * Vec + globalThread(); I < N; I += gridThreads())
    stAs<ST>(Y, I, fastGelu<Tanh>(ldAs<ST>(X, I)));
}

template <Storage ST, int Vec, bool Tanh>
__global__ void fastGeluBackwardKernel(Elems DX, Elems X, Elems DY, int64_t N) {
  int64_t NV = N / Vec;
  SP_GRID_LOOP(V, NV) {
    float A[Vec], B[Vec];
    loadVec<ST, Vec>(X, V, A);
    loadVec<ST, Vec>(DY, V, B);
#pragma unroll
    for (int E = 0; E < Vec; ++E)
      A[E] = B[E] * fastGeluGrad<Tanh>(A[E]);
    storeVec<ST, Vec>(DX, V, A);
  }
  for (int64_t I = NV * Vec + globalThread(); I < N; I += gridThreads())
    stAs<ST>(DX, I, ldAs<ST>(DY, I) * fastGeluGrad<Tanh>(ldAs<ST>(X, I)));
}

/// Fn(Storage, Vec, Tanh) as compile-time constants: Vec the 16-byte vector
/// when every pointer is aligned, else 1.
template <typename F>
inline void withFastGelu(Storage K, bool Tanh,
                         std::initializer_list<const void *> Ps, F &&Fn) {
  bool Ok = true;
  for (const void *P : Ps)
    Ok = Ok && aligned16(P);
  withStorage(K, [&](auto STC) {
    constexpr Storage ST = decltype(STC)::value;
    auto WithTanh = [&](auto VC) {
      if (Tanh)
        Fn(STC, VC, std::true_type());
      else
        Fn(STC, VC, std::false_type());
    };
    if (Ok)
      WithTanh(std::integral_constant<int, vecWidth<ST>()>());
    else
      WithTanh(std::integral_constant<int, 1>());
  });
}

} // namespace

void gelu(Elems Y, Elems X, int64_t N, bool Tanh, Numerics Num,
          cudaStream_t S) {
  if (Num == Numerics::Fast && N > 0)
    return withFastGelu(
        Y.Kind, Tanh, {Y.Data, X.Data}, [&](auto STC, auto VC, auto TC) {
          constexpr int Vec = decltype(VC)::value;
          auto *K =
              &fastGeluKernel<decltype(STC)::value, Vec, decltype(TC)::value>;
          Launch L = elementwiseLaunch(N / Vec > 0 ? N / Vec : N);
          SP_LAUNCH(K, L.Blocks, L.Threads, 0, S, Y, X, N);
        });
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    withStorage(Y.Kind, [&](auto ST) {
      SP_LAUNCH(geluKernel<ST>, L.Blocks, L.Threads, 0, S, Y, X, N, Tanh);
    });
}
void geluBackward(Elems DX, Elems X, Elems DY, int64_t N, bool Tanh,
                  Numerics Num, cudaStream_t S) {
  if (Num == Numerics::Fast && N > 0)
    return withFastGelu(DX.Kind, Tanh, {DX.Data, X.Data, DY.Data},
                        [&](auto STC, auto VC, auto TC) {
                          constexpr int Vec = decltype(VC)::value;
                          auto *K =
                              &fastGeluBackwardKernel<decltype(STC)::value, Vec,
                                                      decltype(TC)::value>;
                          Launch L =
                              elementwiseLaunch(N / Vec > 0 ? N / Vec : N);
                          SP_LAUNCH(K, L.Blocks, L.Threads, 0, S, DX, X, DY, N);
                        });
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    withStorage(DX.Kind, [&](auto ST) {
      SP_LAUNCH(geluBackwardKernel<ST>, L.Blocks, L.Threads, 0, S, DX, X, DY, N,
                Tanh);
    });
}

} // namespace sp::cuda
