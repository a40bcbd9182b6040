//===- LowerTraining.cpp - A compiled training graph to programs ----------===//
#include "driver/LowerTraining.h"
#include "lower/Finalize.h"
#include "lower/LowerGraph.h"
#include "lower/MemoryPlan.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Parallel.h"

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
    return E;
  parallelForEach(*Progs, [](Program &P) { finalizeProgram(P); });
  return Progs;
}

/// ZB-H1 keeps 1F1B's peak when the stages are alike. They are not quite:
/// the W's hold the gradients their B's made for them, and the last rank's
/// LM head keeps the logits' gradient. Where a rank's program under the
/// default delays needs more than the cap (the largest 1F1B rank's arena,
/// or --memory-budget when given), that rank's delay is lowered to the
/// largest that fits, found by bisection. A rank's delay changes only its
/// own program (W steps do not communicate), so each rank is searched
/// alone and keeps the program of the delay it gets.
/// Rewrites S and Progs.
static Error capWeightDelays(const Graph &G, const PassContext &Ctx,
                             Schedule &S, std::vector<Program> &Progs) {
  int64_t Peak = Ctx.Recompute.MemoryBudget;
  const char *CapName = "--memory-budget";
  if (Peak <= 0) {
    auto Ref =
        buildSchedule(ScheduleKind::OneFOneB, S.Ranks, 1, S.Microbatches);
    if (!Ref)
      return Ref.takeError();
    auto RefProgs = lowerRanks(G, Ctx.ActivationDtype, *Ref);
    if (!RefProgs)
      return RefProgs.takeError();
    for (const Program &P : *RefProgs)
      Peak = std::max(Peak, P.ArenaBytes);
    CapName = "1F1B's peak";
  }
  // Each rank over the cap searches its delay on its own (concurrently):
  // the largest D below its default whose program fits, or D = 0 when none
  // does (the rank then needs about its 1F1B arena).
  struct Search {
    int Best = -1;             // -1: the rank fits as it is
    Optional<Program> Kept;    // Best's program; none: Progs[R] (D = 0)
    Optional<Error> Err;
  };
  const std::vector<int> Delays = S.WeightDelay;
  std::vector<Search> Found(S.Ranks);
  parallelForEachN(0, S.Ranks, [&](size_t R) {
    if (Progs[R].ArenaBytes <= Peak)
      return;
    Search &F = Found[R];
    auto Lower = [&](int D) -> Expected<Program> {
      std::vector<int> Try = Delays;
      Try[R] = D;
      auto Sch = buildSchedule(S.Kind, S.Ranks, 1, S.Microbatches, Try);
      if (!Sch)
        return Sch.takeError();
      auto P = lowerPipelineRank(G, Ctx.ActivationDtype, computeSteps(*Sch),
                                 int(R));
      if (!P)
        return P.takeError();
      finalizeProgram(*P);
      return P;
    };
    F.Best = 0;
    for (int Lo = 1, Hi = Delays[R] - 1; Lo <= Hi;) {
      int Mid = (Lo + Hi + 1) / 2;
      auto P = Lower(Mid);
      if (!P) {
        F.Err.emplace(P.takeError());
        return;
      }
      if (P->ArenaBytes > Peak) {
        Hi = Mid - 1;
        continue;
      }
      F.Best = Mid;
      F.Kept = std::move(*P);
      Lo = Mid + 1;
    }
    if (F.Best == 0 && Delays[R] > 0) {
      auto P = Lower(0);
      if (!P) {
        F.Err.emplace(P.takeError());
        return;
      }
      F.Kept = std::move(*P);
    }
  });
  std::vector<int> Capped = Delays;
  Optional<Error> First;
  bool Changed = false;
  for (int R = 0; R < S.Ranks; ++R) {
    Search &F = Found[R];
    if (F.Err) {
      if (First)
        consumeError(std::move(*F.Err));
      else
        First.emplace(std::move(*F.Err));
      continue;
    }
    if (F.Best < 0 || First)
      continue;
    int64_t Arena = F.Kept ? F.Kept->ArenaBytes : Progs[R].ArenaBytes;
    if (Ctx.Recompute.MemoryBudget > 0 && Arena > Ctx.Recompute.MemoryBudget) {
      First.emplace(createStringError(
          inconvertibleErrorCode(),
          "--memory-budget %lld: pipeline rank %d needs %lld bytes even "
          "with each weight-gradient step right after its backward; raise "
          "the budget or recompute (--recompute auto)",
          (long long)Ctx.Recompute.MemoryBudget, R, (long long)Arena));
      continue;
    }
    if (!F.Kept)
      continue; // already at D = 0
    Ctx.remarks() << formatv("zb1p: rank {0} delays its weight gradients by {1} "
                            "backwards instead of {2}, to stay within {3} of "
                            "{4} bytes\n",
                            R, F.Best, Delays[R], CapName, Peak);
    Capped[R] = F.Best;
    Progs[R] = std::move(*F.Kept);
    Changed = true;
  }
  if (First)
    return std::move(*First);
  if (!Changed)
    return Error::success();
  auto CappedS = buildSchedule(S.Kind, S.Ranks, 1, S.Microbatches, Capped);
  if (!CappedS)
    return CappedS.takeError();
  S = std::move(*CappedS);
  return verifyPipelinePrograms(Progs); // the ranks' programs together
}

Error lowerOneMicrobatch(const Graph &G, const PassContext &Ctx,
                         LoweredPlan &LP) {
  if (!LP.OneMicrobatch.Instrs.empty())
    return Error::success();
  auto Prog = lowerGraph(G, Ctx.ActivationDtype);
  if (!Prog)
    return Prog.takeError();
  LP.OneMicrobatch = std::move(*Prog);
  return Error::success();
}

Expected<LoweredPlan> lowerTrainingGraph(const Graph &G, const PassContext &Ctx,
                                         bool WithOneMicrobatch) {
  LoweredPlan LP;
  const PipelineOptions &PO = Ctx.Pipeline;
  if (WithOneMicrobatch || !PO.enabled())
    if (auto E = lowerOneMicrobatch(G, Ctx, LP))
      return E;
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
      return E;
  LP.Stages = std::move(*Progs);
  return LP;
}

} // namespace sp
