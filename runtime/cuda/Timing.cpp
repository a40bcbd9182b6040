//===- Timing.cpp - Device timing of the CUDA backend's calls -------------===//
//
// Traced steps are timed on the device (Backend::timesOnDevice): a pair of
// timing events is recorded on each call's stream around what it enqueues,
// and collectTimes() reads them against an event recorded when timing
// started, so the trace shows what the streams ran at the same time (a
// collective beside its GEMM) without a host wait per call. An adamw call
// of a batch spans from its deferral to the batch's end, the batch's span
// shared among its calls by their elements (MultiTensor.h); a pipeline
// send spans its copy aside.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaBackendImpl.h"
#include "runtime/cuda/MultiTensor.h"
#include <algorithm>
#include <cmath>

using namespace llvm;

namespace sp::cuda {

Error CudaBackend::timeStart(cudaStream_t S, int Kind) {
  size_t Need = 2 * (Timed.size() + 1);
  while (TimingPool.size() < Need) {
    cudaEvent_t E;
    SP_CUDA_TRY(cudaEventCreate(&E));
    TimingPool.push_back(E);
  }
  TimedCall T{TimingPool[Need - 2], TimingPool[Need - 1], Kind};
  SP_CUDA_TRY(cudaEventRecord(T.Start, S));
  Timed.push_back(T);
  return Error::success();
}

Error CudaBackend::startTiming() {
  if (auto E = drain())
    return E;
  if (!TimeBase)
    SP_CUDA_TRY(cudaEventCreate(&TimeBase));
  // Both streams are idle: the base is now on the device's clock.
  SP_CUDA_TRY(cudaEventRecord(TimeBase, Compute));
  Timed.clear();
  AdamwLaunches.clear();
  Timing = true;
  return Error::success();
}

Expected<std::vector<Backend::DeviceTime>> CudaBackend::collectTimes() {
  if (!Timing)
    return std::vector<DeviceTime>();
  Timing = false;
  if (auto E = drain())
    return E;
  std::vector<DeviceTime> R;
  R.reserve(Timed.size());
  for (const TimedCall &T : Timed) {
    float StartMs = 0, Ms = 0;
    SP_CUDA_TRY(cudaEventElapsedTime(&StartMs, TimeBase, T.Start));
    SP_CUDA_TRY(cudaEventElapsedTime(&Ms, T.Start, T.End));
    R.push_back({1e3 * StartMs, 1e3 * Ms, T.Stream});
  }
  // Each instruction of a multi-tensor AdamW launch was timed to the
  // launch's end: share the launch among them instead.
  for (const auto &[Calls, Elements] : AdamwLaunches) {
    double Start = INFINITY, End = -INFINITY;
    for (size_t K : Calls)
      if (K < R.size()) {
        Start = std::min(Start, R[K].StartUs);
        End = std::max(End, R[K].StartUs + R[K].DurationUs);
      }
    if (!(End >= Start))
      continue;
    auto Slices = cuda::shareLaunch(Start, End - Start, Elements);
    for (size_t I = 0; I < Calls.size(); ++I)
      if (Calls[I] < R.size()) {
        R[Calls[I]].StartUs = Slices[I].Start;
        R[Calls[I]].DurationUs = Slices[I].Duration;
      }
  }
  AdamwLaunches.clear();
  Timed.clear();
  return R;
}

} // namespace sp::cuda
