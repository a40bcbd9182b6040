//===- Activations.cuh - The SP_UNARY_OP activations -----------*- CUDA -*-===//
//
// One struct per SP_UNARY_OP line of ir/Ops.def, named as its enumerator,
// with the value f(x) and the derivative f'(x) of one element in double:
// runtime/Numerics.h's, the ones the CPU's kernels
// (runtime/cpu/kernels/Elementwise.cpp) call:
//
//   silu:   x * sigmoid(x), sigmoid from exp(-|x|); grad s (1 + x (1 - s))
//   relu:   max(x, 0); grad 1 for x > 0 else 0
//
//   Y = float(f(double(X)))    DX = float(double(DY) * f'(double(X)))
//
// The kernels and the launchers' cases are generated from ir/Ops.def, so an
// activation is its .def line and its struct in runtime/Numerics.h, and
// every element is computed by the CPU's operations: the results are
// bitwise equal.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"

namespace sp::cuda {
namespace {

// The structs are the CPU's own (runtime/Numerics.h, host and device).
using numerics::Relu;
using numerics::Silu;

template <typename F>
__global__ void activationKernel(float *Y, const float *X, int64_t N) {
  SP_GRID_LOOP(I, N) Y[I] = float(F::value(X[I]));
}

template <typename F>
__global__ void activationBackwardKernel(float *DX, const float *X,
                                         const float *DY, int64_t N) {
  SP_GRID_LOOP(I, N) DX[I] = float(double(DY[I]) * F::grad(X[I]));
}

/// Call(F()) with F the struct of Kind: the one switch over the
/// activations, generated from ir/Ops.def.
template <typename CallFn> void withActivation(Activation Kind, CallFn &&Call) {
  switch (Kind) {
#define SP_OP(Enum, Name)
#define SP_UNARY_OP(Enum, Name, OnnxName)                                      \
  case Activation::Enum:                                                       \
    return Call(Enum());
#include "ir/Ops.def"
  }
}

} // namespace

void activation(Activation F, float *Y, const float *X, int64_t N,
                cudaStream_t S) {
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    withActivation(F, [&](auto Fn) {
      SP_LAUNCH(activationKernel<decltype(Fn)>, L.Blocks, L.Threads, 0, S, Y,
                X, N);
    });
}

void activationBackward(Activation F, float *DX, const float *X,
                        const float *DY, int64_t N, cudaStream_t S) {
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    withActivation(F, [&](auto Fn) {
      SP_LAUNCH(activationBackwardKernel<decltype(Fn)>, L.Blocks, L.Threads, 0,
                S, DX, X, DY, N);
    });
}

} // namespace sp::cuda
