//===- CudaGrid.h - CUDA backends for thread-rank grids ---------*- C++ -*-===//
//
// The CUDA backend of a thread rank on a grid (TrainCompare.h's
// trainOnGrid): one GPU per rank, its groups' NCCL communicators made from
// the rank's run options. Shared by the GPU tests (EndToEndTest.cpp) and the
// ones that only emulated GPUs run (EmulatedBackendTest.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef SP_TESTS_GPU_CUDAGRID_H
#define SP_TESTS_GPU_CUDAGRID_H

#include "runtime/cuda/CudaBackend.h"
#include "TrainCompare.h"

namespace sp {

/// AdamW's eps at which one step's rounding cannot flip a later update, so
/// that every step's gradients of a GPU run compare with the CPU's.
constexpr double StableEps = 1e-3;

/// World's rank's CUDA backend: GPU World.rank(), O's groups; Blockwise:
/// the attention core by the blockwise kernels; Epilogues: linear biases
/// in cuBLASLt's epilogue.
inline llvm::Expected<std::unique_ptr<Backend>>
cudaBackendOf(Communicator &World, const RunOptions &O, bool Blockwise = false,
              bool Epilogues = false) {
  CudaBackendOptions CO;
  CO.Device = World.rank(); // thread ranks: one GPU each
  CO.World = &World;
  CO.Tensor = O.Comm;
  CO.Pipeline = O.PipeComm;
  CO.Data = O.DataComm;
  CO.Context = O.ContextComm;
  CO.BlockwiseAttention = Blockwise;
  CO.CublasLtEpilogues = Epilogues;
  CO.Numerics = cuda::Numerics::Exact; // the comparisons with the CPU's bits
  return createCudaBackend(CO);
}

/// trainOnGrid's maker of those backends.
inline GridBackend cudaGridBackend(bool Blockwise = false,
                                   bool Epilogues = false) {
  return [Blockwise, Epilogues](Communicator &World, const RunOptions &O) {
    return cudaBackendOf(World, O, Blockwise, Epilogues);
  };
}

} // namespace sp

#endif // SP_TESTS_GPU_CUDAGRID_H
