//===- NcclComm.cpp - An NCCL communicator per process group --------------===//
//
// See NcclComm.h.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/NcclComm.h"
#include "runtime/cuda/CudaCheck.h"
#include <cstring>

using namespace llvm;

namespace sp::cuda {

namespace {
/// What rank 0 broadcasts: the id, or why there is none.
struct Bootstrap {
  int32_t Ok = 0;
  char Why[124] = {};
  ncclUniqueId Id;
};
} // namespace

Expected<std::unique_ptr<NcclComm>> NcclComm::create(Communicator &Host) {
  return createOf(Host, 0, -1);
}

Expected<std::unique_ptr<NcclComm>> NcclComm::createPair(Communicator &Host,
                                                         int From, int To) {
  return createOf(Host, From, To);
}

Expected<std::unique_ptr<NcclComm>> NcclComm::createOf(Communicator &Host,
                                                       int Root, int To) {
  Bootstrap B;
  std::memset(static_cast<void *>(&B), 0, sizeof B);
  if (Host.rank() == Root) {
    ncclResult_t R = ncclGetUniqueId(&B.Id);
    B.Ok = R == ncclSuccess;
    if (!B.Ok)
      std::snprintf(B.Why, sizeof B.Why, "%s", ncclGetErrorString(R));
  }
  if (auto E = Host.broadcast(&B, sizeof B, Root))
    return E;
  if (!B.Ok)
    return createStringError(inconvertibleErrorCode(),
                             "ncclGetUniqueId failed on rank %d of %s: %s",
                             Root, Host.name().c_str(), (const char *)B.Why);
  std::unique_ptr<NcclComm> C(new NcclComm);
  if (To < 0) { // the whole group
    C->Rank = Host.rank();
    C->Size = Host.size();
  } else if (Host.rank() == Root || Host.rank() == To) {
    C->Rank = Host.rank() == Root ? 0 : 1;
    C->Size = 2;
  } else {
    return nullptr;
  }
  SP_NCCL_TRY(ncclCommInitRank(&C->Comm, C->Size, B.Id, C->Rank));
  return C;
}

NcclComm::~NcclComm() {
  if (Comm)
    ncclCommDestroy(Comm);
}

void NcclComm::abort() {
  if (Comm)
    ncclCommAbort(Comm);
  Comm = nullptr;
}

Error NcclComm::allReduce(void *Out, const void *In, int64_t Count,
                          ncclDataType_t Type, ncclRedOp_t Op,
                          cudaStream_t S) {
  SP_NCCL_TRY(ncclAllReduce(In, Out, size_t(Count), Type, Op, Comm, S));
  return Error::success();
}

Error NcclComm::allReduceSum(float *Out, const float *In, int64_t Count,
                             cudaStream_t S) {
  return allReduce(Out, In, Count, ncclFloat32, ncclSum, S);
}

Error NcclComm::allReduceSum(double *Out, const double *In, int64_t Count,
                             cudaStream_t S) {
  return allReduce(Out, In, Count, ncclFloat64, ncclSum, S);
}

Error NcclComm::allReduceMax(float *Out, const float *In, int64_t Count,
                             cudaStream_t S) {
  return allReduce(Out, In, Count, ncclFloat32, ncclMax, S);
}

Error NcclComm::allGather(float *Out, const float *In, int64_t Count,
                          cudaStream_t S) {
  SP_NCCL_TRY(ncclAllGather(In, Out, size_t(Count), ncclFloat32, Comm, S));
  return Error::success();
}

Error NcclComm::reduceScatterSum(float *Out, const float *In, int64_t Count,
                                 cudaStream_t S) {
  SP_NCCL_TRY(ncclReduceScatter(In, Out, size_t(Count), ncclFloat32, ncclSum,
                                Comm, S));
  return Error::success();
}

Error NcclComm::broadcast(void *Data, int64_t Bytes, int Root,
                          cudaStream_t S) {
  SP_NCCL_TRY(
      ncclBroadcast(Data, Data, size_t(Bytes), ncclUint8, Root, Comm, S));
  return Error::success();
}

Error NcclComm::send(const void *Data, int64_t Bytes, int Peer,
                     cudaStream_t S) {
  SP_NCCL_TRY(ncclSend(Data, size_t(Bytes), ncclUint8, Peer, Comm, S));
  return Error::success();
}

Error NcclComm::recv(void *Data, int64_t Bytes, int Peer, cudaStream_t S) {
  SP_NCCL_TRY(ncclRecv(Data, size_t(Bytes), ncclUint8, Peer, Comm, S));
  return Error::success();
}

Error NcclComm::groupStart() {
  SP_NCCL_TRY(ncclGroupStart());
  return Error::success();
}

Error NcclComm::groupEnd() {
  SP_NCCL_TRY(ncclGroupEnd());
  return Error::success();
}

Error NcclComm::grouped(function_ref<Error()> Calls) {
  if (auto E = groupStart())
    return E;
  Error Failed = Calls();
  Error Ended = groupEnd();
  if (Failed) {
    consumeError(std::move(Ended));
    return Failed;
  }
  return Ended;
}

} // namespace sp::cuda
