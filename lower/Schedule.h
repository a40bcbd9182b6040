//===- Schedule.h - Pipeline schedules, verified and timed -----*- C++ -*-===//
//
// The order in which each pipeline rank runs the forwards and backwards of
// its model chunks over the microbatches of one training step, with the
// point-to-point sends and receives at the stage cuts written out. Pure
// data: the schedule pass unrolls it into per-rank programs, the verifier
// proves it cannot deadlock, the timing simulation draws it.
//
// Layout (Megatron's): P ranks, M model chunks per rank, V = P M virtual
// stages. Chunk c of rank r holds virtual stage v = c P + r, so virtual
// stage v lives on rank v mod P. The activation of a microbatch flows from
// stage v to v + 1, its gradient from v + 1 to v; the backward of the last
// stage follows its forward directly (it starts from the loss).
//
// Communication steps name the chunk of the rank that runs them: on rank r,
// SendActivation(k, c) sends the output of stage v = c P + r to stage v + 1,
// RecvActivation(k, c) receives the input of stage v from stage v - 1,
// SendGrad(k, c) sends the gradient of the input of stage v to v - 1 and
// RecvGrad(k, c) receives the gradient of the output of stage v from v + 1.
// Peer is the other rank, and redundant on purpose: the verifier checks it.
// Stages on the same rank (P = 1) hand activations over locally, with no
// communication steps.
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_SCHEDULE_H
#define SP_LOWER_SCHEDULE_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <string>
#include <vector>

namespace llvm {
class raw_ostream;
} // namespace llvm

namespace sp {

/// GPipe: every forward, then every backward (the reference, memory N).
/// OneFOneB: PipeDream-Flush, Megatron's non-interleaved schedule.
/// Interleaved: Megatron's interleaved 1F1B over M model chunks per rank.
/// ZeroBubbleH1: 1F1B with each backward split into its input-gradient part
/// (B) and its weight-gradient part (W), the W's of the later ranks moved
/// into the cool-down bubble (Qi et al., "Zero Bubble Pipeline
/// Parallelism", 2024: ZB-H1, 1F1B's peak memory).
enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubbleH1 };

llvm::StringRef scheduleKindName(ScheduleKind K); // "gpipe", "1f1b", ...

/// Backward is the whole backward of a stage, or with a split backward
/// (ZeroBubbleH1) its input-gradient part only: what the previous stage
/// waits for. WeightGrad is the rest, the weight gradients, which nothing
/// downstream waits for.
enum class StepKind : uint8_t {
  Forward,
  Backward,
  WeightGrad,
  SendActivation,
  RecvActivation,
  SendGrad,
  RecvGrad,
};

struct ScheduleStep {
  StepKind Kind = StepKind::Forward;
  int Microbatch = 0;
  int Chunk = 0; // model chunk on the rank that runs the step
  int Peer = -1; // the other rank of a send or receive; -1 for compute

  bool isCompute() const {
    return Kind == StepKind::Forward || Kind == StepKind::Backward ||
           Kind == StepKind::WeightGrad;
  }
  bool isSend() const {
    return Kind == StepKind::SendActivation || Kind == StepKind::SendGrad;
  }
  bool isRecv() const {
    return Kind == StepKind::RecvActivation || Kind == StepKind::RecvGrad;
  }
  friend bool operator==(const ScheduleStep &A, const ScheduleStep &B) {
    return A.Kind == B.Kind && A.Microbatch == B.Microbatch &&
           A.Chunk == B.Chunk && A.Peer == B.Peer;
  }
};

struct Schedule {
  ScheduleKind Kind = ScheduleKind::OneFOneB;
  int Ranks = 1;        // P
  int Chunks = 1;       // M model chunks (virtual stages) per rank
  int Microbatches = 1; // N
  /// ZeroBubbleH1: how many backwards rank r's weight-gradient steps lag
  /// behind (see buildSchedule); empty for the other kinds.
  std::vector<int> WeightDelay;
  /// Steps[r]: rank r's steps in program order.
  std::vector<std::vector<ScheduleStep>> Steps;

  int numStages() const { return Ranks * Chunks; }
  /// Whether every backward is split into a Backward and a WeightGrad step.
  bool splitsBackward() const { return Kind == ScheduleKind::ZeroBubbleH1; }
  /// The step after which a microbatch's activations of a stage are dead:
  /// its backward, or with a split backward its weight-gradient step.
  bool endsMicrobatch(const ScheduleStep &St) const {
    return St.Kind ==
           (splitsBackward() ? StepKind::WeightGrad : StepKind::Backward);
  }
  int stageOf(int Rank, int Chunk) const { return Chunk * Ranks + Rank; }
  int rankOfStage(int Stage) const { return Stage % Ranks; }
  int chunkOfStage(int Stage) const { return Stage / Ranks; }
};

/// "forward of microbatch 3 chunk 1 (stage 5)", "recv activation of
/// microbatch 0 chunk 0 from rank 2": the phrase diagnostics use.
std::string describeStep(const Schedule &S, int Rank, const ScheduleStep &St);

/// The schedule of Kind for P ranks, M chunks per rank, N microbatches.
///
///  - GPipe: every forward, then every backward. With M > 1 chunks the
///    microbatches go in groups of P, each group through every chunk (the
///    interleaved order, all of it warm-up).
///  - OneFOneB (M = 1): rank r runs W = min(P - r - 1, N) warm-up forwards,
///    then N - W pairs of one forward and one backward, then W cool-down
///    backwards (Megatron's forward_backward_pipelining_without_
///    interleaving).
///  - Interleaved (M >= 2, N a multiple of P): the rank's N M forwards, in
///    Megatron's order: the k-th runs chunk (k mod P M) / P on microbatch
///    (k / (P M)) P + k mod P, the k-th backward the chunk M - 1 - that.
///    Warm-up W = min((P - r - 1) 2 + (M - 1) P, N M), or all N M when
///    N = P; then N M - W forward/backward pairs, then W backwards
///    (forward_backward_pipelining_with_interleaving).
///  - ZeroBubbleH1 (M = 1): 1F1B's order of forwards and backwards (B), with
///    rank r's weight-gradient steps (W) delayed by D = min(r, N) backwards:
///    W of microbatch k follows B of microbatch k + D in the steady state
///    and in the cool-down, the last D run at the end. The last rank, which
///    in 1F1B idles longest at the end, thus fills that time with its W's;
///    rank r holds at most (P - r - 1) + 1 + D = P microbatches, the first
///    rank's count in 1F1B: with stages alike, the peak is 1F1B's. With
///    equal F, B and W costs the bubble is (P - 1) (F + B - W) against
///    1F1B's (P - 1) (F + B + W), as the paper derives (for N >= P and
///    W <= F). WeightDelays, when given, sets each rank's D instead
///    (0 <= D <= N; D = 0 runs each W right after its B): the compiler
///    lowers a rank's delay where the stages are not alike (the last one
///    holds the LM head, whose weight gradient keeps the logits' gradient
///    alive until its W) and the default would raise the rank's memory
///    above 1F1B's peak.
///
/// Communication goes where Megatron's goes: GPipe and 1F1B send right
/// after the step that makes a tensor and receive right before the step
/// that needs it (send_forward_recv_backward and friends); interleaved
/// treats a steady-state forward and the backward after it as one slot and
/// posts, after each slot, one batch with the slot's sends and the next
/// slot's receives (send_forward_backward_recv_forward_backward). Placing
/// the interleaved communication step by step instead deadlocks under
/// rendezvous: every rank ends up sending a gradient to a neighbour that is
/// itself sending.
llvm::Expected<Schedule> buildSchedule(ScheduleKind Kind, int P, int M,
                                       int Microbatches,
                                       llvm::ArrayRef<int> WeightDelays = {});

/// How a send completes, for the verifier.
///  - Rendezvous: a send completes only when its receiver has posted the
///    matching receive and vice versa (MPI's synchronous send, NCCL). The
///    consecutive communication steps of a rank (none of them compute) are
///    one batch: posted together, waited on together, as Megatron's
///    batch_isend_irecv. The strict model and the default.
///  - Buffered: a send never blocks (the thread communicator); a receive
///    waits until the matching message has been sent.
/// Messages match by (sender, receiver, kind, microbatch, stages), as the
/// tags of runtime/comm/Communicator.h do; order between them is free.
enum class CommModel { Rendezvous, Buffered };

/// Checks that S is a complete, executable schedule:
///  - every step names a valid microbatch, chunk, and the peer its stage's
///    neighbour lives on; sends and receives only at cuts between ranks;
///  - the forward and the backward of every (microbatch, stage) run exactly
///    once, on the stage's rank, and so does its weight-gradient step when
///    the schedule splits the backward (and no W step when it does not);
///  - simulating every rank under Model: a forward runs after its input
///    arrived (received, or the previous stage ran on this rank), a backward
///    after its own forward and after its output gradient arrived, a W
///    after its backward, a send
///    after the step that makes its tensor; every send is received;
///  - no deadlock: when no rank can move, the error names every blocked
///    rank, the step it is stuck on and whom it waits for.
llvm::Error verifySchedule(const Schedule &S,
                           CommModel Model = CommModel::Rendezvous);

/// The largest number of (microbatch, chunk) pairs whose forward has run on
/// Rank and whose backward (W step, when split) has not, over the rank's
/// program: the
/// microbatches' worth of activations the rank stores at its peak, in units
/// of one chunk. 1F1B: min(P - r, N) (P on the first rank: the paper's
/// Section 4.4). GPipe: N M. Interleaved, first rank, N > P:
/// (P - 1) 2 + (M - 1) P + 1 = P M + P - 1 chunk-microbatches, each 1/M of
/// the rank's layers, i.e. P (1 + (P - 1) / (P M)) microbatches' worth of
/// them: the paper's interleaving factor (with N = P: P M, factor 1).
int maxInFlight(const Schedule &S, int Rank);

/// Durations for the timing simulation, per virtual stage (a vector of V
/// entries) or for all stages (one entry). Backward is the backward proper;
/// Recompute, when given, is the recomputation run just before it. With a
/// split backward, Backward is the input-gradient part and WeightGrad the
/// weight-gradient part; unsplit schedules ignore WeightGrad (their
/// Backward is the whole backward).
struct StepCosts {
  llvm::SmallVector<double, 4> Forward{1.0};
  llvm::SmallVector<double, 4> Backward{2.0};
  llvm::SmallVector<double, 4> Recompute{0.0};
  llvm::SmallVector<double, 4> WeightGrad{0.0};
  /// Latency of one point-to-point message.
  double Comm = 0.0;
};

struct TimedStep {
  double Start = 0, End = 0;
  /// Backward only: the recomputation occupies [Start, RecomputeEnd).
  double RecomputeEnd = 0;
};

struct ScheduleTimes {
  /// Times[r][i] for S.Steps[r][i].
  std::vector<std::vector<TimedStep>> Times;
  double Makespan = 0;
  /// Compute time (forward, recompute, backward) of each rank.
  std::vector<double> Busy;
  /// The pipeline bubble as Narayanan et al. define it: idle time over
  /// ideal time, (makespan - busiest rank's compute) / that compute. With
  /// equal stage costs and no communication: (P - 1) / N for GPipe and
  /// 1F1B, (P - 1) / (N M) interleaved.
  double bubbleFraction() const;
};

/// Start and end times of every step under Costs: a rank runs its steps in
/// order, each as soon as the previous one ended; a compute step takes its
/// stage's cost; sends are asynchronous (zero time on the sender), and the
/// message reaches its receiver Comm later; a receive ends when both it was
/// reached and its message arrived (its Start is when the transfer began
/// or the receiver got there, whichever is later). Fails on an invalid or
/// deadlocking schedule (run verifySchedule for the diagnosis).
llvm::Expected<ScheduleTimes> simulateTimes(const Schedule &S,
                                            const StepCosts &Costs);

/// A readable listing, one line per rank: "rank 0: F0 F1 >a0 <g0 B0 ...",
/// W for a weight-gradient step.
void printSchedule(const Schedule &S, llvm::raw_ostream &OS);

} // namespace sp

#endif // SP_LOWER_SCHEDULE_H
