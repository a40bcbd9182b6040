//===- LowerTraining.cpp - A compiled training graph to programs ----------===//
#include "passes/LowerTraining.h"
#include "lower/Finalize.h"
#include "lower/LowerGraph.h"
#include "lower/MemoryPlan.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

ScheduleKind scheduleKind(PipelineSchedule S) {
  switch (S) {
  case PipelineSchedule::GPipe:
    return ScheduleKind::GPipe;
  case PipelineSchedule::OneFOneB:
    return ScheduleKind::OneFOneB;
  case PipelineSchedule::Interleaved:
    return ScheduleKind::Interleaved;
  case PipelineSchedule::ZeroBubbleH1:
    return ScheduleKind::ZeroBubbleH1;
  }
  llvm_unreachable("unknown schedule");
}

PipelineLayout computeSteps(const Schedule &S) {
  PipelineLayout L;
  L.Stages = S.Ranks;
  L.Chunks = S.Chunks;
  L.Microbatches = S.Microbatches;
  L.SplitBackward = S.splitsBackward();
  L.Steps.resize(S.Ranks);
  for (int R = 0; R < S.Ranks; ++R)
    for (const ScheduleStep &St : S.Steps[R])
      if (St.isCompute())
        L.Steps[R].push_back({St.Kind, St.Microbatch, St.Chunk});
  return L;
}

/// Every rank's program of S, checked free of deadlocks, then finalized.
static Expected<std::vector<Program>> lowerRanks(const Graph &G, DType Dt,
                                                 const Schedule &S) {
  auto Progs = lowerPipeline(G, Dt, computeSteps(S));
  if (!Progs)
    return Progs.takeError();
  if (auto E = verifyPipelinePrograms(*Progs))
    return std::move(E);
  for (Program &P : *Progs)
    finalizeProgram(P);
  return Progs;
}

/// ZB-H1 keeps 1F1B's peak when the stages are alike. Where a rank's
/// program under the default delays needs more than the largest 1F1B
/// rank's arena (the last rank: its LM head's weight gradient keeps the
/// logits' gradient alive until its W), that rank's delay is lowered to
/// the largest that fits, found by bisection (a rank's delay changes only
/// its own program: W steps do not communicate). Rewrites S and Progs.
static Error capWeightDelays(const Graph &G, const PassContext &Ctx,
                             Schedule &S, std::vector<Program> &Progs) {
  auto Ref = buildSchedule(ScheduleKind::OneFOneB, S.Ranks, 1, S.Microbatches);
  if (!Ref)
    return Ref.takeError();
  auto RefProgs = lowerRanks(G, Ctx.ActivationDtype, *Ref);
  if (!RefProgs)
    return RefProgs.takeError();
  int64_t Peak = 0;
  for (const Program &P : *RefProgs)
    Peak = std::max(Peak, P.ArenaBytes);
  std::vector<int> Delays = S.WeightDelay;
  bool Changed = false;
  for (int R = 0; R < S.Ranks; ++R) {
    if (Progs[R].ArenaBytes <= Peak)
      continue;
    auto Arena = [&](int D) -> Expected<int64_t> {
      std::vector<int> Try = Delays;
      Try[R] = D;
      auto Sch = buildSchedule(S.Kind, S.Ranks, 1, S.Microbatches, Try);
      if (!Sch)
        return Sch.takeError();
      auto P = lowerPipelineRank(G, Ctx.ActivationDtype, computeSteps(*Sch), R);
      if (!P)
        return P.takeError();
      finalizeProgram(*P);
      return P->ArenaBytes;
    };
    int Lo = 0, Hi = Delays[R] - 1; // the largest D in [Lo, Hi] that fits
    int Best = 0;
    while (Lo <= Hi) {
      int Mid = (Lo + Hi + 1) / 2;
      auto A = Arena(Mid);
      if (!A)
        return A.takeError();
      if (*A <= Peak) {
        Best = Mid;
        Lo = Mid + 1;
      } else {
        Hi = Mid - 1;
      }
    }
    *Ctx.Remarks << formatv("zb1p: rank {0} delays its weight gradients by {1} "
                            "backwards instead of {2}, to stay within 1F1B's "
                            "peak of {3} bytes\n",
                            R, Best, Delays[R], Peak);
    Delays[R] = Best;
    Changed = true;
  }
  if (!Changed)
    return Error::success();
  auto Capped = buildSchedule(S.Kind, S.Ranks, 1, S.Microbatches, Delays);
  if (!Capped)
    return Capped.takeError();
  auto CappedProgs = lowerRanks(G, Ctx.ActivationDtype, *Capped);
  if (!CappedProgs)
    return CappedProgs.takeError();
  S = std::move(*Capped);
  Progs = std::move(*CappedProgs);
  return Error::success();
}

Expected<LoweredPlan> lowerTrainingGraph(const Graph &G,
                                         const PassContext &Ctx) {
  LoweredPlan LP;
  auto Prog = lowerGraph(G, Ctx.ActivationDtype);
  if (!Prog)
    return Prog.takeError();
  LP.OneMicrobatch = std::move(*Prog);
  const PipelineOptions &PO = Ctx.Pipeline;
  auto S = buildSchedule(scheduleKind(PO.Schedule), PO.Stages, PO.Interleave,
                         PO.Microbatches);
  if (!S)
    return S.takeError();
  LP.Sched = std::move(*S);
  if (!PO.enabled()) {
    finalizeProgram(LP.OneMicrobatch);
    LP.Stages.push_back(LP.OneMicrobatch);
    return LP;
  }
  auto Progs = lowerRanks(G, Ctx.ActivationDtype, LP.Sched);
  if (!Progs)
    return Progs.takeError();
  if (LP.Sched.splitsBackward())
    if (auto E = capWeightDelays(G, Ctx, LP.Sched, *Progs))
      return std::move(E);
  LP.Stages = std::move(*Progs);
  return LP;
}

} // namespace sp
