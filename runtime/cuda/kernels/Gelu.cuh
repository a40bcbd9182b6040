//===- Gelu.cuh - GELU, erf and tanh forms, forward and backward -*- CUDA -*-===//
//
// Reference (runtime/cpu/Kernels.cpp, section 5, the float path): in double,
// rounded once,
//   erf:  y = x Phi(x);            dy/dx = Phi(x) + x exp(-x^2/2) / sqrt(2 pi)
//   tanh: u = sqrt(2/pi) (x + 0.044715 x^3), y = 0.5 x (1 + tanh u)
//         dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi)
//                 (1 + 3 * 0.044715 x^2)
//   DX = float(double(DY) * dy/dx)
// with Phi and 1 + tanh from Common.cuh (the CPU's own approximations), so
// the results are the CPU's bits.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"

namespace sp::cuda {
namespace {

constexpr double InvSqrt2Pi = 0.39894228040143267794;
constexpr double Sqrt2OverPi = 0.79788456080286535588;
constexpr double GeluCoef = 0.044715;

__device__ inline double geluD(double X, bool Tanh) {
  if (Tanh) {
    double U = Sqrt2OverPi * (X + GeluCoef * X * X * X);
    return 0.5 * X * onePlusTanh(U);
  }
  double Gauss;
  return X * normalCdf(X, Gauss);
}

__device__ inline double geluGradD(double X, bool Tanh) {
  if (Tanh) {
    double U = Sqrt2OverPi * (X + GeluCoef * X * X * X);
    double P = onePlusTanh(U);
    double Sech2 = P * (2.0 - P);
    double DU = Sqrt2OverPi * (1.0 + 3 * GeluCoef * X * X);
    return 0.5 * P + 0.5 * X * Sech2 * DU;
  }
  double Gauss;
  double Cdf = normalCdf(X, Gauss);
  return Cdf + X * (InvSqrt2Pi * Gauss);
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

} // namespace

void gelu(Elems Y, Elems X, int64_t N, bool Tanh, cudaStream_t S) {
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    withStorage(Y.Kind, [&](auto ST) {
      SP_LAUNCH(geluKernel<ST>, L.Blocks, L.Threads, 0, S, Y, X, N, Tanh);
    });
}
void geluBackward(Elems DX, Elems X, Elems DY, int64_t N, bool Tanh,
                  cudaStream_t S) {
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    withStorage(DX.Kind, [&](auto ST) {
      SP_LAUNCH(geluBackwardKernel<ST>, L.Blocks, L.Threads, 0, S, DX, X, DY, N,
                Tanh);
    });
}

} // namespace sp::cuda
