//===- sp-opt.cpp - Run passes on textual IR ------------------------------===//
//
//   sp-opt IN.sp --passes=canonicalize,dce [-o OUT.sp]
//   sp-opt IN.sp --passes=...,autodiff,optimizer --lower
//          [--program-passes=fuse-softmax,fuse-epilogue] [--dtype bf16]
//
// Reads textual IR (or an .onnx model, imported first), runs the named passes
// and prints the result. With no --passes it round-trips the IR.
//
// With --lower the graph (a training graph, after autodiff and the
// optimizer) is then lowered to one program (lower/LowerGraph.h: no pipeline
// schedule) without any of the rewrites finalizeProgram runs; only the
// program passes named by --program-passes run on it (lower/ProgramPass.h),
// in the order given, and the program is printed as text
// (plan/ProgramPrinter.h) instead of the graph: the lit tests of the program
// passes (tests/lit/lower/).
//
//===----------------------------------------------------------------------===//
#include "ir/AsmFormat.h"
#include "driver/Compile.h"
#include "lower/LowerGraph.h"
#include "lower/ProgramPass.h"
#include "passes/Passes.h"
#include "plan/ProgramPrinter.h"
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
static cl::opt<bool> ListPasses("list-passes",
                                cl::desc("List the registered passes and "
                                         "program passes"),
                                cl::cat(Cat));
static cl::opt<bool> Lower(
    "lower",
    cl::desc("After the passes, lower the training graph to one program "
             "(no pipeline schedule), run only the --program-passes on it, "
             "and print the program instead of the graph"),
    cl::cat(Cat));
static cl::list<std::string> ProgramPasses(
    "program-passes",
    cl::desc("With --lower: the program passes to run, in this order (see "
             "--list-passes; none by default)"),
    cl::value_desc("a,b,c"), cl::CommaSeparated, cl::cat(Cat));
static cl::opt<DType> LowerDtype(
    "dtype",
    cl::desc("With --lower: the activation dtype of the program (and of "
             "the passes that size with it), as sp-compile --dtype"),
    cl::values(clEnumValN(DType::F32, "fp32", "32-bit float"),
               clEnumValN(DType::BF16, "bf16", "bfloat16"),
               clEnumValN(DType::F16, "fp16", "IEEE half")),
    cl::init(DType::F32), cl::cat(Cat));

/// --program-passes and --dtype need --lower, and a graph pass given to
/// --program-passes, or a program pass to --passes, is named as such.
static Error checkLowerOptions(StringRef GraphPasses) {
  for (auto [Given, Flag] :
       {std::pair<bool, const char *>{ProgramPasses.getNumOccurrences(),
                                      "--program-passes"},
        {LowerDtype.getNumOccurrences(), "--dtype"}})
    if (Given && !Lower)
      return createStringError(inconvertibleErrorCode(),
                               "%s applies to the lowered program; it needs "
                               "--lower",
                               Flag);
  for (const std::string &Name : ProgramPasses)
    if (!lookupProgramPass(Name) && lookupPass(Name))
      return createStringError(inconvertibleErrorCode(),
                               "'%s' is a pass on the graph: give it to "
                               "--passes, not --program-passes",
                               Name.c_str());
  SmallVector<StringRef, 16> Names;
  GraphPasses.split(Names, ',', -1, /*KeepEmpty=*/false);
  for (StringRef Name : Names)
    if (!lookupPass(Name) && lookupProgramPass(Name))
      return createStringError(inconvertibleErrorCode(),
                               "'%s' is a pass on the lowered program: give "
                               "it to --program-passes, with --lower",
                               Name.str().c_str());
  return Error::success();
}

/// The graph after the passes, lowered (--lower) and rewritten by the
/// --program-passes, printed to Output.
static Error lowerAndPrint(const Graph &G) {
  auto P = lowerGraph(G, LowerDtype);
  if (!P)
    return P.takeError();
  if (Error E = runProgramPasses(*P, ProgramPasses))
    return E;
  return writeFileAtomically(Output,
                             [&](raw_ostream &OS) { printProgram(*P, OS); });
}

int main(int Argc, char **Argv) {
  InitLLVM X(Argc, Argv);
  cl::OptionCategory &PMCat = registerPassManagerCLOptions();
  cl::OptionCategory &ImportCat = registerImportCLOptions();
  cl::HideUnrelatedOptions({&Cat, &ImportCat, &PMCat});
  cl::ParseCommandLineOptions(Argc, Argv, "sp-opt: run sp passes on textual IR\n");
  if (ListPasses) {
    outs() << "Passes (--passes), in pipeline order:\n";
    for (const PassInfo &P : registeredPasses())
      outs() << "  " << P.Name << " - " << P.Summary << "\n";
    outs() << "Program passes (--lower --program-passes), in the order "
              "sp-compile runs them:\n";
    for (const ProgramPassInfo &P : registeredProgramPasses())
      outs() << "  " << P.Name << " - " << P.Summary << "\n";
    return 0;
  }
  if (auto E = checkLowerOptions(passesFromCL("")))
    return reportError("sp-opt", std::move(E));
  auto IO = importOptionsFromCL();
  if (!IO)
    return reportError("sp-opt", IO.takeError());
  auto G = loadGraph(Input, *IO);
  if (!G)
    return reportError("sp-opt", G.takeError());
  PassContext Ctx;
  if (auto E = passOptionsFromCL(Ctx))
    return reportError("sp-opt", std::move(E));
  // The passes that size with it (recompute auto, the pipeline split) see
  // the dtype the program is lowered with, as in sp-compile.
  Ctx.ActivationDtype = LowerDtype;
  CompileOptions CO;
  CO.Passes = passesFromCL("");
  CO.PassManager = passManagerOptionsFromCL();
  if (auto E = runPasses(**G, Ctx, CO))
    return reportError("sp-opt", std::move(E));
  if (Lower) {
    if (auto E = lowerAndPrint(**G))
      return reportError("sp-opt", std::move(E));
    return 0;
  }
  if (auto E = writeFileAtomically(Output, [&](raw_ostream &OS) {
        printGraph(**G, OS);
      }))
    return reportError("sp-opt", std::move(E));
  return 0;
}
