//===- sp-compile.cpp - Compile an exported Transformer -------------------===//
//
//   sp-compile MODEL.onnx [-o PLAN] [--batch B --seq S] [--dtype fp32]
//              [--report FILE.json] [--print-after-all] [--dump-dir DIR]
//
// Imports the model, runs the pipeline (passes/Passes.h: DefaultPipeline),
// prints what it recognised and, with -o, lowers the training graph to a
// program, plans its memory and writes the plan directory.
//
//===----------------------------------------------------------------------===//
#include "passes/CollectiveReport.h"
#include "passes/MemoryPlan.h"
#include "passes/MemoryReport.h"
#include "passes/ModelInfo.h"
#include "passes/PassManager.h"
#include "passes/Passes.h"
#include "runtime/Plan.h"
#include "tools/ToolSupport.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include <chrono>
#include <map>
#include <optional>

using namespace llvm;
using namespace sp;

static cl::OptionCategory Cat("sp-compile options");
static cl::opt<std::string> Input(cl::Positional, cl::desc("<model.onnx>"),
                                  cl::Required, cl::cat(Cat));
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
                             raw_ostream &OS) {
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
  auto G = loadGraph(Input, *IO);
  if (!G)
    return reportError("sp-compile", G.takeError());
  PassManager PM(passManagerOptionsFromCL());
  if (auto E = PM.addPipeline(pipelineFromCL(DefaultPipeline)))
    return reportError("sp-compile", std::move(E));
  PassContext Ctx;
  if (auto E = passOptionsFromCL(Ctx))
    return reportError("sp-compile", std::move(E));
  Ctx.Optimizer.WeightDecay = WeightDecay;
  Ctx.Optimizer.Beta1 = Beta1;
  Ctx.Optimizer.Beta2 = Beta2;
  Ctx.Optimizer.Eps = AdamEps;
  Ctx.Optimizer.MaxGradNorm = MaxGradNorm;
  Ctx.ActivationDtype = ActDtype;
  if (auto E = PM.run(**G, Ctx))
    return reportError("sp-compile", createStringError(
                                         inconvertibleErrorCode(), "%s: %s",
                                         Input.c_str(),
                                         toString(std::move(E)).c_str()));
  auto Info = summarizeModel(**G);
  if (!Info)
    return reportError("sp-compile", Info.takeError());
  // Lower and plan the training graph.
  std::optional<Plan> P;
  if (!Output.empty() || Report.getNumOccurrences()) {
    bool Training = any_of((*G)->outputs(), [](const Graph::Output &O) {
      return O.Name == "loss";
    });
    if (Training) {
      auto Prog = lowerGraph(**G, ActDtype);
      if (!Prog)
        return reportError("sp-compile", Prog.takeError());
      planMemory(*Prog);
      P.emplace();
      P->Prog = std::move(*Prog);
    } else if (!Output.empty()) {
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "-o needs a training graph; the "
                                           "pipeline must include autodiff "
                                           "and optimizer"));
    }
  }
  double Seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - Start)
          .count();
  nlohmann::json Facts = modelInfoToJson(*Info);
  std::optional<ActivationReport> Activations;
  if (P) {
    const Program &Prog = P->Prog;
    int64_t Live = peakLiveTempBytes(Prog);
    Facts["plan"] = {{"instructions", Prog.Instrs.size()},
                     {"buffers", Prog.Buffers.size()},
                     {"dtype", dtypeName(ActDtype).str()},
                     {"persistent_bytes", Prog.PersistentBytes},
                     {"arena_bytes", Prog.ArenaBytes},
                     {"peak_live_temp_bytes", Live}};
    Facts["parallel"] = {{"tp", Ctx.TensorParallel},
                         {"sp", Ctx.SequenceParallel}};
    Facts["collectives"] =
        collectivesToJson(collectiveReport(Prog, Ctx.TensorParallel));
    Activations = analyzeActivations(Prog);
    Facts["memory"] = memoryReportToJson(*Activations, Prog);
    Facts["flops"] = flopReportToJson(
        *Activations, Ctx.TensorParallel,
        {Info->Batch, Info->Layers, Info->Seq, Info->Hidden, Info->Vocab});
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
      printActivations(*Activations, Prog, outs());
    }
    outs() << formatv("compiled in {0:F3} s ({1} nodes)\n", Seconds,
                      (*G)->numNodes());
  }
  if (!Output.empty()) {
    P->Manifest = Facts;
    P->Manifest["source"] = Input.getValue();
    P->Manifest["dtype"] = dtypeName(ActDtype).str();
    P->Manifest["tp"] = Ctx.TensorParallel;
    P->Manifest["sp"] = Ctx.SequenceParallel;
    if (auto E = writePlan(Output, *P))
      return reportError("sp-compile", std::move(E));
    if (!Quiet)
      outs() << "wrote plan " << Output << "\n";
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
