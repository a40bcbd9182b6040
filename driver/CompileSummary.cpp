//===- CompileSummary.cpp - What sp-compile prints and its page -----------===//
#include "driver/CompileSummary.h"
#include "lower/Schedule.h"
#include "reports/Charts.h"
#include "reports/CollectiveReport.h"
#include "html/HtmlReport.h"
#include "support/Format.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include <cmath>
#include <map>

using namespace llvm;

namespace sp {

/// The memory and FLOP lines of the summary.
static void printActivations(const ActivationReport &R, const Program &P,
                             const std::optional<LayerFormula> &F,
                             StringRef Family, raw_ostream &OS) {
  int Mid = R.middleLayer();
  OS << formatv("activations per rank: {0} stored per layer (layer {1}), "
                "{2} in all, {3} transient recomputation\n",
                humanBytes(R.layerBytes(Mid)), Mid, humanBytes(R.StoredBytes),
                humanBytes(R.RecomputeTransientBytes));
  if (auto It = R.Stored.find(Mid); It != R.Stored.end()) {
    OS << "  layer " << Mid << " by reader:";
    ListSeparator LS(",");
    for (auto &[Role, Bytes] : It->second)
      OS << LS << " " << Role << " " << humanBytes(Bytes);
    OS << "\n";
  }
  if (F) {
    double Got = R.layerBytes(Mid);
    OS << formatv("  {0} formula: {1} = {2} ({3:F2}% from the "
                  "plan)\n",
                  Family, F->Text, humanBytes(int64_t(F->Bytes)),
                  F->Bytes > 0 ? 100 * (Got - F->Bytes) / F->Bytes : 0.0);
  }
  std::map<std::string, int> Kinds;
  for (const std::string &K : R.LayerRecompute)
    ++Kinds[K];
  OS << "  recompute:";
  ListSeparator LS(",");
  for (auto &[K, N] : Kinds)
    OS << LS << " " << K << " in " << N << " layer" << (N == 1 ? "" : "s");
  OS << "\n";
  double Flops = R.ForwardFlops + R.BackwardFlops;
  OS << formatv("GEMM flops per rank: forward {0:E3}, backward {1:E3}, "
                "recompute {2:E3} (+{3:F2}%)\n",
                R.ForwardFlops, R.BackwardFlops, R.RecomputeFlops,
                Flops > 0 ? 100 * R.RecomputeFlops / Flops : 0.0);
}

/// The stages, the schedule and each stage's memory.
static void printPipeline(const Graph &G, const PipelineOptions &PO,
                          const LoweredPlan &L, const Plan &P,
                          const RunStats &First,
                          const nlohmann::json &Bubble, raw_ostream &OS) {
  std::map<int, std::pair<int, int>> Layers; // stage -> first, last layer
  for (const Node &N : G.nodes())
    if (N.tags().Layer >= 0 && N.tags().Ph == Phase::Forward) {
      auto [It, New] = Layers.try_emplace(N.tags().Stage, N.tags().Layer,
                                          N.tags().Layer);
      It->second.second = std::max(It->second.second, N.tags().Layer);
    }
  OS << formatv("pipeline: {0} ranks x {1} chunk{2}, {3} microbatches, "
                "{4} schedule; layers by stage:",
                PO.Stages, PO.Interleave, PO.Interleave == 1 ? "" : "s",
                PO.Microbatches, scheduleKindName(scheduleKind(PO.Schedule)));
  for (auto &[Stage, Range] : Layers)
    OS << formatv(" {0}-{1}", Range.first, Range.second);
  OS << "\n";
  if (!L.Sched.WeightDelay.empty()) {
    OS << "  weight gradients delayed by (backwards, per rank):";
    for (int D : L.Sched.WeightDelay)
      OS << " " << D;
    OS << "\n";
  }
  OS << formatv("  first stage: {0} microbatch-chunks in flight, {1} of "
                "stored activations\n",
                maxInFlight(L.Sched, 0), humanBytes(First.StoredPeakBytes));
  OS << "  arena by rank:";
  for (int K = 0; K < P.numStages(); ++K)
    OS << " " << humanBytes(P.stage(K).ArenaBytes);
  OS << "\n";
  OS << formatv("  bubble: {0:F1}% simulated from each stage's GEMM work; "
                "1F1B's (P - 1) / N = {1:F1}%\n",
                100 * Bubble["simulated"].get<double>(),
                100 * Bubble["one_f_one_b"].get<double>());
}

void printCompileSummary(const Compilation &C, const Graph &G,
                         const PassContext &Ctx, double Seconds,
                         raw_ostream &OS) {
  printModelSummary(C.Info, G, OS);
  if (C.P) {
    const Program &Prog = C.P->Prog;
    const RunStats &Run = C.Ranks[0];
    OS << formatv("plan: {0} instructions over {1} buffers, {2} "
                      "activations\n",
                      Run.Instructions, Run.Buffers, dtypeName(Ctx.ActivationDtype));
    if (Prog.compact())
      OS << formatv("  run as {0} steps of {1} templates ({2} "
                        "instructions)\n",
                        Prog.Steps.size(), Prog.Templates.size(),
                        Prog.Instrs.size());
    OS << formatv("  arena {0} = persistent {1} (parameters, "
                      "optimizer state, inputs) + temporaries {2} (peak "
                      "live {3})\n",
                      humanBytes(Prog.ArenaBytes),
                      humanBytes(Prog.PersistentBytes),
                      humanBytes(Prog.ArenaBytes - Prog.PersistentBytes),
                      humanBytes(Run.PeakLiveTempBytes));
    ModelState MS = modelState(Prog);
    OS << formatv("  model state: parameters {0} + gradients {1} + "
                      "AdamW moments {2}{3}{7}; Psi = {4}: {5} = {6}\n",
                      humanBytes(MS.ParameterBytes),
                      humanBytes(MS.GradientBytes),
                      humanBytes(MS.OptimizerBytes),
                      MS.DataChunks ? formatv(" (ZeRO-1 chunks over {0} "
                                              "replicas)",
                                              MS.DataChunks)
                                          .str()
                                    : std::string(),
                      MS.Parameters, MS.Formula,
                      humanBytes(int64_t(MS.FormulaParameterBytes +
                                         MS.FormulaGradientBytes +
                                         MS.FormulaOptimizerBytes +
                                         MS.FormulaCopyBytes)),
                      MS.CopyBytes ? " + " + humanBytes(MS.CopyBytes) +
                                         " of " + dtypeName(Ctx.ActivationDtype).str() +
                                         " compute copies"
                                   : std::string());
    printCollectives(collectiveReport(Prog, Ctx.TensorParallel),
                     Ctx.TensorParallel, OS);
    printContextRing(contextRingReport(Prog), OS);
    printActivations(*C.Activations, Prog, C.Formula, C.Info.Family->Name,
                     OS);
    if (Ctx.Pipeline.enabled())
      printPipeline(G, Ctx.Pipeline, *C.Lowered, *C.P, C.Ranks[0],
                    C.Facts["bubble"], OS);
  }
  OS << formatv("compiled in {0:F3} s ({1} nodes)\n", Seconds,
                    G.numNodes());
}

/// --html: the report page of the compiled plan (html/HtmlReport.h). Its
/// memory chart is in the style of the paper's Figure 7: one layer's stored
/// activation bytes under each configuration at this t (sequence
/// parallelism or not; no, selective or full recomputation) by the family's
/// formula, as a percentage of tensor parallelism alone, and this plan's
/// bytes, read off its program, beside its own configuration's.
Error writeCompilePage(StringRef Path, const Compilation &C,
                             const PassContext &Ctx, StringRef Source,
                             StringRef Command) {
  ReportPage Page;
  Page.Tool = "sp-compile";
  Page.Subject = Source.str();
  Page.CommandLine = Command.str();
  Page.Facts = C.Facts;
  const ActivationReport &R = *C.Activations;
  Page.Facts["gemm_flops_per_rank"] = {{"forward", R.ForwardFlops},
                                       {"backward", R.BackwardFlops},
                                       {"recompute", R.RecomputeFlops}};
  std::string Calls;
  raw_string_ostream CallsOS(Calls);
  printCollectives(collectiveReport(C.P->Prog, Ctx.TensorParallel),
                   Ctx.TensorParallel, CallsOS);
  if (!CallsOS.str().empty())
    Page.Facts["collective_calls"] = CallsOS.str();

  int T = Ctx.TensorParallel;
  double E = dtypeSize(Ctx.ActivationDtype);
  double Base = layerFormula(C.Info, T, false, RecomputeMode::None, E).Bytes;
  std::string Ours = R.LayerRecompute.empty()
                         ? "none"
                         : R.LayerRecompute[R.middleLayer()];
  if (Base > 0) {
    BarChart B;
    B.Title = T > 1 ? "Activation memory per layer, as a percentage of "
                      "tensor parallelism alone"
                    : "Activation memory per layer, as a percentage of no "
                      "recomputation";
    B.YLabel = formatv("% of {0} (t = {1})", T > 1 ? "TP" : "none", T).str();
    B.Series = {std::string(C.Info.Family->Name) + " formula", "this plan"};
    B.Width = 900;
    B.Height = 380;
    const std::pair<RecomputeMode, const char *> Modes[] = {
        {RecomputeMode::None, "none"},
        {RecomputeMode::Selective, "selective"},
        {RecomputeMode::Full, "full"}};
    for (auto [Mode, Name] : Modes)
      for (bool SP : {false, true}) {
        if (SP && T == 1)
          break;
        std::string Group = T > 1 ? std::string(SP ? "TP+SP" : "TP") : "";
        if (Mode != RecomputeMode::None || T == 1)
          Group += (Group.empty() ? "" : "+") + std::string(Name);
        B.Groups.push_back(Group);
        bool This = SP == Ctx.SequenceParallel && Ours == Name;
        B.Values.push_back(
            {100 * layerFormula(C.Info, T, SP, Mode, E).Bytes / Base,
             This ? 100 * R.layerBytes(R.middleLayer()) / Base : NAN});
      }
    raw_string_ostream SvgOS(Page.Memory.Svg);
    if (auto Err = writeBarChartSvg(SvgOS, B))
      return Err;
    SvgOS.flush();
    Page.Memory.Caption =
        formatv("Each configuration at t = {0}: one layer's stored "
                "activations by the {1} formula ({2}-byte activations, "
                "1-byte masks), as a percentage of {3}; the second bar is "
                "this plan's layer {4}, read off its program.{5}",
                T, C.Info.Family->Name, int(E), T > 1 ? "tensor parallelism alone" :
                "no recomputation", R.middleLayer(),
                C.Info.FusedAttention
                    ? " With the fused attention core, selective "
                      "recomputation has nothing left to drop."
                    : "")
            .str();
  }
  auto Chart = find_if(C.P->Files, [](const auto &F) {
    return F.first == "schedule.svg";
  });
  if (Chart != C.P->Files.end()) {
    Page.Schedule.Svg = Chart->second;
    Page.Schedule.Caption = "The schedule simulated from each stage's GEMM "
                            "work (also PLAN/schedule.svg): one row per "
                            "pipeline rank; the empty space is the bubble.";
  }
  return writeReportPage(Path, Page);
}

} // namespace sp
