//===- TrainHarness.h - Compile and train a model in-process ----*- C++ -*-===//
//
// Shared by the tests that compare runs: compile a model with the default
// pipeline and some options, train it for a few steps on thread ranks with
// fixed random tokens, and keep the losses and the first step's gathered
// gradients.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TESTS_UNIT_TRAINHARNESS_H
#define SP_TESTS_UNIT_TRAINHARNESS_H

#include "passes/Pass.h"
#include "runtime/Executor.h"
#include <map>
#include <string>
#include <vector>

namespace sp::test {

constexpr const char *TinyModel = SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx";

/// Compiles Model with the default pipeline; Ctx carries --tp, --sp,
/// --recompute.
/// Batch and Seq bind symbolic dimensions (0: the model's own).
llvm::Expected<Plan> tryCompile(llvm::StringRef Model, const PassContext &Ctx,
                                int64_t Batch = 0, int64_t Seq = 0);
/// The same, for a compile that must succeed.
Plan compile(llvm::StringRef Model, const PassContext &Ctx, int64_t Batch = 0,
             int64_t Seq = 0);

struct RunResult {
  std::vector<double> Losses;
  /// After step 1, gathered (float32 values held exactly in double).
  std::map<std::string, std::vector<double>> Grads;
  MemoryStats Memory; // rank 0's, after the run
  /// Every rank's, by world rank.
  std::vector<MemoryStats> RankMemory;
  /// evalLoss on the same batch after the last step, and the logits it
  /// made (gathered on the rank that has them).
  double EvalLoss = 0;
  std::vector<double> Logits;
};

/// Trains on t x p thread ranks (sp-run's layout); the tokens are the same
/// random ones for any layout of the same batch. A float64 plan
/// (widenToFloat64) trains in float64.
/// ExpandCompact: a pipelined plan's compact programs run written out
/// (RunOptions::ExpandCompact).
RunResult train(const Plan &P, double Dropout, int Steps,
                bool ExpandCompact = false);

/// A run in float32 and the same plan's run in float64: the float64 run
/// measures how far float32 rounding moved this computation.
struct RunPair {
  RunResult F32, F64;
};
RunPair trainBoth(const Plan &P, double Dropout, int Steps);

/// The rule for comparing two runs of the same model that differ only in
/// how they compute (layouts, pipelines) -- never a bound tuned on one
/// machine:
///
///   scale(x) = max(relErr(Ref.F32.x, Ref.F64.x), u),  u = 2^-24
///
/// is the reference's measured float32 rounding of each gradient x (u,
/// float32's unit roundoff, when the measure is smaller, as for a gradient
/// that happens to round exactly); the losses share one scale, the largest
/// over the steps, since each step's loss is the same computation (and
/// their float64 check the largest of it and the gradients' scales: the
/// float32 loss is a float64 sum rounded once, which hides the rounding
/// upstream of it). Then
///   - float32: relErr(Run.F32.x, Ref.F32.x) <= K scale(x);
///   - float64: relErr(Run.F64.x, Ref.F64.x) <= K scale(x) 2^-29, the same
///     bound moved to float64's rounding (2^-53 / 2^-24): the two layouts
///     must compute the same mathematics, to float64 precision.
/// K = ToleranceFactor. Two float32 runs that reorder the same sums each
/// deviate from the exact result by about scale(x), so they differ by at
/// most about 2 scale(x); K = 8 leaves a factor of 4 for the spread of that
/// estimate (SP_TOLERANCE_REPORT=1 prints each measured ratio
/// relErr / scale; tests/tolerance_matrix.sh collects the largest over
/// OpenBLAS kernels and thread counts). A layout bug moves a gradient by
/// far more than float32 rounding, and the float64 check sees any error
/// above about 1e-14.
constexpr double ToleranceFactor = 8;
void expectEqualRuns(const RunPair &Run, const RunPair &Ref);

/// Largest |a - b| over largest |b|.
double relErr(const std::vector<double> &A, const std::vector<double> &B);

/// Runs SP_PYTHON (Debian's, with torch and onnx) on Args, a script and its
/// arguments, with its output discarded; whether it exited with 0.
bool runPython(llvm::ArrayRef<llvm::StringRef> Args);

} // namespace sp::test

#endif // SP_TESTS_UNIT_TRAINHARNESS_H
