//===- sp-compile.cpp - Compile an exported Transformer -------------------===//
//
//   sp-compile MODEL.onnx [-o PLAN] [--tp T --sp] [--recompute MODE]
//              [--pp P --interleave M --microbatches N] [--dtype fp32]
//              [--report FILE.json] [--gantt FILE.svg] [--print-after-all]
//   sp-compile --paper-table MODEL.onnx... [--figure7 FILE.svg] [--pp ...]
//
// Imports the model, runs the pipeline (passes/Passes.h: DefaultPasses),
// lowers the training graph to one program per pipeline rank and plans
// their memory, prints what it recognised with the memory, FLOP and
// collective reports and, with -o, writes the plan directory. --paper-table
// compiles the paper's configurations of each model and compares them with
// Table 2 (and Eq. 5/6).
//
//===----------------------------------------------------------------------===//
#include "lower/LowerGraph.h"
#include "passes/Charts.h"
#include "passes/CollectiveReport.h"
#include "passes/Cost.h"
#include "lower/MemoryPlan.h"
#include "passes/MemoryReport.h"
#include "passes/ModelInfo.h"
#include "passes/PassManager.h"
#include "passes/Passes.h"
#include "passes/LowerTraining.h"
#include "lower/UnrollSchedule.h"
#include "plan/Plan.h"
#include "tools/ToolSupport.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include <chrono>
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
static cl::opt<bool> Quiet("quiet", cl::desc("Do not print the summary"),
                           cl::cat(Cat));
static cl::opt<std::string> Output("o", cl::desc("Write the plan directory"),
                                   cl::value_desc("plan"), cl::cat(Cat));
static cl::opt<DType> ActDtype(
    "dtype", cl::desc("Activation dtype of the plan (the CPU runs fp32)"),
    cl::values(clEnumValN(DType::F32, "fp32", "32-bit float"),
               clEnumValN(DType::BF16, "bf16", "bfloat16"),
               clEnumValN(DType::F16, "fp16", "IEEE half")),
    cl::init(DType::F32), cl::cat(Cat));
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
                          const LoweredPlan &L, const ActivationReport &First,
                          raw_ostream &OS) {
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
  OS << formatv("  first stage: {0} microbatch-chunks in flight, {1} of "
                "stored activations\n",
                maxInFlight(L.Sched, 0), humanBytes(First.StoredPeakBytes));
  OS << "  arena by rank:";
  for (size_t K = 0; K < L.Stages.size(); ++K)
    OS << " " << humanBytes(L.Stages[K].ArenaBytes);
  OS << "\n";
}

/// The schedule timed by each stage's GEMM work (GFLOP per microbatch,
/// forward, backward and recompute), as an SVG Gantt chart. A message takes
/// the work an A100 does while NVLink (300 GB/s) moves it: 1040 FLOP per
/// byte.
static Error writeScheduleSvg(const Graph &G, const LoweredPlan &L,
                              StringRef Title, raw_ostream &OS) {
  int V = L.Sched.numStages();
  StepCosts C;
  C.Forward.assign(V, 0.0);
  C.Backward.assign(V, 0.0);
  C.Recompute.assign(V, 0.0);
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
      C.Backward[S] += F;
      break;
    case Phase::Recompute:
      C.Recompute[S] += F;
      break;
    case Phase::Optimizer:
      break;
    }
  }
  int64_t Bytes = 0, Messages = 0;
  for (const Instruction &I : L.Stages[0].Instrs)
    if (I.Op == OpKind::Send) {
      Bytes += L.Stages[0].Buffers[I.In[0]].Bytes;
      ++Messages;
    }
  if (Messages)
    C.Comm = 1040.0 * double(Bytes) / double(Messages) / 1e9;
  auto Times = simulateTimes(L.Sched, C);
  if (!Times)
    return Times.takeError();
  GanttOptions O;
  O.Title = Title.str();
  O.TimeUnit = "GFLOP";
  return writeGanttSvg(OS, L.Sched, *Times, O);
}

static void setOptimizerOptions(PassContext &Ctx) {
  Ctx.Optimizer.WeightDecay = WeightDecay;
  Ctx.Optimizer.Beta1 = Beta1;
  Ctx.Optimizer.Beta2 = Beta2;
  Ctx.Optimizer.Eps = AdamEps;
  Ctx.Optimizer.MaxGradNorm = MaxGradNorm;
}

/// One model of --paper-table: our bytes and Table 2's for each
/// configuration.
struct PaperRow {
  std::string Name;
  int64_t Ours;
  double Formula;
};
struct PaperModel {
  std::string Name;
  ModelInfo Info;
  int T;
  std::vector<PaperRow> Rows;
};

static Expected<PaperModel> paperTable(StringRef Path, const ImportOptions &IO,
                                       const PassContext &Base) {
  auto Imported = loadGraph(Path, IO);
  if (!Imported)
    return Imported.takeError();
  PaperModel M;
  M.Name = sys::path::stem(Path).str();
  M.T = Base.TensorParallel > 1 ? Base.TensorParallel : 8;
  // The imported graph compiled with Base's options but these parallel ones
  // and fp16 accounting.
  auto Compile = [&](int T, bool SP, RecomputeMode R, bool Pipelined,
                     StringRef What) -> Expected<std::unique_ptr<Graph>> {
    std::unique_ptr<Graph> G = (*Imported)->clone();
    PassContext Ctx = Base;
    if (!Pipelined)
      Ctx.Pipeline = PipelineOptions(); // one layer, one microbatch
    Ctx.TensorParallel = T;
    Ctx.SequenceParallel = SP;
    Ctx.Recompute = RecomputeOptions();
    Ctx.Recompute.Mode = R;
    Ctx.ActivationDtype = DType::F16;
    PassManager PM(PassManagerOptions{});
    if (auto E = PM.addPasses(DefaultPasses))
      return std::move(E);
    if (auto E = PM.run(*G, Ctx))
      return createStringError(inconvertibleErrorCode(), "%s (%s): %s",
                               Path.str().c_str(), What.str().c_str(),
                               toString(std::move(E)).c_str());
    return std::move(G);
  };
  for (const PaperConfig &C : paperConfigs()) {
    auto G = Compile(C.TensorParallel ? M.T : 1, C.SequenceParallel,
                     C.Recompute, /*Pipelined=*/false, C.Name);
    if (!G)
      return G.takeError();
    auto Info = summarizeModel(**G);
    if (!Info)
      return Info.takeError();
    M.Info = *Info;
    auto Prog = lowerGraph(**G, DType::F16);
    if (!Prog)
      return Prog.takeError();
    planMemory(*Prog);
    ActivationReport R = analyzeActivations(*Prog);
    M.Rows.push_back({C.Name, R.layerBytes(R.middleLayer()),
                      table2Bytes(C, Info->Heads, Info->Seq, Info->Batch,
                                  Info->Hidden, M.T)});
  }
  // With --pp: the whole first stage (Eq. 5 and 6), from rank 0's unrolled
  // program alone.
  const PipelineOptions &PO = Base.Pipeline;
  if (PO.Stages < 2)
    return M;
  for (bool Selective : {false, true}) {
    auto G = Compile(M.T, /*SP=*/true,
                     Selective ? RecomputeMode::Selective : RecomputeMode::None,
                     /*Pipelined=*/true, "pipeline");
    if (!G)
      return G.takeError();
    auto S = buildSchedule(scheduleKind(PO.Schedule), PO.Stages,
                           PO.Interleave, PO.Microbatches);
    if (!S)
      return S.takeError();
    auto Prog = lowerPipelineRank(**G, DType::F16, computeSteps(*S), 0);
    if (!Prog)
      return Prog.takeError();
    ActivationReport R = analyzeActivations(*Prog);
    const ModelInfo &I = M.Info;
    double SBH = double(I.Seq) * I.Batch * I.Hidden, T = M.T,
           P = PO.Stages, Ms = PO.Interleave;
    double PerLayer = Selective ? 34 : 34 + 5.0 * I.Heads * I.Seq / I.Hidden;
    double Factor = Ms > 1 ? 1 + (P - 1) / (P * Ms) : 1;
    // Eq. 5/6, and the embedding dropout's 1-byte mask (s b h / t) for each
    // microbatch the first chunk holds: p in the paper, which assumes no
    // interleaving; the schedule's own count here.
    int FirstChunk = 0, Live = 0;
    for (const ScheduleStep &St : S->Steps[0])
      if (St.isCompute() && St.Chunk == 0) {
        Live += St.Kind == StepKind::Forward ? 1 : -1;
        FirstChunk = std::max(FirstChunk, Live);
      }
    double Formula =
        SBH * I.Layers / T * PerLayer * Factor + SBH * FirstChunk / T;
    M.Rows.push_back({formatv("first stage, TP+SP{0}, p {1} m {2} (Eq. {3})",
                              Selective ? "+selective" : "", PO.Stages,
                              PO.Interleave, Selective ? 6 : 5)
                          .str(),
                      R.StoredPeakBytes, Formula});
  }
  return M;
}

/// The paper's Figure 7: for each model, each configuration's bytes as a
/// percentage of the tensor-parallel baseline; ours as bars, Table 2's as a
/// tick on each bar.
static Error writeFigure7(ArrayRef<PaperModel> Models, raw_ostream &OS) {
  BarChart C;
  C.Title = "Activation memory per layer, as a percentage of the "
            "tensor-parallel baseline";
  C.YLabel = "% of tensor parallel (t = " +
             std::to_string(Models.empty() ? 8 : Models[0].T) + ")";
  C.MarkerLabel = "Table 2";
  C.YMax = 100;
  C.Width = 900;
  for (size_t K = 1; K < paperConfigs().size(); ++K)
    C.Series.push_back(paperConfigs()[K].Short);
  for (const PaperModel &M : Models) {
    C.Groups.push_back(M.Name);
    std::vector<double> Ours, Paper;
    double Base = M.Rows[1].Ours, BaseF = M.Rows[1].Formula;
    for (size_t K = 1; K < paperConfigs().size(); ++K) {
      Ours.push_back(100 * double(M.Rows[K].Ours) / Base);
      Paper.push_back(100 * M.Rows[K].Formula / BaseF);
    }
    C.Values.push_back(std::move(Ours));
    C.Markers.push_back(std::move(Paper));
  }
  return writeBarChartSvg(OS, C);
}

static int runPaperTable(const ImportOptions &IO, const PassContext &Base) {
  std::vector<PaperModel> Models;
  nlohmann::json J = nlohmann::json::array();
  for (const std::string &Path : Inputs) {
    auto M = paperTable(Path, IO, Base);
    if (!M)
      return reportError("sp-compile", M.takeError());
    const ModelInfo &I = M->Info;
    outs() << formatv("{0}: a {1}, s {2}, b {3}, h {4}, L {5}, t {6}; "
                      "activation bytes of layer {7} per rank, fp16 "
                      "activations and 1-byte masks\n",
                      M->Name, I.Heads, I.Seq, I.Batch, I.Hidden, I.Layers,
                      M->T, I.Layers / 2);
    outs() << formatv("  {0,-50} {1,16} {2,16} {3,9}\n", "configuration",
                      "ours", "Table 2", "diff");
    nlohmann::json Rows = nlohmann::json::array();
    for (const PaperRow &R : M->Rows) {
      double Diff = R.Ours / R.Formula - 1;
      outs() << formatv("  {0,-50} {1,16} {2,16:F0} {3,8:F3}%\n", R.Name,
                        R.Ours, R.Formula, 100 * Diff);
      Rows.push_back({{"configuration", R.Name},
                      {"bytes", R.Ours},
                      {"table2_bytes", R.Formula},
                      {"relative_difference", Diff}});
    }
    J.push_back({{"model", M->Name},
                 {"heads", I.Heads},
                 {"seq", I.Seq},
                 {"batch", I.Batch},
                 {"hidden", I.Hidden},
                 {"layers", I.Layers},
                 {"tp", M->T},
                 {"rows", Rows}});
    Models.push_back(std::move(*M));
  }
  outs() << "the residual is the LayerNorm statistics (mean and 1/std, f32, "
            "per row), which Table 2 ignores\n";
  if (!Figure7.empty()) {
    std::string Svg;
    raw_string_ostream SvgOS(Svg);
    if (auto E = writeFigure7(Models, SvgOS))
      return reportError("sp-compile", std::move(E));
    if (auto E = writeFileAtomically(Figure7, [&](raw_ostream &OS) {
          OS << SvgOS.str();
        }))
      return reportError("sp-compile", std::move(E));
  }
  if (!Report.empty())
    if (auto E = writeFileAtomically(Report, [&](raw_ostream &OS) {
          OS << nlohmann::json({{"paper_table", J}}).dump(2) << "\n";
        }))
      return reportError("sp-compile", std::move(E));
  return 0;
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
  setOptimizerOptions(Ctx);
  Ctx.ActivationDtype = ActDtype;
  if (!Figure7.empty() && !PaperTable)
    return reportError("sp-compile",
                       createStringError(inconvertibleErrorCode(),
                                         "--figure7 needs --paper-table"));
  if (PaperTable) {
    if (!Output.empty())
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--paper-table writes no plan; "
                                           "drop -o"));
    return runPaperTable(*IO, Ctx);
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
  PassManager PM(passManagerOptionsFromCL());
  if (auto E = PM.addPasses(passesFromCL(DefaultPasses)))
    return reportError("sp-compile", std::move(E));
  if (auto E = PM.run(**G, Ctx))
    return reportError("sp-compile", createStringError(
                                         inconvertibleErrorCode(), "%s: %s",
                                         Input.c_str(),
                                         toString(std::move(E)).c_str()));
  auto Info = summarizeModel(**G);
  if (!Info)
    return reportError("sp-compile", Info.takeError());
  // Lower and plan the training graph (a graph the pipeline stopped short
  // of training is only summarised).
  std::optional<Plan> P;
  std::optional<LoweredPlan> Lowered;
  bool Training = any_of((*G)->outputs(), [](const Graph::Output &O) {
    return O.Name == "loss";
  });
  if (Training) {
    auto L = lowerTrainingGraph(**G, Ctx);
    if (!L)
      return reportError("sp-compile", L.takeError());
    Lowered = std::move(*L);
    P.emplace();
    P->Prog = Lowered->Stages[0];
    if (Ctx.Pipeline.enabled())
      P->Stages = Lowered->Stages;
  } else if (!Output.empty()) {
    return reportError("sp-compile",
                       createStringError(inconvertibleErrorCode(),
                                         "-o needs a training graph; the "
                                         "pipeline must include autodiff "
                                         "and optimizer"));
  }
  double Seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - Start)
          .count();
  nlohmann::json Facts = modelInfoToJson(*Info);
  std::optional<ActivationReport> Activations;
  std::optional<ActivationReport> FirstStage;
  std::optional<LayerFormula> Formula;
  if (P) {
    const Program &Prog = P->Prog;
    const Program &OneMicrobatch = Lowered->OneMicrobatch;
    int64_t Live = peakLiveTempBytes(Prog);
    Facts["plan"] = {{"instructions", Prog.Instrs.size()},
                     {"buffers", Prog.Buffers.size()},
                     {"dtype", dtypeName(ActDtype).str()},
                     {"persistent_bytes", Prog.PersistentBytes},
                     {"arena_bytes", Prog.ArenaBytes},
                     {"peak_live_temp_bytes", Live}};
    Facts["parallel"] = {{"tp", Ctx.TensorParallel},
                         {"sp", Ctx.SequenceParallel},
                         {"pp", Ctx.Pipeline.Stages},
                         {"interleave", Ctx.Pipeline.Interleave},
                         {"microbatches", Ctx.Pipeline.Microbatches}};
    Facts["collectives"] =
        collectivesToJson(collectiveReport(OneMicrobatch, Ctx.TensorParallel));
    Activations = analyzeActivations(OneMicrobatch);
    StageMemory SM;
    FirstStage = analyzeActivations(Prog);
    SM.FirstStageStored = FirstStage->StoredPeakBytes;
    SM.InFlight = maxInFlight(Lowered->Sched, 0);
    for (int K = 0; K < P->numStages(); ++K) {
      SM.PeakBytes = std::max(SM.PeakBytes, P->stage(K).ArenaBytes);
      SM.StageArena.push_back(P->stage(K).ArenaBytes);
      SM.StageStored.push_back(
          K == 0 ? FirstStage->StoredPeakBytes
                 : analyzeActivations(P->stage(K)).StoredPeakBytes);
    }
    Facts["memory"] = memoryReportToJson(*Activations, Prog, SM);
    // The family's formula for the middle layer, under the recomputation
    // that layer got.
    if (!Activations->LayerRecompute.empty()) {
      StringRef Kind =
          Activations->LayerRecompute[Activations->middleLayer()];
      RecomputeMode Mode = Kind == "full"        ? RecomputeMode::Full
                           : Kind == "selective" ? RecomputeMode::Selective
                                                 : RecomputeMode::None;
      Formula = layerFormula(*Info, Ctx.TensorParallel, Ctx.SequenceParallel,
                             Mode, dtypeSize(ActDtype));
      Facts["memory"]["formula"] = {{"family", Info->Family},
                                    {"text", Formula->Text},
                                    {"bytes_per_layer", Formula->Bytes}};
    }
    Facts["flops"] = flopReportToJson(
        *Activations, Ctx.TensorParallel,
        {Info->Batch * Ctx.Pipeline.Microbatches, Info->Layers, Info->Seq,
         Info->Hidden, Info->Vocab},
        Ctx.Pipeline.Microbatches);
  }
  if (!Quiet) {
    printModelSummary(*Info, **G, outs());
    if (P) {
      const Program &Prog = P->Prog;
      outs() << formatv("plan: {0} instructions over {1} buffers, {2} "
                        "activations\n",
                        Prog.Instrs.size(), Prog.Buffers.size(),
                        dtypeName(ActDtype));
      outs() << formatv("  arena {0} = persistent {1} (parameters, "
                        "optimizer state, inputs) + temporaries {2} (peak "
                        "live {3})\n",
                        humanBytes(Prog.ArenaBytes),
                        humanBytes(Prog.PersistentBytes),
                        humanBytes(Prog.ArenaBytes - Prog.PersistentBytes),
                        humanBytes(peakLiveTempBytes(Prog)));
      printCollectives(collectiveReport(Prog, Ctx.TensorParallel),
                       Ctx.TensorParallel, outs());
      printActivations(*Activations, Prog, Formula, Info->Family, outs());
      if (Ctx.Pipeline.enabled())
        printPipeline(**G, Ctx.Pipeline, *Lowered, *FirstStage, outs());
    }
    outs() << formatv("compiled in {0:F3} s ({1} nodes)\n", Seconds,
                      (*G)->numNodes());
  }
  if (!Output.empty()) {
    P->Manifest = Facts;
    P->Manifest["source"] = Input;
    P->Manifest["dtype"] = dtypeName(ActDtype).str();
    P->Manifest["tp"] = Ctx.TensorParallel;
    P->Manifest["sp"] = Ctx.SequenceParallel;
    if (Ctx.Pipeline.enabled()) {
      const PipelineOptions &PO = Ctx.Pipeline;
      P->Manifest["pp"] = PO.Stages;
      P->Manifest["interleave"] = PO.Interleave;
      P->Manifest["microbatches"] = PO.Microbatches;
      P->Manifest["schedule"] = scheduleKindName(scheduleKind(PO.Schedule)).str();
    }
    if (Ctx.Pipeline.enabled()) {
      std::string Svg;
      raw_string_ostream OS(Svg);
      if (auto E = writeScheduleSvg(**G, *Lowered, sys::path::stem(Input), OS))
        return reportError("sp-compile", std::move(E));
      P->Files.push_back({"schedule.svg", OS.str()});
    }
    if (auto E = writePlan(Output, *P))
      return reportError("sp-compile", std::move(E));
    if (!Quiet)
      outs() << "wrote plan " << Output << "\n";
  }
  if (!Gantt.empty()) {
    if (!Lowered || !Ctx.Pipeline.enabled())
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "--gantt needs a pipelined training "
                                           "plan (--pp P or --microbatches N)"));
    std::string Svg;
    raw_string_ostream OS(Svg);
    if (auto E = writeScheduleSvg(**G, *Lowered, sys::path::stem(Input), OS))
      return reportError("sp-compile", std::move(E));
    if (auto E = writeFileAtomically(Gantt, [&](raw_ostream &F) {
          F << OS.str();
        }))
      return reportError("sp-compile", std::move(E));
  }
  if (!Report.empty()) {
    nlohmann::json J = Facts;
    J["compile_seconds"] = Seconds;
    if (auto E = writeFileAtomically(Report, [&](raw_ostream &OS) {
          OS << J.dump(2) << "\n";
        }))
      return reportError("sp-compile", std::move(E));
  }
  return 0;
}
