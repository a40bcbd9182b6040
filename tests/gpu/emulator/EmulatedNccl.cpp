//===- EmulatedNccl.cpp - NCCL on threads, and across processes over MPI --===//
//
// See EmulatedRuntime.h: communicators per unique id whose ranks are the
// threads of one process, or (built with MPI, launched by mpirun) the
// processes of a job.
//
//===----------------------------------------------------------------------===//
#include "EmulatedCommon.h"
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

using namespace sp::emu;

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
                size_t Count, ncclRedOp_t Op) {
  T *O = reinterpret_cast<T *>(Out.data());
  for (size_t I = 0; I < Count; ++I) {
    T Acc = static_cast<const T *>(Send[0])[I];
    for (size_t R = 1; R < Send.size(); ++R) {
      T V = static_cast<const T *>(Send[R])[I];
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

/// "ncclAllReduce #k of rank r", collective P's name in messages.
std::string collectiveName(const Posted &P) {
  return std::string(kindName(P.Kind)) + " #" + std::to_string(P.Seq) +
         " of rank " + std::to_string(P.Rank);
}

/// Collective P's result on its rank from Parts, what each rank Q gives
/// it (Q's input; for a reduce-scatter, Q's chunk for this rank): the sum
/// (or maximum) in rank order, the concatenation, or the root's.
std::vector<char> collectiveResult(const Posted &P,
                                   const std::vector<const void *> &Parts) {
  const size_t Bytes = P.Count * typeBytes(P.Type);
  std::vector<char> Result;
  switch (P.Kind) {
  case CollKind::AllReduce:
  case CollKind::ReduceScatter:
    Result.resize(Bytes);
    if (P.Type == ncclFloat32)
      reduceInto<float>(Result, Parts, P.Count, P.Op);
    else if (P.Type == ncclFloat64)
      reduceInto<double>(Result, Parts, P.Count, P.Op);
    else
      fail(collectiveName(P) +
           ": a reduction of a type the emulation does not implement");
    break;
  case CollKind::AllGather:
    Result.resize(Parts.size() * Bytes);
    for (size_t Q = 0; Q < Parts.size(); ++Q)
      std::memcpy(Result.data() + Q * Bytes, Parts[Q], Bytes);
    break;
  case CollKind::Broadcast:
    Result.resize(Bytes);
    std::memcpy(Result.data(), Parts[P.Root], Bytes);
    break;
  }
  return Result;
}

/// Aborts unless collective P agrees with what another rank posted for it.
void checkAgrees(const Posted &P, CollKind Kind, size_t Count,
                 ncclDataType_t Type, ncclRedOp_t Op, int Root) {
  if (Kind != P.Kind || Count != P.Count || Type != P.Type || Op != P.Op ||
      Root != P.Root)
    fail(collectiveName(P) + " of " + P.Id +
         " does not match the other ranks' (" + kindName(Kind) + " of " +
         std::to_string(Count) + " elements)");
}

void runCollective(const Posted &P) {
  Clique &Cl = *P.Cl;
  const int N = Cl.Size, Me = P.Rank;
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
  } else {
    checkAgrees(P, R.Kind, R.Count, R.Type, R.Op, R.Root);
  }
  R.Send[Me] = P.In;
  // A meeting of the round's ranks: this one counted in Count, then a wait
  // for the others (What); false when the clique was aborted meanwhile.
  auto Meet = [&](int &Count, const std::string &What) {
    ++Count;
    Cl.CV.notify_all();
    waitFor(Cl.CV, Lock, [&] { return Count == N || Cl.Aborted; }, What);
    return !Cl.Aborted;
  };
  if (!Meet(R.Arrived, "the other ranks to reach " + collectiveName(P)))
    return;
  Lock.unlock();
  // Every rank computes its result from the others' inputs, then all write:
  // an in-place operand is read by all before any is overwritten.
  std::vector<const void *> Parts(R.Send);
  if (P.Kind == CollKind::ReduceScatter)
    for (const void *&Q : Parts)
      Q = static_cast<const char *>(Q) + Me * P.Count * typeBytes(P.Type);
  std::vector<char> Result = collectiveResult(P, Parts);
  Lock.lock();
  if (!Meet(R.Computed,
            "the other ranks to read their inputs of " + collectiveName(P)))
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
/// Operation tags are 2 k (collectives) and 2 k + 1 (sends), k the
/// operation's index modulo this (within the library's MPI_TAG_UB).
uint64_t TagSpace = uint64_t(1) << 28;
int64_t MaxTag = INT32_MAX;

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
  int *TagUb = nullptr, Found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &TagUb, &Found);
  if (Found && TagUb) {
    MaxTag = *TagUb;
    TagSpace = std::min<uint64_t>(TagSpace, uint64_t(*TagUb - 1) / 2);
  }
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
    if (Registered)
      endWait();
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
      noteWait(What());
      Registered = true;
    }
    if (Clock::now() > Deadline) {
      std::string Others = otherWaits();
      fail("process " + std::to_string(EmuWorldRank) + " waited " +
           std::to_string(timeout().count()) + " s for " + What() +
           " (a deadlock?)" + Others);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

/// ncclCommInitRank for an id made by process Maker of the job.
ncclResult_t initOverMpi(ncclComm_t *Comm, int NRanks, const std::string &Key,
                         int Maker, int Index, int Rank) {
  const int64_t Wide = int64_t(Maker) * 65536 + Index % 65536;
  if (Wide > MaxTag)
    fail("ncclCommInitRank " + Key + ": its meeting tag " +
         std::to_string(Wide) + " exceeds MPI_TAG_UB " +
         std::to_string(MaxTag) +
         " (the emulation's tags allow about MPI_TAG_UB / 65536 processes)");
  const int Tag = int(Wide);
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
  // The group, for messages (made only when one is written).
  auto Group = [&] {
    std::string G;
    for (const Posted &P : Ops)
      G += std::string(G.empty() ? "" : ", ") +
           (P.What == Posted::Coll ? collectiveName(P)
            : P.What == Posted::Send
                ? "send #" + std::to_string(P.Seq) + " to rank " +
                      std::to_string(P.Peer) + " of rank " +
                      std::to_string(P.Rank)
                : "receive #" + std::to_string(P.Seq) + " from rank " +
                      std::to_string(P.Peer) + " of rank " +
                      std::to_string(P.Rank)) +
           " of " + P.Id;
    return G;
  };
  auto check = [&](int Code) {
    if (Code != MPI_SUCCESS)
      fail(Group() + ": " + mpiError(Code));
  };
  auto count = [&](size_t Bytes) {
    if (Bytes > size_t(INT_MAX))
      fail(Group() + ": " + std::to_string(Bytes) +
           " bytes, more than one MPI message of the emulation carries");
    return int(Bytes);
  };
  auto isend = [&](const void *Data, size_t Bytes, int To, int Tag, MPI_Comm C,
                   bool Synchronous) {
    Reqs.push_back(MPI_REQUEST_NULL);
    check(Synchronous ? MPI_Issend(Data, count(Bytes), MPI_BYTE, To, Tag, C,
                                   &Reqs.back())
                      : MPI_Isend(Data, count(Bytes), MPI_BYTE, To, Tag, C,
                                  &Reqs.back()));
  };
  auto irecv = [&](void *Data, size_t Bytes, int From, int Tag, MPI_Comm C,
                   std::string What) {
    Reqs.push_back(MPI_REQUEST_NULL);
    check(MPI_Irecv(Data, count(Bytes), MPI_BYTE, From, Tag, C, &Reqs.back()));
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
        int(P.Seq % TagSpace) * 2 + (P.What == Posted::Coll ? 0 : 1);
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
                       std::to_string(P.Seq) + " from rank " +
                       std::to_string(Q);
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
  if (!mpiWait(Reqs, Statuses, Cls, Group))
    return; // aborted
  for (const Expect &E : Expected) {
    int Got = 0;
    MPI_Get_count(&Statuses[E.Request], MPI_BYTE, &Got);
    if (size_t(Got) != E.Bytes)
      fail("the " + E.What + " of " + Group() + " has " + std::to_string(Got) +
           " bytes; its receive wants " + std::to_string(E.Bytes));
  }
  for (size_t I = 0; I < Ops.size(); ++I) {
    const Posted &P = Ops[I];
    if (P.What != Posted::Coll)
      continue;
    const int N = P.Cl->Size, Me = P.Rank;
    const size_t Bytes = P.Count * typeBytes(P.Type);
    std::vector<const void *> Parts(N);
    for (int Q = 0; Q < N; ++Q) {
      const Header &H = Headers[I][Q];
      checkAgrees(P, CollKind(H[0]), size_t(H[1]), ncclDataType_t(H[2]),
                  ncclRedOp_t(H[3]), int(H[4]));
      Parts[Q] = Q != Me
                     ? static_cast<const void *>(From[I][Q].data())
                     : static_cast<const char *>(P.In) +
                           (P.Kind == CollKind::ReduceScatter ? Me * Bytes : 0);
    }
    std::vector<char> Result = collectiveResult(P, Parts);
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
      std::string L =
          "posted on stream " + std::to_string(streamOrdinal(S)) + ":";
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
/// P (its kind, and its peer or root and op, set) posted with its operands.
ncclResult_t postWith(Posted P, const void *In, void *Out, size_t Count,
                      ncclDataType_t T) {
  P.In = In;
  P.Out = Out;
  P.Count = Count;
  P.Type = T;
  return post(P);
}

ncclResult_t postCollective(CollKind K, const void *In, void *Out, size_t Count,
                            ncclDataType_t T, ncclRedOp_t Op, int Root,
                            ncclComm_t Comm, cudaStream_t S) {
  if (Op != ncclSum && Op != ncclMax)
    return ncclInvalidArgument;
  Posted P{Comm, S, Posted::Coll};
  P.Kind = K;
  P.Op = Op;
  P.Root = Root;
  return postWith(P, In, Out, Count, T);
}

/// A send (of In) or a receive (into Out) of Count elements with Peer.
ncclResult_t postMessage(Posted::WhatT What, const void *In, void *Out,
                         size_t Count, ncclDataType_t T, int Peer,
                         ncclComm_t Comm, cudaStream_t S) {
  Posted P{Comm, S, What};
  P.Peer = Peer;
  return postWith(P, In, Out, Count, T);
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
  return postMessage(Posted::Send, Data, nullptr, Count, T, Peer, Comm, S);
}

ncclResult_t ncclRecv(void *Data, size_t Count, ncclDataType_t T, int Peer,
                      ncclComm_t Comm, cudaStream_t S) {
  return postMessage(Posted::Recv, nullptr, Data, Count, T, Peer, Comm, S);
}
