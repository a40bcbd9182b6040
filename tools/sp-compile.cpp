//===- sp-compile.cpp - Compile an exported Transformer -------------------===//
//
//   sp-compile MODEL.onnx [-o PLAN] [--tp T --sp] [--recompute MODE]
//              [--pp P --interleave M --microbatches N] [--dtype fp32]
//              [--report FILE.json] [--gantt FILE.svg] [--print-after-all]
//              [--html FILE.html]
//   sp-compile --paper-table MODEL.onnx... [--figure7 FILE.svg] [--pp ...]
//
// Imports the model and compiles it (passes/Compile.h: the passes of
// passes/Passes.h, lowering to one planned program per pipeline rank, the
// reports), prints what it recognised with the memory, FLOP and collective
// reports and, with -o, writes the plan directory. --paper-table compiles the
// paper's configurations of each model and compares them with Table 2 (and
// Eq. 5/6; tools/PaperTable.h).
//
//===----------------------------------------------------------------------===//
#include "frontend/GraphExport.h"
#include "lower/MemoryPlan.h"
#include "passes/Charts.h"
#include "passes/CollectiveReport.h"
#include "passes/AutoPlan.h"
#include "passes/Compile.h"
#include "passes/CostModel.h"
#include "passes/LowerTraining.h"
#include "passes/MemoryReport.h"
#include "passes/Passes.h"
#include "plan/Plan.h"
#include "reports/HtmlReport.h"
#include "tools/PaperTable.h"
#include "tools/ToolSupport.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include <chrono>
#include <cmath>
#include <map>
#include <optional>

using namespace llvm;
using namespace sp;

static cl::OptionCategory Cat("sp-compile options");
static cl::list<std::string> Inputs(cl::Positional,
                                    cl::desc("<model.onnx> (several with "
                                             "--paper-table)"),
                                    cl::OneOrMore, cl::cat(Cat));
static cl::opt<std::string> Gantt(
    "gantt",
    cl::desc("With --pp or --microbatches: write the schedule as an SVG Gantt "
             "chart (also PLAN/schedule.svg with -o)"),
    cl::value_desc("file.svg"), cl::cat(Cat));
static cl::opt<bool> PaperTable(
    "paper-table",
    cl::desc("Compile the paper's six Table 2 configurations of each model "
             "(fp16 accounting, t = --tp or 8) and compare the activation "
             "bytes per layer with Table 2's formulas"),
    cl::cat(Cat));
static cl::opt<std::string> Figure7(
    "figure7",
    cl::desc("With --paper-table: write the paper's Figure 7 (each "
             "configuration as a percentage of the tensor-parallel baseline, "
             "per model) as an SVG chart"),
    cl::value_desc("file.svg"), cl::cat(Cat));
static cl::opt<std::string> Report("report", cl::desc("Write a JSON report"),
                                   cl::value_desc("file.json"), cl::cat(Cat));
static cl::opt<std::string> Html(
    "html",
    cl::desc("Write the report as one self-contained HTML page: model, "
             "options, memory (with a Figure 7 style chart), collectives, "
             "pipeline schedule, FLOPs (and the search with --auto)"),
    cl::value_desc("file.html"), cl::cat(Cat));
static cl::opt<bool> Estimate(
    "estimate",
    cl::desc("Print the plan's predicted step time and MFU on a GPU cluster "
             "(passes/CostModel.h; DGX A100 80GB unless --cluster)"),
    cl::init(false), cl::cat(Cat));
static cl::opt<std::string> Cluster(
    "cluster",
    cl::desc("The cluster --estimate assumes, as JSON (models/clusters/); "
             "implies --estimate"),
    cl::value_desc("FILE.json"), cl::init(""), cl::cat(Cat));
static cl::opt<bool> Auto(
    "auto",
    cl::desc("Choose t, SP, p, m, d, the microbatches and the recomputation: "
             "the fastest layout (by the cost model of --estimate) whose "
             "compiled peak fits --gpu-memory on --gpus GPUs"),
    cl::init(false), cl::cat(Cat));
static cl::opt<int> AutoGpus("gpus", cl::desc("With --auto: the GPUs"),
                             cl::value_desc("N"), cl::init(0),
                             cl::cat(Cat));
static cl::opt<std::string> AutoMemory(
    "gpu-memory",
    cl::desc("With --auto: the most a rank's planned arena may take (e.g. "
             "80GiB; leave room for the CUDA context and NCCL)"),
    cl::value_desc("BYTES"), cl::init(""), cl::cat(Cat));
static cl::opt<int64_t> AutoBatch(
    "global-batch",
    cl::desc("With --auto: sequences per step over all replicas (default: "
             "the model's batch per GPU)"),
    cl::value_desc("B"), cl::init(0), cl::cat(Cat));
static cl::opt<std::string> ExportGraphs(
    "export-graphs",
    cl::desc("Write each pipeline rank's lowered program (forward, backward, "
             "recomputation, optimizer, collectives) as an ONNX file for "
             "Netron: DIR/program.onnx or DIR/program-K.onnx"),
    cl::value_desc("DIR"), cl::cat(Cat));
static cl::opt<bool> Quiet("quiet", cl::desc("Do not print the summary"),
                           cl::cat(Cat));
static cl::opt<std::string> Output("o", cl::desc("Write the plan directory"),
                                   cl::value_desc("plan"), cl::cat(Cat));
static cl::opt<DType> ActDtype(
    "dtype",
    cl::desc("Activation dtype of the plan: fp32, or bf16 / fp16 with fp32 "
             "master weights, gradients and AdamW moments"),
    cl::values(clEnumValN(DType::F32, "fp32", "32-bit float"),
               clEnumValN(DType::BF16, "bf16", "bfloat16"),
               clEnumValN(DType::F16, "fp16", "IEEE half")),
    cl::init(DType::F32), cl::cat(Cat));
static cl::opt<double> LossScale(
    "loss-scale",
    cl::desc("--dtype fp16: the initial dynamic loss scale, a power of two "
             "(default 65536)"),
    cl::init(65536), cl::cat(Cat));
static cl::opt<int64_t> LossScaleWindow(
    "loss-scale-window",
    cl::desc("--dtype fp16: clean steps before the loss scale doubles "
             "(default 2000)"),
    cl::init(2000), cl::cat(Cat));
static cl::opt<double> WeightDecay("weight-decay",
                                   cl::desc("AdamW weight decay of matrices and embeddings"),
                                   cl::init(0.1), cl::cat(Cat));
static cl::opt<double> Beta1("beta1", cl::desc("AdamW beta1"), cl::init(0.9),
                             cl::cat(Cat));
static cl::opt<double> Beta2("beta2", cl::desc("AdamW beta2"), cl::init(0.95),
                             cl::cat(Cat));
static cl::opt<double> AdamEps("adam-eps", cl::desc("AdamW epsilon"),
                               cl::init(1e-8), cl::cat(Cat));
static cl::opt<double> MaxGradNorm("max-grad-norm",
                                   cl::desc("Global gradient-norm clipping (0: off)"),
                                   cl::init(1.0), cl::cat(Cat));


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

/// The plan's step on cluster M by the cost model (passes/CostModel.h): the
/// summary's lines, and "estimate" in the report.
static Expected<std::string> printEstimate(const ClusterSpec &M,
                                          const PassContext &Ctx,
                                          Compilation &C) {
  ParallelLayout Y = layoutOf(Ctx);
  bool Fp32 = Ctx.ActivationDtype == DType::F32;
  double Peak = gemmPeak(M, Ctx.ActivationDtype);
  auto E = estimatePlan(M, Ctx, *C.P);
  if (!E)
    return E.takeError();
  C.Facts["estimate"] = {
      {"cluster", M.Name},
      {"gpus", Y.gpus()},
      {"peak_flops", Peak},
      {"gemm_efficiency", M.GemmEfficiency},
      {"step_seconds", E->Seconds},
      {"pipeline_seconds", E->PipelineSeconds},
      {"bubble", E->BubbleFraction},
      {"gemm_seconds", E->ComputeSeconds},
      {"memory_bound_seconds", E->MemoryBoundSeconds},
      {"tensor_comm_seconds", E->TensorCommSeconds},
      {"data_parallel_seconds", E->DataParallelSeconds},
      {"optimizer_seconds", E->OptimizerSeconds},
      {"model_flops", E->ModelFlops},
      {"hardware_flops", E->HardwareFlops},
      {"mfu", E->Mfu},
      {"hfu", E->Hfu}};
  // Three decimals in s, ms or us.
  auto T = humanSeconds;
  return formatv("estimate on {0} x {1} ({2} GEMMs at {3:P0} of {4:F1} "
                 "TFLOP/s): step {5} = pipeline {6} (bubble {7:F1}%) + "
                 "exposed data-parallel sum {8} + optimizer {9}\n  busiest "
                 "rank: GEMMs {10}, memory-bound ops {14}, tensor collectives "
                 "{11}; MFU {12:F1}%, HFU {13:F1}%\n",
                 Y.gpus(), M.Name, Fp32 ? "fp32" : "16-bit",
                 M.GemmEfficiency, Peak / 1e12, T(E->Seconds),
                 T(E->PipelineSeconds), 100 * E->BubbleFraction,
                 T(E->DataParallelSeconds), T(E->OptimizerSeconds),
                 T(E->ComputeSeconds), T(E->TensorCommSeconds), 100 * E->Mfu,
                 100 * E->Hfu, T(E->MemoryBoundSeconds))
      .str();
}

/// --html: the report page of the compiled plan (tools/HtmlReport.h). Its
/// memory chart is in the style of the paper's Figure 7: one layer's stored
/// activation bytes under each configuration at this t (sequence
/// parallelism or not; no, selective or full recomputation) by the family's
/// formula, as a percentage of tensor parallelism alone, and this plan's
/// bytes, read off its program, beside its own configuration's.
static Error writeHtmlReport(StringRef Path, const Compilation &C,
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
    B.Series = {C.Info.Family + " formula", "this plan"};
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
                T, C.Info.Family, int(E), T > 1 ? "tensor parallelism alone" :
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

/// AdamW's settings: a decay rate outside [0, 1), a non-positive epsilon
/// or a negative weight decay or clipping norm trains nonsense (or NaN).
static Error checkOptimizerFlags() {
  auto Bad = [](const char *Flag, double V, const char *Want) {
    return createStringError(inconvertibleErrorCode(),
                             "%s must be %s, got %g", Flag, Want, V);
  };
  for (auto [Flag, Opt] : {std::pair{"--beta1", &Beta1}, {"--beta2", &Beta2}})
    if (!(*Opt >= 0 && *Opt < 1))
      return Bad(Flag, *Opt, "in [0, 1)");
  if (!(AdamEps > 0) || !std::isfinite(AdamEps))
    return Bad("--adam-eps", AdamEps, "a positive number");
  for (auto [Flag, Opt] : {std::pair{"--weight-decay", &WeightDecay},
                           {"--max-grad-norm", &MaxGradNorm}})
    if (!(*Opt >= 0) || !std::isfinite(*Opt))
      return Bad(Flag, *Opt, "a non-negative number (0: off)");
  return Error::success();
}

static void setOptimizerOptions(PassContext &Ctx) {
  Ctx.Optimizer.WeightDecay = WeightDecay;
  Ctx.Optimizer.Beta1 = Beta1;
  Ctx.Optimizer.Beta2 = Beta2;
  Ctx.Optimizer.Eps = AdamEps;
  Ctx.Optimizer.MaxGradNorm = MaxGradNorm;
}

int main(int Argc, char **Argv) {
  InitLLVM X(Argc, Argv);
  cl::OptionCategory &PMCat = registerPassManagerCLOptions();
  cl::OptionCategory &ImportCat = registerImportCLOptions();
  cl::HideUnrelatedOptions({&Cat, &ImportCat, &PMCat});
  cl::ParseCommandLineOptions(
      Argc, Argv, "sp-compile: compile an exported Transformer for training\n");
  auto Start = std::chrono::steady_clock::now();
  auto IO = importOptionsFromCL();
  if (!IO)
    return reportError("sp-compile", IO.takeError());
  PassContext Ctx;
  if (auto E = passOptionsFromCL(Ctx))
    return reportError("sp-compile", std::move(E));
  if (auto E = checkOptimizerFlags())
    return reportError("sp-compile", std::move(E));
  setOptimizerOptions(Ctx);
  Ctx.ActivationDtype = ActDtype;
  if ((LossScale.getNumOccurrences() || LossScaleWindow.getNumOccurrences()) &&
      ActDtype != DType::F16)
    return reportError("sp-compile",
                       createStringError(inconvertibleErrorCode(),
                                         "--loss-scale and --loss-scale-window "
                                         "apply to --dtype fp16 (fp32 and bf16 "
                                         "have fp32's exponent range and need "
                                         "no loss scaling)"));
  int Exp = 0;
  if (!(LossScale >= 1 && LossScale <= 0x1p64) ||
      std::frexp(LossScale, &Exp) != 0.5)
    return reportError("sp-compile",
                       createStringError(inconvertibleErrorCode(),
                                         "--loss-scale must be a power of two "
                                         "in [1, 2^64] (so that scaling is "
                                         "exact), got %g",
                                         LossScale.getValue()));
  if (LossScaleWindow < 1)
    return reportError("sp-compile",
                       createStringError(inconvertibleErrorCode(),
                                         "--loss-scale-window must be >= 1"));
  Ctx.LossScale = LossScale;
  Ctx.LossScaleWindow = LossScaleWindow;
  if (!Figure7.empty() && !PaperTable)
    return reportError("sp-compile",
                       createStringError(inconvertibleErrorCode(),
                                         "--figure7 needs --paper-table"));
  if (!Gantt.empty() && !Ctx.Pipeline.enabled())
    return reportError("sp-compile",
                       createStringError(inconvertibleErrorCode(),
                                         "--gantt needs a pipelined training "
                                         "plan (--pp P or --microbatches N)"));
  // Every output file can be written, checked before any is: a bad --report
  // must not fail after the plan is written.
  for (auto [Path, Flag] : {std::pair{&Report, "--report"},
                            {&Html, "--html"},
                            {&Gantt, "--gantt"},
                            {&Figure7, "--figure7"}})
    if (!Path->empty())
      if (auto E = checkWritableFile(*Path))
        return reportError("sp-compile",
                           createStringError(inconvertibleErrorCode(), "%s: %s",
                                             Flag,
                                             toString(std::move(E)).c_str()));
  std::optional<AutoOptions> AutoO;
  if (Auto) {
    bool Chosen = Ctx.TensorParallel != 1 || Ctx.SequenceParallel ||
                  Ctx.Pipeline.enabled() || Ctx.DataParallel != 1 ||
                  Ctx.Zero || Ctx.Recompute.Mode != RecomputeMode::None;
    if (Chosen)
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--auto chooses --tp, --sp, --pp, "
                                           "--interleave, --microbatches, "
                                           "--dp, --zero and --recompute; "
                                           "drop them"));
    if (PaperTable)
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--auto and --paper-table do not "
                                           "go together"));
    AutoOptions A;
    if (AutoGpus < 1)
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--auto needs --gpus N (N >= 1)"));
    A.Gpus = AutoGpus;
    if (AutoMemory.empty())
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--auto needs --gpu-memory BYTES "
                                           "(e.g. 80GiB)"));
    auto Mem = byteFlag("--gpu-memory", AutoMemory, "80GiB or 40GB");
    if (!Mem)
      return reportError("sp-compile", Mem.takeError());
    A.GpuMemory = double(*Mem);
    if (AutoBatch < 0)
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--global-batch must be positive"));
    A.GlobalBatch = AutoBatch;
    AutoO = A;
  } else {
    for (auto [Given, Flag] :
         {std::pair{AutoGpus.getNumOccurrences() > 0, "--gpus"},
          {AutoMemory.getNumOccurrences() > 0, "--gpu-memory"},
          {AutoBatch.getNumOccurrences() > 0, "--global-batch"}})
      if (Given)
        return reportError("sp-compile",
                           createStringError(inconvertibleErrorCode(),
                                             "%s needs --auto", Flag));
  }
  std::optional<ClusterSpec> Machine;
  if (Estimate || !Cluster.empty() || Auto) {
    auto M = Cluster.empty() ? Expected<ClusterSpec>(ClusterSpec())
                             : readClusterSpec(Cluster);
    if (!M)
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--cluster: %s",
                                           toString(M.takeError()).c_str()));
    Machine = *M;
  }
  // The output folders too: the graphs must not be written when -o will
  // fail, nor the plan when --export-graphs will.
  if (!Output.empty())
    if (auto E = checkPlanOutput(Output))
      return reportError("sp-compile", std::move(E));
  if (!ExportGraphs.empty()) {
    if (auto E = checkGraphsOutput(ExportGraphs))
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--export-graphs %s",
                                           toString(std::move(E)).c_str()));
    if (PaperTable)
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--export-graphs writes one plan's "
                                           "programs; --paper-table compiles "
                                           "several (drop one of them)"));
  }
  if (PaperTable) {
    if (!Output.empty())
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--paper-table writes no plan; "
                                           "drop -o"));
    if (!Html.empty())
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--html describes one compiled "
                                           "plan and --paper-table compiles "
                                           "several; drop --html and write "
                                           "the table's chart with --figure7 "
                                           "FILE.svg (its numbers with "
                                           "--report FILE.json)"));
    if (auto E = runPaperTable(Inputs, *IO, Ctx, Figure7, Report, outs()))
      return reportError("sp-compile", std::move(E));
    return 0;
  }
  if (Inputs.size() != 1)
    return reportError("sp-compile",
                       createStringError(inconvertibleErrorCode(),
                                         "expected one model, got %zu (only "
                                         "--paper-table takes several)",
                                         Inputs.size()));
  const std::string &Input = Inputs[0];
  auto G = loadGraph(Input, *IO);
  if (!G)
    return reportError("sp-compile", G.takeError());
  CompileOptions CO;
  CO.Passes = passesFromCL(DefaultPasses);
  CO.PassManager = passManagerOptionsFromCL();
  CO.Source = Input;
  std::optional<AutoResult> Searched;
  if (AutoO) {
    AutoO->Cluster = *Machine;
    AutoO->Source = Input;
    auto R = searchLayouts(**G, Ctx, *AutoO);
    if (!R)
      return reportError("sp-compile", R.takeError());
    printSearch(*R, *AutoO, outs());
    Searched = std::move(*R);
    // The rest prints, estimates and writes the best plan.
    Ctx = layoutContext(Ctx, Searched->Fits.front());
    *G = std::move(Searched->BestGraph);
  }
  auto C = Searched ? Expected<Compilation>(std::move(*Searched->Best))
                    : compileToPlan(**G, Ctx, CO);
  if (!C)
    return reportError("sp-compile", C.takeError());
  if (Searched)
    C->Facts["auto"] = searchToJson(*Searched, *AutoO);
  if (!C->P && !Output.empty())
    return reportError("sp-compile",
                       createStringError(inconvertibleErrorCode(),
                                         "-o needs a training graph; the "
                                         "pipeline must include autodiff "
                                         "and optimizer"));
  if (!C->P && !Html.empty())
    return reportError("sp-compile",
                       createStringError(inconvertibleErrorCode(),
                                         "--html needs a training graph; the "
                                         "pipeline must include autodiff and "
                                         "optimizer"));
  if (!C->P && !ExportGraphs.empty())
    return reportError("sp-compile",
                       createStringError(inconvertibleErrorCode(),
                                         "--export-graphs needs a training "
                                         "graph; the pipeline must include "
                                         "autodiff and optimizer"));
  double Seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - Start)
          .count();
  if (!Quiet) {
    printModelSummary(C->Info, **G, outs());
    if (C->P) {
      const Program &Prog = C->P->Prog;
      const RunStats &Run = C->Ranks[0];
      outs() << formatv("plan: {0} instructions over {1} buffers, {2} "
                        "activations\n",
                        Run.Instructions, Run.Buffers, dtypeName(ActDtype));
      if (Prog.compact())
        outs() << formatv("  run as {0} steps of {1} templates ({2} "
                          "instructions)\n",
                          Prog.Steps.size(), Prog.Templates.size(),
                          Prog.Instrs.size());
      outs() << formatv("  arena {0} = persistent {1} (parameters, "
                        "optimizer state, inputs) + temporaries {2} (peak "
                        "live {3})\n",
                        humanBytes(Prog.ArenaBytes),
                        humanBytes(Prog.PersistentBytes),
                        humanBytes(Prog.ArenaBytes - Prog.PersistentBytes),
                        humanBytes(Run.PeakLiveTempBytes));
      ModelState MS = modelState(Prog);
      outs() << formatv("  model state: parameters {0} + gradients {1} + "
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
                                           " of " + dtypeName(ActDtype).str() +
                                           " compute copies"
                                     : std::string());
      printCollectives(collectiveReport(Prog, Ctx.TensorParallel),
                       Ctx.TensorParallel, outs());
      printActivations(*C->Activations, Prog, C->Formula, C->Info.Family,
                       outs());
      if (Ctx.Pipeline.enabled())
        printPipeline(**G, Ctx.Pipeline, *C->Lowered, *C->P, C->Ranks[0],
                      C->Facts["bubble"], outs());
    }
    outs() << formatv("compiled in {0:F3} s ({1} nodes)\n", Seconds,
                      (*G)->numNodes());
  }
  if (Machine) {
    if (!C->P)
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--estimate needs a training "
                                           "graph; the pipeline must include "
                                           "autodiff and optimizer"));
    auto E = printEstimate(*Machine, Ctx, *C);
    if (!E)
      return reportError("sp-compile", E.takeError());
    outs() << *E; // asked for: printed under --quiet too
  }
  if (!ExportGraphs.empty()) {
    auto Names = exportGraphs(*C->P, ExportGraphs);
    if (!Names)
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--export-graphs: %s",
                                           toString(Names.takeError()).c_str()));
    if (!Quiet)
      outs() << formatv("wrote {0} ONNX graph{1} to {2} ({3})\n",
                        Names->size(), Names->size() == 1 ? "" : "s",
                        ExportGraphs, join(*Names, ", "));
  }
  if (!Output.empty()) {
    if (auto E = writePlan(Output, *C->P))
      return reportError("sp-compile", std::move(E));
    if (!Quiet)
      outs() << "wrote plan " << Output << "\n";
  }
  if (!Gantt.empty()) {
    if (!C->Lowered || !Ctx.Pipeline.enabled())
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--gantt needs a pipelined training "
                                           "plan (--pp P or --microbatches N)"));
    // The chart the plan holds (compileToPlan drew it).
    auto Chart = find_if(C->P->Files, [](const auto &F) {
      return F.first == "schedule.svg";
    });
    assert(Chart != C->P->Files.end() && "a pipelined plan has its chart");
    if (auto E = writeFileAtomically(Gantt, [&](raw_ostream &F) {
          F << Chart->second;
        }))
      return reportError("sp-compile", std::move(E));
  }
  if (!Report.empty()) {
    nlohmann::json J = C->Facts;
    J["compile_seconds"] = Seconds;
    if (auto E = writeFileAtomically(Report, [&](raw_ostream &OS) {
          OS << J.dump(2) << "\n";
        }))
      return reportError("sp-compile", std::move(E));
  }
  if (!Html.empty()) {
    if (auto E = writeHtmlReport(Html, *C, Ctx, Input,
                                 commandLine(Argc, Argv)))
      return reportError("sp-compile", std::move(E));
    if (!Quiet)
      outs() << "wrote report page " << Html << "\n";
  }
  return 0;
}
