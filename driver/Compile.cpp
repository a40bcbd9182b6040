//===- Compile.cpp - The compile driver -----------------------------------===//
#include "driver/Compile.h"
#include "lower/MemoryPlan.h"
#include "lower/UnrollSchedule.h"
#include "reports/Charts.h"
#include "reports/CollectiveReport.h"
#include "analysis/Cost.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Parallel.h"
#include "llvm/Support/Path.h"

using namespace llvm;

namespace sp {

Error runPasses(Graph &G, PassContext &Ctx, const CompileOptions &O) {
  PassManager PM(O.PassManager);
  if (auto E = PM.addPasses(O.Passes))
    return E;
  Error E = PM.run(G, Ctx);
  if (!E || O.Source.empty())
    return E;
  return createStringError(inconvertibleErrorCode(), "%s: %s",
                           O.Source.c_str(), toString(std::move(E)).c_str());
}

/// The schedule timed by each stage's GEMM work (GFLOP per microbatch,
/// forward, backward and recompute; with a split backward, the weight
/// gradients' share of the backward apart). A message takes the work an
/// A100 does while NVLink (300 GB/s) moves it: 1040 FLOP per byte.
static Expected<ScheduleTimes> timeSchedule(const Graph &G,
                                            const LoweredPlan &L,
                                            const Program &FirstRank) {
  int V = L.Sched.numStages();
  StepCosts C;
  C.Forward.assign(V, 0.0);
  C.Backward.assign(V, 0.0);
  C.Recompute.assign(V, 0.0);
  C.WeightGrad.assign(V, 0.0);
  DenseSet<const Node *> Weight;
  if (L.Sched.splitsBackward()) {
    auto W = weightGradNodes(G, V);
    if (!W)
      return W.takeError();
    Weight = std::move(*W);
  }
  for (const Node &N : G.nodes()) {
    int S = std::max(N.tags().Stage, 0);
    if (S >= V)
      continue;
    double F = gemmFlops(N) / 1e9;
    switch (N.tags().Ph) {
    case Phase::Forward:
      C.Forward[S] += F;
      break;
    case Phase::Backward:
    case Phase::Recompute:
      if (Weight.count(&N))
        C.WeightGrad[S] += F;
      else
        (N.tags().Ph == Phase::Backward ? C.Backward : C.Recompute)[S] += F;
      break;
    case Phase::Optimizer:
      break;
    }
  }
  int64_t Bytes = 0, Messages = 0;
  for (const Instruction &I : FirstRank.Instrs)
    if (I.Op == OpKind::Send) {
      Bytes += FirstRank.Buffers[I.In[0]].Bytes;
      ++Messages;
    }
  if (Messages)
    C.Comm = 1040.0 * double(Bytes) / double(Messages) / 1e9;
  return simulateTimes(L.Sched, C);
}

/// The report of a lowered plan, and the manifest beside it.
static Error reportPlan(const Graph &G, const PassContext &Ctx,
                        const CompileOptions &O, Compilation &C) {
  // The analyses read each rank's program as it runs, a compact program
  // walked over its steps.
  std::vector<Optional<Expected<RunStats>>> Runs(C.P->numStages());
  parallelForEachN(0, Runs.size(), [&](size_t K) {
    Runs[K].emplace(runStats(C.P->stage(K)));
  });
  for (auto &R : Runs) {
    if (!*R)
      return R->takeError();
    C.Ranks.push_back(**R);
  }
  const Program &Prog = C.P->Prog;
  const Program &OneMicrobatch = C.Lowered->OneMicrobatch;
  nlohmann::json &Facts = C.Facts;
  const RunStats &First = C.Ranks[0];
  Facts["plan"] = {{"instructions", First.Instructions},
                   {"buffers", First.Buffers},
                   {"dtype", dtypeName(Ctx.ActivationDtype).str()},
                   {"persistent_bytes", Prog.PersistentBytes},
                   {"arena_bytes", Prog.ArenaBytes},
                   {"peak_live_temp_bytes", First.PeakLiveTempBytes}};
  if (Prog.compact())
    Facts["plan"]["compact"] = {{"template_instructions", Prog.Instrs.size()},
                                {"templates", Prog.Templates.size()},
                                {"steps", Prog.Steps.size()}};
  Facts["parallel"] = {{"dp", Ctx.DataParallel},
                       {"cp", Ctx.ContextParallel},
                       {"zero", Ctx.Zero},
                       {"tp", Ctx.TensorParallel},
                       {"sp", Ctx.SequenceParallel},
                       {"pp", Ctx.Pipeline.Stages},
                       {"interleave", Ctx.Pipeline.Interleave},
                       {"microbatches", Ctx.Pipeline.Microbatches}};
  Facts["collectives"] =
      collectivesToJson(collectiveReport(OneMicrobatch, Ctx.TensorParallel));
  if (Ctx.ContextParallel > 1)
    Facts["context_parallel"] =
        contextRingToJson(contextRingReport(OneMicrobatch));
  C.Activations = analyzeActivations(OneMicrobatch);
  StageMemory SM;
  SM.FirstStageStored = First.StoredPeakBytes;
  SM.InFlight = maxInFlight(C.Lowered->Sched, 0);
  for (int K = 0; K < C.P->numStages(); ++K) {
    SM.PeakBytes = std::max(SM.PeakBytes, C.P->stage(K).ArenaBytes);
    SM.StageArena.push_back(C.P->stage(K).ArenaBytes);
    SM.StageStored.push_back(C.Ranks[K].StoredPeakBytes);
  }
  Facts["memory"] = memoryReportToJson(*C.Activations, Prog, SM);
  const ModelInfo &Info = C.Info;
  if (!C.Activations->LayerRecompute.empty()) {
    StringRef Kind = C.Activations->LayerRecompute[C.Activations->middleLayer()];
    RecomputeMode Mode = Kind == "full"        ? RecomputeMode::Full
                         : Kind == "selective" ? RecomputeMode::Selective
                                               : RecomputeMode::None;
    // Each context-parallel rank stores its s / C positions' activations
    // (the key/value blocks of the ring are in flight, not stored).
    ModelInfo RankInfo = Info;
    RankInfo.Seq /= Ctx.ContextParallel;
    C.Formula = layerFormula(RankInfo, Ctx.TensorParallel, Ctx.SequenceParallel,
                             Mode, dtypeSize(Ctx.ActivationDtype));
    Facts["memory"]["formula"] = {{"family", Info.Family->Name},
                                  {"text", C.Formula->Text},
                                  {"bytes_per_layer", C.Formula->Bytes}};
  }
  Facts["flops"] =
      flopReportToJson(*C.Activations, Ctx.TensorParallel * Ctx.ContextParallel,
                       {Info.Batch * Ctx.Pipeline.Microbatches, Info.Layers,
                        Info.Seq, Info.Hidden, Info.Vocab},
                       Ctx.Pipeline.Microbatches);

  nlohmann::json &M = C.P->Manifest;
  M = Facts;
  M["source"] = O.Source;
  M["dtype"] = dtypeName(Ctx.ActivationDtype).str();
  if (Ctx.ActivationDtype == DType::F16)
    M["loss_scale"] = {{"initial", Ctx.LossScale},
                       {"growth_interval", Ctx.LossScaleWindow}};
  M["tp"] = Ctx.TensorParallel;
  if (Ctx.DataParallel > 1)
    M["dp"] = Ctx.DataParallel;
  if (Ctx.Zero)
    M["zero"] = Ctx.Zero;
  M["sp"] = Ctx.SequenceParallel;
  if (Ctx.ContextParallel > 1) {
    M["cp"] = Ctx.ContextParallel;
    M["cp_comm"] = Ctx.ContextComm;
    if (Ctx.ContextComm == "a2a+ring")
      M["cp_a2a"] = Ctx.ContextAllToAll;
  }
  if (Ctx.Pipeline.enabled()) {
    const PipelineOptions &PO = Ctx.Pipeline;
    M["pp"] = PO.Stages;
    M["interleave"] = PO.Interleave;
    M["microbatches"] = PO.Microbatches;
    M["schedule"] = scheduleKindName(scheduleKind(PO.Schedule)).str();
    if (!C.Lowered->Sched.WeightDelay.empty())
      M["weight_delays"] = C.Lowered->Sched.WeightDelay;
  }
  return Error::success();
}

Expected<Compilation> compileToPlan(Graph &G, PassContext &Ctx,
                                    const CompileOptions &O) {
  if (auto E = runPasses(G, Ctx, O))
    return E;
  Compilation C;
  auto Info = summarizeModel(G);
  if (!Info)
    return Info.takeError();
  C.Info = std::move(*Info);
  // Under context parallelism the graph is one rank's s / C positions; the
  // model (and its manifest) keeps the sequence it was exported with.
  C.Info.Seq *= Ctx.ContextParallel;
  C.Facts = modelInfoToJson(C.Info);
  // A graph the passes stopped short of training is only summarised.
  bool Training = any_of(G.outputs(), [](const Graph::Output &Out) {
    return Out.Name == "loss";
  });
  if (!Training)
    return C;
  auto L = lowerTrainingGraph(G, Ctx, /*WithOneMicrobatch=*/!O.PlanOnly);
  if (!L)
    return L.takeError();
  C.Lowered = std::move(*L);
  C.P.emplace();
  // The programs move into the plan (at the paper's sizes each is tens of
  // megabytes); the plan keeps rank 0's as its Prog too.
  if (Ctx.Pipeline.enabled()) {
    C.P->Stages = std::move(C.Lowered->Stages);
    C.P->Prog = C.P->Stages[0];
  } else {
    C.P->Prog = std::move(C.Lowered->Stages[0]);
  }
  C.Lowered->Stages.clear();
  if (O.PlanOnly)
    return C;
  if (auto E = finishPlan(G, Ctx, O, C))
    return E;
  return C;
}

Error finishPlan(const Graph &G, const PassContext &Ctx,
                 const CompileOptions &O, Compilation &C) {
  assert(C.P && C.Lowered && C.Ranks.empty() && "a fresh PlanOnly compile");
  if (auto E = lowerOneMicrobatch(G, Ctx, *C.Lowered))
    return E;
  if (auto E = reportPlan(G, Ctx, O, C))
    return E;
  if (Ctx.Pipeline.enabled()) {
    auto Times = timeSchedule(G, *C.Lowered, C.P->Prog);
    if (!Times)
      return Times.takeError();
    const PipelineOptions &PO = Ctx.Pipeline;
    nlohmann::json Bubble = {
        {"schedule", scheduleKindName(C.Lowered->Sched.Kind).str()},
        {"simulated", Times->bubbleFraction()},
        {"one_f_one_b", double(PO.Stages - 1) / PO.Microbatches}};
    C.Facts["bubble"] = Bubble;
    C.P->Manifest["bubble"] = Bubble;
    std::string Svg;
    raw_string_ostream OS(Svg);
    GanttOptions GO;
    GO.Title = sys::path::stem(O.Source).str();
    GO.TimeUnit = "GFLOP";
    if (auto E = writeGanttSvg(OS, C.Lowered->Sched, *Times, GO))
      return E;
    C.P->Files.push_back({"schedule.svg", OS.str()});
  }
  return Error::success();
}

} // namespace sp
