//===- Plan.h - The plan directory ------------------------------*- C++ -*-===//
//
//   PLAN/manifest.json   format version, model facts, options, arena size
//   PLAN/program.json    the program (plan/Program.h)
//
// The directory is written atomically: into a temporary directory beside it,
// then renamed into place, so a failed compile leaves nothing behind and an
// existing plan is replaced whole.
//
//===----------------------------------------------------------------------===//
#ifndef SP_PLAN_PLAN_H
#define SP_PLAN_PLAN_H

#include "plan/Program.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"
#include <nlohmann/json.hpp>

namespace sp {

struct Plan {
  /// manifest.json: "format_version", "model" {layers, hidden, ...},
  /// "dtype", "source", "arena_bytes", ... Extra keys are kept as is.
  nlohmann::json Manifest;
  /// The program (program.json); with pipeline stages, stage 0's.
  Program Prog;
  /// With --pp or --microbatches: one program per pipeline rank
  /// (program-K.json); Stages[0] is Prog.
  std::vector<Program> Stages;
  /// Other files of the plan directory (name, contents), e.g. the
  /// schedule's Gantt chart.
  std::vector<std::pair<std::string, std::string>> Files;
  int numStages() const { return Stages.empty() ? 1 : int(Stages.size()); }
  const Program &stage(int K) const { return Stages.empty() ? Prog : Stages[K]; }
};

/// Whether writePlan can write Dir: a folder it can create, or a plan
/// directory it replaces (any other existing folder or file is refused).
llvm::Error checkPlanOutput(llvm::StringRef Dir);

llvm::Error writePlan(llvm::StringRef Dir, const Plan &P);

/// The same plan computing in float64: every f32 buffer becomes f64 and
/// every offset and size doubles, so the memory plan stays valid (buffers
/// that did not overlap still do not, and none outgrows its doubled slot);
/// parameters still load from their f32 sources. The CPU executor runs it
/// with RunOptions::AllowFloat64: the tests measure float32's rounding
/// against it.
Plan widenToFloat64(const Plan &P);

/// Reads and checks a plan: the directory, the format version (a plan from
/// another version is refused with the versions named), the types of the
/// manifest's entries that sp-run reads, the programs.
llvm::Expected<Plan> readPlan(llvm::StringRef Dir);

/// The contents of the plan file Name (manifest.json, program.json, ...).
using PlanFileReader =
    llvm::function_ref<llvm::Expected<std::string>(llvm::StringRef Name)>;
/// readPlan over files that ReadFile supplies (the fuzzer reads plans from
/// memory); Dir names the plan in messages.
llvm::Expected<Plan> readPlan(llvm::StringRef Dir, PlanFileReader ReadFile);

} // namespace sp

#endif // SP_PLAN_PLAN_H
