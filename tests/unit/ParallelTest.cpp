//===- ParallelTest.cpp - Tensor/sequence parallel runs equal one device --===//
//
// Compiles the default model for t in {1, 2, 4}, with sequence parallelism
// off and on, runs each on thread ranks, and checks that the loss and every
// gathered gradient equal the one-device run, with dropout off and on (the
// masks are keyed by global element index, so they are the same on any
// layout).
//
//===----------------------------------------------------------------------===//
#include "frontend/OnnxImporter.h"
#include "passes/MemoryPlan.h"
#include "passes/PassManager.h"
#include "passes/Passes.h"
#include "runtime/Executor.h"
#include "gtest/gtest.h"
#include <cmath>
#include <map>
#include <mutex>
#include <random>

using namespace sp;
using namespace llvm;

namespace {

Plan compileTiny(int TP, bool SP) {
  registerOnnxDataLoader();
  auto G = cantFail(
      importOnnx(SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx", ImportOptions()));
  PassManager PM(PassManagerOptions{});
  cantFail(PM.addPipeline(DefaultPipeline));
  PassContext Ctx;
  Ctx.TensorParallel = TP;
  Ctx.SequenceParallel = SP;
  cantFail(PM.run(*G, Ctx));
  Plan P;
  P.Prog = cantFail(lowerGraph(*G, DType::F32));
  planMemory(P.Prog);
  P.Manifest = {{"dtype", "f32"}, {"tp", TP}};
  return P;
}

struct RunResult {
  std::vector<double> Losses;
  std::map<std::string, std::vector<float>> Grads; // after step 1, gathered
};

RunResult train(int TP, bool SP, double Dropout, int Steps) {
  Plan P = compileTiny(TP, SP);
  std::mt19937 Rng(7);
  std::vector<int64_t> Idx(4 * 64), Targets(4 * 64);
  for (size_t I = 0; I < Idx.size(); ++I) {
    Idx[I] = Rng() % 256;
    Targets[I] = Rng() % 256;
  }
  RunResult R;
  std::mutex M;
  cantFail(runOnThreadRanks(TP, [&](Communicator &C) -> Error {
    RunOptions O;
    O.Comm = &C;
    O.Dropout = Dropout;
    auto E = Executor::create(P, O);
    if (!E)
      return E.takeError();
    for (int S = 1; S <= Steps; ++S) {
      auto L = (*E)->trainStep(Idx, Targets, 1e-3, S);
      if (!L)
        return L.takeError();
      if (C.rank() == 0)
        R.Losses.push_back(*L);
      if (S > 1)
        continue;
      for (const TensorView &Param : (*E)->parameters()) {
        auto Full = (*E)->gather(*(*E)->gradient(Param.Name));
        if (!Full)
          return Full.takeError();
        std::lock_guard<std::mutex> Lock(M);
        if (C.rank() == 0)
          R.Grads[Param.Name] = std::move(*Full);
      }
    }
    return Error::success();
  }));
  return R;
}

double relErr(const std::vector<float> &A, const std::vector<float> &B) {
  double Diff = 0, Ref = 0;
  for (size_t I = 0; I < A.size(); ++I) {
    Diff = std::max(Diff, std::abs(double(A[I]) - B[I]));
    Ref = std::max(Ref, std::abs(double(B[I])));
  }
  return Diff / std::max(Ref, 1e-30);
}

struct Config {
  int TP;
  bool SP;
  double Dropout;
};

class ParallelEqualsOneDevice : public ::testing::TestWithParam<Config> {};

TEST_P(ParallelEqualsOneDevice, LossAndGradients) {
  Config C = GetParam();
  constexpr int Steps = 3;
  RunResult Ref = train(1, false, C.Dropout, Steps);
  RunResult Par = train(C.TP, C.SP, C.Dropout, Steps);
  ASSERT_EQ(Par.Losses.size(), Ref.Losses.size());
  for (int S = 0; S < Steps; ++S)
    EXPECT_NEAR(Par.Losses[S], Ref.Losses[S], 1e-6 * std::abs(Ref.Losses[S]))
        << "step " << S + 1;
  ASSERT_EQ(Par.Grads.size(), Ref.Grads.size());
  for (auto &[Name, G] : Ref.Grads) {
    ASSERT_EQ(Par.Grads[Name].size(), G.size()) << Name;
    EXPECT_LT(relErr(Par.Grads[Name], G), 1e-6) << Name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    TensorSequence, ParallelEqualsOneDevice,
    ::testing::Values(Config{2, false, 0.0}, Config{2, true, 0.0},
                      Config{4, false, 0.0}, Config{4, true, 0.0},
                      Config{2, false, 0.1}, Config{2, true, 0.1},
                      Config{4, true, 0.1}),
    [](const auto &Info) {
      return "tp" + std::to_string(Info.param.TP) +
             (Info.param.SP ? "_sp" : "") +
             (Info.param.Dropout > 0 ? "_dropout" : "");
    });

} // namespace
