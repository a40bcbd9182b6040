//===- ContextParallelTest.cpp - Context-parallel runs equal one device ---===//
//
// Compiles models with --cp C (passes/ContextParallel.cpp), alone and with
// tensor + sequence parallelism and pipelines, trains them on thread ranks
// (the ring attention of runtime/cpu/ContextAttention.h over the cp group),
// and checks that the losses and every gradient equal the one-device run,
// dropout on and off: the masks are keyed by global positions, so they are
// the same on any layout. The bounds are the harness's (TrainHarness.h): a
// multiple of the one-device run's float32 rounding, measured against its
// float64 run. The models: the default GPT, and HF-style GPT-2, Llama
// (grouped-query attention, rotary tables looked up by position ids) and
// BERT (bidirectional, an attention-mask input, token types) exports; the
// ring, the all-to-all (--cp-comm a2a) and the hierarchical a2a+ring.
//
//===----------------------------------------------------------------------===//
#include "TestSupport.h"
#include "TrainHarness.h"
#include "gtest/gtest.h"

using namespace sp;
using namespace sp::test;
using namespace llvm;

namespace {

struct CpLayout {
  int CP = 1, TP = 1, PP = 1;
  bool SP = false;
  RecomputeMode Recompute = RecomputeMode::None;
  const char *Comm = "ring";
  int AllToAll = 1; // --cp-a2a, with Comm "a2a+ring"
};

Plan compileCp(StringRef Model, CpLayout L) {
  PassContext Ctx;
  Ctx.FusedAttention = true;
  Ctx.ContextParallel = L.CP;
  Ctx.ContextComm = L.Comm;
  Ctx.ContextAllToAll = L.AllToAll;
  Ctx.TensorParallel = L.TP;
  Ctx.SequenceParallel = L.SP;
  Ctx.Recompute.Mode = L.Recompute;
  if (L.PP > 1) {
    Ctx.Pipeline.Stages = L.PP;
    Ctx.Pipeline.Microbatches = 2;
  }
  return compile(Model, Ctx);
}

/// The layout's run against one device's, over Steps steps.
void expectCpEqualsOneDevice(StringRef Model, CpLayout L, double Dropout,
                             int Steps = 2) {
  CpLayout One;
  One.PP = L.PP; // the same microbatches: the same batch rows per step
  expectEqualRuns(trainBoth(compileCp(Model, L), Dropout, Steps),
                  trainBoth(compileCp(Model, One), Dropout, Steps));
}

TEST(ContextParallel, TinyGptCp2) {
  expectCpEqualsOneDevice(TinyModel, {2}, 0.0);
}

TEST(ContextParallel, TinyGptCp2Dropout) {
  expectCpEqualsOneDevice(TinyModel, {2}, 0.1);
}

TEST(ContextParallel, TinyGptCp4Dropout) {
  expectCpEqualsOneDevice(TinyModel, {4}, 0.1);
}

/// Each context rank's 32 positions split again over two tensor ranks,
/// across the zigzag seam.
TEST(ContextParallel, TinyGptCp2Tp2SequenceParallelDropout) {
  expectCpEqualsOneDevice(TinyModel, {2, 2, 1, true}, 0.1);
}

TEST(ContextParallel, TinyGptCp2Pipeline2) {
  expectCpEqualsOneDevice(TinyModel, {2, 1, 2}, 0.1);
}

/// Full recomputation runs each layer's forward again in the backward, the
/// ring included (its dropout drawn again at the same positions).
TEST(ContextParallel, TinyGptCp2FullRecomputeDropout) {
  CpLayout L{2};
  L.Recompute = RecomputeMode::Full;
  expectCpEqualsOneDevice(TinyModel, L, 0.1);
}

/// The all-to-all (--cp-comm a2a): heads traded for positions.
CpLayout allToAll(int CP, int TP = 1, bool SP = false) {
  CpLayout L{CP, TP, 1, SP};
  L.Comm = "a2a";
  return L;
}
TEST(ContextParallel, TinyGptAllToAllCp2Dropout) {
  expectCpEqualsOneDevice(TinyModel, allToAll(2), 0.1);
}
TEST(ContextParallel, TinyGptAllToAllCp4Dropout) {
  expectCpEqualsOneDevice(TinyModel, allToAll(4), 0.1);
}
TEST(ContextParallel, TinyGptAllToAllCp2Tp2SequenceParallelDropout) {
  expectCpEqualsOneDevice(TinyModel, allToAll(2, 2, true), 0.1);
}

/// Hierarchical (--cp-comm a2a+ring --cp-a2a 2): all-to-all groups of two
/// consecutive cp ranks, the ring across the groups.
CpLayout hierarchical(int CP, int K, int TP = 1, bool SP = false) {
  CpLayout L{CP, TP, 1, SP};
  L.Comm = "a2a+ring";
  L.AllToAll = K;
  return L;
}
TEST(ContextParallel, TinyGptHierarchicalCp4A2a2Dropout) {
  expectCpEqualsOneDevice(TinyModel, hierarchical(4, 2), 0.1);
}
TEST(ContextParallel, TinyGptHierarchicalCp4A2a2Tp2SequenceParallelDropout) {
  // 4 heads: 2 a tensor rank, 1 a rank of the all-to-all group.
  expectCpEqualsOneDevice(TinyModel, hierarchical(4, 2, 2, true), 0.1);
}

/// The compile-time refusals name what to change.
TEST(ContextParallel, RefusesWhatItCannotSplit) {
  PassContext Ctx;
  Ctx.FusedAttention = true;
  Ctx.ContextParallel = 3; // 64 positions into 6 chunks
  auto P = tryCompile(TinyModel, Ctx);
  ASSERT_FALSE(bool(P));
  EXPECT_NE(errorText(P).find("2 x cp = 6"), std::string::npos);
  Ctx.ContextParallel = 2;
  Ctx.FusedAttention = false; // the unfused core's [s, s] scores
  P = tryCompile(TinyModel, Ctx);
  ASSERT_FALSE(bool(P));
  EXPECT_NE(errorText(P).find("--attention fused"), std::string::npos);
  // 4 heads over t 2 and cp 4: 2 heads a tensor rank, not 4 ways.
  Ctx.FusedAttention = true;
  Ctx.ContextParallel = 4;
  Ctx.TensorParallel = 2;
  Ctx.ContextComm = "a2a";
  P = tryCompile(TinyModel, Ctx);
  ASSERT_FALSE(bool(P));
  EXPECT_NE(errorText(P).find("each tensor-parallel rank's 2 heads"),
            std::string::npos);
  // a2a+ring: groups of 4 over a tensor rank's 2 heads; of 3 in cp 4; of
  // 4 in cp 4 (that is a2a) and of 1 (the ring).
  Ctx.ContextParallel = 8;
  Ctx.ContextComm = "a2a+ring";
  Ctx.ContextAllToAll = 4;
  Ctx.TensorParallel = 2;
  P = tryCompile(TinyModel, Ctx);
  ASSERT_FALSE(bool(P));
  EXPECT_NE(errorText(P).find("--cp-a2a 4: each tensor-parallel rank's 2 "
                              "heads"),
            std::string::npos);
  Ctx.TensorParallel = 1;
  Ctx.ContextParallel = 4;
  Ctx.ContextAllToAll = 3;
  P = tryCompile(TinyModel, Ctx);
  ASSERT_FALSE(bool(P));
  EXPECT_NE(errorText(P).find("--cp-a2a can be 2"), std::string::npos);
  for (auto [K, Use] : {std::pair{4, "use --cp-comm a2a"},
                        std::pair{1, "use --cp-comm ring"}}) {
    Ctx.ContextAllToAll = K;
    P = tryCompile(TinyModel, Ctx);
    ASSERT_FALSE(bool(P));
    EXPECT_NE(errorText(P).find(Use), std::string::npos);
  }
}

/// HF-style exports (models/export_family.py), each made once per process
/// (ctest runs every test in a process of its own: only the family it
/// needs).
class ContextParallelFamilies : public ::testing::Test {
protected:
  static void TearDownTestSuite() { Dir.reset(); }
  static std::string model(StringRef Family) {
    if (!Dir)
      Dir = std::make_unique<TempDir>();
    std::string Out = Dir->file(Family.str() + ".onnx");
    if (llvm::sys::fs::exists(Out))
      return Out;
    std::vector<StringRef> Argv = {SP_SOURCE_DIR "/models/export_family.py",
                                   "--family",
                                   Family,
                                   "-o",
                                   Out,
                                   "--layers",
                                   "2",
                                   "--hidden",
                                   "32",
                                   "--heads",
                                   "4",
                                   "--seq",
                                   "16",
                                   "--batch",
                                   "2",
                                   "--vocab",
                                   "64"};
    if (Family == "llama")
      Argv.insert(Argv.end(), {"--kv-heads", "2"});
    else
      Argv.insert(Argv.end(), {"--dropout", "0.1"});
    EXPECT_TRUE(runPython(Argv)) << "the torch export of " << Family.str()
                                 << " failed (is python3-torch installed?)";
    return Out;
  }
  static std::unique_ptr<TempDir> Dir;
};
std::unique_ptr<TempDir> ContextParallelFamilies::Dir;

TEST_F(ContextParallelFamilies, Gpt2Cp2Dropout) {
  expectCpEqualsOneDevice(model("gpt2"), {2}, 0.1);
}
TEST_F(ContextParallelFamilies, Gpt2Cp4Dropout) {
  expectCpEqualsOneDevice(model("gpt2"), {4}, 0.1);
}
TEST_F(ContextParallelFamilies, LlamaGqaCp2) {
  expectCpEqualsOneDevice(model("llama"), {2}, 0.0);
}
TEST_F(ContextParallelFamilies, LlamaGqaCp4) {
  expectCpEqualsOneDevice(model("llama"), {4}, 0.0);
}
TEST_F(ContextParallelFamilies, BertCp2Dropout) {
  expectCpEqualsOneDevice(model("bert"), {2}, 0.1);
}
TEST_F(ContextParallelFamilies, BertCp4Dropout) {
  expectCpEqualsOneDevice(model("bert"), {4}, 0.1);
}
TEST_F(ContextParallelFamilies, LlamaGqaAllToAllCp2) {
  expectCpEqualsOneDevice(model("llama"), allToAll(2), 0.0);
}
TEST_F(ContextParallelFamilies, BertAllToAllCp4Dropout) {
  expectCpEqualsOneDevice(model("bert"), allToAll(4), 0.1);
}
TEST_F(ContextParallelFamilies, LlamaGqaHierarchicalCp4A2a2) {
  expectCpEqualsOneDevice(model("llama"), hierarchical(4, 2), 0.0);
}

} // namespace
