//===- ThreadCommunicator.cpp - N ranks as N threads of one process -------===//
//
// The ranks of a group share a Group: a generation-counted barrier (mutex +
// condition variable), one posted descriptor per rank, and a mailbox.
//
// A collective is two barriers. Each rank posts a descriptor (the call, its
// count and root, its buffer pointer, and the cause if its own arguments are
// bad) and waits in the first barrier; the last rank to arrive checks that
// all descriptors agree, so a mismatch or a bad argument on any rank becomes
// the same error on every rank instead of a hang or a race. Then every rank
// reads the others' buffers and computes its own result (reductions add in
// rank order, so every rank gets the same bits as a sequential sum over ranks
// 0..N-1), and waits in the second barrier before it writes an in-place
// result or returns, so no buffer is overwritten or reused while another
// rank still reads it. barrier() and split() are one barrier; split builds
// the new groups while the last rank holds the lock.
//
// Point to point: send copies the bytes into the mailbox under (source,
// destination, tag) and returns; recv blocks until a message is there.
//
// Abort: all groups split from the same createThreadCommunicators call share
// a Domain holding an abort flag. abort(Reason) sets it (the first reason
// wins) and wakes every waiter of every group; from then on, every waiting or
// later call on any rank returns "aborted by rank R: Reason" (R is the rank
// in the communicators from createThreadCommunicators). Lock order: a
// group's mutex, then the domain's; abort takes the domain's alone and
// releases it before it locks the groups.
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/CommSupport.h"
#include "runtime/comm/Communicator.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>
#include <atomic>
#include <cassert>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

using namespace llvm;

namespace sp {
namespace {

struct Group;

/// What every group split from one createThreadCommunicators call shares.
struct Domain {
  std::atomic<bool> Aborted{false};
  std::mutex M;
  std::string Reason;                      // guarded by M, set once
  std::vector<std::weak_ptr<Group>> Groups; // guarded by M, to wake on abort

  void addGroup(const std::shared_ptr<Group> &G) {
    std::lock_guard<std::mutex> L(M);
    llvm::erase_if(Groups, [](const std::weak_ptr<Group> &W) {
      return W.expired();
    });
    Groups.push_back(G);
  }

  void abort(int Rank, StringRef Why);

  std::string reason() {
    std::lock_guard<std::mutex> L(M);
    return Reason;
  }
};

enum class OpKind {
  AllReduceSum,
  AllReduceMax,
  AllGather,
  ReduceScatterSum,
  Broadcast,
  Barrier,
  Split,
};

StringRef opName(OpKind K) {
  switch (K) {
  case OpKind::AllReduceSum:
    return "allReduceSum";
  case OpKind::AllReduceMax:
    return "allReduceMax";
  case OpKind::AllGather:
    return "allGather";
  case OpKind::ReduceScatterSum:
    return "reduceScatterSum";
  case OpKind::Broadcast:
    return "broadcast";
  case OpKind::Barrier:
    return "barrier";
  case OpKind::Split:
    return "split";
  }
  llvm_unreachable("unknown collective");
}

/// One rank's side of a collective, posted in the first barrier.
struct OpDesc {
  OpKind Kind = OpKind::Barrier;
  int64_t Count = 0; // elements, or bytes for broadcast
  CommType Type = CommType::F32; // the element type of the collectives
  int Root = 0;      // broadcast
  int Color = 0, Key = 0; // split
  const void *In = nullptr;
  std::string Problem; // this rank's bad argument, if any

  std::string describe() const {
    switch (Kind) {
    case OpKind::Barrier:
    case OpKind::Split:
      return opName(Kind).str();
    case OpKind::Broadcast:
      return formatv("broadcast({0} bytes, root {1})", Count, Root).str();
    default:
      return formatv("{0}({1}) of {2} elements", opName(Kind),
                     commTypeName(Type), Count)
          .str();
    }
  }
};

/// The shared state of one communicator's ranks.
struct Group {
  Group(std::shared_ptr<Domain> Dom, int Size)
      : Dom(std::move(Dom)), Size(Size), Here(Size), Posted(Size),
        SplitGroups(Size), SplitRanks(Size) {}

  const std::shared_ptr<Domain> Dom;
  const int Size;

  std::mutex M;
  std::condition_variable BarrierCV;
  int Arrived = 0;
  /// Which ranks have arrived at the pending barrier (for timeouts).
  std::vector<char> Here;
  uint64_t Generation = 0;
  std::vector<OpDesc> Posted;
  /// The outcome of the last checked barrier: empty, or the cause of the
  /// error every rank returns. Stable until every rank arrives again.
  std::string Problem;
  /// The result of the last split, by rank here.
  std::vector<std::shared_ptr<Group>> SplitGroups;
  std::vector<int> SplitRanks;

  std::condition_variable MailCV;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> Mail;
};

void Domain::abort(int Rank, StringRef Why) {
  std::vector<std::weak_ptr<Group>> ToWake;
  {
    std::lock_guard<std::mutex> L(M);
    if (Aborted.load())
      return;
    Reason = formatv("aborted by rank {0}: {1}", Rank, Why).str();
    Aborted.store(true);
    ToWake = Groups;
  }
  // Locking each group's mutex before notifying means a rank that checked
  // the flag just before it was set is already waiting and gets woken.
  for (const std::weak_ptr<Group> &W : ToWake) {
    if (std::shared_ptr<Group> G = W.lock()) {
      std::lock_guard<std::mutex> L(G->M);
      G->BarrierCV.notify_all();
      G->MailCV.notify_all();
    }
  }
}

/// The cause every rank reports for the first barrier of a collective, or
/// empty when all ranks posted the same call with good arguments.
std::string checkPosted(const std::vector<OpDesc> &Posted) {
  for (size_t R = 0; R < Posted.size(); ++R)
    if (!Posted[R].Problem.empty())
      return formatv("rank {0}: {1}", R, Posted[R].Problem).str();
  const OpDesc &First = Posted[0];
  for (size_t R = 1; R < Posted.size(); ++R) {
    const OpDesc &D = Posted[R];
    if (D.Kind != First.Kind || D.Count != First.Count ||
        D.Type != First.Type || D.Root != First.Root)
      return formatv("collective mismatch: rank 0 called {0} but rank {1} "
                     "called {2}",
                     First.describe(), R, D.describe())
          .str();
  }
  return "";
}

class ThreadCommunicator final : public Communicator {
public:
  ThreadCommunicator(std::shared_ptr<Group> G, int Rank, int RootRank)
      : G(std::move(G)), Rank(Rank), RootRank(RootRank) {}

  int rank() const override { return Rank; }
  int size() const override { return G->Size; }
  std::string name() const override {
    return formatv("thread {0}/{1}", Rank, G->Size).str();
  }

  using Communicator::allGather;
  using Communicator::allReduceSum;
  using Communicator::reduceScatterSum;

  Error allReduceSum(void *Data, int64_t Count, CommType T) override {
    StringRef Op = "allReduceSum";
    int64_t B = commTypeBytes(T);
    OpDesc D = desc(OpKind::AllReduceSum, Count, Data, T);
    D.Problem = comm::checkBuffer("data", Data, Count, B);
    if (Error E = arrive(Op, &D))
      return E;
    // Every rank reduces all inputs in rank order into its own scratch, and
    // writes its buffer only after everyone has read it.
    Scratch.resize(std::max<int64_t>(Count, 0) * B);
    comm::sumInRankOrder(T, Scratch.data(), posted(0), Count);
    if (Error E = arrive(Op, nullptr))
      return E;
    if (Count > 0)
      std::memcpy(Data, Scratch.data(), Count * B);
    return Error::success();
  }

  Error allReduceMax(float *Data, int64_t Count) override {
    StringRef Op = "allReduceMax";
    OpDesc D = desc(OpKind::AllReduceMax, Count, Data, CommType::F32);
    D.Problem = comm::checkBuffer("data", Data, Count, 4);
    if (Error E = arrive(Op, &D))
      return E;
    Scratch.resize(std::max<int64_t>(Count, 0) * 4);
    float *Max = reinterpret_cast<float *>(Scratch.data());
    if (Count > 0) {
      std::memcpy(Max, G->Posted[0].In, Count * 4);
      for (int R = 1; R < G->Size; ++R)
        comm::accumulateMax(Max, static_cast<const float *>(G->Posted[R].In),
                            Count);
    }
    if (Error E = arrive(Op, nullptr))
      return E;
    if (Count > 0)
      std::memcpy(Data, Max, Count * 4);
    return Error::success();
  }

  Error allGather(void *Out, const void *In, int64_t Count,
                  CommType T) override {
    StringRef Op = "allGather";
    int64_t B = commTypeBytes(T);
    OpDesc D = desc(OpKind::AllGather, Count, In, T);
    D.Problem = comm::checkInOut(Out, Count * G->Size, In, Count, B);
    if (Error E = arrive(Op, &D))
      return E;
    if (Count > 0)
      for (int R = 0; R < G->Size; ++R)
        std::memcpy(static_cast<char *>(Out) + R * Count * B,
                    G->Posted[R].In, Count * B);
    return arrive(Op, nullptr);
  }

  Error reduceScatterSum(void *Out, const void *In, int64_t Count,
                         CommType T) override {
    StringRef Op = "reduceScatterSum";
    int64_t B = commTypeBytes(T);
    OpDesc D = desc(OpKind::ReduceScatterSum, Count, In, T);
    D.Problem = comm::checkInOut(Out, Count, In, Count * G->Size, B);
    if (Error E = arrive(Op, &D))
      return E;
    // Out is this rank's own and nobody else reads it: sum into it directly.
    comm::sumInRankOrder(T, Out, posted(Rank * Count * B), Count);
    return arrive(Op, nullptr);
  }

  Error broadcast(void *Data, int64_t Bytes, int Root) override {
    StringRef Op = "broadcast";
    OpDesc D = desc(OpKind::Broadcast, Bytes, Data);
    D.Root = Root;
    D.Problem =
        comm::firstProblem({comm::checkBuffer("data", Data, Bytes),
                            comm::checkRank("root", Root, G->Size)});
    if (Error E = arrive(Op, &D))
      return E;
    if (Rank != Root && Bytes > 0)
      std::memcpy(Data, G->Posted[Root].In, Bytes);
    return arrive(Op, nullptr);
  }

  Error send(const void *Data, int64_t Bytes, int Peer, int Tag) override {
    StringRef Op = "send";
    if (Error E =
            local(Op, comm::checkMessage(Data, Bytes, Peer, Tag, G->Size)))
      return E;
    const char *Bytes0 = static_cast<const char *>(Data);
    std::vector<char> Message(Bytes0, Bytes0 + Bytes);
    std::lock_guard<std::mutex> L(G->M);
    G->Mail[{Rank, Peer, Tag}].push_back(std::move(Message));
    G->MailCV.notify_all();
    return Error::success();
  }

  Error recv(void *Data, int64_t Bytes, int Peer, int Tag) override {
    StringRef Op = "recv";
    if (Error E =
            local(Op, comm::checkMessage(Data, Bytes, Peer, Tag, G->Size)))
      return E;
    std::unique_lock<std::mutex> L(G->M);
    auto Key = std::make_tuple(Peer, Rank, Tag);
    bool Woken = G->MailCV.wait_for(L, Timeout, [&] {
      if (G->Dom->Aborted.load())
        return true;
      auto It = G->Mail.find(Key);
      return It != G->Mail.end() && !It->second.empty();
    });
    if (!Woken) {
      std::string Cause = timeoutCause(
          Op, formatv("a message from rank {0} with tag {1}", Peer, Tag).str());
      L.unlock();
      G->Dom->abort(RootRank, Cause);
      return comm::makeError(*this, Op, G->Dom->reason());
    }
    if (G->Dom->Aborted.load())
      return comm::makeError(*this, Op, G->Dom->reason());
    auto It = G->Mail.find(Key);
    std::vector<char> Message = std::move(It->second.front());
    It->second.pop_front();
    if (It->second.empty())
      G->Mail.erase(It);
    L.unlock();
    if (static_cast<int64_t>(Message.size()) != Bytes)
      return comm::makeError(
          *this, Op,
          formatv("the message from rank {0} with tag {1} has {2} bytes, "
                  "expected {3}",
                  Peer, Tag, Message.size(), Bytes));
    if (Bytes > 0)
      std::memcpy(Data, Message.data(), Bytes);
    return Error::success();
  }

  Error barrier() override {
    OpDesc D = desc(OpKind::Barrier, 0, nullptr);
    return arrive("barrier", &D);
  }

  Expected<std::unique_ptr<Communicator>> split(int Color, int Key) override {
    StringRef Op = "split";
    OpDesc D = desc(OpKind::Split, 0, nullptr);
    D.Color = Color;
    D.Key = Key;
    D.Problem = comm::checkColor(Color);
    if (Error E = arrive(Op, &D, [this] { formGroups(); }))
      return E;
    std::lock_guard<std::mutex> L(G->M);
    auto C = std::make_unique<ThreadCommunicator>(G->SplitGroups[Rank],
                                                  G->SplitRanks[Rank], RootRank);
    C->setTimeout(Timeout);
    return C;
  }

  void abort(StringRef Reason) override { G->Dom->abort(RootRank, Reason); }

private:
  OpDesc desc(OpKind Kind, int64_t Count, const void *In,
              CommType Type = CommType::F32) const {
    OpDesc D;
    D.Kind = Kind;
    D.Count = Count;
    D.Type = Type;
    D.In = In;
    return D;
  }

  /// Every rank's posted input, Offset bytes in.
  SmallVector<const void *, 8> posted(int64_t Offset) const {
    SmallVector<const void *, 8> In;
    for (const OpDesc &D : G->Posted)
      In.push_back(static_cast<const char *>(D.In) + Offset);
    return In;
  }

  /// The checks of a call that involves no other rank.
  Error local(StringRef Op, const std::string &Problem) const {
    if (G->Dom->Aborted.load())
      return comm::makeError(*this, Op, G->Dom->reason());
    if (!Problem.empty())
      return comm::makeError(*this, Op, Problem);
    return Error::success();
  }

  /// Waits until every rank of the group has arrived. With a descriptor
  /// (the first barrier of a call), posts it, and the last rank to arrive
  /// checks all of them and then runs OnComplete (under the lock) if they
  /// agree; every rank returns the same error if they do not. Returns an
  /// error if the domain is aborted before the barrier completes.
  Error arrive(StringRef Op, const OpDesc *D,
               function_ref<void()> OnComplete = nullptr) {
    std::unique_lock<std::mutex> L(G->M);
    if (G->Dom->Aborted.load())
      return comm::makeError(*this, Op, G->Dom->reason());
    if (D)
      G->Posted[Rank] = *D;
    uint64_t Generation = G->Generation;
    G->Here[Rank] = 1;
    if (++G->Arrived == G->Size) {
      G->Arrived = 0;
      std::fill(G->Here.begin(), G->Here.end(), 0);
      if (D) {
        G->Problem = checkPosted(G->Posted);
        if (G->Problem.empty() && OnComplete)
          OnComplete();
      }
      ++G->Generation;
      G->BarrierCV.notify_all();
    } else {
      bool Woken = G->BarrierCV.wait_for(L, Timeout, [&] {
        return G->Generation != Generation || G->Dom->Aborted.load();
      });
      if (!Woken) {
        // The ranks that never came: give up on the job for all.
        std::string Missing;
        int Count = 0;
        for (int R = 0; R < G->Size; ++R)
          if (!G->Here[R]) {
            Missing += (Count++ ? ", " : "") + std::to_string(R);
          }
        std::string Cause = timeoutCause(
            Op, formatv("rank{0} {1} (of {2})", Count > 1 ? "s" : "", Missing,
                        G->Size)
                    .str());
        L.unlock();
        G->Dom->abort(RootRank, Cause);
        return comm::makeError(*this, Op, G->Dom->reason());
      }
      if (G->Generation == Generation)
        return comm::makeError(*this, Op, G->Dom->reason());
    }
    if (D && !G->Problem.empty())
      return comm::makeError(*this, Op, G->Problem);
    return Error::success();
  }

  /// split's completion, run by the last rank under the group's lock: one
  /// new group per color, ranks ordered by (key, rank here).
  void formGroups() {
    std::map<int, std::vector<std::pair<int, int>>> Members; // color -> (key, rank)
    for (int R = 0; R < G->Size; ++R)
      Members[G->Posted[R].Color].push_back({G->Posted[R].Key, R});
    for (auto &[Color, List] : Members) {
      llvm::sort(List);
      auto New = std::make_shared<Group>(G->Dom, static_cast<int>(List.size()));
      G->Dom->addGroup(New);
      for (size_t I = 0; I < List.size(); ++I) {
        G->SplitGroups[List[I].second] = New;
        G->SplitRanks[List[I].second] = static_cast<int>(I);
      }
    }
  }

  std::shared_ptr<Group> G;
  int Rank;
  int RootRank; // rank in the communicators of createThreadCommunicators
  /// The all-reduces' result, written back after every rank has read.
  std::vector<char> Scratch;
};

} // namespace

std::vector<std::unique_ptr<Communicator>> createThreadCommunicators(int N) {
  assert(N >= 1 && "a thread communicator needs at least one rank");
  std::vector<std::unique_ptr<Communicator>> Comms;
  if (N < 1)
    return Comms;
  auto Dom = std::make_shared<Domain>();
  auto G = std::make_shared<Group>(Dom, N);
  Dom->addGroup(G);
  for (int R = 0; R < N; ++R)
    Comms.push_back(std::make_unique<ThreadCommunicator>(G, R, R));
  return Comms;
}

Error runOnThreadRanks(int N,
                       function_ref<Error(Communicator &)> Body) {
  if (N < 1)
    return createStringError(inconvertibleErrorCode(),
                             "runOnThreadRanks: %d ranks, need at least one",
                             N);
  std::vector<std::unique_ptr<Communicator>> Comms =
      createThreadCommunicators(N);
  std::vector<std::string> Failures(N);
  std::vector<char> Failed(N, 0); // not vector<bool>: one thread per element
  auto RunRank = [&](int R) {
    Communicator &C = *Comms[R];
    std::string Message;
    bool Ok = true;
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
    try {
#endif
      if (Error E = Body(C)) {
        Ok = false;
        Message = toString(std::move(E));
      }
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
    } catch (const std::exception &Ex) {
      Ok = false;
      Message = std::string("exception: ") + Ex.what();
    } catch (...) {
      Ok = false;
      Message = "unknown exception";
    }
#endif
    if (!Ok) {
      C.abort(Message);
      Failures[R] = std::move(Message);
      Failed[R] = 1;
    }
  };
  std::vector<std::thread> Threads;
  Threads.reserve(N);
  for (int R = 0; R < N; ++R)
    Threads.emplace_back(RunRank, R);
  for (std::thread &T : Threads)
    T.join();
  Error All = Error::success();
  for (int R = 0; R < N; ++R)
    if (Failed[R])
      All = joinErrors(std::move(All),
                       createStringError(inconvertibleErrorCode(),
                                         "rank %d: %s", R,
                                         Failures[R].c_str()));
  return All;
}

} // namespace sp
