//===- sp-opt.cpp - Run passes on textual IR ------------------------------===//
//
//   sp-opt IN.sp --passes=canonicalize,dce [-o OUT.sp]
//
// Reads textual IR (or an .onnx model, imported first), runs the named passes
// and prints the result. With no --passes it round-trips the IR.
//
//===----------------------------------------------------------------------===//
#include "ir/AsmFormat.h"
#include "driver/Compile.h"
#include "passes/Passes.h"
#include "tools/ToolSupport.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"

using namespace llvm;
using namespace sp;

static cl::OptionCategory Cat("sp-opt options");
static cl::opt<std::string> Input(cl::Positional, cl::desc("<input .sp or .onnx>"),
                                  cl::init("-"), cl::cat(Cat));
static cl::opt<std::string> Output("o", cl::desc("Output file (default stdout)"),
                                   cl::value_desc("file"), cl::init("-"),
                                   cl::cat(Cat));
static cl::opt<bool> ListPasses("list-passes", cl::desc("List the registered passes"),
                                cl::cat(Cat));

int main(int Argc, char **Argv) {
  InitLLVM X(Argc, Argv);
  cl::OptionCategory &PMCat = registerPassManagerCLOptions();
  cl::OptionCategory &ImportCat = registerImportCLOptions();
  cl::HideUnrelatedOptions({&Cat, &ImportCat, &PMCat});
  cl::ParseCommandLineOptions(Argc, Argv, "sp-opt: run sp passes on textual IR\n");
  if (ListPasses) {
    for (const PassInfo &P : registeredPasses())
      outs() << "  " << P.Name << " - " << P.Summary << "\n";
    return 0;
  }
  auto IO = importOptionsFromCL();
  if (!IO)
    return reportError("sp-opt", IO.takeError());
  auto G = loadGraph(Input, *IO);
  if (!G)
    return reportError("sp-opt", G.takeError());
  PassContext Ctx;
  if (auto E = passOptionsFromCL(Ctx))
    return reportError("sp-opt", std::move(E));
  CompileOptions CO;
  CO.Passes = passesFromCL("");
  CO.PassManager = passManagerOptionsFromCL();
  if (auto E = runPasses(**G, Ctx, CO))
    return reportError("sp-opt", std::move(E));
  if (auto E = writeFileAtomically(Output, [&](raw_ostream &OS) {
        printGraph(**G, OS);
      }))
    return reportError("sp-opt", std::move(E));
  return 0;
}
