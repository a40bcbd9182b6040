//===- RecomputeTest.cpp - Recomputation changes memory, not results ------===//
//
// Every recompute mode must give bitwise the same losses and gradients as
// none, with dropout on (the cloned dropouts keep their Philox keys), for t
// in {1, 2, 4} with sequence parallelism off and on; the executor's measured
// stored-activation bytes must equal the plan's; auto must fit its budget or
// say which budget would.
//
//===----------------------------------------------------------------------===//
#include "TrainHarness.h"
#include "reports/MemoryReport.h"
#include "gtest/gtest.h"
#include <cstring>

using namespace sp;
using namespace sp::test;
using namespace llvm;

namespace {

struct Layout {
  int TP;
  bool SP;
};

PassContext context(Layout L, RecomputeMode M, int K = 1,
                    int64_t Budget = 0) {
  PassContext Ctx;
  Ctx.TensorParallel = L.TP;
  Ctx.SequenceParallel = L.SP;
  Ctx.Recompute.Mode = M;
  Ctx.Recompute.Layers = K;
  Ctx.Recompute.MemoryBudget = Budget;
  return Ctx;
}

void expectBitwiseEqual(const RunResult &A, const RunResult &Ref) {
  ASSERT_EQ(A.Losses.size(), Ref.Losses.size());
  for (size_t S = 0; S < Ref.Losses.size(); ++S)
    EXPECT_EQ(A.Losses[S], Ref.Losses[S]) << "step " << S + 1;
  ASSERT_EQ(A.Grads.size(), Ref.Grads.size());
  for (auto &[Name, G] : Ref.Grads) {
    auto It = A.Grads.find(Name);
    ASSERT_NE(It, A.Grads.end()) << Name;
    ASSERT_EQ(It->second.size(), G.size()) << Name;
    EXPECT_EQ(std::memcmp(It->second.data(), G.data(),
                          G.size() * sizeof(double)),
              0)
        << Name << " differs (relative " << relErr(It->second, G) << ")";
  }
}

/// The executor's measured stored activations equal the plan's.
void expectMeasuredEqualsPlanned(const Plan &P, const RunResult &R) {
  ActivationReport A = analyzeActivations(P.Prog);
  EXPECT_EQ(R.Memory.StoredActivationBytes, A.StoredPeakBytes);
  EXPECT_EQ(R.Memory.HighWaterBytes, P.Prog.ArenaBytes);
  for (int L = -1; L < A.Layers; ++L) {
    auto It = R.Memory.StoredActivationBytesByLayer.find(L);
    int64_t Measured =
        It == R.Memory.StoredActivationBytesByLayer.end() ? 0 : It->second;
    EXPECT_EQ(Measured, A.layerBytes(L)) << "layer " << L;
  }
}

class RecomputeEqualsNone : public ::testing::TestWithParam<Layout> {};

TEST_P(RecomputeEqualsNone, BitwiseLossAndGradients) {
  Layout L = GetParam();
  constexpr double Dropout = 0.1;
  constexpr int Steps = 3;
  Plan None = compile(TinyModel, context(L, RecomputeMode::None));
  RunResult Ref = train(None, Dropout, Steps);
  expectMeasuredEqualsPlanned(None, Ref);
  ActivationReport NoneA = analyzeActivations(None.Prog);

  Plan Full = compile(TinyModel, context(L, RecomputeMode::Full));
  // A budget between full and none: auto must recompute some, not all.
  int64_t Budget = (None.Prog.ArenaBytes + Full.Prog.ArenaBytes) / 2;
  struct Mode {
    const char *Name;
    PassContext Ctx;
  } Modes[] = {
      {"selective", context(L, RecomputeMode::Selective)},
      {"full", context(L, RecomputeMode::Full)},
      {"full, every 2 layers", context(L, RecomputeMode::Full, 2)},
      {"auto", context(L, RecomputeMode::Auto, 1, Budget)},
      // Stage-aware (the planner's): per-layer modes, the first layer full.
      {"per layer: full, none", context(L, RecomputeMode::None)},
      // Per-layer modes and groups: both layers full, in one group.
      {"per layer: full every 2", context(L, RecomputeMode::None)},
  };
  Modes[4].Ctx.Recompute.LayerModes = {RecomputeMode::Full,
                                       RecomputeMode::None};
  Modes[5].Ctx.Recompute.LayerModes = {RecomputeMode::Full,
                                       RecomputeMode::Full};
  Modes[5].Ctx.Recompute.LayerGroups = {2, 2};
  for (const Mode &M : Modes) {
    SCOPED_TRACE(M.Name);
    Plan P = compile(TinyModel, M.Ctx);
    ActivationReport A = analyzeActivations(P.Prog);
    EXPECT_LT(A.StoredBytes, NoneA.StoredBytes);
    EXPECT_GT(A.RecomputeFlops, 0);
    if (M.Ctx.Recompute.Mode == RecomputeMode::Auto) {
      EXPECT_LE(P.Prog.ArenaBytes, Budget);
    }
    RunResult R = train(P, Dropout, Steps);
    expectBitwiseEqual(R, Ref);
    expectMeasuredEqualsPlanned(P, R);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, RecomputeEqualsNone,
                         ::testing::Values(Layout{1, false}, Layout{2, false},
                                           Layout{2, true}, Layout{4, false},
                                           Layout{4, true}),
                         [](const auto &Info) {
                           return "tp" + std::to_string(Info.param.TP) +
                                  (Info.param.SP ? "_sp" : "");
                         });

/// Selective keeps Q, K and V and drops the softmax output, its mask and
/// the dropped-out scores: the attention core's readers change, nothing
/// else.
TEST(Recompute, SelectiveDropsTheAttentionCoreOnly) {
  Layout L{1, false};
  ActivationReport None =
      analyzeActivations(compile(TinyModel, context(L, RecomputeMode::None)).Prog);
  ActivationReport Sel = analyzeActivations(
      compile(TinyModel, context(L, RecomputeMode::Selective)).Prog);
  int Mid = None.middleLayer();
  for (auto &[Role, Bytes] : None.Stored.at(Mid)) {
    SCOPED_TRACE(Role);
    auto It = Sel.Stored.at(Mid).find(Role);
    int64_t SelBytes = It == Sel.Stored.at(Mid).end() ? 0 : It->second;
    if (Role == "softmax" || Role == "attn_core_dropout")
      EXPECT_EQ(SelBytes, 0);
    else if (Role == "av") // keeps V, drops the dropped-out scores
      EXPECT_LT(SelBytes, Bytes);
    else
      EXPECT_EQ(SelBytes, Bytes);
  }
  EXPECT_EQ(Sel.LayerRecompute, std::vector<std::string>(Sel.Layers, "selective"));
}

/// Full recomputation in groups of K keeps only each group's input.
TEST(Recompute, FullKeepsOnlyGroupInputs) {
  Layout L{1, false};
  ActivationReport Full1 =
      analyzeActivations(compile(TinyModel, context(L, RecomputeMode::Full)).Prog);
  ActivationReport Full2 = analyzeActivations(
      compile(TinyModel, context(L, RecomputeMode::Full, 2)).Prog);
  ASSERT_EQ(Full1.Layers, 2);
  // One stored tensor per layer: its input, read by the recomputed ln1.
  for (int I = 0; I < 2; ++I) {
    ASSERT_EQ(Full1.Stored.at(I).size(), 1u);
    EXPECT_EQ(Full1.Stored.at(I).begin()->first, "ln1");
  }
  // Groups of two: layer 1's input is recomputed from layer 0's.
  EXPECT_EQ(Full2.layerBytes(0), Full1.layerBytes(0));
  EXPECT_EQ(Full2.layerBytes(1), 0);
  EXPECT_GT(Full2.RecomputeTransientBytes, 0);
}

TEST(Recompute, AutoWithRoomRecomputesNothing) {
  Layout L{1, false};
  Plan None = compile(TinyModel, context(L, RecomputeMode::None));
  Plan Auto = compile(TinyModel, context(L, RecomputeMode::Auto, 1,
                                         None.Prog.ArenaBytes));
  ActivationReport A = analyzeActivations(Auto.Prog);
  EXPECT_EQ(A.RecomputeFlops, 0);
  EXPECT_EQ(Auto.Prog.ArenaBytes, None.Prog.ArenaBytes);
}

TEST(Recompute, AutoBelowTheSmallestPlanNamesIt) {
  Layout L{1, false};
  Plan Full = compile(TinyModel, context(L, RecomputeMode::Full));
  auto P = tryCompile(TinyModel, context(L, RecomputeMode::Auto, 1,
                                         Full.Prog.ArenaBytes - 1));
  ASSERT_FALSE(bool(P));
  std::string Msg = toString(P.takeError());
  EXPECT_NE(Msg.find("no plan fits"), std::string::npos) << Msg;
  EXPECT_NE(Msg.find(std::to_string(Full.Prog.ArenaBytes)), std::string::npos)
      << Msg;
}

/// The groups a pipeline stage keeps whole: uniform groups of K from layer
/// 0, and with per-layer modes runs of full layers of the same K, K at a
/// time from the run's first layer; every other layer alone.
TEST(Recompute, Groups) {
  using RM = RecomputeMode;
  RecomputeOptions O;
  EXPECT_EQ(recomputeGroups(O, 3), (std::vector<int>{0, 1, 2}));
  O.Mode = RM::Full;
  O.Layers = 3;
  EXPECT_EQ(recomputeGroups(O, 7), (std::vector<int>{0, 0, 0, 1, 1, 1, 2}));
  O.Mode = RM::Selective; // K applies to full recomputation only
  EXPECT_EQ(recomputeGroups(O, 3), (std::vector<int>{0, 1, 2}));
  O.LayerModes = {RM::Full, RM::Full, RM::Full, RM::None,
                  RM::Full, RM::Full, RM::Full, RM::Selective};
  EXPECT_EQ(recomputeGroups(O, 8),
            (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7})); // no LayerGroups
  O.LayerGroups = {2, 2, 2, 2, 2, 2, 4, 4};
  EXPECT_EQ(recomputeGroups(O, 8), (std::vector<int>{0, 0, 1, 2, 3, 3, 4, 5}));
}

/// Per-layer modes recompute exactly the layers they name, and a list of
/// the wrong length is refused.
TEST(Recompute, PerLayerModes) {
  Layout L{1, false};
  PassContext Ctx = context(L, RecomputeMode::None);
  Ctx.Recompute.LayerModes = {RecomputeMode::None, RecomputeMode::Full};
  ActivationReport A = analyzeActivations(compile(TinyModel, Ctx).Prog);
  ASSERT_EQ(A.LayerRecompute.size(), 2u);
  EXPECT_EQ(A.LayerRecompute[0], "none");
  EXPECT_EQ(A.LayerRecompute[1], "full");
  Ctx.Recompute.LayerModes = {RecomputeMode::Full};
  auto P = tryCompile(TinyModel, Ctx);
  ASSERT_FALSE(bool(P));
  std::string Msg = toString(P.takeError());
  EXPECT_NE(Msg.find("1 per-layer modes for the 2 layers"), std::string::npos)
      << Msg;
}

} // namespace
