//===- Gelu.cuh - GELU, erf and tanh forms, forward and backward -*- CUDA -*-===//
//
// Reference (runtime/cpu/kernels/Gelu.cpp, the float path): in double,
// rounded once,
//   erf:  y = x Phi(x);            dy/dx = Phi(x) + x exp(-x^2/2) / sqrt(2 pi)
//   tanh: u = sqrt(2/pi) (x + 0.044715 x^3), y = 0.5 x (1 + tanh u)
//         dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi)
//                 (1 + 3 * 0.044715 x^2)
//   DX = float(double(DY) * dy/dx)
// by the functions of runtime/Numerics.h that the CPU kernels call (Phi and
// 1 + tanh from IEEE operations), so the results are the CPU's bits.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"

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
