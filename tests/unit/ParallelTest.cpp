//===- ParallelTest.cpp - Tensor/sequence parallel runs equal one device --===//
//
// Compiles the default model for t in {1, 2, 4}, with sequence parallelism
// off and on, runs each on thread ranks, and checks that the loss and every
// gathered gradient equal the one-device run, with dropout off and on (the
// masks are keyed by global element index, so they are the same on any
// layout). The bounds are the harness's (TrainHarness.h): a multiple of the
// one-device run's float32 rounding, measured against its float64 run.
//
//===----------------------------------------------------------------------===//
#include "TrainHarness.h"
#include "llvm/Support/FileSystem.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

using namespace sp;
using namespace sp::test;
using namespace llvm;

namespace {

RunPair trainTp(int TP, bool SP, double Dropout, int Steps,
                StringRef Model = TinyModel) {
  PassContext Ctx;
  Ctx.TensorParallel = TP;
  Ctx.SequenceParallel = SP;
  return trainBoth(compile(Model, Ctx), Dropout, Steps);
}

struct TpConfig {
  int TP;
  bool SP;
  double Dropout;
};

class ParallelEqualsOneDevice : public ::testing::TestWithParam<TpConfig> {};

TEST_P(ParallelEqualsOneDevice, LossAndGradients) {
  TpConfig C = GetParam();
  constexpr int Steps = 3;
  expectEqualRuns(trainTp(C.TP, C.SP, C.Dropout, Steps),
                  trainTp(1, false, C.Dropout, Steps));
}

/// A vocabulary of 66 over 4 ranks is padded to 68; the padding logits are
/// masked out of the loss and the run still equals one device. An untied
/// head, exported by torch.
TEST(ParallelVocabulary, PaddedVocabularyEqualsOneDevice) {
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("sp-vocab", Dir));
  std::string Model = (Dir + "/gpt.onnx").str();
  std::string Script = SP_SOURCE_DIR "/models/export_gpt.py";
  ASSERT_TRUE(runPython({Script, "-o", Model, "--layers", "1", "--hidden",
                         "32", "--heads", "4", "--seq", "16", "--vocab", "66",
                         "--batch", "2", "--untied", "--dropout", "0.1"}))
      << "the torch export failed (is python3-torch installed?)";
  RunPair Ref = trainTp(1, false, 0.1, 2, Model);
  RunPair Par = trainTp(4, true, 0.1, 2, Model);
  expectEqualRuns(Par, Ref);
  sys::fs::remove_directories(Dir);
}

/// The comparison rule can fail: a run equal to the reference passes, and
/// one float32 gradient element moved by 1e-4 of the tensor's largest, or
/// one float64 element moved by 1e-11, fails.
TEST(ToleranceRule, CatchesSmallDifferences) {
  RunPair Ref = trainTp(1, false, 0.0, 1);
  expectEqualRuns(Ref, Ref);
  auto Perturbed = [&](bool F64, double By) {
    RunPair Run = Ref;
    auto &G = (F64 ? Run.F64 : Run.F32).Grads.begin()->second;
    double Max = 0;
    for (double V : G)
      Max = std::max(Max, std::abs(V));
    G[G.size() / 2] += By * Max;
    return Run;
  };
  RunPair Bad32 = Perturbed(false, 1e-4), Bad64 = Perturbed(true, 1e-11);
  EXPECT_NONFATAL_FAILURE(expectEqualRuns(Bad32, Ref), "float32 runs differ");
  EXPECT_NONFATAL_FAILURE(expectEqualRuns(Bad64, Ref), "float64 runs differ");
}

INSTANTIATE_TEST_SUITE_P(
    TensorSequence, ParallelEqualsOneDevice,
    ::testing::Values(TpConfig{2, false, 0.0}, TpConfig{2, true, 0.0},
                      TpConfig{4, false, 0.0}, TpConfig{4, true, 0.0},
                      TpConfig{2, false, 0.1}, TpConfig{2, true, 0.1},
                      TpConfig{4, true, 0.1}),
    [](const auto &Info) {
      return "tp" + std::to_string(Info.param.TP) +
             (Info.param.SP ? "_sp" : "") +
             (Info.param.Dropout > 0 ? "_dropout" : "");
    });

} // namespace
