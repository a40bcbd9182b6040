//===- PipelineChannels.cpp - Pipeline messages over NCCL -----------------===//
//
// Pipeline sends are buffered as the CPU backend's are, so that no schedule
// the CPU runs deadlocks here: a send copies its data to a staging slot on
// the instruction's stream and is posted at once, on a stream of its own
// for the peer, over an NCCL communicator of just the two ranks for that
// direction (a channel, made with the backend); the rank's receives are
// posted on the NCCL stream, over the peer's channel to it. A send then
// waits for nothing but its receive, and nothing on the rank's other
// streams waits for a send (an NCCL send blocks its stream until it is
// received: posted on the NCCL stream, 1F1B's sends would deadlock, both
// stages sending first; held and posted with the next receive in one NCCL
// group, the interleaved schedule's did, on emulated GPUs,
// tests/gpu/EmulatedBackendTest.cpp). A staging slot is reused once its send
// has completed (cudaEventQuery), else another is made.
//
//===----------------------------------------------------------------------===//
#include "runtime/CollectiveWalk.h"
#include "runtime/cuda/CudaBackendImpl.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp::cuda {

Error CudaBackend::makeChannels(Communicator &Pipe) {
  const int P = Pipe.size(), Me = Pipe.rank();
  // Every direction between neighbours, in one order on every stage.
  std::vector<std::pair<int, int>> Directions;
  for (int K = 0; K < P; ++K)
    for (auto D : {std::pair{K, (K + 1) % P}, std::pair{(K + 1) % P, K}})
      if (!is_contained(Directions, D))
        Directions.push_back(D);
  for (auto [From, To] : Directions) {
    auto C = cuda::NcclComm::createPair(Pipe, From, To);
    if (!C)
      return C.takeError();
    if (From == Me) {
      Channel &Ch = SendChannels[To];
      Ch.Comm = std::move(*C);
      SP_CUDA_TRY(cudaStreamCreateWithFlags(&Ch.Stream, cudaStreamNonBlocking));
    } else if (To == Me) {
      RecvChannels[From].Comm = std::move(*C);
    }
  }
  return Error::success();
}

Error CudaBackend::pipelineMessage(const KernelCall &C, cudaStream_t S) {
  auto Pipe = pipelineGroup(C);
  if (!Pipe)
    return Pipe.takeError();
  if ((*Pipe)->size() == 1)
    return makeError("a pipeline message in a one-stage pipeline group");
  auto N = nccl(**Pipe);
  if (!N)
    return N.takeError();
  if (S != ncclStream())
    return makeError("a pipeline message off the NCCL stream");
  // runtime/CollectiveWalk.h's walk, as the CPU's: the sends and receives
  // over the channels (no tags: a channel per peer and direction).
  struct Steps {
    CudaBackend &B;
    cuda::NcclComm &N;
    cudaStream_t S;
    Error send(int Peer, const void *Data, int64_t Bytes, int) {
      return B.sendTo(Peer, Data, Bytes, S);
    }
    Error recv(int Peer, void *Data, int64_t Bytes, int) {
      return B.recvFrom(Peer, Data, Bytes, S);
    }
    Error copy(void *Dst, const void *Src, int64_t Bytes) {
      SP_CUDA_TRY(
          cudaMemcpyAsync(Dst, Src, Bytes, cudaMemcpyDeviceToDevice, S));
      return Error::success();
    }
    Error broadcast(void *Data, int64_t Bytes, int Root) {
      return N.broadcast(Data, Bytes, Root, S);
    }
    Expected<float *> scratch(int64_t Count) {
      return B.scratch(S == B.Comm, Count);
    }
    void add(float *Y, const float *Part, int64_t Count) {
      cuda::add(Y, Y, Part, Count, S);
    }
  };
  return pipelineWalk<float>(C, **Pipe, Steps{*this, **N, S});
}

Expected<CudaBackend::Channel *>
CudaBackend::channelOf(std::map<int, Channel> &Of, int Peer, StringRef What) {
  auto It = Of.find(Peer);
  if (It == Of.end())
    return makeError(formatv("a pipeline {0} stage {1}, which does not "
                             "neighbour this one",
                             What, Peer)
                         .str());
  return &It->second;
}

Error CudaBackend::sendTo(int Peer, const void *Data, int64_t Bytes,
                          cudaStream_t S) {
  auto Ch = channelOf(SendChannels, Peer, "send to");
  if (!Ch)
    return Ch.takeError();
  // A slot whose send has completed, large enough, else a new one.
  SendSlot *Slot = nullptr;
  for (SendSlot &K : SendSlots) {
    cudaError_t Q = cudaEventQuery(K.Done);
    if (Q == cudaErrorNotReady)
      continue;
    SP_CUDA_TRY(Q);
    if (K.Bytes >= Bytes) {
      Slot = &K;
      break;
    }
  }
  if (!Slot) {
    SendSlots.emplace_back();
    Slot = &SendSlots.back();
    if (auto E = allocateWhileRunning(reinterpret_cast<void **>(&Slot->Data),
                                      size_t(Bytes)))
      return E;
    Slot->Bytes = Bytes;
    SP_CUDA_TRY(cudaEventCreateWithFlags(&Slot->Done, cudaEventDisableTiming));
    SP_CUDA_TRY(
        cudaEventCreateWithFlags(&Slot->Staged, cudaEventDisableTiming));
  }
  SP_CUDA_TRY(cudaMemcpyAsync(Slot->Data, Data, size_t(Bytes),
                              cudaMemcpyDeviceToDevice, S));
  SP_CUDA_TRY(cudaEventRecord(Slot->Staged, S));
  SP_CUDA_TRY(cudaStreamWaitEvent((*Ch)->Stream, Slot->Staged, 0));
  if (auto E = (*Ch)->Comm->send(Slot->Data, Bytes, /*Peer=*/1, (*Ch)->Stream))
    return E;
  SP_CUDA_TRY(cudaEventRecord(Slot->Done, (*Ch)->Stream));
  return Error::success();
}

Error CudaBackend::recvFrom(int Peer, void *Data, int64_t Bytes,
                            cudaStream_t S) {
  auto Ch = channelOf(RecvChannels, Peer, "receive from");
  if (!Ch)
    return Ch.takeError();
  return (*Ch)->Comm->recv(Data, Bytes, /*Peer=*/0, S);
}

} // namespace sp::cuda
