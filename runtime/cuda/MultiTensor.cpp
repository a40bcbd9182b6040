//===- MultiTensor.cpp - Many tensors in one kernel launch -----------------===//
#include "runtime/cuda/MultiTensor.h"
#include <cstddef>

namespace sp::cuda {

std::vector<MultiTensorLaunch>
planMultiTensor(const std::vector<int64_t> &Sizes, int64_t ChunkSize,
                int MaxTensors, int MaxBlocks) {
  std::vector<MultiTensorLaunch> Launches;
  if (ChunkSize <= 0 || MaxTensors <= 0 || MaxBlocks <= 0)
    return Launches;
  for (std::size_t T = 0; T < Sizes.size(); ++T) {
    int64_t Chunks = Sizes[T] > 0 ? (Sizes[T] + ChunkSize - 1) / ChunkSize : 0;
    for (int64_t C = 0; C < Chunks; ++C) {
      bool Holds = !Launches.empty() && !Launches.back().Tensors.empty() &&
                   Launches.back().Tensors.back() == int(T);
      if (Launches.empty() ||
          int(Launches.back().Blocks.size()) == MaxBlocks ||
          (!Holds && int(Launches.back().Tensors.size()) == MaxTensors)) {
        Launches.emplace_back();
        Holds = false;
      }
      MultiTensorLaunch &L = Launches.back();
      if (!Holds)
        L.Tensors.push_back(int(T));
      L.Blocks.push_back({int(L.Tensors.size()) - 1, C});
    }
  }
  return Launches;
}

} // namespace sp::cuda
