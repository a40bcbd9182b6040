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
  std::map<std::string, std::vector<float>> Grads; // after step 1, gathered
  MemoryStats Memory;                              // rank 0's, after the run
};

/// Trains on t x p thread ranks (sp-run's layout); the tokens are the same
/// random ones for any layout of the same batch.
RunResult train(const Plan &P, double Dropout, int Steps);

/// Every loss within 1e-6 relative and every gradient within 1e-6 (largest
/// difference over largest value) of the reference run.
void expectEqualRuns(const RunResult &Run, const RunResult &Ref);

/// Largest |a - b| over largest |b|.
double relErr(const std::vector<float> &A, const std::vector<float> &B);

} // namespace sp::test

#endif // SP_TESTS_UNIT_TRAINHARNESS_H
