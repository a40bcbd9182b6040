//===- Communicator.h - Collectives between the ranks of a job -*- C++ -*-===//
//
// The runtime's one view of communication: a group of ranks that run the same
// program and meet in collectives (all-reduce, all-gather, reduce-scatter,
// broadcast, barrier), point-to-point messages, and split() into subgroups
// (e.g. the tensor-parallel groups of a data-parallel job).
//
// Three implementations, so that one rank needs no communication library:
//  - single rank: collectives are copies, send/recv are errors;
//  - threads: N ranks inside one process, one communicator object per thread
//    (tests, and CPU runs of a parallel plan without MPI);
//  - MPI: thin checked wrappers over MPI_COMM_WORLD, only when sp was built
//    with MPI (SP_HAVE_MPI).
//
// Rules for callers:
//  - Every rank of a communicator calls the same collectives in the same
//    order with the same counts (and the same Root). The thread version
//    checks this and reports a mismatch as an error on every rank; MPI does
//    not, and may hang or fail.
//  - One communicator object is used by one thread at a time.
//  - Buffers of a collective must not overlap, except the in-place
//    all-reduces. They may be reused as soon as the call returns.
//  - An error on one rank leaves the others waiting in their next collective.
//    A rank that fails calls abort(Reason): with threads every waiting and
//    later call of the whole job (all communicators split from the same
//    root) returns an error naming the aborting rank and the reason; with
//    MPI the whole job is terminated (MPI_Abort). runOnThreadRanks does this
//    for thread ranks.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_COMM_COMMUNICATOR_H
#define SP_RUNTIME_COMM_COMMUNICATOR_H

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sp {

/// The element types collectives move and sum. The 16-bit floats sum in
/// float and round to nearest even: with threads (and one rank) the whole
/// rank-order sum is rounded once; MPI, which has no 16-bit float type,
/// rounds after each pairwise step of its own order. F64 serves the
/// float64 runs that measure float32's rounding (Plan widenToFloat64).
enum class CommType : uint8_t { F32, BF16, F16, I64, F64 };
/// Its size in bytes and its name ("float", "bf16", "f16", "int64",
/// "double").
int64_t commTypeBytes(CommType T);
const char *commTypeName(CommType T);

class Communicator {
public:
  virtual ~Communicator();

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// A short name for logs and diagnostics, e.g. "thread 1/4", "mpi 0/2".
  virtual std::string name() const = 0;

  /// Element-wise sum, in place, over Count elements of type T. With
  /// threads the sum is computed in rank order starting from rank 0's value
  /// (the same bits on every rank, and the same as a sequential sum over
  /// ranks 0..N-1); MPI's order is not specified. int64 sums are exact in any
  /// order.
  virtual llvm::Error allReduceSum(void *Data, int64_t Count, CommType T) = 0;
  /// Element-wise maximum over float32, in place; NaN propagates.
  virtual llvm::Error allReduceMax(float *Data, int64_t Count) = 0;
  /// Out[r * Count .. (r+1) * Count) = In of rank r (rank-major
  /// concatenation), Count elements of type T each. Out holds size() * Count.
  virtual llvm::Error allGather(void *Out, const void *In, int64_t Count,
                                CommType T) = 0;
  /// In holds size() chunks of Count elements of type T; Out (Count
  /// elements) = sum over ranks of chunk rank(), as allReduceSum sums.
  virtual llvm::Error reduceScatterSum(void *Out, const void *In,
                                       int64_t Count, CommType T) = 0;

  /// The float32, float64 and int64 forms.
  llvm::Error allReduceSum(float *Data, int64_t Count) {
    return allReduceSum(Data, Count, CommType::F32);
  }
  llvm::Error allReduceSum(double *Data, int64_t Count) {
    return allReduceSum(Data, Count, CommType::F64);
  }
  llvm::Error allReduceSum(int64_t *Data, int64_t Count) {
    return allReduceSum(Data, Count, CommType::I64);
  }
  llvm::Error allGather(float *Out, const float *In, int64_t Count) {
    return allGather(Out, In, Count, CommType::F32);
  }
  llvm::Error allGather(double *Out, const double *In, int64_t Count) {
    return allGather(Out, In, Count, CommType::F64);
  }
  llvm::Error reduceScatterSum(float *Out, const float *In, int64_t Count) {
    return reduceScatterSum(Out, In, Count, CommType::F32);
  }
  llvm::Error reduceScatterSum(double *Out, const double *In, int64_t Count) {
    return reduceScatterSum(Out, In, Count, CommType::F64);
  }
  /// Copies Root's Bytes bytes at Data into Data on every other rank.
  virtual llvm::Error broadcast(void *Data, int64_t Bytes, int Root) = 0;
  /// Point to point. Messages between the same (sender, receiver, Tag) arrive
  /// in order; recv must ask for exactly the size that was sent. Sends are
  /// buffered (send never blocks: threads queue a copy, MPI posts MPI_Isend
  /// on a copy), so only a recv whose message is never sent can hang.
  virtual llvm::Error send(const void *Data, int64_t Bytes, int Peer,
                           int Tag) = 0;
  virtual llvm::Error recv(void *Data, int64_t Bytes, int Peer, int Tag) = 0;
  virtual llvm::Error barrier() = 0;
  /// A sub-communicator of the ranks with the same Color (non-negative),
  /// ordered by Key and then by rank here (MPI_Comm_split semantics);
  /// collective over all ranks of this one.
  virtual llvm::Expected<std::unique_ptr<Communicator>> split(int Color,
                                                              int Key) = 0;
  /// Gives up on the job so that no other rank waits forever for this one
  /// (see the file comment). Threads: later and waiting calls on every rank
  /// return an error. MPI: prints Reason and terminates the job. Single rank:
  /// later calls return an error.
  virtual void abort(llvm::StringRef Reason) = 0;

  /// How long a call may wait for the other ranks (a collective for all of
  /// them, recv for its message). Past it the rank gives up: it aborts the
  /// job with the call and the ranks it waited for, so that a hung or dead
  /// rank never hangs the others (threads: every rank's call fails with that
  /// reason; MPI: the job ends, MPI_Abort). split() passes it on.
  void setTimeout(std::chrono::milliseconds T) { Timeout = T; }
  std::chrono::milliseconds timeout() const { return Timeout; }
  /// sp-run's default (--comm-timeout): five minutes.
  static constexpr std::chrono::milliseconds DefaultTimeout{300000};

protected:
  /// "timed out after 1.5 s in allReduceSum waiting for rank 1 (of 4) (raise
  /// it with --comm-timeout)": the cause a timed-out rank aborts with.
  std::string timeoutCause(llvm::StringRef Op, llvm::StringRef Waiting) const;

  std::chrono::milliseconds Timeout = DefaultTimeout;
};

/// A communicator of one rank: collectives are copies, send/recv are errors.
std::unique_ptr<Communicator> createSingleRankCommunicator();

/// N in-process ranks for N threads (one object per rank; rank i used by
/// thread i). N must be at least 1.
std::vector<std::unique_ptr<Communicator>> createThreadCommunicators(int N);

/// Runs Body(rank i's communicator) on N new threads, one per rank, and joins
/// them. A rank whose Body returns an error (or throws) aborts the group, so
/// the others fail instead of hanging. Returns the errors of the failing
/// ranks, each prefixed with "rank I: ", or success.
llvm::Error
runOnThreadRanks(int N, llvm::function_ref<llvm::Error(Communicator &)> Body);

/// MPI_COMM_WORLD (a duplicate of it, with errors returned rather than
/// fatal). MPI_Init_thread (MPI_THREAD_SERIALIZED) is called by the first
/// call unless MPI is already initialized, and then MPI_Finalize at exit.
/// Errors if sp was built without MPI or an MPI call fails, naming the call.
llvm::Expected<std::unique_ptr<Communicator>>
createMpiCommunicator(int *Argc, char ***Argv);

/// Whether sp was built with MPI (createMpiCommunicator can succeed).
bool mpiAvailable();

} // namespace sp

#endif // SP_RUNTIME_COMM_COMMUNICATOR_H
