//===- NcclComm.h - An NCCL communicator per process group -------*- C++ -*-===//
//
// One NCCL communicator for one of a rank's groups (tp, pp, dp), bootstrapped
// over the group's host communicator (runtime/comm: MPI across processes, or
// threads): rank 0 creates the ncclUniqueId and broadcasts it, with a flag
// saying whether it could, so that a failure on rank 0 fails every rank
// instead of leaving them waiting; then every rank calls ncclCommInitRank on
// its current device. Creation is collective over the group.
//
// The calls enqueue on the stream given and return at once; buffers are
// device memory. Sums are NCCL's (its ring order, not the CPU's rank order).
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_NCCLCOMM_H
#define SP_RUNTIME_CUDA_NCCLCOMM_H

#include "runtime/comm/Communicator.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"
#include <cuda_runtime_api.h>
#include <memory>
#include <nccl.h>

namespace sp::cuda {

class NcclComm {
public:
  /// Collective over Host's ranks; the current CUDA device is this rank's.
  static llvm::Expected<std::unique_ptr<NcclComm>> create(Communicator &Host);
  /// Collective over Host's ranks: a communicator of the two ranks From
  /// (its rank 0) and To (rank 1) of Host, for From's sends to To; null on
  /// the other ranks.
  static llvm::Expected<std::unique_ptr<NcclComm>>
  createPair(Communicator &Host, int From, int To);
  ~NcclComm();
  NcclComm(const NcclComm &) = delete;
  NcclComm &operator=(const NcclComm &) = delete;

  int rank() const { return Rank; }
  int size() const { return Size; }

  llvm::Error allReduceSum(float *Out, const float *In, int64_t Count,
                           cudaStream_t S);
  llvm::Error allReduceSum(double *Out, const double *In, int64_t Count,
                           cudaStream_t S);
  llvm::Error allReduceMax(float *Out, const float *In, int64_t Count,
                           cudaStream_t S);
  /// Out = the ranks' In, rank-major (Count floats each).
  llvm::Error allGather(float *Out, const float *In, int64_t Count,
                        cudaStream_t S);
  /// Out (Count floats) = the sum over ranks of their chunk rank() of In.
  llvm::Error reduceScatterSum(float *Out, const float *In, int64_t Count,
                               cudaStream_t S);
  llvm::Error broadcast(void *Data, int64_t Bytes, int Root, cudaStream_t S);
  llvm::Error send(const void *Data, int64_t Bytes, int Peer, cudaStream_t S);
  llvm::Error recv(void *Data, int64_t Bytes, int Peer, cudaStream_t S);
  /// ncclGroupStart / ncclGroupEnd: the sends and receives between them
  /// progress together (none waits for the others to be matched first).
  static llvm::Error groupStart();
  static llvm::Error groupEnd();
  /// Calls (NCCL calls) between groupStart and groupEnd; the group is ended
  /// whatever they return, the first error wins.
  static llvm::Error grouped(llvm::function_ref<llvm::Error()> Calls);
  /// ncclCommAbort: its kernels waiting for peers end, and the communicator
  /// is gone (every later call on it is an error).
  void abort();

private:
  NcclComm() = default;
  /// The whole group (To < 0, the id from Root) or the pair Root, To.
  static llvm::Expected<std::unique_ptr<NcclComm>> createOf(Communicator &Host,
                                                            int Root, int To);
  llvm::Error allReduce(void *Out, const void *In, int64_t Count,
                        ncclDataType_t Type, ncclRedOp_t Op, cudaStream_t S);
  ncclComm_t Comm = nullptr;
  int Rank = 0, Size = 1;
};

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_NCCLCOMM_H
