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
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Program.h"
#include "gtest/gtest.h"
#include <cmath>
#include <map>
#include <mutex>
#include <random>

using namespace sp;
using namespace llvm;

namespace {

constexpr const char *TinyModel = SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx";

Plan compile(StringRef Model, int TP, bool SP) {
  registerOnnxDataLoader();
  auto G = cantFail(importOnnx(Model, ImportOptions()));
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

RunResult train(int TP, bool SP, double Dropout, int Steps,
                StringRef Model = TinyModel) {
  Plan P = compile(Model, TP, SP);
  std::mt19937 Rng(7);
  // Token ids within the model's vocabulary, sized from the plan.
  int64_t Vocab = 0, Tokens = 0;
  for (const Instruction &I : P.Prog.Instrs)
    if (I.Role == "embed" && I.Op == OpKind::Embedding) {
      const ProgramBuffer &T = P.Prog.Buffers[I.In[0]];
      Vocab = T.Data->type().Shape[0];
      Tokens = P.Prog.Buffers[I.In[1]].Type.numElements();
    }
  std::vector<int64_t> Idx(Tokens), Targets(Tokens);
  for (size_t I = 0; I < Idx.size(); ++I) {
    Idx[I] = Rng() % Vocab;
    Targets[I] = Rng() % Vocab;
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

void expectEqualRuns(const RunResult &Par, const RunResult &Ref) {
  ASSERT_EQ(Par.Losses.size(), Ref.Losses.size());
  for (size_t S = 0; S < Ref.Losses.size(); ++S)
    EXPECT_NEAR(Par.Losses[S], Ref.Losses[S], 1e-6 * std::abs(Ref.Losses[S]))
        << "step " << S + 1;
  ASSERT_EQ(Par.Grads.size(), Ref.Grads.size());
  for (auto &[Name, G] : Ref.Grads) {
    auto It = Par.Grads.find(Name);
    ASSERT_NE(It, Par.Grads.end()) << Name;
    ASSERT_EQ(It->second.size(), G.size()) << Name;
    EXPECT_LT(relErr(It->second, G), 1e-6) << Name;
  }
}

class ParallelEqualsOneDevice : public ::testing::TestWithParam<Config> {};

TEST_P(ParallelEqualsOneDevice, LossAndGradients) {
  Config C = GetParam();
  constexpr int Steps = 3;
  expectEqualRuns(train(C.TP, C.SP, C.Dropout, Steps),
                  train(1, false, C.Dropout, Steps));
}

/// A vocabulary of 66 over 4 ranks is padded to 68; the padding logits are
/// masked out of the loss and the run still equals one device. An untied
/// head, exported by torch.
TEST(ParallelVocabulary, PaddedVocabularyEqualsOneDevice) {
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("sp-vocab", Dir));
  std::string Model = (Dir + "/gpt.onnx").str();
  std::string Script = SP_SOURCE_DIR "/models/export_gpt.py";
  std::vector<StringRef> Args = {SP_PYTHON, Script,     "-o",      Model,   "--layers",
                      "1",       "--hidden", "32",      "--heads", "4",
                      "--seq",   "16",       "--vocab", "66",      "--batch",
                      "2",       "--untied", "--dropout", "0.1"};
  Optional<StringRef> Quiet[] = {None, StringRef(""), StringRef("")};
  ASSERT_EQ(sys::ExecuteAndWait(SP_PYTHON, Args, None, Quiet), 0)
      << "the torch export failed (is python3-torch installed?)";
  RunResult Ref = train(1, false, 0.1, 2, Model);
  RunResult Par = train(4, true, 0.1, 2, Model);
  expectEqualRuns(Par, Ref);
  sys::fs::remove_directories(Dir);
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
