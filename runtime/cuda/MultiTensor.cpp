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

std::vector<TimeSlice> shareLaunch(double Start, double Duration,
                                   const std::vector<int64_t> &Elements) {
  double Total = 0;
  for (int64_t N : Elements)
    Total += double(N);
  std::vector<TimeSlice> R;
  R.reserve(Elements.size());
  double At = Start;
  for (size_t K = 0; K < Elements.size(); ++K) {
    double Share = Total > 0 ? double(Elements[K]) / Total
                             : 1.0 / double(Elements.size());
    double End = K + 1 == Elements.size() ? Start + Duration
                                          : At + Share * Duration;
    R.push_back({At, End - At});
    At = End;
  }
  return R;
}

} // namespace sp::cuda
