//===- DeviceMemory.cpp - The CUDA backend's memory -----------------------===//
//
// The arena (one cudaMalloc at the plan's offsets), host copies through
// pinned staging, and the device memory besides the arena: the data-error
// word and the gradient-norm scalars (made with the backend), the send
// staging slots (PipelineChannels.cpp), and scratch regions (one per
// stream) that grow to the largest reorder, per-row statistic, float32
// copy or attention workspace needed. A region outgrown while work is
// queued is retired, not freed: freed with the backend.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaBackendImpl.h"
#include "llvm/Support/MathExtras.h"
#include <algorithm>
#include <cstring>

using namespace llvm;

namespace sp::cuda {

Expected<char *> CudaBackend::allocate(size_t Bytes) {
  SP_CUDA_TRY(cudaSetDevice(Device));
  size_t Size = std::max<size_t>(alignTo(Bytes, 256), 256);
  void *P = nullptr;
  cudaError_t E = cudaMalloc(&P, Size);
  if (E != cudaSuccess)
    return createStringError(
        inconvertibleErrorCode(),
        "cannot allocate the %zu-byte arena on CUDA device %d: %s: %s", Size,
        Device, cudaGetErrorName(E), cudaGetErrorString(E));
  // cudaMemset runs on the legacy stream, which the backend's non-blocking
  // streams do not wait for: finish it here.
  SP_CUDA_TRY(cudaMemset(P, 0, Size));
  SP_CUDA_TRY(cudaDeviceSynchronize());
  return static_cast<char *>(P);
}

/// Pinned staging of at most this many bytes; larger copies go in pieces.
constexpr size_t MaxStaging = size_t(64) << 20;

Error CudaBackend::staged(size_t Bytes,
                          function_ref<Error(size_t Off, size_t N)> Piece) {
  if (auto E = drain())
    return E;
  size_t Want = std::min(Bytes, MaxStaging);
  if (Want > StagingBytes) {
    if (Staging)
      RetiredHost.push_back(Staging);
    Staging = nullptr;
    SP_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void **>(&Staging), Want,
                              cudaHostAllocDefault));
    StagingBytes = Want;
  }
  for (size_t Off = 0; Off < Bytes; Off += StagingBytes)
    if (auto E = Piece(Off, std::min(StagingBytes, Bytes - Off)))
      return E;
  return Error::success();
}

Error CudaBackend::copyToBackend(char *Dst, const void *Src, size_t Bytes) {
  return staged(Bytes, [&](size_t Off, size_t N) -> Error {
    std::memcpy(Staging, static_cast<const char *>(Src) + Off, N);
    SP_CUDA_TRY(cudaMemcpyAsync(Dst + Off, Staging, N, cudaMemcpyHostToDevice,
                                Compute));
    SP_CUDA_TRY(cudaStreamSynchronize(Compute));
    return Error::success();
  });
}

Error CudaBackend::copyToHost(void *Dst, const char *Src, size_t Bytes) {
  return staged(Bytes, [&](size_t Off, size_t N) -> Error {
    SP_CUDA_TRY(cudaMemcpyAsync(Staging, Src + Off, N, cudaMemcpyDeviceToHost,
                                Compute));
    SP_CUDA_TRY(cudaStreamSynchronize(Compute));
    std::memcpy(static_cast<char *>(Dst) + Off, Staging, N);
    return Error::success();
  });
}

Error CudaBackend::allocateWhileRunning(void **P, size_t Bytes) {
  SP_CUDA_TRY(cudaMallocAsync(P, Bytes, nullptr));
  SP_CUDA_TRY(cudaStreamSynchronize(nullptr));
  return Error::success();
}

Expected<char *> CudaBackend::grow(char *&Region, int64_t &Size,
                                   int64_t Bytes) {
  if (Bytes > Size) {
    // The old region may still be in use by queued work: retired.
    if (Region)
      Retired.push_back(Region);
    Region = nullptr;
    if (auto E = allocateWhileRunning(reinterpret_cast<void **>(&Region),
                                      size_t(Bytes)))
      return E;
    Size = Bytes;
  }
  return Region;
}

Expected<char *> CudaBackend::mixedScratch(int K, int64_t Bytes) {
  return grow(Mixed[K], MixedBytes[K], Bytes);
}

Expected<float *> CudaBackend::scratch(bool ForComm, int64_t Floats) {
  auto R = grow(Scratch[ForComm], ScratchBytes[ForComm],
                Floats * int64_t(sizeof(float)));
  if (!R)
    return R.takeError();
  return reinterpret_cast<float *>(*R);
}

Expected<float *> CudaBackend::paddedScratch(const KernelCall &C,
                                             int64_t Parts, bool ForComm) {
  int64_t Padded = 0;
  for (int B : C.I.In) {
    int64_t N = C.Prog.Buffers[B].Type.numElements();
    int64_t Chunk = dataChunkElements(N, Parts);
    if (N != Chunk * Parts)
      Padded += Chunk * Parts;
  }
  if (!Padded)
    return nullptr;
  return scratch(ForComm, Padded);
}

} // namespace sp::cuda
