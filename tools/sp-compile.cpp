//===- sp-compile.cpp - Compile an exported Transformer -------------------===//
//
//   sp-compile MODEL.onnx [--batch B --seq S] [--report FILE.json]
//              [--print-after-all] [--dump-dir DIR] [--time-passes]
//
// Imports the model, runs the pipeline (default: constant-fold, canonicalize,
// dce, detect-transformer) and prints what it recognised.
//
//===----------------------------------------------------------------------===//
#include "passes/ModelInfo.h"
#include "passes/PassManager.h"
#include "passes/Passes.h"
#include "tools/ToolSupport.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include <chrono>

using namespace llvm;
using namespace sp;

static cl::OptionCategory Cat("sp-compile options");
static cl::opt<std::string> Input(cl::Positional, cl::desc("<model.onnx>"),
                                  cl::Required, cl::cat(Cat));
static cl::opt<int64_t> Batch("batch",
                              cl::desc("Micro-batch size (binds a symbolic batch dimension)"),
                              cl::init(0), cl::cat(Cat));
static cl::opt<int64_t> Seq("seq",
                            cl::desc("Sequence length (binds a symbolic sequence dimension)"),
                            cl::init(0), cl::cat(Cat));
static cl::opt<std::string> Report("report", cl::desc("Write a JSON report"),
                                   cl::value_desc("file.json"), cl::cat(Cat));
static cl::opt<bool> Quiet("quiet", cl::desc("Do not print the summary"),
                           cl::cat(Cat));

int main(int Argc, char **Argv) {
  InitLLVM X(Argc, Argv);
  cl::OptionCategory &PMCat = registerPassManagerCLOptions();
  cl::HideUnrelatedOptions({&Cat, &PMCat});
  cl::ParseCommandLineOptions(
      Argc, Argv, "sp-compile: compile an exported Transformer for training\n");
  for (auto [Name, V] : {std::pair{"--batch", &Batch}, {"--seq", &Seq}})
    if (V->getNumOccurrences() && *V <= 0)
      return reportError("sp-compile",
                         createStringError(inconvertibleErrorCode(),
                                           "%s must be a positive integer",
                                           Name));
  auto Start = std::chrono::steady_clock::now();
  ImportOptions IO;
  IO.Batch = Batch;
  IO.Seq = Seq;
  auto G = loadGraph(Input, IO);
  if (!G)
    return reportError("sp-compile", G.takeError());
  PassManager PM(passManagerOptionsFromCL());
  if (auto E = PM.addPipeline(pipelineFromCL(DefaultPipeline)))
    return reportError("sp-compile", std::move(E));
  PassContext Ctx;
  if (auto E = PM.run(**G, Ctx))
    return reportError("sp-compile", createStringError(
                                         inconvertibleErrorCode(), "%s: %s",
                                         Input.c_str(),
                                         toString(std::move(E)).c_str()));
  double Seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - Start)
          .count();
  auto Info = summarizeModel(**G);
  if (!Info)
    return reportError("sp-compile", Info.takeError());
  if (!Quiet) {
    printModelSummary(*Info, **G, outs());
    outs() << formatv("compiled in {0:F3} s ({1} nodes)\n", Seconds,
                      (*G)->numNodes());
  }
  if (!Report.empty()) {
    nlohmann::json J = modelInfoToJson(*Info);
    J["compile_seconds"] = Seconds;
    if (auto E = writeFileAtomically(Report, [&](raw_ostream &OS) {
          OS << J.dump(2) << "\n";
        }))
      return reportError("sp-compile", std::move(E));
  }
  return 0;
}
