//===- MpiCommunicator.cpp - Checked wrappers over MPI --------------------===//
//
// Each call is one MPI call (or a few, for buffers past MPI's int counts) on
// a duplicate of MPI_COMM_WORLD whose error handler returns errors, so a
// failing call becomes an llvm::Error naming the call and MPI's own message.
// Compiled without SP_HAVE_MPI, createMpiCommunicator reports that sp was
// built without MPI.
//
// Chunking: allReduce, broadcast, send and recv split buffers into pieces of
// at most 2^30 elements (bytes), the same on every rank. allGather and
// reduceScatterSum need each rank's count to fit an int.
//
// Every wait polls a nonblocking call (MPI_Iallreduce, MPI_Irecv, ...) so
// that the communicator's timeout holds: a rank that waits past it aborts the
// job, naming the call.
//
// Sends are buffered, as with threads: send copies the bytes and posts
// MPI_Isend, so it never waits for the receiver (pipeline stages send to
// each other in both directions at once). Completed sends are released at
// the next point-to-point call; the destructor waits for the rest.
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/Communicator.h"
#include "runtime/comm/CommSupport.h"

#ifdef SP_HAVE_MPI
#include "ir/Float16.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"
#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>
#include <cstdlib>
#include <mpi.h>
#include <list>
#include <mutex>
#include <vector>
#endif

using namespace llvm;

namespace sp {

#ifdef SP_HAVE_MPI

namespace {

constexpr int64_t MaxChunk = int64_t(1) << 30;

/// MPI's message for an error code.
std::string mpiErrorString(int Code) {
  char Buffer[MPI_MAX_ERROR_STRING];
  int Length = 0;
  if (MPI_Error_string(Code, Buffer, &Length) != MPI_SUCCESS)
    return formatv("unknown MPI error code {0}", Code).str();
  return std::string(Buffer, Length);
}

/// An error for a failed MPI call outside any communicator.
Error mpiCallError(StringRef Call, int Code) {
  return createStringError(inconvertibleErrorCode(), "mpi: %s failed: %s",
                           Call.str().c_str(), mpiErrorString(Code).c_str());
}

/// The 16-bit float sums: MPI has no such types, so they travel as
/// MPI_UINT16_T and reduce with a user operation that widens, adds in float
/// and rounds (once per pairwise step: MPI's tree or ring decides the order,
/// as for float).
template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void sum16(void *In, void *InOut, int *Len, MPI_Datatype *) {
  const uint16_t *X = static_cast<const uint16_t *>(In);
  uint16_t *Y = static_cast<uint16_t *>(InOut);
  for (int I = 0; I < *Len; ++I)
    Y[I] = Narrow(Widen(X[I]) + Widen(Y[I]));
}

/// The MPI type and sum operation of T (the 16-bit ones created once, at the
/// first use, after MPI_Init; never freed: MPI_Finalize releases them).
std::pair<MPI_Datatype, MPI_Op> sumOf(CommType T) {
  static MPI_Op SumBF16 = MPI_OP_NULL, SumF16 = MPI_OP_NULL;
  static std::once_flag Once;
  switch (T) {
  case CommType::F32:
    return {MPI_FLOAT, MPI_SUM};
  case CommType::I64:
    return {MPI_INT64_T, MPI_SUM};
  case CommType::F64:
    return {MPI_DOUBLE, MPI_SUM};
  case CommType::BF16:
  case CommType::F16:
    std::call_once(Once, [] {
      MPI_Op_create(sum16<bfloat16ToFloat, floatToBFloat16>, 1, &SumBF16);
      MPI_Op_create(sum16<halfToFloat, floatToHalf>, 1, &SumF16);
    });
    return {MPI_UINT16_T, T == CommType::BF16 ? SumBF16 : SumF16};
  }
  llvm_unreachable("unknown element type");
}

class MpiCommunicator final : public Communicator {
public:
  /// Takes ownership of Comm (freed in the destructor unless MPI is already
  /// finalized).
  MpiCommunicator(MPI_Comm Comm, int Rank, int Size)
      : Comm(Comm), Rank(Rank), Size(Size) {}

  ~MpiCommunicator() override {
    int Finalized = 0;
    MPI_Finalized(&Finalized);
    if (Finalized)
      return;
    for (PendingSend &S : Pending)
      MPI_Wait(&S.Request, MPI_STATUS_IGNORE);
    MPI_Comm_free(&Comm);
  }

  /// Takes a new communicator handle, sets its error handler to return
  /// errors, and wraps it (or frees it on failure).
  static Expected<std::unique_ptr<Communicator>> wrap(MPI_Comm New) {
    int Rank = 0, Size = 0;
    StringRef Call;
    int Code = MPI_SUCCESS;
    if ((Code = MPI_Comm_set_errhandler(New, MPI_ERRORS_RETURN)))
      Call = "MPI_Comm_set_errhandler";
    else if ((Code = MPI_Comm_rank(New, &Rank)))
      Call = "MPI_Comm_rank";
    else if ((Code = MPI_Comm_size(New, &Size)))
      Call = "MPI_Comm_size";
    if (Code != MPI_SUCCESS) {
      MPI_Comm_free(&New);
      return mpiCallError(Call, Code);
    }
    return std::make_unique<MpiCommunicator>(New, Rank, Size);
  }

  int rank() const override { return Rank; }
  int size() const override { return Size; }
  std::string name() const override {
    return formatv("mpi {0}/{1}", Rank, Size).str();
  }

  using Communicator::allGather;
  using Communicator::allReduceSum;
  using Communicator::reduceScatterSum;

  Error allReduceSum(void *Data, int64_t Count, CommType T) override {
    auto [Type, Sum] = sumOf(T);
    return allReduce("allReduceSum", static_cast<char *>(Data), Count,
                     commTypeBytes(T), Type, Sum);
  }
  Error allReduceMax(float *Data, int64_t Count) override {
    return allReduce("allReduceMax", reinterpret_cast<char *>(Data), Count, 4,
                     MPI_FLOAT, MPI_MAX);
  }

  Error allGather(void *Out, const void *In, int64_t Count,
                  CommType T) override {
    StringRef Op = "allGather";
    if (Error E = checkChunks(Op, Out, Count * Size, In, Count, Count, T))
      return E;
    MPI_Datatype Type = sumOf(T).first;
    MPI_Request R;
    return complete(Op, "MPI_Iallgather",
                    MPI_Iallgather(In, static_cast<int>(Count), Type, Out,
                                   static_cast<int>(Count), Type, Comm, &R),
                    R);
  }

  Error reduceScatterSum(void *Out, const void *In, int64_t Count,
                         CommType T) override {
    StringRef Op = "reduceScatterSum";
    if (Error E = checkChunks(Op, Out, Count, In, Count * Size, Count, T))
      return E;
    auto [Type, Sum] = sumOf(T);
    MPI_Request R;
    return complete(Op, "MPI_Ireduce_scatter_block",
                    MPI_Ireduce_scatter_block(In, Out, static_cast<int>(Count),
                                              Type, Sum, Comm, &R),
                    R);
  }

  Error broadcast(void *Data, int64_t Bytes, int Root) override {
    StringRef Op = "broadcast";
    if (Error E =
            check(Op, comm::firstProblem({comm::checkBuffer("data", Data, Bytes),
                                          comm::checkRank("root", Root, Size)})))
      return E;
    char *P = static_cast<char *>(Data);
    for (int64_t Offset = 0; Offset < Bytes; Offset += MaxChunk) {
      int N = static_cast<int>(std::min(MaxChunk, Bytes - Offset));
      MPI_Request R;
      if (Error E = complete(Op, "MPI_Ibcast",
                             MPI_Ibcast(P + Offset, N, MPI_BYTE, Root, Comm,
                                        &R),
                             R))
        return E;
    }
    return Error::success();
  }

  Error send(const void *Data, int64_t Bytes, int Peer, int Tag) override {
    StringRef Op = "send";
    if (Error E = check(Op, pointToPointProblem(Data, Bytes, Peer, Tag)))
      return E;
    if (Error E = releaseCompletedSends(Op))
      return E;
    const char *P = static_cast<const char *>(Data);
    // A zero-byte message is still one message.
    int64_t Offset = 0;
    do {
      int N = static_cast<int>(std::min(MaxChunk, Bytes - Offset));
      Pending.emplace_back();
      PendingSend &S = Pending.back();
      S.Bytes.assign(P + Offset, P + Offset + N);
      if (Error E = call(Op, "MPI_Isend",
                         MPI_Isend(S.Bytes.data(), N, MPI_BYTE, Peer, Tag,
                                   Comm, &S.Request))) {
        Pending.pop_back();
        return E;
      }
      Offset += N;
    } while (Offset < Bytes);
    return Error::success();
  }

  Error recv(void *Data, int64_t Bytes, int Peer, int Tag) override {
    StringRef Op = "recv";
    if (Error E = check(Op, pointToPointProblem(Data, Bytes, Peer, Tag)))
      return E;
    if (Error E = releaseCompletedSends(Op))
      return E;
    char *P = static_cast<char *>(Data);
    int64_t Offset = 0;
    do {
      int N = static_cast<int>(std::min(MaxChunk, Bytes - Offset));
      MPI_Status Status;
      MPI_Request R;
      if (Error E = complete(Op, "MPI_Irecv",
                             MPI_Irecv(P + Offset, N, MPI_BYTE, Peer, Tag,
                                       Comm, &R),
                             R, &Status,
                             formatv("a message from rank {0} with tag {1}",
                                     Peer, Tag)
                                 .str()))
        return E;
      int Got = 0;
      if (Error E = call(Op, "MPI_Get_count",
                         MPI_Get_count(&Status, MPI_BYTE, &Got)))
        return E;
      if (Got != N)
        return comm::makeError(
            *this, Op,
            formatv("the message from rank {0} with tag {1} has {2} bytes, "
                    "expected {3}",
                    Peer, Tag, Offset + Got, Bytes));
      Offset += N;
    } while (Offset < Bytes);
    return Error::success();
  }

  Error barrier() override {
    MPI_Request R;
    return complete("barrier", "MPI_Ibarrier", MPI_Ibarrier(Comm, &R), R);
  }

  Expected<std::unique_ptr<Communicator>> split(int Color, int Key) override {
    StringRef Op = "split";
    if (Error E = check(Op, comm::checkColor(Color)))
      return E;
    MPI_Comm New;
    if (Error E = call(Op, "MPI_Comm_split",
                       MPI_Comm_split(Comm, Color, Key, &New)))
      return E;
    auto Wrapped = wrap(New);
    if (!Wrapped)
      return comm::makeError(*this, Op, toString(Wrapped.takeError()));
    (*Wrapped)->setTimeout(Timeout);
    return Wrapped;
  }

  void abort(StringRef Reason) override {
    // One write of the whole line: a pipe keeps it whole, where separate
    // writes could be cut by the abort banner mpirun prints at the same time.
    std::string Line = name() + ": aborting the job: " + Reason.str() + "\n";
    errs() << Line;
    errs().flush();
    MPI_Abort(Comm, 1);
    std::abort(); // MPI_Abort does not return; if it does, still stop
  }

private:
  /// A posted MPI_Isend and the copy of the bytes it sends.
  struct PendingSend {
    MPI_Request Request = MPI_REQUEST_NULL;
    std::vector<char> Bytes;
  };

  Error releaseCompletedSends(StringRef Op) {
    for (auto It = Pending.begin(); It != Pending.end();) {
      int Done = 0;
      if (Error E = call(Op, "MPI_Test",
                         MPI_Test(&It->Request, &Done, MPI_STATUS_IGNORE)))
        return E;
      It = Done ? Pending.erase(It) : std::next(It);
    }
    return Error::success();
  }

  Error check(StringRef Op, const std::string &Problem) const {
    if (!Problem.empty())
      return comm::makeError(*this, Op, Problem);
    return Error::success();
  }

  /// Code is the result of MPI function Call made for Op.
  Error call(StringRef Op, StringRef Call, int Code) const {
    if (Code == MPI_SUCCESS)
      return Error::success();
    return comm::makeError(*this, Op,
                           Call + " failed: " + mpiErrorString(Code));
  }

  /// Completes the nonblocking Call (its start returned Code) made for Op.
  /// It polls rather than blocks, so that the timeout holds: past it, the
  /// rank aborts the job naming Op and what it waited for (Waiting; the
  /// other ranks, for a collective). Polls spin briefly, then sleep up to
  /// a millisecond between tests, so a rank left waiting does not burn a
  /// core.
  Error complete(StringRef Op, StringRef Call, int Code, MPI_Request &Request,
                 MPI_Status *Status = MPI_STATUS_IGNORE,
                 std::string Waiting = "") {
    if (Error E = call(Op, Call, Code))
      return E;
    auto Deadline = std::chrono::steady_clock::now() + Timeout;
    std::chrono::microseconds Pause(0);
    for (int Polls = 0;; ++Polls) {
      int Done = 0;
      if (Error E = call(Op, Call, MPI_Test(&Request, &Done, Status)))
        return E;
      if (Done)
        return Error::success();
      if (Polls < 1000)
        continue;
      if (std::chrono::steady_clock::now() > Deadline)
        abort(timeoutCause(Op, Waiting.empty()
                                   ? formatv("the other ranks (of {0})", Size)
                                         .str()
                                   : Waiting));
      Pause = std::min(std::chrono::microseconds(1000),
                       std::max(std::chrono::microseconds(1), Pause * 2));
      std::this_thread::sleep_for(Pause);
    }
  }

  static std::string fitsInt(int64_t Count) {
    if (Count > INT_MAX)
      return formatv("count {0} exceeds MPI's int counts", Count).str();
    return "";
  }

  /// The checks of allGather and reduceScatterSum, which move Count
  /// elements of type T a rank: their buffers (comm::checkInOut), and a
  /// Count that MPI's int counts hold.
  Error checkChunks(StringRef Op, const void *Out, int64_t OutCount,
                    const void *In, int64_t InCount, int64_t Count,
                    CommType T) const {
    return check(Op, comm::firstProblem({comm::checkInOut(Out, OutCount, In,
                                                          InCount,
                                                          commTypeBytes(T)),
                                         fitsInt(Count)}));
  }

  std::string pointToPointProblem(const void *Data, int64_t Bytes, int Peer,
                                  int Tag) const {
    std::string Problem = comm::checkMessage(Data, Bytes, Peer, Tag, Size);
    if (!Problem.empty())
      return Problem;
    void *Value = nullptr;
    int Found = 0;
    if (MPI_Comm_get_attr(Comm, MPI_TAG_UB, &Value, &Found) == MPI_SUCCESS &&
        Found && Tag > *static_cast<int *>(Value))
      return formatv("tag {0} exceeds MPI_TAG_UB {1}", Tag,
                     *static_cast<int *>(Value))
          .str();
    return "";
  }

  Error allReduce(StringRef Op, char *Data, int64_t Count, int64_t ElemBytes,
                  MPI_Datatype Type, MPI_Op Reduction) {
    if (Error E = check(Op, comm::checkBuffer("data", Data, Count, ElemBytes)))
      return E;
    for (int64_t Offset = 0; Offset < Count; Offset += MaxChunk) {
      int N = static_cast<int>(std::min(MaxChunk, Count - Offset));
      MPI_Request R;
      if (Error E = complete(Op, "MPI_Iallreduce",
                             MPI_Iallreduce(MPI_IN_PLACE,
                                            Data + Offset * ElemBytes, N, Type,
                                            Reduction, Comm, &R),
                             R))
        return E;
    }
    return Error::success();
  }

  MPI_Comm Comm;
  int Rank;
  int Size;
  std::list<PendingSend> Pending;
};

void finalizeMpiAtExit() {
  int Finalized = 0;
  MPI_Finalized(&Finalized);
  if (!Finalized)
    MPI_Finalize();
}

} // namespace

Expected<std::unique_ptr<Communicator>> createMpiCommunicator(int *Argc,
                                                              char ***Argv) {
  static std::mutex InitMutex;
  std::lock_guard<std::mutex> Lock(InitMutex);
  int Finalized = 0;
  MPI_Finalized(&Finalized);
  if (Finalized)
    return createStringError(inconvertibleErrorCode(),
                             "mpi: MPI_Init_thread: MPI is already finalized");
  int Initialized = 0;
  if (int Code = MPI_Initialized(&Initialized))
    return mpiCallError("MPI_Initialized", Code);
  if (!Initialized) {
    int Provided = 0;
    if (int Code =
            MPI_Init_thread(Argc, Argv, MPI_THREAD_SERIALIZED, &Provided))
      return mpiCallError("MPI_Init_thread", Code);
    std::atexit(finalizeMpiAtExit);
    if (Provided < MPI_THREAD_SERIALIZED)
      return createStringError(
          inconvertibleErrorCode(),
          "mpi: MPI_Init_thread: the MPI library provides thread level %d, "
          "sp needs MPI_THREAD_SERIALIZED (%d)",
          Provided, MPI_THREAD_SERIALIZED);
  }
  MPI_Comm World;
  if (int Code = MPI_Comm_dup(MPI_COMM_WORLD, &World))
    return mpiCallError("MPI_Comm_dup", Code);
  return MpiCommunicator::wrap(World);
}

bool mpiAvailable() { return true; }

#else // !SP_HAVE_MPI

Expected<std::unique_ptr<Communicator>> createMpiCommunicator(int *Argc,
                                                              char ***Argv) {
  return createStringError(
      inconvertibleErrorCode(),
      "mpi: sp was built without MPI (install an MPI library such as Debian's "
      "libopenmpi-dev and configure with -DSP_ENABLE_MPI=ON)");
}

bool mpiAvailable() { return false; }

#endif // SP_HAVE_MPI

} // namespace sp
