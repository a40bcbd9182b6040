//===- sp-compile.cpp - Compile an exported Transformer -------------------===//
//
//   sp-compile MODEL.onnx [-o PLAN] [--tp T --sp] [--recompute MODE]
//              [--pp P --interleave M --microbatches N] [--dtype fp32]
//              [--report FILE.json] [--gantt FILE.svg] [--print-after-all]
//              [--html FILE.html]
//   sp-compile --paper-table MODEL.onnx... [--figure7 FILE.svg] [--pp ...]
//
// Imports the model and compiles it (driver/Compile.h: the passes of
// passes/Passes.h, lowering to one planned program per pipeline rank, the
// reports), prints what it recognised with the memory, FLOP and collective
// reports (driver/CompileSummary.h) and, with -o, writes the plan directory
// (driver/CompileTool.h). --auto searches the layouts first
// (planner/AutoPlan.h); --paper-table compiles the paper's configurations of
// each model and compares them with Table 2 (and Eq. 5/6;
// tools/PaperTable.h).
//
//===----------------------------------------------------------------------===//
#include "driver/CompileSummary.h"
#include "driver/CompileTool.h"
#include "html/HtmlReport.h"
#include "planner/AutoPlan.h"
#include "planner/Estimate.h"
#include "tools/PaperTable.h"
#include "tools/ToolSupport.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include <chrono>

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
             "(planner/CostModel.h; DGX A100 80GB unless --cluster)"),
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

/// The flags as the driver's options (a flag not given stays unset).
static CompileToolOptions toolOptions() {
  CompileToolOptions O;
  O.Inputs = Inputs;
  O.Output = Output, O.Report = Report, O.Html = Html, O.Gantt = Gantt;
  O.Figure7 = Figure7, O.ExportGraphs = ExportGraphs;
  O.PaperTable = PaperTable, O.Quiet = Quiet;
  O.Estimate = Estimate, O.Cluster = Cluster, O.Auto = Auto;
  if (AutoGpus.getNumOccurrences())
    O.AutoGpus = AutoGpus;
  if (AutoMemory.getNumOccurrences())
    O.AutoMemory = AutoMemory;
  if (AutoBatch.getNumOccurrences())
    O.AutoBatch = AutoBatch;
  O.ActDtype = ActDtype;
  if (LossScale.getNumOccurrences())
    O.LossScale = LossScale;
  if (LossScaleWindow.getNumOccurrences())
    O.LossScaleWindow = LossScaleWindow;
  O.Optimizer = {.Beta1 = Beta1, .Beta2 = Beta2, .Eps = AdamEps,
                 .WeightDecay = WeightDecay, .MaxGradNorm = MaxGradNorm};
  return O;
}

int main(int Argc, char **Argv) {
  InitLLVM X(Argc, Argv);
  cl::OptionCategory &PMCat = registerPassManagerCLOptions();
  cl::OptionCategory &ImportCat = registerImportCLOptions();
  cl::HideUnrelatedOptions({&Cat, &ImportCat, &PMCat});
  cl::ParseCommandLineOptions(
      Argc, Argv, "sp-compile: compile an exported Transformer for training\n");
  auto Start = std::chrono::steady_clock::now();
  auto Fail = [](Error E) { return reportError("sp-compile", std::move(E)); };
  auto IO = importOptionsFromCL();
  if (!IO)
    return Fail(IO.takeError());
  PassContext Ctx;
  if (auto E = passOptionsFromCL(Ctx))
    return Fail(std::move(E));
  CompileToolOptions O = toolOptions();
  if (auto E = O.validate(Ctx))
    return Fail(std::move(E));
  std::optional<ClusterSpec> Machine;
  if (O.wantsCluster()) {
    auto M = O.Cluster.empty() ? Expected<ClusterSpec>(ClusterSpec())
                               : readClusterSpec(O.Cluster);
    if (!M)
      return Fail(createStringError(inconvertibleErrorCode(), "--cluster: %s",
                                    toString(M.takeError()).c_str()));
    Machine = *M;
  }
  if (auto E = checkCompileOutputs(O))
    return Fail(std::move(E));
  if (O.PaperTable) {
    if (auto E = runPaperTable(O.Inputs, *IO, Ctx, O.Figure7, O.Report, outs()))
      return Fail(std::move(E));
    return 0;
  }
  auto G = loadGraph(O.Inputs[0], *IO);
  if (!G)
    return Fail(G.takeError());
  CompileOptions CO;
  CO.Passes = passesFromCL(DefaultPasses);
  CO.PassManager = passManagerOptionsFromCL();
  CO.Source = O.Inputs[0];
  std::optional<AutoResult> Searched;
  AutoOptions A;
  if (O.Auto) {
    A.Gpus = *O.AutoGpus;
    A.GpuMemory = double(O.autoMemoryBytes());
    A.GlobalBatch = O.AutoBatch.value_or(0);
    A.Cluster = *Machine;
    A.Source = CO.Source;
    auto R = searchLayouts(**G, Ctx, A);
    if (!R)
      return Fail(R.takeError());
    printSearch(*R, A, outs());
    Searched = std::move(*R);
    // The rest prints, estimates and writes the best plan.
    Ctx = layoutContext(Ctx, Searched->Fits.front());
    *G = std::move(Searched->BestGraph);
  }
  auto C = Searched ? Expected<Compilation>(std::move(*Searched->Best))
                    : compileToPlan(**G, Ctx, CO);
  if (!C)
    return Fail(C.takeError());
  if (Searched)
    C->Facts["auto"] = searchToJson(*Searched, A);
  if (auto E = checkTrainingOutputs(O, *C))
    return Fail(std::move(E));
  double Seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - Start)
                       .count();
  if (!O.Quiet)
    printCompileSummary(*C, **G, Ctx, Seconds, outs());
  if (Machine) {
    auto E = estimateCompilation(*Machine, Ctx, *C);
    if (!E)
      return Fail(E.takeError());
    outs() << *E; // asked for: printed under --quiet too
  }
  if (auto E = writeCompileOutputs(O, Ctx, *C, Seconds, outs()))
    return Fail(std::move(E));
  if (!O.Html.empty()) {
    if (auto E = writeCompilePage(O.Html, *C, Ctx, CO.Source,
                                  commandLine(Argc, Argv)))
      return Fail(std::move(E));
    if (!O.Quiet)
      outs() << "wrote report page " << O.Html << "\n";
  }
  return 0;
}
