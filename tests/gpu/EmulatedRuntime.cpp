//===- EmulatedRuntime.cpp - The CUDA runtime, NCCL and cuBLAS on the CPU -===//
//
// See EmulatedRuntime.h. Only the entry points the CUDA backend and its
// tests call are defined; a call of any other fails to link.
//
//===----------------------------------------------------------------------===//
#include "EmulatedRuntime.h"
#include "ir/Float16.h"
#include <algorithm>
#include <array>
#include <atomic>
#include <cblas.h>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nccl.h>
#include <string>
#include <thread>
#include <tuple>
#include <vector>
#ifdef SP_EMULATED_MPI
#include <climits>
#include <mpi.h>
#endif

using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void fail(const std::string &Why) {
  std::fprintf(stderr, "emulated CUDA runtime: %s\n", Why.c_str());
  std::fflush(stderr);
  std::abort();
}

/// The environment variable Name as an integer of at least Min (Default
/// when unset).
long envInt(const char *Name, long Default, long Min) {
  const char *V = std::getenv(Name);
  return V ? std::max(Min, std::atol(V)) : Default;
}

/// How long any wait may take before it is taken for a deadlock.
std::chrono::seconds timeout() {
  static const long S = envInt("SP_EMULATED_TIMEOUT", 300, 1);
  return std::chrono::seconds(S);
}

/// What each thread waits for now (for the message of a deadlock).
std::mutex WaitsMutex;
std::map<std::thread::id, std::string> Waits;

/// Waits on CV under Lock until Ready(); after the timeout, aborts naming
/// What and everything else waited for at the time.
template <typename F>
void waitFor(std::condition_variable &CV, std::unique_lock<std::mutex> &Lock,
             F &&Ready, const std::string &What) {
  if (Ready())
    return;
  {
    std::lock_guard<std::mutex> G(WaitsMutex);
    Waits[std::this_thread::get_id()] = What;
  }
  bool Done = CV.wait_for(Lock, timeout(), Ready);
  std::lock_guard<std::mutex> G(WaitsMutex);
  Waits.erase(std::this_thread::get_id());
  if (Done)
    return;
  std::string Others;
  for (const auto &[Id, W] : Waits)
    Others += "\n  also waiting: " + W;
  fail("waited " + std::to_string(timeout().count()) + " s for " + What +
       " (a deadlock?)" + Others);
}

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

//===----------------------------------------------------------------------===//
// NCCL
//===----------------------------------------------------------------------===//

namespace {

enum class CollKind { AllReduce, AllGather, ReduceScatter, Broadcast };

/// One collective, as every rank of the group posted it.
struct Round {
  CollKind Kind;
  size_t Count;
  ncclDataType_t Type;
  ncclRedOp_t Op;
  int Root;
  std::vector<const void *> Send;
  int Arrived = 0, Computed = 0, Left = 0;
};

/// A message of ncclSend, until the peer's ncclRecv takes it.
struct Message {
  const void *Data;
  size_t Bytes;
  bool Taken = false;
};

/// What the ranks of one communicator share.
struct Clique {
  int Size;
  std::mutex M;
  std::condition_variable CV;
  std::map<uint64_t, Round> Rounds;
  std::map<std::tuple<int, int, uint64_t>, Message> Messages; // src, dst, k
  int Members = 0;
  bool Aborted = false; // ncclCommAbort: every wait on it ends
#ifdef SP_EMULATED_MPI
  // Across processes: this process's rank of the clique; its operations
  // are MPI messages on this communicator, whose ranks are the clique's.
  MPI_Comm Mpi = MPI_COMM_NULL;
#endif

  bool aborted() {
    std::lock_guard<std::mutex> Lock(M);
    return Aborted;
  }
};

std::mutex CliquesMutex;
std::map<std::string, std::shared_ptr<Clique>> Cliques;
std::atomic<uint64_t> NextId{1};

size_t typeBytes(ncclDataType_t T) {
  switch (T) {
  case ncclFloat32:
    return 4;
  case ncclFloat64:
    return 8;
  case ncclUint8:
  case ncclInt8:
    return 1;
  default:
    fail("an NCCL datatype the emulation does not implement: " +
         std::to_string(int(T)));
  }
}

const char *kindName(CollKind K) {
  switch (K) {
  case CollKind::AllReduce:
    return "ncclAllReduce";
  case CollKind::AllGather:
    return "ncclAllGather";
  case CollKind::ReduceScatter:
    return "ncclReduceScatter";
  case CollKind::Broadcast:
    return "ncclBroadcast";
  }
  return "?";
}

template <typename T>
void reduceInto(std::vector<char> &Out, const std::vector<const void *> &Send,
                size_t Offset, size_t Count, ncclRedOp_t Op) {
  T *O = reinterpret_cast<T *>(Out.data());
  for (size_t I = 0; I < Count; ++I) {
    T Acc = static_cast<const T *>(Send[0])[Offset + I];
    for (size_t R = 1; R < Send.size(); ++R) {
      T V = static_cast<const T *>(Send[R])[Offset + I];
      Acc = Op == ncclMax ? std::max(Acc, V) : T(Acc + V);
    }
    O[I] = Acc;
  }
}

} // namespace

struct ncclComm {
  std::shared_ptr<Clique> C;
  int Rank = 0;
  std::string Id;
  // Host-side counters, in posting order: the k-th collective, and the
  // k-th send to and receive from each peer.
  uint64_t Collectives = 0;
  std::map<int, uint64_t> Sent, Received;
};

namespace {

/// One NCCL operation as posted (host side).
struct Posted {
  enum WhatT { Coll, Send, Recv };
  Posted(ncclComm *Comm, cudaStream_t Stream, WhatT What)
      : Comm(Comm), Stream(Stream), What(What) {}
  ncclComm *Comm;
  cudaStream_t Stream;
  WhatT What;
  CollKind Kind = CollKind::AllReduce;
  const void *In = nullptr;
  void *Out = nullptr;
  size_t Count = 0;
  ncclDataType_t Type = ncclUint8;
  ncclRedOp_t Op = ncclSum;
  int Root = 0, Peer = 0;
  uint64_t Seq = 0;
  // Copied from Comm when posted (ncclCommAbort frees Comm).
  std::shared_ptr<Clique> Cl;
  int Rank = 0;
  std::string Id;
};

thread_local int GroupDepth = 0;
thread_local std::vector<Posted> Grouped;

void runCollective(const Posted &P) {
  Clique &Cl = *P.Cl;
  const int N = Cl.Size, Me = P.Rank;
  const size_t Elem = typeBytes(P.Type);
  std::string What = std::string(kindName(P.Kind)) + " #" +
                     std::to_string(P.Seq) + " of rank " + std::to_string(Me);
  std::unique_lock<std::mutex> Lock(Cl.M);
  auto [It, New] = Cl.Rounds.try_emplace(P.Seq);
  Round &R = It->second;
  if (New) {
    R.Kind = P.Kind;
    R.Count = P.Count;
    R.Type = P.Type;
    R.Op = P.Op;
    R.Root = P.Root;
    R.Send.assign(N, nullptr);
  } else if (R.Kind != P.Kind || R.Count != P.Count || R.Type != P.Type ||
             R.Op != P.Op || R.Root != P.Root) {
    fail(What + " does not match the other ranks' (" + kindName(R.Kind) +
         " of " + std::to_string(R.Count) + " elements)");
  }
  R.Send[Me] = P.In;
  ++R.Arrived;
  Cl.CV.notify_all();
  waitFor(
      Cl.CV, Lock, [&] { return R.Arrived == N || Cl.Aborted; },
      "the other ranks to reach " + What);
  if (Cl.Aborted)
    return;
  Lock.unlock();
  // Every rank computes its result from the others' inputs, then all write:
  // an in-place operand is read by all before any is overwritten.
  std::vector<char> Result;
  switch (P.Kind) {
  case CollKind::AllReduce:
  case CollKind::ReduceScatter: {
    size_t Offset = P.Kind == CollKind::ReduceScatter ? Me * P.Count : 0;
    Result.resize(P.Count * Elem);
    if (P.Type == ncclFloat32)
      reduceInto<float>(Result, R.Send, Offset, P.Count, P.Op);
    else if (P.Type == ncclFloat64)
      reduceInto<double>(Result, R.Send, Offset, P.Count, P.Op);
    else
      fail(What + ": a reduction of a type the emulation does not implement");
    break;
  }
  case CollKind::AllGather:
    Result.resize(N * P.Count * Elem);
    for (int Q = 0; Q < N; ++Q)
      std::memcpy(Result.data() + Q * P.Count * Elem, R.Send[Q],
                  P.Count * Elem);
    break;
  case CollKind::Broadcast:
    Result.resize(P.Count * Elem);
    std::memcpy(Result.data(), R.Send[P.Root], P.Count * Elem);
    break;
  }
  Lock.lock();
  ++R.Computed;
  Cl.CV.notify_all();
  waitFor(
      Cl.CV, Lock, [&] { return R.Computed == N || Cl.Aborted; },
      "the other ranks to read their inputs of " + What);
  if (Cl.Aborted)
    return;
  std::memcpy(P.Out, Result.data(), Result.size());
  if (++R.Left == N)
    Cl.Rounds.erase(It);
}

#ifdef SP_EMULATED_MPI
//===----------------------------------------------------------------------===//
// NCCL across processes, over MPI
//===----------------------------------------------------------------------===//
//
// A process launched by mpirun (or srun) among two or more is one rank of
// the job with devices of its own, as on a real cluster, and a communicator
// of the job's ranks carries its operations as MPI messages between the
// processes: ncclGetUniqueId names the process that made the id, the ranks
// of ncclCommInitRank meet there (each sends its rank, the maker answers
// with every rank's process) and make an MPI communicator of the clique's
// processes in rank order. A collective sends each peer a header (kind,
// count, type, op, root), checked against the receiver's, and the data
// each peer needs, and takes the result from what it received, summing in
// rank order; ncclSend is MPI_Issend, complete only once the peer's
// receive has matched it. Every operation of a group is posted before any
// is waited for. Tags are the operation's index (collectives even, the
// k-th send between two ranks odd), so operations on concurrent streams
// never match each other's messages. Waits poll, end on ncclCommAbort and
// give up after SP_EMULATED_TIMEOUT. MPI is initialised here, before
// main, with MPI_THREAD_MULTIPLE (each stream's worker thread sends and
// receives), and finalised at exit; sp's own MPI communicator finds it
// initialised and uses it as it is.

/// The number of processes the launcher started (1 when none did).
int launchedProcesses() {
  for (const char *V : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char *N = std::getenv(V))
      return std::max(1, std::atoi(N));
  if (std::getenv("SLURM_STEP_ID"))
    if (const char *N = std::getenv("SLURM_NTASKS"))
      return std::max(1, std::atoi(N));
  return 1;
}

MPI_Comm EmuWorld = MPI_COMM_NULL;
int EmuWorldRank = 0;

std::string mpiError(int Code) {
  char Text[MPI_MAX_ERROR_STRING];
  int Len = 0;
  if (MPI_Error_string(Code, Text, &Len) != MPI_SUCCESS)
    return "MPI error " + std::to_string(Code);
  return std::string(Text, Len);
}

void mpiCheck(int Code, const std::string &What) {
  if (Code != MPI_SUCCESS)
    fail(What + ": " + mpiError(Code));
}

const bool MpiStarted = [] {
  if (launchedProcesses() < 2)
    return false;
  int Provided = 0;
  mpiCheck(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &Provided),
           "MPI_Init_thread");
  if (Provided < MPI_THREAD_MULTIPLE)
    fail("NCCL across processes needs MPI_THREAD_MULTIPLE; the MPI library "
         "provides thread level " +
         std::to_string(Provided));
  mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &EmuWorld), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(EmuWorld, MPI_ERRORS_RETURN);
  MPI_Comm_rank(EmuWorld, &EmuWorldRank);
  std::atexit([] {
    int Finalized = 0;
    MPI_Finalized(&Finalized);
    if (!Finalized)
      MPI_Finalize();
  });
  return true;
}();

/// Waits until every request of Reqs is complete, polling; false when one
/// of Cls is aborted first. After the timeout, aborts naming What().
template <typename F>
bool mpiWait(std::vector<MPI_Request> &Reqs, std::vector<MPI_Status> &Statuses,
             const std::vector<Clique *> &Cls, F &&What) {
  Statuses.resize(Reqs.size());
  const Clock::time_point Deadline = Clock::now() + timeout();
  bool Registered = false;
  auto Unregister = [&] {
    if (!Registered)
      return;
    std::lock_guard<std::mutex> G(WaitsMutex);
    Waits.erase(std::this_thread::get_id());
  };
  for (;;) {
    int Done = 0;
    int Code =
        MPI_Testall(int(Reqs.size()), Reqs.data(), &Done, Statuses.data());
    if (Code == MPI_ERR_IN_STATUS)
      for (const MPI_Status &S : Statuses)
        if (S.MPI_ERROR != MPI_SUCCESS && S.MPI_ERROR != MPI_ERR_PENDING)
          fail(What() + ": " + mpiError(S.MPI_ERROR) +
               " (a message bigger than its receive: the ranks disagree)");
    mpiCheck(Code, What());
    if (Done) {
      Unregister();
      return true;
    }
    for (Clique *C : Cls)
      if (C->aborted()) {
        Unregister();
        return false;
      }
    if (!Registered) {
      std::lock_guard<std::mutex> G(WaitsMutex);
      Waits[std::this_thread::get_id()] = What();
      Registered = true;
    }
    if (Clock::now() > Deadline) {
      std::string Others;
      {
        std::lock_guard<std::mutex> G(WaitsMutex);
        for (const auto &[Id, W] : Waits)
          if (Id != std::this_thread::get_id())
            Others += "\n  also waiting in this process: " + W;
      }
      fail("process " + std::to_string(EmuWorldRank) + " waited " +
           std::to_string(timeout().count()) + " s for " + What() +
           " (a deadlock?)" + Others);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

int bytesOf(size_t Bytes, const std::string &What) {
  if (Bytes > size_t(INT_MAX))
    fail(What + ": " + std::to_string(Bytes) +
         " bytes, more than one MPI message of the emulation carries");
  return int(Bytes);
}

/// ncclCommInitRank for an id made by process Maker of the job.
ncclResult_t initOverMpi(ncclComm_t *Comm, int NRanks, const std::string &Key,
                         int Maker, int Index, int Rank) {
  const int Tag = Maker * 65536 + Index % 65536;
  std::string What = "the other ranks of ncclCommInitRank " + Key + " (rank " +
                     std::to_string(Rank) + " of " + std::to_string(NRanks) +
                     ")";
  auto C = std::make_shared<Clique>();
  C->Size = NRanks;
  std::vector<int> Procs(NRanks, -1); // the process of each rank
  std::vector<MPI_Request> Reqs;
  std::vector<MPI_Status> Statuses;
  auto Describe = [&] { return What; };
  if (EmuWorldRank == Maker) {
    Procs[Rank] = Maker;
    for (int I = 1; I < NRanks; ++I) {
      int Msg[2];
      Reqs.assign(1, MPI_REQUEST_NULL);
      mpiCheck(
          MPI_Irecv(Msg, 2, MPI_INT, MPI_ANY_SOURCE, Tag, EmuWorld, &Reqs[0]),
          What);
      mpiWait(Reqs, Statuses, {}, Describe);
      if (Msg[1] != NRanks || Msg[0] < 0 || Msg[0] >= NRanks ||
          Procs[Msg[0]] != -1)
        fail(What + ": process " + std::to_string(Statuses[0].MPI_SOURCE) +
             " joined as rank " + std::to_string(Msg[0]) + " of " +
             std::to_string(Msg[1]));
      Procs[Msg[0]] = Statuses[0].MPI_SOURCE;
    }
    Reqs.clear();
    for (int R = 0; R < NRanks; ++R)
      if (R != Rank) {
        Reqs.push_back(MPI_REQUEST_NULL);
        mpiCheck(MPI_Isend(Procs.data(), NRanks, MPI_INT, Procs[R], Tag,
                           EmuWorld, &Reqs.back()),
                 What);
      }
    mpiWait(Reqs, Statuses, {}, Describe);
  } else {
    int Msg[2] = {Rank, NRanks};
    Reqs.assign(2, MPI_REQUEST_NULL);
    mpiCheck(MPI_Isend(Msg, 2, MPI_INT, Maker, Tag, EmuWorld, &Reqs[0]), What);
    mpiCheck(MPI_Irecv(Procs.data(), NRanks, MPI_INT, Maker, Tag, EmuWorld,
                       &Reqs[1]),
             What);
    mpiWait(Reqs, Statuses, {}, Describe);
  }
  MPI_Group World, Group;
  MPI_Comm_group(EmuWorld, &World);
  mpiCheck(MPI_Group_incl(World, NRanks, Procs.data(), &Group), What);
  mpiCheck(MPI_Comm_create_group(EmuWorld, Group, Tag, &C->Mpi), What);
  MPI_Comm_set_errhandler(C->Mpi, MPI_ERRORS_RETURN);
  MPI_Group_free(&Group);
  MPI_Group_free(&World);
  C->Members = NRanks;
  auto *N = new ncclComm;
  N->C = std::move(C);
  N->Rank = Rank;
  N->Id = Key;
  *Comm = N;
  return ncclSuccess;
}

/// One group's operations (see runGroup) as MPI messages.
void runGroupOverMpi(const std::vector<Posted> &Ops) {
  // What a collective's ranks must agree on, sent ahead of its data.
  using Header = std::array<int64_t, 5>;
  auto headerOf = [](const Posted &P) {
    return Header{int64_t(P.Kind), int64_t(P.Count), int64_t(P.Type),
                  int64_t(P.Op), int64_t(P.Root)};
  };
  struct Expect { // a received message and the bytes it must have
    size_t Request;
    size_t Bytes;
    std::string What;
  };
  std::vector<MPI_Request> Reqs;
  std::vector<Expect> Expected;
  std::vector<Clique *> Cls;
  // Per operation, per peer: its header and data, received.
  std::vector<std::vector<Header>> Headers(Ops.size());
  std::vector<std::vector<std::vector<char>>> From(Ops.size());
  std::string Group;
  for (const Posted &P : Ops)
    Group +=
        std::string(Group.empty() ? "" : ", ") +
        (P.What == Posted::Send ? "send #" + std::to_string(P.Seq) +
                                      " to rank " + std::to_string(P.Peer)
         : P.What == Posted::Recv
             ? "receive #" + std::to_string(P.Seq) + " from rank " +
                   std::to_string(P.Peer)
             : std::string(kindName(P.Kind)) + " #" + std::to_string(P.Seq)) +
        " of rank " + std::to_string(P.Rank) + " of " + P.Id;
  auto isend = [&](const void *Data, size_t Bytes, int To, int Tag, MPI_Comm C,
                   bool Synchronous) {
    Reqs.push_back(MPI_REQUEST_NULL);
    int N = bytesOf(Bytes, Group);
    mpiCheck(Synchronous
                 ? MPI_Issend(Data, N, MPI_BYTE, To, Tag, C, &Reqs.back())
                 : MPI_Isend(Data, N, MPI_BYTE, To, Tag, C, &Reqs.back()),
             Group);
  };
  auto irecv = [&](void *Data, size_t Bytes, int From, int Tag, MPI_Comm C,
                   std::string What) {
    Reqs.push_back(MPI_REQUEST_NULL);
    mpiCheck(MPI_Irecv(Data, bytesOf(Bytes, Group), MPI_BYTE, From, Tag, C,
                       &Reqs.back()),
             Group);
    Expected.push_back({Reqs.size() - 1, Bytes, std::move(What)});
  };
  for (size_t I = 0; I < Ops.size(); ++I) {
    const Posted &P = Ops[I];
    Clique &Cl = *P.Cl;
    if (Cl.Mpi == MPI_COMM_NULL)
      fail("a group of NCCL operations mixes communicators within a process "
           "and across processes");
    Cls.push_back(&Cl);
    const int N = Cl.Size, Me = P.Rank;
    const size_t Bytes = P.Count * typeBytes(P.Type);
    const int Tag =
        int(P.Seq % (uint64_t(1) << 28)) * 2 + (P.What == Posted::Coll ? 0 : 1);
    if (P.What == Posted::Send) {
      isend(P.In, Bytes, P.Peer, Tag, Cl.Mpi, true);
      continue;
    }
    if (P.What == Posted::Recv) {
      irecv(P.Out, Bytes, P.Peer, Tag, Cl.Mpi,
            "send #" + std::to_string(P.Seq) + " from rank " +
                std::to_string(P.Peer) + " to rank " + std::to_string(Me));
      continue;
    }
    Headers[I].assign(N, headerOf(P));
    From[I].resize(N);
    for (int Q = 0; Q < N; ++Q) {
      if (Q == Me)
        continue;
      const bool Sends = P.Kind != CollKind::Broadcast || Me == P.Root,
                 Receives = P.Kind != CollKind::Broadcast || Q == P.Root;
      std::string Of = std::string(kindName(P.Kind)) + " #" +
                       std::to_string(P.Seq) + " of rank " + std::to_string(Q);
      // The header goes first on the same tag: MPI keeps their order.
      isend(&Headers[I][Me], sizeof(Header), Q, Tag, Cl.Mpi, false);
      irecv(&Headers[I][Q], sizeof(Header), Q, Tag, Cl.Mpi, Of);
      if (Sends)
        isend(static_cast<const char *>(P.In) +
                  (P.Kind == CollKind::ReduceScatter ? Q * Bytes : 0),
              Bytes, Q, Tag, Cl.Mpi, false);
      if (Receives) {
        From[I][Q].resize(Bytes);
        irecv(From[I][Q].data(), Bytes, Q, Tag, Cl.Mpi, Of);
      }
    }
  }
  std::vector<MPI_Status> Statuses;
  if (!mpiWait(Reqs, Statuses, Cls, [&] { return Group; }))
    return; // aborted
  for (const Expect &E : Expected) {
    int Got = 0;
    MPI_Get_count(&Statuses[E.Request], MPI_BYTE, &Got);
    if (size_t(Got) != E.Bytes)
      fail("the " + E.What + " of " + Group + " has " + std::to_string(Got) +
           " bytes; its receive wants " + std::to_string(E.Bytes));
  }
  for (size_t I = 0; I < Ops.size(); ++I) {
    const Posted &P = Ops[I];
    if (P.What != Posted::Coll)
      continue;
    const int N = P.Cl->Size, Me = P.Rank;
    const size_t Elem = typeBytes(P.Type), Bytes = P.Count * Elem;
    for (int Q = 0; Q < N; ++Q)
      if (Headers[I][Q] != headerOf(P))
        fail(std::string(kindName(P.Kind)) + " #" + std::to_string(P.Seq) +
             " of rank " + std::to_string(Me) + " of " + P.Id +
             " does not match rank " + std::to_string(Q) + "'s (" +
             kindName(CollKind(Headers[I][Q][0])) + " of " +
             std::to_string(Headers[I][Q][1]) + " elements)");
    std::vector<const void *> Ptrs(N);
    for (int Q = 0; Q < N; ++Q)
      Ptrs[Q] = Q != Me
                    ? static_cast<const void *>(From[I][Q].data())
                    : static_cast<const char *>(P.In) +
                          (P.Kind == CollKind::ReduceScatter ? Me * Bytes : 0);
    std::vector<char> Result;
    switch (P.Kind) {
    case CollKind::AllReduce:
    case CollKind::ReduceScatter:
      Result.resize(Bytes);
      if (P.Type == ncclFloat32)
        reduceInto<float>(Result, Ptrs, 0, P.Count, P.Op);
      else if (P.Type == ncclFloat64)
        reduceInto<double>(Result, Ptrs, 0, P.Count, P.Op);
      else
        fail("a reduction of a type the emulation does not implement");
      break;
    case CollKind::AllGather:
      Result.resize(N * Bytes);
      for (int Q = 0; Q < N; ++Q)
        std::memcpy(Result.data() + Q * Bytes, Ptrs[Q], Bytes);
      break;
    case CollKind::Broadcast:
      Result.assign(static_cast<const char *>(Ptrs[P.Root]),
                    static_cast<const char *>(Ptrs[P.Root]) + Bytes);
      break;
    }
    std::memcpy(P.Out, Result.data(), Result.size());
  }
}

#endif // SP_EMULATED_MPI

/// The operations of one group (or one alone) on one stream, as NCCL runs
/// them: all together, so that a group of sends and receives completes when
/// every one of them has.
void runGroup(const std::vector<Posted> &Ops) {
#ifdef SP_EMULATED_MPI
  if (Ops[0].Cl->Mpi != MPI_COMM_NULL)
    return runGroupOverMpi(Ops);
#endif
  // Sends are posted first, then collectives run, then receives take their
  // messages; the group ends when its sends have been taken.
  for (const Posted &P : Ops)
    if (P.What == Posted::Send) {
      Clique &Cl = *P.Cl;
      std::lock_guard<std::mutex> Lock(Cl.M);
      Cl.Messages[{P.Rank, P.Peer, P.Seq}] =
          Message{P.In, P.Count * typeBytes(P.Type)};
      Cl.CV.notify_all();
    }
  for (const Posted &P : Ops)
    if (P.What == Posted::Coll)
      runCollective(P);
  for (const Posted &P : Ops)
    if (P.What == Posted::Recv) {
      Clique &Cl = *P.Cl;
      std::unique_lock<std::mutex> Lock(Cl.M);
      auto Key = std::make_tuple(P.Peer, P.Rank, P.Seq);
      std::string What = "send #" + std::to_string(P.Seq) + " from rank " +
                         std::to_string(P.Peer) + " to rank " +
                         std::to_string(P.Rank);
      waitFor(
          Cl.CV, Lock,
          [&] { return Cl.Messages.count(Key) != 0 || Cl.Aborted; },
          "the " + What);
      if (Cl.Aborted)
        return;
      Message &Msg = Cl.Messages[Key];
      size_t Bytes = P.Count * typeBytes(P.Type);
      if (Msg.Bytes != Bytes)
        fail("the " + What + " has " + std::to_string(Msg.Bytes) +
             " bytes; its receive wants " + std::to_string(Bytes));
      std::memcpy(P.Out, Msg.Data, Bytes);
      Msg.Taken = true;
      Cl.CV.notify_all();
    }
  for (const Posted &P : Ops)
    if (P.What == Posted::Send) {
      Clique &Cl = *P.Cl;
      std::unique_lock<std::mutex> Lock(Cl.M);
      auto Key = std::make_tuple(P.Rank, P.Peer, P.Seq);
      waitFor(
          Cl.CV, Lock, [&] { return Cl.Messages[Key].Taken || Cl.Aborted; },
          "rank " + std::to_string(P.Peer) + " to receive send #" +
              std::to_string(P.Seq) + " of rank " + std::to_string(P.Rank));
      Cl.Messages.erase(Key);
    }
}

/// Queues the grouped operations, one unit per stream.
void launchGrouped() {
  std::vector<Posted> Ops = std::move(Grouped);
  Grouped.clear();
  std::vector<cudaStream_t> Order;
  for (const Posted &P : Ops)
    if (std::find(Order.begin(), Order.end(), P.Stream) == Order.end())
      Order.push_back(P.Stream);
  static const bool Log = std::getenv("SP_EMULATED_LOG") != nullptr;
  for (cudaStream_t S : Order) {
    std::vector<Posted> Mine;
    for (const Posted &P : Ops)
      if (P.Stream == S)
        Mine.push_back(P);
    if (Log) {
      std::string L = "posted on stream " + std::to_string(S->Ordinal) + ":";
      for (const Posted &P : Mine)
        L += P.What == Posted::Send ? " send#" + std::to_string(P.Seq) + "->" +
                                          std::to_string(P.Peer)
             : P.What == Posted::Recv ? " recv#" + std::to_string(P.Seq) +
                                            "<-" + std::to_string(P.Peer)
                                      : std::string(" ") + kindName(P.Kind);
      std::fprintf(stderr, "[rank %d of %s] %s\n", Mine[0].Rank,
                   Mine[0].Id.c_str(), L.c_str());
    }
    enqueue(S, [Mine] { runGroup(Mine); });
  }
}

ncclResult_t post(Posted P) {
  if (!P.Comm ||
      (P.What != Posted::Coll &&
       (P.Peer < 0 || P.Peer >= P.Comm->C->Size || P.Peer == P.Comm->Rank)))
    return ncclInvalidArgument;
  if (P.What == Posted::Coll)
    P.Seq = P.Comm->Collectives++;
  else if (P.What == Posted::Send)
    P.Seq = P.Comm->Sent[P.Peer]++;
  else
    P.Seq = P.Comm->Received[P.Peer]++;
  P.Cl = P.Comm->C;
  P.Rank = P.Comm->Rank;
  P.Id = P.Comm->Id;
  P.Comm = nullptr;
  Grouped.push_back(P);
  if (GroupDepth == 0)
    launchGrouped();
  return ncclSuccess;
}

} // namespace

ncclResult_t ncclGetUniqueId(ncclUniqueId *Id) {
  std::memset(Id, 0, sizeof *Id);
#ifdef SP_EMULATED_MPI
  if (MpiStarted) { // the job's processes: this one made it
    std::snprintf(Id->internal, sizeof Id->internal,
                  "emulated-nccl-mpi-%d-%llu", EmuWorldRank,
                  (unsigned long long)NextId++);
    return ncclSuccess;
  }
#endif
  std::snprintf(Id->internal, sizeof Id->internal, "emulated-nccl-%llu",
                (unsigned long long)NextId++);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *Comm, int NRanks, ncclUniqueId Id,
                              int Rank) {
  if (NRanks < 1 || Rank < 0 || Rank >= NRanks)
    return ncclInvalidArgument;
  std::string Key(Id.internal, strnlen(Id.internal, sizeof Id.internal));
#ifdef SP_EMULATED_MPI
  int Maker = 0;
  unsigned long long Index = 0;
  if (std::sscanf(Key.c_str(), "emulated-nccl-mpi-%d-%llu", &Maker, &Index) ==
      2) {
    if (!MpiStarted)
      fail("ncclCommInitRank " + Key +
           ": an id of another process, and this one was not launched by MPI");
    return initOverMpi(Comm, NRanks, Key, Maker, int(Index), Rank);
  }
#endif
  std::shared_ptr<Clique> C;
  {
    std::lock_guard<std::mutex> Lock(CliquesMutex);
    auto &Slot = Cliques[Key];
    if (!Slot) {
      Slot = std::make_shared<Clique>();
      Slot->Size = NRanks;
    }
    C = Slot;
  }
  if (C->Size != NRanks)
    return ncclInvalidArgument;
  {
    // ncclCommInitRank returns when every rank has joined.
    std::unique_lock<std::mutex> Lock(C->M);
    ++C->Members;
    C->CV.notify_all();
    waitFor(
        C->CV, Lock, [&] { return C->Members >= C->Size; },
        "the other ranks of an ncclCommInitRank");
  }
  auto *N = new ncclComm;
  N->C = C;
  N->Rank = Rank;
  N->Id = Key;
  *Comm = N;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t Comm) {
  if (!Comm)
    return ncclSuccess;
  {
    std::lock_guard<std::mutex> Lock(CliquesMutex);
    auto It = Cliques.find(Comm->Id);
    if (It != Cliques.end() && It->second.use_count() <= 2)
      Cliques.erase(It);
  }
  delete Comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t Comm) {
  if (!Comm)
    return ncclSuccess;
  {
    std::lock_guard<std::mutex> Lock(Comm->C->M);
    Comm->C->Aborted = true;
    Comm->C->CV.notify_all();
  }
  return ncclCommDestroy(Comm);
}

const char *ncclGetErrorString(ncclResult_t R) {
  return R == ncclSuccess ? "no error" : "error of the emulated NCCL";
}

ncclResult_t ncclGroupStart() {
  ++GroupDepth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (GroupDepth == 0)
    return ncclInvalidUsage;
  if (--GroupDepth == 0)
    launchGrouped();
  return ncclSuccess;
}

namespace {
ncclResult_t postCollective(CollKind K, const void *In, void *Out, size_t Count,
                            ncclDataType_t T, ncclRedOp_t Op, int Root,
                            ncclComm_t Comm, cudaStream_t S) {
  if (Op != ncclSum && Op != ncclMax)
    return ncclInvalidArgument;
  Posted P{Comm, S, Posted::Coll};
  P.Kind = K;
  P.In = In;
  P.Out = Out;
  P.Count = Count;
  P.Type = T;
  P.Op = Op;
  P.Root = Root;
  return post(P);
}
} // namespace

ncclResult_t ncclAllReduce(const void *In, void *Out, size_t Count,
                           ncclDataType_t T, ncclRedOp_t Op, ncclComm_t Comm,
                           cudaStream_t S) {
  return postCollective(CollKind::AllReduce, In, Out, Count, T, Op, 0, Comm, S);
}

ncclResult_t ncclAllGather(const void *In, void *Out, size_t Count,
                           ncclDataType_t T, ncclComm_t Comm, cudaStream_t S) {
  return postCollective(CollKind::AllGather, In, Out, Count, T, ncclSum, 0,
                        Comm, S);
}

ncclResult_t ncclReduceScatter(const void *In, void *Out, size_t Count,
                               ncclDataType_t T, ncclRedOp_t Op,
                               ncclComm_t Comm, cudaStream_t S) {
  return postCollective(CollKind::ReduceScatter, In, Out, Count, T, Op, 0, Comm,
                        S);
}

ncclResult_t ncclBroadcast(const void *In, void *Out, size_t Count,
                           ncclDataType_t T, int Root, ncclComm_t Comm,
                           cudaStream_t S) {
  return postCollective(CollKind::Broadcast, In, Out, Count, T, ncclSum, Root,
                        Comm, S);
}

ncclResult_t ncclSend(const void *Data, size_t Count, ncclDataType_t T,
                      int Peer, ncclComm_t Comm, cudaStream_t S) {
  Posted P{Comm, S, Posted::Send};
  P.In = Data;
  P.Count = Count;
  P.Type = T;
  P.Peer = Peer;
  return post(P);
}

ncclResult_t ncclRecv(void *Data, size_t Count, ncclDataType_t T, int Peer,
                      ncclComm_t Comm, cudaStream_t S) {
  Posted P{Comm, S, Posted::Recv};
  P.Out = Data;
  P.Count = Count;
  P.Type = T;
  P.Peer = Peer;
  return post(P);
}

//===----------------------------------------------------------------------===//
// cuBLAS
//===----------------------------------------------------------------------===//

struct cublasContext {
  cudaStream_t Stream = nullptr;
  cublasMath_t Mode = CUBLAS_DEFAULT_MATH;
};

namespace {

/// X rounded to TF32 (8 exponent bits, 10 mantissa bits), to nearest even.
float toTf32(float X) {
  uint32_t U;
  std::memcpy(&U, &X, 4);
  if ((U & 0x7f800000u) != 0x7f800000u) {
    U += 0xfffu + ((U >> 13) & 1u);
    U &= ~0x1fffu;
  }
  std::memcpy(&X, &U, 4);
  return X;
}

/// The Rows x Cols column-major operand at P (leading dimension Ld) of
/// type T as float32, packed (leading dimension Rows), into Out.
void widen(const void *P, cudaDataType T, int Rows, int Cols, int Ld, bool Tf32,
           std::vector<float> &Out) {
  Out.resize(size_t(Rows) * Cols);
  for (int C = 0; C < Cols; ++C)
    for (int R = 0; R < Rows; ++R) {
      size_t At = size_t(C) * Ld + R;
      float V;
      if (T == CUDA_R_32F)
        V = static_cast<const float *>(P)[At];
      else if (T == CUDA_R_16BF)
        V = sp::bfloat16ToFloat(static_cast<const uint16_t *>(P)[At]);
      else if (T == CUDA_R_16F)
        V = sp::halfToFloat(static_cast<const uint16_t *>(P)[At]);
      else
        fail("a GEMM operand type the emulation does not implement");
      Out[size_t(C) * Rows + R] = Tf32 ? toTf32(V) : V;
    }
}

bool validGemm(cublasOperation_t TA, cublasOperation_t TB, int M, int N, int K,
               int Lda, int Ldb, int Ldc, int Batch) {
  return M >= 0 && N >= 0 && K >= 0 && Batch >= 0 &&
         (TA == CUBLAS_OP_N || TA == CUBLAS_OP_T) &&
         (TB == CUBLAS_OP_N || TB == CUBLAS_OP_T) && Ldc >= std::max(1, M) &&
         Lda >= std::max(1, TA == CUBLAS_OP_N ? M : K) &&
         Ldb >= std::max(1, TB == CUBLAS_OP_N ? K : N);
}

/// C = alpha op(A) op(B) + beta C, column-major, C float32, now (on the
/// calling stream's worker).
void gemmNow(cublasOperation_t TA, cublasOperation_t TB, int M, int N, int K,
             float Alpha, const void *A, cudaDataType AT, int Lda, long long SA,
             const void *B, cudaDataType BT, int Ldb, long long SB, float Beta,
             float *C, int Ldc, long long SC, int Batch, bool Tf32) {
  size_t ABytes = AT == CUDA_R_32F ? 4 : 2, BBytes = BT == CUDA_R_32F ? 4 : 2;
  const int ARows = TA == CUBLAS_OP_N ? M : K,
            ACols = TA == CUBLAS_OP_N ? K : M,
            BRows = TB == CUBLAS_OP_N ? K : N,
            BCols = TB == CUBLAS_OP_N ? N : K;
  // float32 operands as they are; 16-bit or TF32 ones widened first.
  std::vector<float> Af, Bf;
  for (int I = 0; I < Batch; ++I) {
    const char *Ai = static_cast<const char *>(A) + I * SA * ABytes;
    const char *Bi = static_cast<const char *>(B) + I * SB * BBytes;
    const float *Ap = reinterpret_cast<const float *>(Ai),
                *Bp = reinterpret_cast<const float *>(Bi);
    int La = Lda, Lb = Ldb;
    if (AT != CUDA_R_32F || Tf32) {
      widen(Ai, AT, ARows, ACols, Lda, Tf32, Af);
      Ap = Af.data();
      La = std::max(1, ARows);
    }
    if (BT != CUDA_R_32F || Tf32) {
      widen(Bi, BT, BRows, BCols, Ldb, Tf32, Bf);
      Bp = Bf.data();
      Lb = std::max(1, BRows);
    }
    cblas_sgemm(CblasColMajor, TA == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                TB == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, M, N, K, Alpha,
                Ap, La, Bp, Lb, Beta, C + I * SC, Ldc);
  }
}

/// gemmNow on H's stream.
cublasStatus_t gemmOn(cublasHandle_t H, cublasOperation_t TA,
                      cublasOperation_t TB, int M, int N, int K, float Alpha,
                      const void *A, cudaDataType AT, int Lda, long long SA,
                      const void *B, cudaDataType BT, int Ldb, long long SB,
                      float Beta, float *C, int Ldc, long long SC, int Batch) {
  if (!validGemm(TA, TB, M, N, K, Lda, Ldb, Ldc, Batch))
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool Tf32 =
      AT == CUDA_R_32F && (H->Mode & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH;
  enqueue(H->Stream, [=] {
    gemmNow(TA, TB, M, N, K, Alpha, A, AT, Lda, SA, B, BT, Ldb, SB, Beta, C,
            Ldc, SC, Batch, Tf32);
  });
  return CUBLAS_STATUS_SUCCESS;
}

} // namespace

cublasStatus_t cublasCreate_v2(cublasHandle_t *H) {
  *H = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t H) {
  delete H;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t H, cudaStream_t S) {
  H->Stream = S;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t H, cublasMath_t Mode) {
  H->Mode = Mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t H, cublasOperation_t TA,
                              cublasOperation_t TB, int M, int N, int K,
                              const float *Alpha, const float *A, int Lda,
                              const float *B, int Ldb, const float *Beta,
                              float *C, int Ldc) {
  return gemmOn(H, TA, TB, M, N, K, *Alpha, A, CUDA_R_32F, Lda, 0, B,
                CUDA_R_32F, Ldb, 0, *Beta, C, Ldc, 0, 1);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t H, cublasOperation_t TA,
                                         cublasOperation_t TB, int M, int N,
                                         int K, const float *Alpha,
                                         const float *A, int Lda, long long SA,
                                         const float *B, int Ldb, long long SB,
                                         const float *Beta, float *C, int Ldc,
                                         long long SC, int Batch) {
  return gemmOn(H, TA, TB, M, N, K, *Alpha, A, CUDA_R_32F, Lda, SA, B,
                CUDA_R_32F, Ldb, SB, *Beta, C, Ldc, SC, Batch);
}

cublasStatus_t cublasGemmEx(cublasHandle_t H, cublasOperation_t TA,
                            cublasOperation_t TB, int M, int N, int K,
                            const void *Alpha, const void *A, cudaDataType AT,
                            int Lda, const void *B, cudaDataType BT, int Ldb,
                            const void *Beta, void *C, cudaDataType CT, int Ldc,
                            cublasComputeType_t Compute, cublasGemmAlgo_t) {
  if (CT != CUDA_R_32F || Compute != CUBLAS_COMPUTE_32F || AT != BT)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemmOn(H, TA, TB, M, N, K, *static_cast<const float *>(Alpha), A, AT,
                Lda, 0, B, BT, Ldb, 0, *static_cast<const float *>(Beta),
                static_cast<float *>(C), Ldc, 0, 1);
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t H, cublasOperation_t TA, cublasOperation_t TB, int M, int N,
    int K, const void *Alpha, const void *A, cudaDataType AT, int Lda,
    long long SA, const void *B, cudaDataType BT, int Ldb, long long SB,
    const void *Beta, void *C, cudaDataType CT, int Ldc, long long SC,
    int Batch, cublasComputeType_t Compute, cublasGemmAlgo_t) {
  if (CT != CUDA_R_32F || Compute != CUBLAS_COMPUTE_32F || AT != BT)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemmOn(H, TA, TB, M, N, K, *static_cast<const float *>(Alpha), A, AT,
                Lda, SA, B, BT, Ldb, SB, *static_cast<const float *>(Beta),
                static_cast<float *>(C), Ldc, SC, Batch);
}

//===----------------------------------------------------------------------===//
// cuBLASLt: cublasLtMatmul with the default and the bias epilogues
//===----------------------------------------------------------------------===//

struct cublasLtContext {};

namespace {
std::atomic<int64_t> LtMatmuls{0}, LtRefused{0};
} // namespace

int64_t sp::emu::ltMatmuls() { return LtMatmuls.load(); }
int64_t sp::emu::ltRefused() { return LtRefused.load(); }

namespace {

/// What cublasLtMatmulDescCreate and SetAttribute describe.
struct LtDesc {
  cublasComputeType_t Compute;
  cudaDataType_t Scale;
  cublasOperation_t TA = CUBLAS_OP_N, TB = CUBLAS_OP_N;
  cublasLtEpilogue_t Epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void *Bias = nullptr;
  cudaDataType_t BiasType = CUDA_R_32F;
};

struct LtLayout {
  cudaDataType_t Type;
  uint64_t Rows, Cols;
  int64_t Ld;
};

/// A heuristic's preferences: its workspace, and the alignments in bytes
/// the pointers of A, B, C and D will have (cuBLASLt assumes 256 unless
/// told, and an algorithm chosen for an alignment may need it).
struct LtPref {
  size_t Workspace = 0;
  uint32_t Align[4] = {256, 256, 256, 256};
};

/// Whether P is aligned to A bytes.
bool alignedTo(const void *P, uint32_t A) {
  return reinterpret_cast<uintptr_t>(P) % A == 0;
}

LtDesc &descOf(cublasLtMatmulDesc_t D) {
  return *reinterpret_cast<LtDesc *>(D);
}
const LtLayout &layoutOf(cublasLtMatrixLayout_t L) {
  return *reinterpret_cast<const LtLayout *>(L);
}

template <typename T> bool setFrom(T &Field, const void *Buf, size_t Bytes) {
  if (Bytes != sizeof(T))
    return false;
  std::memcpy(&Field, Buf, sizeof(T));
  return true;
}

/// Whether cublasLtMatmul can run D = op(A) op(B) (+ bias) as described:
/// the combinations the emulation implements, which are the backend's.
cublasStatus_t checkLt(const LtDesc &D, const LtLayout &A, const LtLayout &B,
                       const LtLayout &C, const LtLayout &Dl) {
  if ((D.Compute != CUBLAS_COMPUTE_32F &&
       D.Compute != CUBLAS_COMPUTE_32F_FAST_TF32) ||
      D.Scale != CUDA_R_32F || A.Type != B.Type ||
      (A.Type != CUDA_R_32F && A.Type != CUDA_R_16BF && A.Type != CUDA_R_16F) ||
      C.Type != CUDA_R_32F || Dl.Type != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (D.Epilogue != CUBLASLT_EPILOGUE_DEFAULT &&
      (D.Epilogue != CUBLASLT_EPILOGUE_BIAS || D.BiasType != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  uint64_t M = Dl.Rows, N = Dl.Cols;
  uint64_t K = D.TA == CUBLAS_OP_N ? A.Cols : A.Rows;
  bool Shapes = (D.TA == CUBLAS_OP_N ? A.Rows : A.Cols) == M &&
                (D.TB == CUBLAS_OP_N ? B.Rows : B.Cols) == K &&
                (D.TB == CUBLAS_OP_N ? B.Cols : B.Rows) == N && C.Rows == M &&
                C.Cols == N && A.Ld >= int64_t(A.Rows) &&
                B.Ld >= int64_t(B.Rows) && Dl.Ld >= int64_t(M) && C.Ld == Dl.Ld;
  return Shapes ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

} // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t *H) {
  *H = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t H) {
  delete H;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *D,
                                        cublasComputeType_t Compute,
                                        cudaDataType_t Scale) {
  auto *Desc = new LtDesc;
  Desc->Compute = Compute;
  Desc->Scale = Scale;
  *D = reinterpret_cast<cublasLtMatmulDesc_t>(Desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t D) {
  delete &descOf(D);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t D,
                                              cublasLtMatmulDescAttributes_t A,
                                              const void *Buf, size_t Bytes) {
  LtDesc &Desc = descOf(D);
  bool Ok = false;
  switch (A) {
  case CUBLASLT_MATMUL_DESC_TRANSA:
    Ok = setFrom(Desc.TA, Buf, Bytes);
    break;
  case CUBLASLT_MATMUL_DESC_TRANSB:
    Ok = setFrom(Desc.TB, Buf, Bytes);
    break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE:
    Ok = setFrom(Desc.Epilogue, Buf, Bytes);
    break;
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
    Ok = setFrom(Desc.Bias, Buf, Bytes);
    break;
  case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
    Ok = setFrom(Desc.BiasType, Buf, Bytes);
    break;
  default: // an attribute the emulation does not model
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return Ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *L,
                                          cudaDataType Type, uint64_t Rows,
                                          uint64_t Cols, int64_t Ld) {
  *L = reinterpret_cast<cublasLtMatrixLayout_t>(
      new LtLayout{Type, Rows, Cols, Ld});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t L) {
  delete &layoutOf(L);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *P) {
  *P = reinterpret_cast<cublasLtMatmulPreference_t>(new LtPref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t P) {
  delete reinterpret_cast<LtPref *>(P);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t
cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t P,
                                     cublasLtMatmulPreferenceAttributes_t A,
                                     const void *Buf, size_t Bytes) {
  LtPref &Pref = *reinterpret_cast<LtPref *>(P);
  bool Ok = false;
  switch (A) {
  case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
    Ok = setFrom(Pref.Workspace, Buf, Bytes);
    break;
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
    Ok = setFrom(Pref.Align[A - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES],
                 Buf, Bytes);
    break;
  default: // a preference the emulation does not model
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return Ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t, cublasLtMatmulDesc_t D, cublasLtMatrixLayout_t A,
    cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
    cublasLtMatrixLayout_t Dl, cublasLtMatmulPreference_t P, int Requested,
    cublasLtMatmulHeuristicResult_t *Results, int *Count) {
  *Count = 0;
  if (Requested < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  cublasStatus_t St =
      checkLt(descOf(D), layoutOf(A), layoutOf(B), layoutOf(C), layoutOf(Dl));
  if (St != CUBLAS_STATUS_SUCCESS)
    return St;
  std::memset(&Results[0], 0, sizeof Results[0]);
  // The algorithm needs the alignments it was chosen for.
  const LtPref &Pref = *reinterpret_cast<const LtPref *>(P);
  for (int K = 0; K < 4; ++K)
    Results[0].algo.data[K] = Pref.Align[K];
  Results[0].state = CUBLAS_STATUS_SUCCESS;
  Results[0].wavesCount = 1.0f;
  *Count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t D,
                              const void *Alpha, const void *A,
                              cublasLtMatrixLayout_t Al, const void *B,
                              cublasLtMatrixLayout_t Bl, const void *Beta,
                              const void *C, cublasLtMatrixLayout_t Cl,
                              void *Dp, cublasLtMatrixLayout_t Dl,
                              const cublasLtMatmulAlgo_t *Algo, void *, size_t,
                              cudaStream_t S) {
  const LtDesc Desc = descOf(D); // as it is now: later changes are later calls
  const LtLayout AL = layoutOf(Al), BL = layoutOf(Bl), CL = layoutOf(Cl),
                 DL = layoutOf(Dl);
  if (!Algo)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (cublasStatus_t St = checkLt(Desc, AL, BL, CL, DL);
      St != CUBLAS_STATUS_SUCCESS)
    return St;
  if (Desc.Epilogue == CUBLASLT_EPILOGUE_BIAS && !Desc.Bias)
    return CUBLAS_STATUS_INVALID_VALUE;
  const float Al0 = *static_cast<const float *>(Alpha),
              Be0 = *static_cast<const float *>(Beta);
  const int M = int(DL.Rows), N = int(DL.Cols),
            K = int(Desc.TA == CUBLAS_OP_N ? AL.Cols : AL.Rows);
  if (C != Dp && Be0 != 0.0f) // the backend passes C = D
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const void *Ptrs[4] = {A, B, C, Dp};
  for (int K = 0; K < 4; ++K)
    if (!alignedTo(Ptrs[K], uint32_t(Algo->data[K]))) {
      ++LtRefused; // less aligned than the algorithm was chosen for
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  ++LtMatmuls;
  enqueue(S, [=] {
    float *Out = static_cast<float *>(Dp);
    gemmNow(Desc.TA, Desc.TB, M, N, K, Al0, A, AL.Type, int(AL.Ld), 0, B,
            BL.Type, int(BL.Ld), 0, Be0, Out, int(DL.Ld), 0, 1,
            Desc.Compute == CUBLAS_COMPUTE_32F_FAST_TF32 &&
                AL.Type == CUDA_R_32F);
    // The accumulator, a float, plus the bias, rounded once.
    if (Desc.Epilogue == CUBLASLT_EPILOGUE_BIAS) {
      const float *Bias = static_cast<const float *>(Desc.Bias);
      for (int J = 0; J < N; ++J)
        for (int I = 0; I < M; ++I)
          Out[size_t(J) * DL.Ld + I] += Bias[I];
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}
