//===- MultiTensor.h - Many tensors in one kernel launch ---------*- C++ -*-===//
//
// The CUDA backend updates the parameters with one AdamW kernel over many
// tensors (kernels/AdamW.cuh, Optimizer.cpp's run of consecutive adamw
// calls) instead of a launch per tensor, as apex's and Megatron-LM's
// multi_tensor_apply do: the tensors are cut into chunks of MultiTensorChunk
// elements, each block of a launch updates one chunk of one tensor, and a
// launch carries a table (passed as the kernel's argument) of at most
// MultiTensorMaxTensors tensors and MultiTensorMaxBlocks blocks. A tensor
// whose chunks do not fit in one launch continues in the next.
//
// planMultiTensor is that cutting, on the host, in plain C++ (no CUDA, no
// LLVM: the kernels' translation unit includes it), tested without a device
// in tests/gpu/HostLogicTest.cpp.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_MULTITENSOR_H
#define SP_RUNTIME_CUDA_MULTITENSOR_H

#include <cstdint>
#include <vector>

namespace sp::cuda {

/// Elements per chunk (one block of 256 threads, 256 elements a thread).
constexpr int64_t MultiTensorChunk = 65536;
/// The table of one launch: it must fit the 4 KiB of a kernel's arguments.
constexpr int MultiTensorMaxTensors = 36;
constexpr int MultiTensorMaxBlocks = 320;

struct MultiTensorBlock {
  int Slot;      // the tensor: an index into the launch's Tensors
  int64_t Chunk; // its elements [Chunk * ChunkSize, (Chunk + 1) * ChunkSize)
};

struct MultiTensorLaunch {
  /// Indices into the sizes given to planMultiTensor, in order.
  std::vector<int> Tensors;
  /// One per block of the launch, in order.
  std::vector<MultiTensorBlock> Blocks;
};

/// The launches that cover every element of tensors of the given sizes
/// exactly once, in order (tensors of no element are skipped; no launch is
/// empty): at most MaxTensors tensors and MaxBlocks blocks each.
std::vector<MultiTensorLaunch>
planMultiTensor(const std::vector<int64_t> &Sizes,
                int64_t ChunkSize = MultiTensorChunk,
                int MaxTensors = MultiTensorMaxTensors,
                int MaxBlocks = MultiTensorMaxBlocks);

/// A device trace's share of one multi-tensor launch for each instruction
/// it ran: the launch's span [Start, Start + Duration) cut into consecutive
/// pieces in instruction order, each as long as its share of the elements
/// (Elements; all equal when they sum to 0). Without this each instruction
/// would show the whole launch, and a trace summed by op would count the
/// optimizer once per tensor.
struct TimeSlice {
  double Start, Duration;
};
std::vector<TimeSlice> shareLaunch(double Start, double Duration,
                                   const std::vector<int64_t> &Elements);

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_MULTITENSOR_H
