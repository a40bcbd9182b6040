//===- ProgramPass.cpp - The table of program passes ----------------------===//
//
// The registry of lower/ProgramPasses.def and the runs of its passes, by
// name (sp-opt --program-passes) or all in order (finalizeProgram).
//
//===----------------------------------------------------------------------===//
#include "lower/ProgramPass.h"

using namespace llvm;

namespace sp {

static const ProgramPassInfo Registry[] = {
#define SP_PROGRAM_PASS(Name, Factory, Summary) {Name, Summary, &Factory},
#include "lower/ProgramPasses.def"
};

ArrayRef<ProgramPassInfo> registeredProgramPasses() { return Registry; }

const ProgramPassInfo *lookupProgramPass(StringRef Name) {
  for (const ProgramPassInfo &P : Registry)
    if (Name == P.Name)
      return &P;
  return nullptr;
}

static Error runPass(Program &P, const ProgramPassInfo &Info) {
  std::unique_ptr<ProgramPass> Pass = Info.Create();
  assert(Pass->name() == Info.Name && "a pass's name differs from its entry");
  if (Error E = Pass->run(P))
    return createStringError(inconvertibleErrorCode(), "%s: %s", Info.Name,
                             toString(std::move(E)).c_str());
  return Error::success();
}

Error runProgramPasses(Program &P, ArrayRef<std::string> Names) {
  SmallVector<const ProgramPassInfo *, 8> Passes;
  for (const std::string &Name : Names) {
    const ProgramPassInfo *Info = lookupProgramPass(Name);
    if (!Info)
      return createStringError(inconvertibleErrorCode(),
                               "unknown program pass '%s' (see sp-opt "
                               "--list-passes)",
                               Name.c_str());
    Passes.push_back(Info);
  }
  for (const ProgramPassInfo *Info : Passes)
    if (Error E = runPass(P, *Info))
      return E;
  return Error::success();
}

Error runProgramPasses(Program &P) {
  for (const ProgramPassInfo &Info : Registry)
    if (Error E = runPass(P, Info))
      return E;
  return Error::success();
}

} // namespace sp
