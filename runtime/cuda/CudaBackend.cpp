//===- CudaBackend.cpp - The CUDA backend ---------------------------------===//
//
// A backend (CudaBackendImpl.h) runs a plan's instructions on one GPU:
// made with its device, streams, cuBLAS handle and NCCL communicators; run()
// plans the program's streams once (StreamPlan.h) and issues each
// instruction on the stream the plan assigns it, after the events it lists,
// by Dispatch.cpp; every host wait gives up after the groups' timeout,
// aborting NCCL, so that a dead or stuck peer fails this rank instead of
// hanging it. Also the entry points of CudaBackend.h.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaBackendImpl.h"
#include "runtime/cuda/DeviceSelect.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"
#include <cstdlib>
#include <thread>

using namespace llvm;

namespace sp::cuda {

namespace {

/// FNV-1a over what the stream plan depends on: the instructions' ops and
/// buffers and the buffers' places in the arena.
uint64_t fingerprint(const Program &P) {
  uint64_t H = 0xcbf29ce484222325ull;
  auto Mix = [&](uint64_t V) {
    H ^= V;
    H *= 0x100000001b3ull;
  };
  for (const Instruction &I : P.Instrs) {
    Mix(uint64_t(I.Op));
    for (int B : I.In)
      Mix(uint64_t(B));
    Mix(~0ull);
    for (int B : I.Out)
      Mix(uint64_t(B));
  }
  for (const ProgramBuffer &B : P.Buffers) {
    Mix(uint64_t(B.Offset));
    Mix(uint64_t(B.Type.numBytes()));
  }
  return H;
}

} // namespace

Expected<std::unique_ptr<CudaBackend>>
CudaBackend::create(const CudaBackendOptions &O) {
  std::unique_ptr<CudaBackend> B(new CudaBackend);
  if (auto E = B->init(O))
    return E;
  return B;
}

Error CudaBackend::init(const CudaBackendOptions &O) {
  Error Own = initDevice(O);
  if (O.AgreeBeforeCollectives)
    Own = O.AgreeBeforeCollectives(std::move(Own));
  if (Own)
    return Own;
  // The groups' NCCL communicators, collectively, in a fixed order.
  for (Communicator *G : {O.Tensor, O.Pipeline, O.Data, O.Context})
    if (G && G->size() > 1)
      if (auto C = nccl(*G); !C)
        return C.takeError();
  if (O.Pipeline && O.Pipeline->size() > 1)
    if (auto E = makeChannels(*O.Pipeline))
      return E;
  return Error::success();
}

Error CudaBackend::initDevice(const CudaBackendOptions &O) {
  if (auto E = checkCudaDevice())
    return E;
  int Count = 0;
  SP_CUDA_TRY(cudaGetDeviceCount(&Count));
  auto Local = cuda::findLocalRank(
      [](const char *V) -> const char * { return std::getenv(V); }, O.World);
  if (!Local)
    return Local.takeError();
  auto Dev = cuda::chooseDevice(*Local, Count, O.Device);
  if (!Dev)
    return Dev.takeError();
  Device = *Dev;
  Overlap = O.Overlap;
  // The groups' timeout (sp-run's --comm-timeout), for waits on the device.
  for (Communicator *G : {O.World, O.Tensor, O.Pipeline, O.Data, O.Context})
    if (G)
      Timeout = G->timeout();
  SP_CUDA_TRY(cudaSetDevice(Device));
  SP_CUDA_TRY(cudaStreamCreateWithFlags(&Compute, cudaStreamNonBlocking));
  SP_CUDA_TRY(cudaStreamCreateWithFlags(&Comm, cudaStreamNonBlocking));
  SP_CUDA_TRY(cudaEventCreateWithFlags(&ToNccl, cudaEventDisableTiming));
  SP_CUDA_TRY(cudaEventCreateWithFlags(&FromNccl, cudaEventDisableTiming));
  auto Api = loadCublas();
  if (!Api)
    return Api.takeError();
  Cublas = *Api;
  SP_CUBLAS_TRY(Cublas->Create(&Blas));
  TF32 = O.AllowTF32;
  Blockwise = O.BlockwiseAttention;
  Num = O.Numerics;
  if (O.CublasLtEpilogues) {
    auto L = cuda::CublasLt::create();
    if (!L)
      return L.takeError();
    Lt = std::move(*L);
  }
  SP_CUBLAS_TRY(Cublas->SetMathMode(Blas, mathMode()));
  SP_CUDA_TRY(cudaMalloc(&Err, sizeof(cuda::DeviceError)));
  SP_CUDA_TRY(cudaMemset(Err, 0, sizeof(cuda::DeviceError)));
  SP_CUDA_TRY(cudaMalloc(&Norm, sizeof(NormScalars)));
  SP_CUDA_TRY(cudaMemset(Norm, 0, sizeof(NormScalars)));
  SP_CUDA_TRY(cudaDeviceSynchronize());
  return Error::success();
}


CudaBackend::~CudaBackend() {
  cudaSetDevice(Device);
  consumeError(flushAdamw());
  // The queued work, sends to peers included, ends or is given up (a peer
  // that failed never receives: waitFor aborts NCCL after the timeout, and
  // the aborted kernels end).
  for (auto &[Peer, Ch] : SendChannels)
    settle(Ch.Stream, "pipeline send");
  settle(Compute, "compute");
  settle(Comm, "communication");
  for (auto &[Peer, Ch] : SendChannels)
    cudaStreamDestroy(Ch.Stream);
  SendChannels.clear();
  RecvChannels.clear();
  Nccl.clear();
  for (cudaEvent_t E : Events)
    if (E)
      cudaEventDestroy(E);
  for (cudaEvent_t E : TimingPool)
    cudaEventDestroy(E);
  if (TimeBase)
    cudaEventDestroy(TimeBase);
  if (ToNccl)
    cudaEventDestroy(ToNccl);
  if (FromNccl)
    cudaEventDestroy(FromNccl);
  if (Blas)
    Cublas->Destroy(Blas);
  cudaFree(Err);
  cudaFree(Norm);
  // What allocateWhileRunning allocated, in the legacy stream's order.
  for (char *P :
       {Scratch[0], Scratch[1], Mixed[0], Mixed[1], AttentionWork[0],
        AttentionWork[1], ContextWork[0], ContextWork[1], ContextWork[2],
        ContextWork[3], ContextBias[0], ContextBias[1]})
    if (P)
      cudaFreeAsync(P, nullptr);
  for (SendSlot &Slot : SendSlots) {
    cudaFreeAsync(Slot.Data, nullptr);
    cudaEventDestroy(Slot.Done);
    cudaEventDestroy(Slot.Staged);
  }
  for (void *P : Retired)
    cudaFreeAsync(P, nullptr);
  cudaStreamSynchronize(nullptr);
  if (Staging)
    cudaFreeHost(Staging);
  for (void *P : RetiredHost)
    cudaFreeHost(P);
  if (Compute)
    cudaStreamDestroy(Compute);
  if (Comm)
    cudaStreamDestroy(Comm);
}

void CudaBackend::release(char *Arena) {
  cudaSetDevice(Device);
  consumeError(flushAdamw());
  settle(Compute, "compute");
  settle(Comm, "communication");
  cudaFree(Arena);
}

void CudaBackend::settle(cudaStream_t S, const char *Name) {
  if (!S)
    return;
  consumeError(waitFor(S, Name));
  cudaStreamSynchronize(S);
}

Error CudaBackend::drain() {
  SP_CUDA_TRY(cudaSetDevice(Device));
  if (auto E = flushAdamw())
    return E;
  if (auto E = waitFor(Comm, "communication"))
    return E;
  return waitFor(Compute, "compute");
}

Error CudaBackend::waitFor(cudaStream_t S, const char *Name) {
  // The stream is polled (cudaStreamSynchronize cannot time out): yielding
  // for the first SpinFor, so a wait inside a step (a phase's end, the grad
  // norm's read) ends within microseconds of the work; then sleeping, the
  // pause doubling up to 5 ms, for the long waits (a peer's collective).
  // Sleeping from the start overshot a 6 ms wait by up to 5 ms (the pauses
  // 20 us, 40 us, ... summed past it): on an H200 the GPU sat idle for a
  // third of a bf16 layer's step.
  constexpr auto SpinFor = std::chrono::milliseconds(50);
  auto Start = std::chrono::steady_clock::now();
  for (auto Pause = std::chrono::microseconds(20);;) {
    cudaError_t Q = cudaStreamQuery(S);
    if (Q != cudaErrorNotReady) {
      SP_CUDA_TRY(Q);
      return Error::success();
    }
    auto Waited = std::chrono::steady_clock::now() - Start;
    if (Waited >= Timeout)
      break;
    if (Waited < SpinFor) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(Pause);
    Pause = std::min(2 * Pause, std::chrono::microseconds(5000));
  }
  // What the stream waits for never came: a peer's part of a collective or
  // of a pipeline message, most likely. Abort NCCL, so that the stream and
  // this rank can end.
  for (auto &[G, C] : Nccl)
    C->abort();
  for (auto *Channels : {&SendChannels, &RecvChannels})
    for (auto &[Peer, Ch] : *Channels)
      Ch.Comm->abort();
  return createStringError(
      inconvertibleErrorCode(),
      "timed out after %.1f s waiting for the %s stream of CUDA device %d "
      "(an NCCL collective or pipeline message whose other ranks never came?); "
      "NCCL aborted (raise the wait with --comm-timeout)",
      std::chrono::duration<double>(Timeout).count(), Name, Device);
}

double CudaBackend::peakFlops(StringRef Dtype) const {
  int Major = 0, Minor = 0, SMs = 0, ClockKHz = 0;
  if (cudaDeviceGetAttribute(&Major, cudaDevAttrComputeCapabilityMajor,
                             Device) != cudaSuccess ||
      cudaDeviceGetAttribute(&Minor, cudaDevAttrComputeCapabilityMinor,
                             Device) != cudaSuccess ||
      cudaDeviceGetAttribute(&SMs, cudaDevAttrMultiProcessorCount, Device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&ClockKHz, cudaDevAttrClockRate, Device) !=
          cudaSuccess)
    return 0;
  return cuda::gpuPeakFlops(Major, Minor, SMs, ClockKHz, Dtype, TF32);
}

Error CudaBackend::synchronize() {
  if (auto E = drain())
    return E;
  cuda::DeviceError Found;
  SP_CUDA_TRY(cudaMemcpy(&Found, Err, sizeof Found, cudaMemcpyDeviceToHost));
  if (!Found.Code)
    return Error::success();
  SP_CUDA_TRY(cudaMemset(Err, 0, sizeof(cuda::DeviceError)));
  switch (Found.Code) {
  case cuda::EmbeddingIdOutOfRange:
    return createStringError(inconvertibleErrorCode(),
                             "embedding id out of range (element %lld, value "
                             "%lld), found on the device",
                             Found.Index, Found.Value);
  case cuda::CrossEntropyTargetOutOfRange:
    return createStringError(inconvertibleErrorCode(),
                             "cross entropy target out of range (element "
                             "%lld, value %lld), found on the device",
                             Found.Index, Found.Value);
  default:
    return createStringError(inconvertibleErrorCode(),
                             "a CUDA kernel reported error code %d", Found.Code);
  }
}

Error CudaBackend::issue(const KernelCall &C, cudaStream_t S, bool Mixed) {
  if (auto E = Mixed ? dispatchMixed(C, S) : dispatch(C, S))
    return E;
  SP_CUDA_TRY(cudaGetLastError());
  if (Timing)
    if (auto E = timeEnd(Timed.size() - 1, S))
      return E;
  return Error::success();
}

Error CudaBackend::run(const KernelCall &C) {
  for (const auto *List : {&C.I.Out, &C.I.In})
    for (int B : *List)
      if (C.Prog.Buffers[B].Type.Dtype == DType::F64)
        return makeError("the CUDA backend runs float32 plans; this one "
                         "computes in float64");
  SP_CUDA_TRY(cudaSetDevice(Device));
  // An instruction with bf16 or fp16 buffers runs on float32 copies, unless
  // its kernel reads and writes them in place.
  bool Mixed = cuda::touches16Bit(C.I, C.Prog.Buffers) &&
               !inPlace16(C.I, C.Prog.Buffers);
  const Instruction *First = C.Prog.Instrs.data();
  size_t NumInstrs = C.Prog.Instrs.size();
  bool InProgram = &C.I >= First && &C.I < First + NumInstrs;
  if (!InProgram) {
    // A call on an instruction outside its program (tests): in order with
    // everything before it, on the compute stream.
    if (auto E = drain())
      return E;
    if (Timing)
      if (auto E = timeStart(Compute, 0))
        return E;
    if (auto E = issue(C, Compute, Mixed))
      return E;
    return drain();
  }
  size_t J = size_t(&C.I - First);
  // A run starts at instruction 0: check that the plan is this program's
  // (a program at a freed one's address must not reuse its plan).
  uint64_t Print = J == 0 ? fingerprint(C.Prog) : PlannedPrint;
  if (Planned != &C.Prog || PlannedInstrs != NumInstrs ||
      Print != PlannedPrint) {
    if (auto E = drain())
      return E;
    for (cudaEvent_t E : Events)
      if (E)
        SP_CUDA_TRY(cudaEventDestroy(E));
    Plan = cuda::planStreams(C.Prog, Overlap);
    Events.assign(NumInstrs, nullptr);
    for (size_t J = 0; J < NumInstrs; ++J)
      if (Plan.Steps[J].RecordEvent)
        SP_CUDA_TRY(
            cudaEventCreateWithFlags(&Events[J], cudaEventDisableTiming));
    Planned = &C.Prog;
    PlannedInstrs = NumInstrs;
    PlannedPrint = fingerprint(C.Prog);
  }
  const cuda::StreamStep &Step = Plan.Steps[J];
  cudaStream_t S = Step.Stream == cuda::StreamKind::Comm ? Comm : Compute;
  // A 16-bit adamw (the plans' masters and moments are f32) runs alone.
  bool IsAdamw = C.I.Op == OpKind::AdamW && !Mixed;
  if (!Adamw.Tensors.empty() && !(IsAdamw && adamwJoins(C, S, Step)))
    if (auto E = flushAdamw())
      return E;
  for (int W : Step.WaitFor)
    SP_CUDA_TRY(cudaStreamWaitEvent(S, Events[W], 0));
  if (Timing)
    if (auto E = timeStart(S, int(Step.Stream)))
      return E;
  if (IsAdamw) {
    auto Chunk = adamwChunk(C);
    if (!Chunk)
      return Chunk.takeError();
    deferAdamw(C, S, J, *Chunk, Step.RecordEvent);
    if (Timing) {
      Adamw.Timed.push_back(Timed.size() - 1);
      Adamw.TimedElements.push_back(Chunk->Count);
    }
    return Error::success();
  }
  if (auto E = issue(C, S, Mixed))
    return E;
  if (Step.RecordEvent)
    SP_CUDA_TRY(cudaEventRecord(Events[J], S));
  return Error::success();
}

} // namespace sp::cuda

namespace sp {

bool cudaBackendBuilt() { return true; }

Error loadCudaLibraries() {
  auto Api = cuda::loadCublas();
  return Api ? Error::success() : Api.takeError();
}

int cudaDeviceCount() {
  int Count = 0;
  if (cudaGetDeviceCount(&Count) != cudaSuccess) {
    cudaGetLastError(); // clear the sticky status of the failed query
    return 0;
  }
  return Count;
}

Error checkCudaDevice() {
  int Count = 0;
  cudaError_t E = cudaGetDeviceCount(&Count);
  if (E != cudaSuccess) {
    cudaGetLastError();
    return createStringError(
        inconvertibleErrorCode(), "%s",
        cuda::noDeviceMessage(formatv("{0}: {1}", cudaGetErrorName(E),
                                      cudaGetErrorString(E))
                                  .str())
            .c_str());
  }
  if (Count == 0)
    return createStringError(inconvertibleErrorCode(), "%s",
                             cuda::noDeviceMessage("0 devices").c_str());
  return Error::success();
}

Expected<std::unique_ptr<Backend>>
createCudaBackend(const CudaBackendOptions &Opts) {
  auto B = cuda::CudaBackend::create(Opts);
  if (!B)
    return B.takeError();
  return std::unique_ptr<Backend>(std::move(*B));
}

} // namespace sp
