//===- NumericsMode.h - Exact or fast arithmetic of the CUDA kernels -*- C++ -*-===//
//
// Plain C++ (no CUDA headers): CudaBackend.h's options name it, and the
// kernels' launchers (CudaKernels.h) take it.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_NUMERICSMODE_H
#define SP_RUNTIME_CUDA_NUMERICSMODE_H

#include <cstdint>

namespace sp::cuda {

/// How a kernel that has two forms computes (CudaBackendOptions::Numerics,
/// sp-run --cuda-numerics). Exact: the CPU kernel's arithmetic in its
/// order, so its bits (the checking mode the backend comparisons use).
/// Fast: float32 arithmetic in an order chosen for the GPU (whole warps or
/// blocks per row, tree sums, vectorised loads); still fixed, so a run
/// gives the same bits every time, and within bounds derived from
/// float32's rounding of the exact form (tests/gpu/KernelTest.cpp).
enum class Numerics : uint8_t { Exact, Fast };

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_NUMERICSMODE_H
