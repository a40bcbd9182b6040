//===- Schedule.cpp - Pipeline schedules, verified and timed --------------===//
//
// Builds the GPipe, 1F1B and interleaved 1F1B schedules of Schedule.h,
// checks them by running every rank step by step, and times them.
//
//  - Building: first each rank's compute order (forwards and backwards) from
//    Megatron's formulas (warm-up count, then one forward and one backward,
//    then cool-down), cut into slots (one compute step; with interleaving,
//    a steady-state forward and its backward), then the communication:
//    before the first slot the receives it needs, after each slot one batch
//    of the sends of what it made and the receives of the next slot. This
//    is where Megatron's combined send_*_recv_* calls post them.
//  - Verifying: a static pass (ranges, peers, exactly-once compute, every
//    send paired with exactly one receive on its peer), then a simulation
//    in rounds: each rank runs until it blocks; a round in which no rank
//    moves while some are unfinished is a deadlock, reported with every
//    blocked rank's step. Data dependencies are checked as steps run, so a
//    schedule that would compute on a tensor it has not received is an
//    error too, not a silent race.
//  - Timing: the same rounds with clocks; sends are asynchronous.
//
//===----------------------------------------------------------------------===//
#include "lower/Schedule.h"
#include "support/Diagnostics.h"
#include "support/Format.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/Sequence.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

using namespace llvm;

namespace sp {

namespace {

/// One compute step before communication is placed. An interleaved
/// steady-state forward is Paired with the backward after it: the two form
/// one slot, and their communication goes around the pair, as Megatron's
/// interleaved schedule does (its non-interleaved one communicates around
/// each step).
struct Compute {
  StepKind Kind; // Forward, Backward or WeightGrad
  int Microbatch;
  int Chunk;
  bool Paired = false;
};

/// Rank R's forwards and backwards in order.
std::vector<Compute> computeOrder(ScheduleKind Kind, int P, int M, int N,
                                  int R, int Delay = 0) {
  std::vector<Compute> Order;
  switch (Kind) {
  case ScheduleKind::GPipe:
    // Microbatches in groups of P, each group through every chunk before
    // the next: the interleaved order with everything in warm-up, so that
    // the activation coming back round from rank P - 1 to rank 0 finds
    // rank 0 ready for it (chunk-major order would make it wait behind all
    // N forwards of chunk 0, which only buffered sends survive).
    for (int G = 0; G < N; G += P)
      for (int C = 0; C < M; ++C)
        for (int K = G; K < std::min(G + P, N); ++K)
          Order.push_back({StepKind::Forward, K, C});
    for (int G = 0; G < N; G += P)
      for (int C = M - 1; C >= 0; --C)
        for (int K = G; K < std::min(G + P, N); ++K)
          Order.push_back({StepKind::Backward, K, C});
    return Order;
  case ScheduleKind::OneFOneB: {
    int Warmup = std::min(P - R - 1, N);
    int Remaining = N - Warmup;
    for (int K = 0; K < Warmup; ++K)
      Order.push_back({StepKind::Forward, K, 0});
    for (int I = 0; I < Remaining; ++I) {
      Order.push_back({StepKind::Forward, Warmup + I, 0});
      Order.push_back({StepKind::Backward, I, 0});
    }
    for (int I = Remaining; I < N; ++I)
      Order.push_back({StepKind::Backward, I, 0});
    return Order;
  }
  case ScheduleKind::ZeroBubbleH1: {
    // 1F1B's order, each backward followed by the W of the microbatch D
    // backwards before it, the last D W's at the end.
    std::vector<Compute> Order1F1B =
        computeOrder(ScheduleKind::OneFOneB, P, 1, N, R);
    for (const Compute &C : Order1F1B) {
      Order.push_back(C);
      if (C.Kind == StepKind::Backward && C.Microbatch >= Delay)
        Order.push_back({StepKind::WeightGrad, C.Microbatch - Delay, 0});
    }
    for (int K = N - Delay; K < N; ++K)
      Order.push_back({StepKind::WeightGrad, K, 0});
    return Order;
  }
  case ScheduleKind::Interleaved: {
    // The k-th forward (backward) of the rank, as Megatron's
    // get_model_chunk_id numbers them; each chunk sees its microbatches in
    // order, P at a time.
    int Group = P * M, Total = N * M;
    auto Microbatch = [&](int K) { return K / Group * P + K % P; };
    auto ChunkOf = [&](int K, bool Backward) {
      int C = K % Group / P;
      return Backward ? M - 1 - C : C;
    };
    int Warmup = N == P ? Total
                        : std::min((P - R - 1) * 2 + (M - 1) * P, Total);
    int Remaining = Total - Warmup;
    auto F = [&](int K) {
      Order.push_back({StepKind::Forward, Microbatch(K), ChunkOf(K, false)});
    };
    auto B = [&](int K) {
      Order.push_back({StepKind::Backward, Microbatch(K), ChunkOf(K, true)});
    };
    for (int K = 0; K < Warmup; ++K)
      F(K);
    for (int I = 0; I < Remaining; ++I) {
      F(Warmup + I);
      Order.back().Paired = true;
      B(I);
    }
    for (int I = Remaining; I < Total; ++I)
      B(I);
    return Order;
  }
  }
  llvm_unreachable("unknown schedule kind");
}

/// A message: the activation or the gradient of one microbatch leaving one
/// stage. Packed into an integer key.
int64_t messageKey(const Schedule &S, bool Grad, int Microbatch,
                   int FromStage) {
  return (int64_t(Microbatch) * S.numStages() + FromStage) * 2 + (Grad ? 1 : 0);
}

/// The message a communication step sends or receives.
int64_t messageOf(const Schedule &S, int Rank, const ScheduleStep &St) {
  int V = S.stageOf(Rank, St.Chunk);
  switch (St.Kind) {
  case StepKind::SendActivation:
    return messageKey(S, false, St.Microbatch, V);
  case StepKind::RecvActivation:
    return messageKey(S, false, St.Microbatch, V - 1);
  case StepKind::SendGrad:
    return messageKey(S, true, St.Microbatch, V);
  case StepKind::RecvGrad:
    return messageKey(S, true, St.Microbatch, V + 1);
  case StepKind::Forward:
  case StepKind::Backward:
  case StepKind::WeightGrad:
    break;
  }
  llvm_unreachable("compute steps carry no message");
}

/// The stage at the other end of a communication step, or -1 when there is
/// none (a send past the last stage, a receive before the first).
int peerStage(const Schedule &S, int Rank, const ScheduleStep &St) {
  int V = S.stageOf(Rank, St.Chunk);
  int Other = St.Kind == StepKind::SendActivation || St.Kind == StepKind::RecvGrad
                  ? V + 1
                  : V - 1;
  return Other >= 0 && Other < S.numStages() ? Other : -1;
}

std::string where(const Schedule &S, int Rank, int Index) {
  return formatv("rank {0} step {1} ({2})", Rank, Index,
                 describeStep(S, Rank, S.Steps[Rank][Index]))
      .str();
}

/// Static checks: shape, ranges, peers, exactly-once compute and sends, and
/// a receive for every send on its peer (and the converse).
Error checkStatic(const Schedule &S) {
  if (S.Ranks < 1 || S.Chunks < 1 || S.Microbatches < 1)
    return makeError(formatv("schedule has {0} ranks, {1} chunks and {2} "
                             "microbatches; each must be at least 1",
                             S.Ranks, S.Chunks, S.Microbatches));
  if (int(S.Steps.size()) != S.Ranks)
    return makeError(formatv("schedule of {0} ranks lists steps for {1}",
                             S.Ranks, S.Steps.size()));
  int V = S.numStages(), N = S.Microbatches;
  std::vector<int> Fwd(size_t(N) * V, 0), Bwd(size_t(N) * V, 0),
      Wgt(size_t(N) * V, 0);
  // Where each message is sent and received (rank, step), -1: nowhere.
  // Message keys are dense (messageKey), below 2 N V.
  std::vector<std::pair<int, int>> SentAt(2 * size_t(N) * V, {-1, -1}),
      RecvAt(2 * size_t(N) * V, {-1, -1});
  for (int R = 0; R < S.Ranks; ++R) {
    for (int I = 0, E = S.Steps[R].size(); I < E; ++I) {
      const ScheduleStep &St = S.Steps[R][I];
      if (St.Microbatch < 0 || St.Microbatch >= N || St.Chunk < 0 ||
          St.Chunk >= S.Chunks)
        return makeError(formatv(
            "rank {0} step {1} names microbatch {2} chunk {3}; the schedule "
            "has microbatches 0-{4} and chunks 0-{5}",
            R, I, St.Microbatch, St.Chunk, N - 1, S.Chunks - 1));
      int Stage = S.stageOf(R, St.Chunk);
      size_t Slot = size_t(St.Microbatch) * V + Stage;
      if (St.isCompute()) {
        if (St.Kind == StepKind::WeightGrad && !S.splitsBackward())
          return makeError(
              formatv("{0}: the {1} schedule does not split the backward",
                      where(S, R, I), scheduleKindName(S.Kind)));
        int &Count = St.Kind == StepKind::Forward    ? Fwd[Slot]
                     : St.Kind == StepKind::Backward ? Bwd[Slot]
                                                     : Wgt[Slot];
        if (++Count > 1)
          return makeError(formatv("{0} runs a second time", where(S, R, I)));
        continue;
      }
      int Other = peerStage(S, R, St);
      if (Other < 0)
        return makeError(formatv("{0}: stage {1} has no neighbour that "
                                 "way (stages 0-{2})",
                                 where(S, R, I), Stage, V - 1));
      int PeerRank = S.rankOfStage(Other);
      if (PeerRank == R)
        return makeError(formatv(
            "{0}: stages {1} and {2} are both on rank {3}, which hands the "
            "tensor over locally",
            where(S, R, I), Stage, Other, R));
      if (St.Peer != PeerRank)
        return makeError(formatv("{0}: stage {1} is on rank {2}, not "
                                 "rank {3}",
                                 where(S, R, I), Other, PeerRank, St.Peer));
      int64_t Key = messageOf(S, R, St);
      auto &At = (St.isSend() ? SentAt : RecvAt)[Key];
      if (At.first >= 0)
        return makeError(formatv("{0} repeats {1}", where(S, R, I),
                                 where(S, At.first, At.second)));
      At = {R, I};
    }
  }
  for (int K = 0; K < N; ++K)
    for (int Stage = 0; Stage < V; ++Stage) {
      size_t Slot = size_t(K) * V + Stage;
      const char *Missing =
          !Fwd[Slot]                              ? "forward"
          : !Bwd[Slot]                            ? "backward"
          : S.splitsBackward() && !Wgt[Slot] ? "weight-gradient step"
                                                  : nullptr;
      if (Missing)
        return makeError(formatv(
            "rank {0} never runs the {1} of microbatch {2} chunk {3} "
            "(stage {4})",
            S.rankOfStage(Stage), Missing, K, S.chunkOfStage(Stage), Stage));
    }
  // Pairing, in rank and step order so the first mismatch reported is
  // stable.
  for (int R = 0; R < S.Ranks; ++R)
    for (int I = 0, E = S.Steps[R].size(); I < E; ++I) {
      const ScheduleStep &St = S.Steps[R][I];
      if (St.isCompute())
        continue;
      const auto &Other = St.isSend() ? RecvAt : SentAt;
      if (Other[messageOf(S, R, St)].first < 0)
        return makeError(formatv("{0} has no matching {1} on rank {2}",
                                 where(S, R, I), St.isSend() ? "recv" : "send",
                                 St.Peer));
    }
  return Error::success();
}

/// Runs every rank of a statically valid schedule in rounds. Model decides
/// when sends complete; the callbacks see each step as it runs.
class Simulator {
public:
  Simulator(const Schedule &S, CommModel Model) : S(S), Model(Model) {
    size_t Slots = size_t(S.Microbatches) * S.numStages();
    FwdDone.assign(Slots, false);
    BwdDone.assign(Slots, false);
    WgtDone.assign(Slots, false);
    Received.assign(2 * Slots, false);
    InFlight.assign(2 * Slots, {-1, -1});
    PC.assign(S.Ranks, 0);
    Done.resize(S.Ranks);
  }

  /// Called with (rank, step index) as each step completes, in an order
  /// that respects every dependency (the timing simulation's clock).
  std::function<void(int, int)> OnRun;

  Error run() {
    for (;;) {
      bool Progress = false;
      for (int R = 0; R < S.Ranks; ++R) {
        Expected<bool> Moved = advance(R);
        if (!Moved)
          return Moved.takeError();
        Progress |= *Moved;
      }
      if (Model == CommModel::Rendezvous) {
        Expected<bool> Matched = matchRendezvous();
        if (!Matched)
          return Matched.takeError();
        Progress |= *Matched;
      }
      bool Finished = all_of(seq(0, S.Ranks), [&](int R) {
        return PC[R] == int(S.Steps[R].size());
      });
      if (Finished)
        break;
      if (!Progress)
        return deadlock();
    }
    if (InFlightCount) {
      const auto &Where = *find_if(
          InFlight, [](const std::pair<int, int> &W) { return W.first >= 0; });
      return makeError(formatv("{0} is never received",
                               where(S, Where.first, Where.second)));
    }
    return Error::success();
  }

private:
  size_t slot(int Microbatch, int Stage) const {
    return size_t(Microbatch) * S.numStages() + Stage;
  }

  /// Data dependencies of a step about to run on rank R; a violation is an
  /// error of the schedule, not a wait.
  Error checkReady(int R, int I) {
    const ScheduleStep &St = S.Steps[R][I];
    int V = S.stageOf(R, St.Chunk), K = St.Microbatch;
    auto Missing = [&](const Twine &What) {
      return makeError(
          formatv("{0} runs before {1}", where(S, R, I), What.str()));
    };
    switch (St.Kind) {
    case StepKind::Forward:
      if (V > 0) {
        if (S.rankOfStage(V - 1) == R) {
          if (!FwdDone[slot(K, V - 1)])
            return Missing(formatv("the forward of stage {0}", V - 1));
        } else if (!Received[messageKey(S, false, K, V - 1)]) {
          return Missing("its input activation is received");
        }
      }
      return Error::success();
    case StepKind::Backward:
      if (!FwdDone[slot(K, V)])
        return Missing("its forward");
      if (V + 1 < S.numStages()) {
        if (S.rankOfStage(V + 1) == R) {
          if (!BwdDone[slot(K, V + 1)])
            return Missing(formatv("the backward of stage {0}", V + 1));
        } else if (!Received[messageKey(S, true, K, V + 1)]) {
          return Missing("its output gradient is received");
        }
      }
      return Error::success();
    case StepKind::WeightGrad:
      return BwdDone[slot(K, V)] ? Error::success()
                                 : Missing("its backward");
    case StepKind::SendActivation:
      return FwdDone[slot(K, V)] ? Error::success()
                                 : Missing("the forward that makes it");
    case StepKind::SendGrad:
      return BwdDone[slot(K, V)] ? Error::success()
                                 : Missing("the backward that makes it");
    case StepKind::RecvActivation:
    case StepKind::RecvGrad:
      return Error::success();
    }
    llvm_unreachable("unknown step kind");
  }

  void complete(int R, int I) {
    const ScheduleStep &St = S.Steps[R][I];
    int V = S.stageOf(R, St.Chunk);
    switch (St.Kind) {
    case StepKind::Forward:
      FwdDone[slot(St.Microbatch, V)] = true;
      break;
    case StepKind::Backward:
      BwdDone[slot(St.Microbatch, V)] = true;
      break;
    case StepKind::WeightGrad:
      WgtDone[slot(St.Microbatch, V)] = true;
      break;
    case StepKind::SendActivation:
    case StepKind::SendGrad:
      break;
    case StepKind::RecvActivation:
    case StepKind::RecvGrad:
      Received[messageOf(S, R, St)] = true;
      break;
    }
    if (OnRun)
      OnRun(R, I);
  }

  /// End of the batch of communication steps starting at I.
  int batchEnd(int R, int I) const {
    const auto &Steps = S.Steps[R];
    while (I < int(Steps.size()) && !Steps[I].isCompute())
      ++I;
    return I;
  }

  /// Runs rank R as far as it can go alone. Under rendezvous, it stops at
  /// a batch of communication steps, which matchRendezvous completes.
  Expected<bool> advance(int R) {
    bool Moved = false;
    const auto &Steps = S.Steps[R];
    while (PC[R] < int(Steps.size())) {
      int I = PC[R];
      const ScheduleStep &St = Steps[I];
      if (St.isCompute()) {
        if (Error E = checkReady(R, I))
          return E;
        complete(R, I);
        ++PC[R];
        Moved = true;
        continue;
      }
      if (Model == CommModel::Rendezvous) {
        if (Done[R].empty()) { // post the batch
          int End = batchEnd(R, I);
          for (int J = I; J < End; ++J)
            if (Error E = checkReady(R, J))
              return E;
          Done[R].assign(End - I, false);
        }
        break;
      }
      // Buffered: a send deposits its message, a receive takes it.
      if (Error E = checkReady(R, I))
        return E;
      int64_t Key = messageOf(S, R, St);
      if (St.isSend()) {
        if (InFlight[Key].first < 0) {
          InFlight[Key] = {R, I};
          ++InFlightCount;
        }
      } else {
        if (InFlight[Key].first < 0)
          break;
        InFlight[Key] = {-1, -1};
        --InFlightCount;
      }
      complete(R, I);
      ++PC[R];
      Moved = true;
    }
    return Moved;
  }

  /// Completes every pair of posted, matching rendezvous operations, and
  /// moves the ranks whose batch is then complete past it.
  Expected<bool> matchRendezvous() {
    bool Moved = false;
    for (int R = 0; R < S.Ranks; ++R) {
      if (Done[R].empty())
        continue;
      for (int J = 0, E = Done[R].size(); J < E; ++J) {
        const ScheduleStep &St = S.Steps[R][PC[R] + J];
        if (Done[R][J] || !St.isSend())
          continue;
        int Q = St.Peer;
        if (Done[Q].empty())
          continue;
        int64_t Key = messageOf(S, R, St);
        for (int JQ = 0, EQ = Done[Q].size(); JQ < EQ; ++JQ) {
          const ScheduleStep &Other = S.Steps[Q][PC[Q] + JQ];
          if (Done[Q][JQ] || !Other.isRecv() || Other.Peer != R ||
              messageOf(S, Q, Other) != Key)
            continue;
          Done[R][J] = Done[Q][JQ] = true;
          complete(R, PC[R] + J);
          complete(Q, PC[Q] + JQ);
          Moved = true;
          break;
        }
      }
    }
    for (int R = 0; R < S.Ranks; ++R)
      if (!Done[R].empty() && all_of(Done[R], [](bool B) { return B; })) {
        PC[R] += Done[R].size();
        Done[R].clear();
        Moved = true;
      }
    return Moved;
  }

  Error deadlock() const {
    std::string Msg = "deadlock:";
    bool First = true;
    for (int R = 0; R < S.Ranks; ++R) {
      int I = PC[R];
      if (I == int(S.Steps[R].size()))
        continue;
      Msg += First ? " " : "; ";
      First = false;
      // Under rendezvous the rank waits on its whole batch: name every
      // operation of it still pending.
      SmallVector<int, 4> Pending;
      if (!Done[R].empty()) {
        for (int J = 0, E = Done[R].size(); J < E; ++J)
          if (!Done[R][J])
            Pending.push_back(I + J);
      } else {
        Pending.push_back(I);
      }
      Msg += formatv("rank {0} is stuck at step {1} (", R, Pending.front());
      for (int J = 0, E = Pending.size(); J < E; ++J) {
        const ScheduleStep &St = S.Steps[R][Pending[J]];
        if (J)
          Msg += formatv(", step {0}: ", Pending[J]);
        Msg += describeStep(S, R, St);
      }
      Msg += ")";
    }
    return makeError(Msg);
  }

  const Schedule &S;
  CommModel Model;
  std::vector<bool> FwdDone, BwdDone, WgtDone;
  /// By message key (messageKey: dense, below 2 N V).
  std::vector<bool> Received;
  /// Buffered: messages sent and not yet received, with their send step
  /// ((-1, -1): none), and how many there are.
  std::vector<std::pair<int, int>> InFlight;
  size_t InFlightCount = 0;
  std::vector<int> PC;
  /// Rendezvous: which operations of the rank's posted batch completed;
  /// empty when the rank has no batch posted.
  std::vector<std::vector<bool>> Done;
};

} // namespace

StringRef scheduleKindName(ScheduleKind K) {
  switch (K) {
  case ScheduleKind::GPipe:
    return "gpipe";
  case ScheduleKind::OneFOneB:
    return "1f1b";
  case ScheduleKind::Interleaved:
    return "interleaved";
  case ScheduleKind::ZeroBubbleH1:
    return "zb1p";
  }
  llvm_unreachable("unknown schedule kind");
}

std::string describeStep(const Schedule &S, int Rank, const ScheduleStep &St) {
  int Stage = S.stageOf(Rank, St.Chunk);
  const char *What = "";
  const char *Dir = "";
  switch (St.Kind) {
  case StepKind::Forward:
    What = "forward";
    break;
  case StepKind::Backward:
    What = "backward";
    break;
  case StepKind::WeightGrad:
    What = "weight gradients";
    break;
  case StepKind::SendActivation:
    What = "send activation";
    Dir = "to";
    break;
  case StepKind::RecvActivation:
    What = "recv activation";
    Dir = "from";
    break;
  case StepKind::SendGrad:
    What = "send gradient";
    Dir = "to";
    break;
  case StepKind::RecvGrad:
    What = "recv gradient";
    Dir = "from";
    break;
  }
  // llvm::format (printf), not formatv: the chart labels every step.
  std::string D;
  raw_string_ostream OS(D);
  OS << format("%s of microbatch %d chunk %d (stage %d)", What, St.Microbatch,
               St.Chunk, Stage);
  if (!St.isCompute())
    OS << format(" %s rank %d", Dir, St.Peer);
  return OS.str();
}

Expected<Schedule> buildSchedule(ScheduleKind Kind, int P, int M,
                                 int Microbatches, ArrayRef<int> WeightDelays) {
  int N = Microbatches;
  if (P < 1)
    return makeError(
        formatv("a pipeline needs at least 1 rank, got P = {0}", P));
  if (M < 1)
    return makeError(formatv(
        "a pipeline needs at least 1 model chunk per rank, got M = {0}", M));
  if (N < 1)
    return makeError(
        formatv("a pipeline needs at least 1 microbatch, got {0}", N));
  if ((Kind == ScheduleKind::OneFOneB || Kind == ScheduleKind::ZeroBubbleH1) &&
      M != 1)
    return makeError(formatv(
        "the {1} schedule runs 1 model chunk per rank, got M = {0}; use "
        "the interleaved schedule for {0} chunks per rank",
        M, scheduleKindName(Kind)));
  if (Kind == ScheduleKind::Interleaved) {
    if (M < 2)
      return makeError(formatv(
          "the interleaved schedule needs at least 2 model chunks per rank, "
          "got M = {0}; use M >= 2, or the 1f1b schedule for 1 chunk",
          M));
    if (N % P != 0) {
      int Lower = N / P * P, Upper = Lower + P;
      std::string Use = Lower > 0 ? formatv("{0} or {1}", Lower, Upper).str()
                                  : formatv("{0}", Upper).str();
      return makeError(formatv(
          "the interleaved schedule needs the number of microbatches to be "
          "a multiple of P = {0}, got {1}; use {2} microbatches",
          P, N, Use));
    }
  }
  if (!WeightDelays.empty()) {
    if (Kind != ScheduleKind::ZeroBubbleH1)
      return makeError(formatv("the {0} schedule does not split the "
                               "backward; it takes no weight delays",
                               scheduleKindName(Kind)));
    if (int(WeightDelays.size()) != P)
      return makeError(
          formatv("{0} weight delays for {1} ranks", WeightDelays.size(), P));
    for (int R = 0; R < P; ++R)
      if (WeightDelays[R] < 0 || WeightDelays[R] > N)
        return makeError(formatv("rank {0}'s weight delay {1} is outside "
                                 "[0, {2}] (the microbatches)",
                                 R, WeightDelays[R], N));
  }
  Schedule S;
  S.Kind = Kind;
  S.Ranks = P;
  S.Chunks = M;
  S.Microbatches = N;
  S.Steps.resize(P);
  if (Kind == ScheduleKind::ZeroBubbleH1)
    for (int R = 0; R < P; ++R)
      S.WeightDelay.push_back(WeightDelays.empty() ? std::min(R, N)
                                                   : WeightDelays[R]);
  int V = P * M;
  for (int R = 0; R < P; ++R) {
    std::vector<ScheduleStep> &Out = S.Steps[R];
    auto Push = [&](StepKind K, const Compute &C, int Peer) {
      ScheduleStep St;
      St.Kind = K;
      St.Microbatch = C.Microbatch;
      St.Chunk = C.Chunk;
      St.Peer = Peer;
      Out.push_back(St);
    };
    // Slots: a compute step, or a paired forward and backward. Before the
    // first slot, the receives it needs; after each slot one batch: the
    // sends of what the slot made and the receives the next slot needs
    // (Megatron's send_forward_recv_forward, send_forward_backward_recv_
    // forward_backward, send_backward_recv_backward).
    std::vector<Compute> Order = computeOrder(
        Kind, P, M, N, R, S.WeightDelay.empty() ? 0 : S.WeightDelay[R]);
    SmallVector<std::pair<size_t, size_t>, 64> Slots;
    for (size_t I = 0; I < Order.size();) {
      size_t End = Order[I].Paired ? I + 2 : I + 1;
      Slots.push_back({I, std::min(End, Order.size())});
      I = End;
    }
    auto Neighbour = [&](const Compute &C, int Delta) {
      int Other = S.stageOf(R, C.Chunk) + Delta;
      if (Other < 0 || Other >= V || S.rankOfStage(Other) == R)
        return -1;
      return S.rankOfStage(Other);
    };
    // A weight-gradient step neither receives nor sends.
    auto Recvs = [&](size_t Slot) {
      for (size_t I = Slots[Slot].first; I < Slots[Slot].second; ++I) {
        const Compute &C = Order[I];
        if (C.Kind == StepKind::WeightGrad)
          continue;
        bool Backward = C.Kind == StepKind::Backward;
        int Peer = Neighbour(C, Backward ? 1 : -1);
        if (Peer >= 0)
          Push(Backward ? StepKind::RecvGrad : StepKind::RecvActivation, C,
               Peer);
      }
    };
    auto Sends = [&](size_t Slot) {
      for (size_t I = Slots[Slot].first; I < Slots[Slot].second; ++I) {
        const Compute &C = Order[I];
        if (C.Kind == StepKind::WeightGrad)
          continue;
        bool Backward = C.Kind == StepKind::Backward;
        int Peer = Neighbour(C, Backward ? -1 : 1);
        if (Peer >= 0)
          Push(Backward ? StepKind::SendGrad : StepKind::SendActivation, C,
               Peer);
      }
    };
    if (!Slots.empty())
      Recvs(0);
    for (size_t Slot = 0; Slot < Slots.size(); ++Slot) {
      for (size_t I = Slots[Slot].first; I < Slots[Slot].second; ++I)
        Push(Order[I].Kind, Order[I], -1);
      Sends(Slot);
      if (Slot + 1 < Slots.size())
        Recvs(Slot + 1);
    }
  }
  return S;
}

Error verifySchedule(const Schedule &S, CommModel Model) {
  if (Error E = checkStatic(S))
    return E;
  Simulator Sim(S, Model);
  return Sim.run();
}

int maxInFlight(const Schedule &S, int Rank) {
  assert(Rank >= 0 && Rank < S.Ranks && "rank out of range");
  int Live = 0, Max = 0;
  for (const ScheduleStep &St : S.Steps[Rank]) {
    if (St.Kind == StepKind::Forward)
      Max = std::max(Max, ++Live);
    else if (S.endsMicrobatch(St))
      --Live;
  }
  return Max;
}

double ScheduleTimes::bubbleFraction() const {
  double Ideal = 0;
  for (double B : Busy)
    Ideal = std::max(Ideal, B);
  return Ideal > 0 ? (Makespan - Ideal) / Ideal : 0.0;
}

Expected<ScheduleTimes> simulateTimes(const Schedule &S,
                                      const StepCosts &Costs) {
  if (Error E = checkStatic(S))
    return E;
  int V = S.numStages();
  const std::pair<const char *, const SmallVectorImpl<double> *> Lists[] = {
      {"forward", &Costs.Forward},
      {"backward", &Costs.Backward},
      {"recompute", &Costs.Recompute},
      {"weight-gradient", &Costs.WeightGrad}};
  for (const auto &[Name, List] : Lists) {
    if (List->size() != 1 && int(List->size()) != V)
      return makeError(formatv(
          "{0} costs list {1} entries; give 1 for every stage or one per "
          "virtual stage ({2})",
          Name, List->size(), V));
    for (double C : *List)
      if (!std::isfinite(C) || C < 0)
        return makeError(formatv("{0} cost {1} is not a finite "
                                 "non-negative time",
                                 Name, generalNumber(C)));
  }
  if (!std::isfinite(Costs.Comm) || Costs.Comm < 0)
    return makeError(formatv("communication cost {0} is not a finite "
                             "non-negative time",
                             generalNumber(Costs.Comm)));
  auto Cost = [](ArrayRef<double> L, int Stage) {
    return L.size() == 1 ? L[0] : L[Stage];
  };

  ScheduleTimes T;
  T.Times.resize(S.Ranks);
  for (int R = 0; R < S.Ranks; ++R)
    T.Times[R].resize(S.Steps[R].size());
  T.Busy.assign(S.Ranks, 0.0);
  std::vector<double> Clock(S.Ranks, 0.0);
  // Message (messageKey) -> time the sender sent it.
  std::vector<double> SentAt(2 * size_t(S.Microbatches) * S.numStages(), 0.0);
  Simulator Sim(S, CommModel::Buffered);
  Sim.OnRun = [&](int R, int I) {
    const ScheduleStep &St = S.Steps[R][I];
    int Stage = S.stageOf(R, St.Chunk);
    TimedStep &TS = T.Times[R][I];
    double Now = Clock[R];
    switch (St.Kind) {
    case StepKind::Forward:
      TS.Start = Now;
      TS.End = Now + Cost(Costs.Forward, Stage);
      break;
    case StepKind::Backward:
      TS.Start = Now;
      TS.RecomputeEnd = Now + Cost(Costs.Recompute, Stage);
      TS.End = TS.RecomputeEnd + Cost(Costs.Backward, Stage);
      break;
    case StepKind::WeightGrad:
      TS.Start = Now;
      TS.End = Now + Cost(Costs.WeightGrad, Stage);
      break;
    case StepKind::SendActivation:
    case StepKind::SendGrad:
      TS.Start = TS.End = Now;
      SentAt[messageOf(S, R, St)] = Now;
      break;
    case StepKind::RecvActivation:
    case StepKind::RecvGrad: {
      double Sent = SentAt[messageOf(S, R, St)];
      TS.Start = std::max(Now, Sent);
      TS.End = std::max(Now, Sent + Costs.Comm);
      break;
    }
    }
    if (St.isCompute())
      T.Busy[R] += TS.End - TS.Start;
    Clock[R] = TS.End;
    T.Makespan = std::max(T.Makespan, TS.End);
  };
  if (Error E = Sim.run())
    return E;
  return T;
}

void printSchedule(const Schedule &S, raw_ostream &OS) {
  for (int R = 0; R < S.Ranks; ++R) {
    OS << "rank " << R << ":";
    for (const ScheduleStep &St : S.Steps[R]) {
      OS << ' ';
      switch (St.Kind) {
      case StepKind::Forward:
        OS << 'F';
        break;
      case StepKind::Backward:
        OS << 'B';
        break;
      case StepKind::WeightGrad:
        OS << 'W';
        break;
      case StepKind::SendActivation:
        OS << ">a";
        break;
      case StepKind::RecvActivation:
        OS << "<a";
        break;
      case StepKind::SendGrad:
        OS << ">g";
        break;
      case StepKind::RecvGrad:
        OS << "<g";
        break;
      }
      OS << St.Microbatch;
      if (S.Chunks > 1)
        OS << '.' << St.Chunk;
    }
    OS << '\n';
  }
}

} // namespace sp
