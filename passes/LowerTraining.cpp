//===- LowerTraining.cpp - A compiled training graph to programs ----------===//
#include "passes/LowerTraining.h"
#include "lower/Finalize.h"
#include "lower/LowerGraph.h"
#include "lower/MemoryPlan.h"

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
  }
  llvm_unreachable("unknown schedule");
}

PipelineLayout computeSteps(const Schedule &S) {
  PipelineLayout L;
  L.Stages = S.Ranks;
  L.Chunks = S.Chunks;
  L.Microbatches = S.Microbatches;
  L.Steps.resize(S.Ranks);
  for (int R = 0; R < S.Ranks; ++R)
    for (const ScheduleStep &St : S.Steps[R])
      if (St.isCompute())
        L.Steps[R].push_back(
            {St.Kind == StepKind::Backward, St.Microbatch, St.Chunk});
  return L;
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
  auto Progs = lowerPipeline(G, Ctx.ActivationDtype, computeSteps(LP.Sched));
  if (!Progs)
    return Progs.takeError();
  if (auto E = verifyPipelinePrograms(*Progs))
    return std::move(E);
  for (Program &P : *Progs)
    finalizeProgram(P);
  LP.Stages = std::move(*Progs);
  return LP;
}

} // namespace sp
