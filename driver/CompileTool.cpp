//===- CompileTool.cpp - sp-compile's flags and outputs -------------------===//
#include "driver/CompileTool.h"
#include "frontend/GraphExport.h"
#include "plan/AtomicFile.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include <cmath>

using namespace llvm;

namespace sp {

/// AdamW's settings: a decay rate outside [0, 1), a non-positive epsilon
/// or a negative weight decay or clipping norm trains nonsense (or NaN).
static Error checkOptimizer(const OptimizerOptions &O) {
  auto Bad = [](const char *Flag, double V, const char *Want) {
    return createStringError(inconvertibleErrorCode(),
                             "%s must be %s, got %g", Flag, Want, V);
  };
  for (auto [Flag, V] : {std::pair{"--beta1", O.Beta1}, {"--beta2", O.Beta2}})
    if (!(V >= 0 && V < 1))
      return Bad(Flag, V, "in [0, 1)");
  if (!(O.Eps > 0) || !std::isfinite(O.Eps))
    return Bad("--adam-eps", O.Eps, "a positive number");
  for (auto [Flag, V] : {std::pair{"--weight-decay", O.WeightDecay},
                         {"--max-grad-norm", O.MaxGradNorm}})
    if (!(V >= 0) || !std::isfinite(V))
      return Bad(Flag, V, "a non-negative number (0: off)");
  return Error::success();
}

/// --dtype fp16's loss scaling: a power of two (so that scaling is exact)
/// and a window of at least one step; the other dtypes need none.
static Error checkLossScale(const CompileToolOptions &O, PassContext &Ctx) {
  if ((O.LossScale || O.LossScaleWindow) && O.ActDtype != DType::F16)
    return makeError("--loss-scale and --loss-scale-window apply to --dtype "
                     "fp16 (fp32 and bf16 have fp32's exponent range and need "
                     "no loss scaling)");
  double Scale = O.LossScale.value_or(65536);
  int64_t Window = O.LossScaleWindow.value_or(2000);
  int Exp = 0;
  if (!(Scale >= 1 && Scale <= 0x1p64) || std::frexp(Scale, &Exp) != 0.5)
    return createStringError(inconvertibleErrorCode(),
                             "--loss-scale must be a power of two in [1, "
                             "2^64] (so that scaling is exact), got %g",
                             Scale);
  if (Window < 1)
    return makeError("--loss-scale-window must be >= 1");
  Ctx.LossScale = Scale;
  Ctx.LossScaleWindow = Window;
  return Error::success();
}

/// --auto chooses the layout itself and needs the machine and the batch;
/// its flags mean nothing without it.
static Error checkAuto(const CompileToolOptions &O, const PassContext &Ctx) {
  if (!O.Auto) {
    for (auto [Given, Flag] : {std::pair{O.AutoGpus.has_value(), "--gpus"},
                               {O.AutoMemory.has_value(), "--gpu-memory"},
                               {O.AutoBatch.has_value(), "--global-batch"}})
      if (Given)
        return createStringError(inconvertibleErrorCode(), "%s needs --auto",
                                 Flag);
    return Error::success();
  }
  bool Chosen = Ctx.TensorParallel != 1 || Ctx.SequenceParallel ||
                Ctx.Pipeline.enabled() || Ctx.DataParallel != 1 || Ctx.Zero ||
                Ctx.Recompute.Mode != RecomputeMode::None;
  if (Chosen)
    return makeError("--auto chooses --tp, --sp, --pp, --interleave, "
                     "--microbatches, --dp, --zero and --recompute; drop them");
  if (O.PaperTable)
    return makeError("--auto and --paper-table do not go together");
  if (O.AutoGpus.value_or(0) < 1)
    return makeError("--auto needs --gpus N (N >= 1)");
  if (O.AutoMemory.value_or("").empty())
    return makeError("--auto needs --gpu-memory BYTES (e.g. 80GiB)");
  if (auto Mem = byteFlag("--gpu-memory", *O.AutoMemory, "80GiB or 40GB");
      !Mem)
    return Mem.takeError();
  if (O.AutoBatch.value_or(0) < 0)
    return makeError("--global-batch must be positive");
  return Error::success();
}

int64_t CompileToolOptions::autoMemoryBytes() const {
  return cantFail(byteFlag("--gpu-memory", *AutoMemory, "80GiB or 40GB"));
}

Error CompileToolOptions::validate(PassContext &Ctx) const {
  if (auto E = checkOptimizer(Optimizer))
    return E;
  Ctx.Optimizer = Optimizer;
  Ctx.ActivationDtype = ActDtype;
  if (auto E = checkLossScale(*this, Ctx))
    return E;
  if (!Figure7.empty() && !PaperTable)
    return makeError("--figure7 needs --paper-table");
  if (!Gantt.empty() && !Ctx.Pipeline.enabled())
    return makeError("--gantt needs a pipelined training plan (--pp P or "
                     "--microbatches N)");
  // Every output file can be written, checked before any is: a bad
  // --report must not fail after the plan is written.
  for (auto [Path, Flag] : {std::pair{&Report, "--report"},
                            {&Html, "--html"},
                            {&Gantt, "--gantt"},
                            {&Figure7, "--figure7"}})
    if (!Path->empty())
      if (auto E = checkWritableFile(*Path))
        return createStringError(inconvertibleErrorCode(), "%s: %s", Flag,
                                 toString(std::move(E)).c_str());
  return checkAuto(*this, Ctx);
}

Error checkCompileOutputs(const CompileToolOptions &O) {
  // The output folders too: the graphs must not be written when -o will
  // fail, nor the plan when --export-graphs will.
  if (!O.Output.empty())
    if (auto E = checkPlanOutput(O.Output))
      return E;
  if (!O.ExportGraphs.empty()) {
    if (auto E = checkGraphsOutput(O.ExportGraphs))
      return createStringError(inconvertibleErrorCode(), "--export-graphs %s",
                               toString(std::move(E)).c_str());
    if (O.PaperTable)
      return makeError("--export-graphs writes one plan's programs; "
                       "--paper-table compiles several (drop one of them)");
  }
  if (O.PaperTable) {
    if (!O.Output.empty())
      return makeError("--paper-table writes no plan; drop -o");
    if (!O.Html.empty())
      return makeError("--html describes one compiled plan and --paper-table "
                       "compiles several; drop --html and write the table's "
                       "chart with --figure7 FILE.svg (its numbers with "
                       "--report FILE.json)");
    return Error::success();
  }
  if (O.Inputs.size() != 1)
    return createStringError(inconvertibleErrorCode(),
                             "expected one model, got %zu (only --paper-table "
                             "takes several)",
                             O.Inputs.size());
  return Error::success();
}

Error checkTrainingOutputs(const CompileToolOptions &O, const Compilation &C) {
  if (C.P)
    return Error::success();
  const char *Why = "needs a training graph; the pipeline must include "
                    "autodiff and optimizer";
  for (auto [Asked, Flag] : {std::pair{!O.Output.empty(), "-o"},
                             {!O.Html.empty(), "--html"},
                             {!O.ExportGraphs.empty(), "--export-graphs"},
                             {O.wantsCluster(), "--estimate"}})
    if (Asked)
      return createStringError(inconvertibleErrorCode(), "%s %s", Flag, Why);
  return Error::success();
}

Error writeCompileOutputs(const CompileToolOptions &O, const PassContext &Ctx,
                          const Compilation &C, double Seconds,
                          raw_ostream &OS) {
  if (!O.ExportGraphs.empty()) {
    auto Names = exportGraphs(*C.P, O.ExportGraphs);
    if (!Names)
      return createStringError(inconvertibleErrorCode(), "--export-graphs: %s",
                               toString(Names.takeError()).c_str());
    if (!O.Quiet)
      OS << formatv("wrote {0} ONNX graph{1} to {2} ({3})\n", Names->size(),
                    Names->size() == 1 ? "" : "s", O.ExportGraphs,
                    join(*Names, ", "));
  }
  if (!O.Output.empty()) {
    if (auto E = writePlan(O.Output, *C.P))
      return E;
    if (!O.Quiet)
      OS << "wrote plan " << O.Output << "\n";
  }
  if (!O.Gantt.empty()) {
    if (!C.Lowered || !Ctx.Pipeline.enabled())
      return makeError("--gantt needs a pipelined training plan (--pp P or "
                       "--microbatches N)");
    // The chart the plan holds (compileToPlan drew it).
    auto Chart = find_if(C.P->Files, [](const auto &F) {
      return F.first == "schedule.svg";
    });
    assert(Chart != C.P->Files.end() && "a pipelined plan has its chart");
    if (auto E = writeFileAtomically(
            O.Gantt, [&](raw_ostream &F) { F << Chart->second; }))
      return E;
  }
  if (!O.Report.empty()) {
    nlohmann::json J = C.Facts;
    J["compile_seconds"] = Seconds;
    if (auto E = writeFileAtomically(
            O.Report, [&](raw_ostream &F) { F << J.dump(2) << "\n"; }))
      return E;
  }
  return Error::success();
}

} // namespace sp
