//===- Compile.h - The compile driver ---------------------------*- C++ -*-===//
//
// What sp-compile does between reading a model and printing or writing it,
// for sp-compile, the paper table and the tests alike: run the passes, find
// the model's facts and, for a training graph, lower it to the per-rank
// programs (planned), build the plan with its manifest and schedule chart,
// and the reports (memory with the family's formula, FLOPs, collectives).
//
//===----------------------------------------------------------------------===//
#ifndef SP_DRIVER_COMPILE_H
#define SP_DRIVER_COMPILE_H

#include "driver/LowerTraining.h"
#include "reports/MemoryReport.h"
#include "analysis/ModelInfo.h"
#include "passes/PassManager.h"
#include "passes/Passes.h"
#include "plan/Plan.h"
#include <optional>

namespace sp {

struct CompileOptions {
  /// The passes to run (a --passes value).
  std::string Passes = DefaultPasses;
  PassManagerOptions PassManager;
  /// The model file: the manifest's "source" and the chart's title.
  std::string Source;
  /// The programs and their memory plans only: no reports, manifest facts
  /// or schedule chart, and with pipeline options no one-microbatch program
  /// (what the planner's search needs of each layout; finishPlan adds the
  /// rest).
  bool PlanOnly = false;
};

struct Compilation {
  ModelInfo Info;
  /// The report (sp-compile --report): the model facts and, for a training
  /// graph, "plan", "parallel", "collectives", "memory" (with the family's
  /// "formula") and "flops"; with pipeline options, "bubble": the
  /// schedule's, simulated from each stage's GEMM work (the Gantt chart's),
  /// and 1F1B's (P - 1) / N, as fractions of the ideal time.
  nlohmann::json Facts;
  /// Only when the passes made a training graph (a "loss" output); its
  /// programs have moved into P.
  std::optional<LoweredPlan> Lowered;
  /// The plan: programs, manifest (the facts and the options), files.
  std::optional<Plan> P;
  /// One microbatch through the whole model.
  std::optional<ActivationReport> Activations;
  /// Each pipeline rank's program as it runs (one entry without stages).
  std::vector<RunStats> Ranks;
  /// The family's per-layer formula for the middle layer, under that
  /// layer's recomputation.
  std::optional<LayerFormula> Formula;
};

/// Runs O.Passes on G (Ctx holds the pass options) and no more. A failing
/// pass's error names O.Source when it is set.
llvm::Error runPasses(Graph &G, PassContext &Ctx, const CompileOptions &O);

/// Runs the passes on G, then summarises, lowers and reports.
llvm::Expected<Compilation> compileToPlan(Graph &G, PassContext &Ctx,
                                          const CompileOptions &O);

/// The second half of compileToPlan: the reports, manifest facts and
/// schedule chart of C, a training graph's compilation made with PlanOnly
/// from G (after the passes) and Ctx. compileToPlan with O is that compile
/// followed by this.
llvm::Error finishPlan(const Graph &G, const PassContext &Ctx,
                       const CompileOptions &O, Compilation &C);

} // namespace sp

#endif // SP_DRIVER_COMPILE_H
