//===- EmulatedRuntime.cpp - The CUDA runtime on the CPU ------------------===//
//
// See EmulatedRuntime.h: device memory, streams and events. NCCL is
// EmulatedNccl.cpp's, cuBLAS and cuBLASLt EmulatedCublas.cpp's. Only the
// entry points the CUDA backend and its tests call are defined; a call of
// any other fails to link.
//
//===----------------------------------------------------------------------===//
#include "EmulatedCommon.h"
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace sp::emu {

void fail(const std::string &Why) {
  std::fprintf(stderr, "emulated CUDA runtime: %s\n", Why.c_str());
  std::fflush(stderr);
  std::abort();
}

long envInt(const char *Name, long Default, long Min) {
  const char *V = std::getenv(Name);
  return V ? std::max(Min, std::atol(V)) : Default;
}

std::chrono::seconds timeout() {
  static const long S = envInt("SP_EMULATED_TIMEOUT", 300, 1);
  return std::chrono::seconds(S);
}

namespace {
/// What each thread waits for now (for the message of a deadlock).
std::mutex WaitsMutex;
std::map<std::thread::id, std::string> Waits;
} // namespace

void noteWait(const std::string &What) {
  std::lock_guard<std::mutex> G(WaitsMutex);
  Waits[std::this_thread::get_id()] = What;
}

void endWait() {
  std::lock_guard<std::mutex> G(WaitsMutex);
  Waits.erase(std::this_thread::get_id());
}

std::string otherWaits() {
  std::lock_guard<std::mutex> G(WaitsMutex);
  std::string Others;
  for (const auto &[Id, W] : Waits)
    if (Id != std::this_thread::get_id())
      Others += "\n  also waiting: " + W;
  return Others;
}

} // namespace sp::emu

using namespace sp::emu;

namespace {

thread_local int CurrentDevice = 0;

int deviceCount() {
  static const int N = int(envInt("SP_EMULATED_DEVICES", 8, 0));
  return N;
}

//===----------------------------------------------------------------------===//
// Device memory
//===----------------------------------------------------------------------===//

std::mutex AllocMutex;
std::map<const char *, size_t> Allocations; // start -> bytes

bool isDevice(const void *P) {
  const char *C = static_cast<const char *>(P);
  std::lock_guard<std::mutex> Lock(AllocMutex);
  auto It = Allocations.upper_bound(C);
  if (It == Allocations.begin())
    return false;
  --It;
  return C < It->first + It->second;
}

void checkKind(void *Dst, const void *Src, cudaMemcpyKind Kind) {
  bool DstDev = isDevice(Dst), SrcDev = isDevice(Src);
  bool WantDst =
           Kind == cudaMemcpyHostToDevice || Kind == cudaMemcpyDeviceToDevice,
       WantSrc =
           Kind == cudaMemcpyDeviceToHost || Kind == cudaMemcpyDeviceToDevice;
  if (Kind == cudaMemcpyDefault)
    return;
  if (DstDev != WantDst || SrcDev != WantSrc)
    fail("a copy of kind " + std::to_string(int(Kind)) + " from " +
         (SrcDev ? "device" : "host") + " to " + (DstDev ? "device" : "host") +
         " memory");
}

//===----------------------------------------------------------------------===//
// Streams and events
//===----------------------------------------------------------------------===//

std::atomic<int> DelayOrdinal{-1}, DelayUs{0};

} // namespace

struct CUstream_st {
  int Device = 0, Ordinal = 0;
  std::mutex M;
  std::condition_variable CV;
  std::deque<std::function<void()>> Queue;
  bool Running = false, Stop = false;
  std::thread Worker;

  void loop() {
    std::unique_lock<std::mutex> Lock(M);
    for (;;) {
      CV.wait(Lock, [&] { return Stop || !Queue.empty(); });
      if (Queue.empty())
        return;
      std::function<void()> Work = std::move(Queue.front());
      Queue.pop_front();
      Running = true;
      Lock.unlock();
      if (Ordinal == DelayOrdinal.load() && DelayUs.load() > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(DelayUs.load()));
      Work();
      Lock.lock();
      Running = false;
      CV.notify_all();
    }
  }
  void drain() {
    std::unique_lock<std::mutex> Lock(M);
    waitFor(
        CV, Lock, [&] { return Queue.empty() && !Running; },
        "stream " + std::to_string(Ordinal) + " of device " +
            std::to_string(Device) + " to finish its work");
  }
};

struct CUevent_st {
  unsigned Flags = 0;
  std::mutex M;
  std::condition_variable CV;
  uint64_t Recorded = 0, Completed = 0;
  Clock::time_point At;
};

namespace {

std::mutex StreamsMutex;
std::vector<CUstream_st *> Streams;

void syncDevice(int Device) {
  std::vector<CUstream_st *> Of;
  {
    std::lock_guard<std::mutex> Lock(StreamsMutex);
    for (CUstream_st *S : Streams)
      if (S->Device == Device)
        Of.push_back(S);
  }
  for (CUstream_st *S : Of)
    S->drain();
}

} // namespace

void sp::emu::enqueue(cudaStream_t S, std::function<void()> Work) {
  if (!S) {
    Work();
    return;
  }
  std::lock_guard<std::mutex> Lock(S->M);
  S->Queue.push_back(std::move(Work));
  S->CV.notify_all();
}

void sp::emu::setStreamDelay(int Ordinal, int Microseconds) {
  DelayOrdinal = Ordinal;
  DelayUs = Microseconds;
}

using sp::emu::enqueue;

//===----------------------------------------------------------------------===//
// The CUDA runtime
//===----------------------------------------------------------------------===//

cudaError_t cudaGetDeviceCount(int *Count) {
  *Count = deviceCount();
  return deviceCount() ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaSetDevice(int Device) {
  if (Device < 0 || Device >= deviceCount())
    return cudaErrorInvalidDevice;
  CurrentDevice = Device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *Value, cudaDeviceAttr Attr,
                                   int Device) {
  if (Device < 0 || Device >= deviceCount())
    return cudaErrorInvalidDevice;
  switch (Attr) { // an H100 SXM
  case cudaDevAttrComputeCapabilityMajor:
    *Value = 9;
    return cudaSuccess;
  case cudaDevAttrComputeCapabilityMinor:
    *Value = 0;
    return cudaSuccess;
  case cudaDevAttrMultiProcessorCount:
    *Value = 132;
    return cudaSuccess;
  case cudaDevAttrClockRate:
    *Value = 1980000;
    return cudaSuccess;
  default:
    return cudaErrorInvalidValue;
  }
}

cudaError_t cudaGetLastError() { return cudaSuccess; }

const char *cudaGetErrorName(cudaError_t E) {
  switch (E) {
  case cudaSuccess:
    return "cudaSuccess";
  case cudaErrorNoDevice:
    return "cudaErrorNoDevice";
  case cudaErrorInvalidDevice:
    return "cudaErrorInvalidDevice";
  case cudaErrorMemoryAllocation:
    return "cudaErrorMemoryAllocation";
  case cudaErrorNotReady:
    return "cudaErrorNotReady";
  default:
    return "cudaErrorInvalidValue";
  }
}

const char *cudaGetErrorString(cudaError_t E) {
  return E == cudaSuccess ? "no error" : "error of the emulated CUDA runtime";
}

namespace {
cudaError_t allocate(void **P, size_t Bytes) {
  size_t Size = std::max<size_t>((Bytes + 255) / 256 * 256, 256);
  void *M = std::aligned_alloc(256, Size);
  if (!M)
    return cudaErrorMemoryAllocation;
  std::memset(M, 0xFF, Size); // NaN floats: nothing was written yet
  std::lock_guard<std::mutex> Lock(AllocMutex);
  Allocations[static_cast<char *>(M)] = Size;
  *P = M;
  return cudaSuccess;
}
} // namespace

cudaError_t cudaMalloc(void **P, size_t Bytes) {
  syncDevice(CurrentDevice); // may wait for the device, as cudaFree
  return allocate(P, Bytes);
}

cudaError_t cudaMallocAsync(void **P, size_t Bytes, cudaStream_t S) {
  if (S) // (the backend allocates on the legacy stream)
    fail("cudaMallocAsync on a stream: the emulation allocates at once");
  return allocate(P, Bytes);
}

namespace {
cudaError_t release(void *P) {
  if (!P)
    return cudaSuccess;
  {
    std::lock_guard<std::mutex> Lock(AllocMutex);
    if (!Allocations.erase(static_cast<char *>(P)))
      fail("a free of a pointer cudaMalloc did not return");
  }
  std::free(P);
  return cudaSuccess;
}
} // namespace

cudaError_t cudaFreeAsync(void *P, cudaStream_t S) {
  if (S) // (the backend frees on the legacy stream)
    fail("cudaFreeAsync on a stream: the emulation frees at once");
  return release(P);
}

cudaError_t cudaFree(void *P) {
  if (P)
    syncDevice(CurrentDevice); // cudaFree waits for the device's work
  return release(P);
}

cudaError_t cudaHostAlloc(void **P, size_t Bytes, unsigned) {
  *P = std::malloc(std::max<size_t>(Bytes, 1));
  return *P ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeHost(void *P) {
  if (P)
    syncDevice(CurrentDevice); // as cudaFree
  std::free(P);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *Dst, const void *Src, size_t Bytes,
                       cudaMemcpyKind Kind) {
  checkKind(Dst, Src, Kind);
  std::memcpy(Dst, Src, Bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *Dst, const void *Src, size_t Bytes,
                            cudaMemcpyKind Kind, cudaStream_t S) {
  checkKind(Dst, Src, Kind);
  enqueue(S, [=] { std::memmove(Dst, Src, Bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *Dst, size_t DPitch, const void *Src,
                              size_t SPitch, size_t Width, size_t Height,
                              cudaMemcpyKind Kind, cudaStream_t S) {
  if (Width > DPitch || Width > SPitch)
    return cudaErrorInvalidValue;
  checkKind(Dst, Src, Kind);
  enqueue(S, [=] {
    for (size_t R = 0; R < Height; ++R)
      std::memmove(static_cast<char *>(Dst) + R * DPitch,
                   static_cast<const char *>(Src) + R * SPitch, Width);
  });
  return cudaSuccess;
}

cudaError_t cudaMemset(void *P, int V, size_t Bytes) {
  if (!isDevice(P))
    fail("cudaMemset of host memory");
  std::memset(P, V, Bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *P, int V, size_t Bytes, cudaStream_t S) {
  if (!isDevice(P))
    fail("cudaMemsetAsync of host memory");
  enqueue(S, [=] { std::memset(P, V, Bytes); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *S, unsigned) {
  auto *N = new CUstream_st;
  N->Device = CurrentDevice;
  {
    std::lock_guard<std::mutex> Lock(StreamsMutex);
    for (CUstream_st *S : Streams)
      N->Ordinal += S->Device == CurrentDevice;
    Streams.push_back(N);
  }
  N->Worker = std::thread([N] { N->loop(); });
  *S = N;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t S) {
  S->drain();
  {
    std::lock_guard<std::mutex> Lock(S->M);
    S->Stop = true;
    S->CV.notify_all();
  }
  S->Worker.join();
  {
    std::lock_guard<std::mutex> Lock(StreamsMutex);
    Streams.erase(std::find(Streams.begin(), Streams.end(), S));
  }
  delete S;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t S) {
  if (!S)
    return cudaSuccess;
  std::lock_guard<std::mutex> Lock(S->M);
  return S->Queue.empty() && !S->Running ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamSynchronize(cudaStream_t S) {
  if (S)
    S->drain();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  syncDevice(CurrentDevice);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *E) {
  *E = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *E, unsigned Flags) {
  *E = new CUevent_st;
  (*E)->Flags = Flags;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t E) {
  delete E;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t E, cudaStream_t S) {
  uint64_t Gen;
  {
    std::lock_guard<std::mutex> Lock(E->M);
    Gen = ++E->Recorded;
  }
  enqueue(S, [E, Gen] {
    std::lock_guard<std::mutex> Lock(E->M);
    E->Completed = std::max(E->Completed, Gen);
    E->At = Clock::now();
    E->CV.notify_all();
  });
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t S, cudaEvent_t E, unsigned) {
  uint64_t Gen;
  {
    std::lock_guard<std::mutex> Lock(E->M);
    Gen = E->Recorded; // the latest record at the time of the call
  }
  enqueue(S, [E, Gen] {
    std::unique_lock<std::mutex> Lock(E->M);
    waitFor(
        E->CV, Lock, [&] { return E->Completed >= Gen; },
        "an event (cudaStreamWaitEvent)");
  });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t E) {
  std::lock_guard<std::mutex> Lock(E->M);
  return E->Completed >= E->Recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *Ms, cudaEvent_t Start,
                                 cudaEvent_t End) {
  if ((Start->Flags | End->Flags) & cudaEventDisableTiming)
    return cudaErrorInvalidResourceHandle;
  std::scoped_lock Lock(Start->M, End->M);
  if (!Start->Recorded || !End->Recorded)
    return cudaErrorInvalidResourceHandle;
  if (Start->Completed < Start->Recorded || End->Completed < End->Recorded)
    return cudaErrorNotReady;
  *Ms = float(
      std::chrono::duration<double, std::milli>(End->At - Start->At).count());
  return cudaSuccess;
}

int sp::emu::streamOrdinal(cudaStream_t S) { return S ? S->Ordinal : -1; }
