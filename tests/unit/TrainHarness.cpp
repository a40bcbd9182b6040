//===- TrainHarness.cpp - Compile and train a model in-process ------------===//
#include "TrainHarness.h"
#include "frontend/OnnxImporter.h"
#include "driver/Compile.h"
#include "runtime/comm/ProcessGrid.h"
#include "runtime/cpu/CpuBackend.h"
#include "gtest/gtest.h"
#include "llvm/Support/Program.h"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>

using namespace llvm;


namespace sp::test {

Expected<Plan> tryCompile(StringRef Model, const PassContext &Ctx,
                          int64_t Batch, int64_t Seq) {
  registerOnnxDataLoader();
  ImportOptions IO;
  IO.Batch = Batch;
  IO.Seq = Seq;
  auto G = importOnnx(Model, IO);
  if (!G)
    return G.takeError();
  PassContext C = Ctx;
  CompileOptions O;
  O.Source = Model.str();
  auto Compiled = compileToPlan(**G, C, O);
  if (!Compiled)
    return Compiled.takeError();
  return std::move(*Compiled->P);
}

Plan compile(StringRef Model, const PassContext &Ctx, int64_t Batch,
             int64_t Seq) {
  auto P = tryCompile(Model, Ctx, Batch, Seq);
  if (!P)
    report_fatal_error(Twine("test compile failed: ") +
                       toString(P.takeError()));
  return std::move(*P);
}

RunResult train(const Plan &P, double Dropout, int Steps,
                bool ExpandCompact) {
  int TP = P.Manifest.value("tp", 1), PP = P.numStages(),
      CP = P.Manifest.value("cp", 1);
  const int Ranks = TP * PP * CP;
  RunResult R;
  R.RankMemory.resize(Ranks);
  std::mutex M;
  // As sp-run does: the process's kernel threads shared by its ranks.
  // SP_TEST_THREADS sets them (tests/tolerance_matrix.sh varies it).
  int Threads = Ranks > 1 ? 1 : 2;
  if (const char *T = std::getenv("SP_TEST_THREADS"))
    Threads = std::max(1, std::atoi(T));
  CpuBackend::setThreads(Threads);
  Error E = runOnThreadRanks(Ranks, [&](Communicator &World) -> Error {
    ProcessGrid Grid;
    Grid.Pipeline = PP;
    Grid.Tensor = TP;
    Grid.Context = CP;
    auto Groups = splitGroups(World, Grid);
    if (!Groups)
      return Groups.takeError();
    // The first tensor rank of each stage of the first context rank keeps
    // the results (the context ranks' gradients are summed: the same).
    const bool Keeps = Groups->At.Tensor == 0 && Groups->At.Context == 0;
    RunOptions O;
    O.Comm = Groups->Tensor.get();
    O.PipeComm = Groups->Pipeline.get();
    O.DataComm = Groups->Data.get();
    O.ContextComm = Groups->Context.get();
    O.Dropout = Dropout;
    O.AllowFloat64 = true;
    O.ExpandCompact = ExpandCompact;
    auto E = Executor::create(P, O);
    if (!E)
      return E.takeError();
    // The same random tokens on every rank.
    std::mt19937 Rng(7);
    TokenBatch Data;
    for (int64_t I = 0; I < (*E)->batch() * (*E)->seq(); ++I) {
      Data.Tokens.push_back(Rng() % (*E)->vocab());
      Data.Targets.push_back(Rng() % (*E)->vocab());
    }
    for (int S = 1; S <= Steps; ++S) {
      auto L = (*E)->trainStep(Data, 1e-3, S);
      if (!L)
        return L.takeError();
      if (World.rank() == 0)
        R.Losses.push_back(*L);
      if (S > 1)
        continue;
      // Every stage's own parameters (not the copies of another stage's).
      for (const TensorView &Param : (*E)->parameters()) {
        if (StringRef(Param.Name).contains('@'))
          continue;
        auto G = (*E)->gradient(Param.Name);
        if (!G)
          return createStringError(inconvertibleErrorCode(),
                                   "no gradient of " + Param.Name);
        auto Full = (*E)->gather64(*G);
        if (!Full)
          return Full.takeError();
        std::lock_guard<std::mutex> Lock(M);
        if (Keeps)
          R.Grads[Param.Name] = std::move(*Full);
      }
    }
    {
      std::lock_guard<std::mutex> Lock(M);
      R.RankMemory[World.rank()] = (*E)->memory();
      if (World.rank() == 0)
        R.Memory = (*E)->memory();
    }
    auto Eval = (*E)->evalLoss(Data);
    if (!Eval)
      return Eval.takeError();
    // (A context rank's logits are its positions'; left out.)
    if (auto L = CP == 1 ? (*E)->logits() : std::nullopt) {
      auto Full = (*E)->gather64(*L);
      if (!Full)
        return Full.takeError();
      std::lock_guard<std::mutex> Lock(M);
      if (Keeps)
        R.Logits = std::move(*Full);
    }
    if (World.rank() == 0)
      R.EvalLoss = *Eval;
    return Error::success();
  });
  EXPECT_FALSE(bool(E)) << toString(std::move(E));
  return R;
}

RunPair trainBoth(const Plan &P, double Dropout, int Steps) {
  return {train(P, Dropout, Steps), train(widenToFloat64(P), Dropout, Steps)};
}

namespace {

/// float32's unit roundoff, and the ratio of float64's to it.
constexpr double U32 = 0x1p-24, To64 = 0x1p-29;

/// One quantity (a step's loss or a gradient) under the rule of
/// expectEqualRuns.
void expectWithinScale(const std::string &What, double Err32, double Err64,
                       double Rounding32, double Rounding64) {
  double Scale = std::max(Rounding32, U32), Scale64 = std::max(Rounding64, U32);
  double Bound32 = ToleranceFactor * Scale,
         Bound64 = ToleranceFactor * Scale64 * To64;
  EXPECT_LE(Err32, Bound32) << What << ": float32 runs differ by " << Err32
                            << ", over " << ToleranceFactor
                            << " x the reference's float32 rounding "
                            << Scale;
  EXPECT_LE(Err64, Bound64) << What << ": float64 runs differ by " << Err64
                            << " (bound " << Bound64
                            << "): the layouts compute different values";
  if (std::getenv("SP_TOLERANCE_REPORT")) {
    const auto *T = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "tolerance %s.%s %s f32 %.3g f64 %.3g\n",
                 T ? T->test_suite_name() : "?", T ? T->name() : "?",
                 What.c_str(), Err32 / Scale, Err64 / (Scale64 * To64));
  }
}

double relDiff(double A, double B) {
  return std::abs(A - B) / std::max(std::abs(B), 1e-30);
}

} // namespace

void expectEqualRuns(const RunPair &Run, const RunPair &Ref) {
  for (const RunResult *R : {&Run.F32, &Run.F64, &Ref.F64}) {
    ASSERT_EQ(R->Losses.size(), Ref.F32.Losses.size());
    ASSERT_EQ(R->Grads.size(), Ref.F32.Grads.size());
  }
  double GradRounding = 0;
  for (auto &[Name, G] : Ref.F32.Grads) {
    const std::vector<double> *Other[3];
    int K = 0;
    for (const RunResult *R : {&Run.F32, &Run.F64, &Ref.F64}) {
      auto It = R->Grads.find(Name);
      ASSERT_NE(It, R->Grads.end()) << Name;
      ASSERT_EQ(It->second.size(), G.size()) << Name;
      Other[K++] = &It->second;
    }
    double Rounding = relErr(G, *Other[2]);
    GradRounding = std::max(GradRounding, Rounding);
    expectWithinScale("gradient of " + Name, relErr(*Other[0], G),
                      relErr(*Other[1], *Other[2]), Rounding, Rounding);
  }
  // Every step's loss is the same computation: its float32 rounding is the
  // largest the reference shows over the steps (one step's can cancel by
  // chance). The float32 loss is a float64 sum rounded once, which hides
  // the rounding upstream of it; its float64 check takes that of the
  // gradients, which the same forward pass produced.
  double LossRounding = 0;
  for (size_t S = 0; S < Ref.F32.Losses.size(); ++S)
    LossRounding = std::max(
        LossRounding, relDiff(Ref.F32.Losses[S], Ref.F64.Losses[S]));
  for (size_t S = 0; S < Ref.F32.Losses.size(); ++S)
    expectWithinScale("loss of step " + std::to_string(S + 1),
                      relDiff(Run.F32.Losses[S], Ref.F32.Losses[S]),
                      relDiff(Run.F64.Losses[S], Ref.F64.Losses[S]),
                      LossRounding, std::max(LossRounding, GradRounding));
}

double relErr(const std::vector<double> &A, const std::vector<double> &B) {
  double Diff = 0, Ref = 0;
  for (size_t I = 0; I < A.size(); ++I) {
    Diff = std::max(Diff, std::abs(A[I] - B[I]));
    Ref = std::max(Ref, std::abs(B[I]));
  }
  return Diff / std::max(Ref, 1e-30);
}

bool runPython(llvm::ArrayRef<llvm::StringRef> Args) {
  std::vector<llvm::StringRef> Argv = {SP_PYTHON};
  Argv.insert(Argv.end(), Args.begin(), Args.end());
  llvm::Optional<llvm::StringRef> Quiet[] = {llvm::None, llvm::StringRef(""),
                                             llvm::StringRef("")};
  return llvm::sys::ExecuteAndWait(SP_PYTHON, Argv, llvm::None, Quiet) == 0;
}

} // namespace sp::test
