//===- AutoPlanTest.cpp - The planner's search against brute force --------===//
//
// The default model (2 layers, 4 heads, batch 4) on 4 GPUs: every layout
// of the space (t, SP, p, m, d, ZeRO, recomputation), compiled one by one
// here, against what searchLayouts returns, at memory budgets that let all,
// some or none of them fit. The search prunes layouts whose parameters and
// optimizer state alone exceed the budget: it must never prune one that
// fits.
//
//===----------------------------------------------------------------------===//
#include "TrainHarness.h"
#include "planner/AutoPlan.h"
#include "frontend/OnnxImporter.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "gtest/gtest.h"
#include <limits>

using namespace sp;
using namespace llvm;

namespace {

std::unique_ptr<Graph> tinyModel() {
  registerOnnxDataLoader();
  auto G = importOnnx(SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx",
                      ImportOptions());
  if (!G)
    report_fatal_error(Twine("import failed: ") + toString(G.takeError()));
  return std::move(*G);
}

struct Tried {
  AutoCandidate C;
  bool Compiled = false;
};

/// Every layout of 4 GPUs for the default model (global batch 16: four
/// sequences a GPU), compiled and estimated as the search would, with no
/// pruning.
std::vector<Tried> bruteForce(const Graph &G, const ClusterSpec &Cluster,
                              const PassContext &Base) {
  std::vector<Tried> All;
  const int Gpus = 4, Heads = 4, Layers = 2, Batch = 4, Global = 16;
  for (int T : {1, 2, 4})
    for (int P = 1; P <= Layers; ++P) {
      if ((Gpus / T) % P || Heads % T)
        continue;
      int D = Gpus / (T * P);
      if (Global % (D * Batch))
        continue;
      int N = Global / (D * Batch);
      for (int M = 1; M <= 4; ++M) {
        if (M > 1 && (P == 1 || P * M > Layers || N % P))
          continue;
        for (int Zero : {0, 1})
          for (int SP : {0, 1})
            for (auto [Rc, Every] :
                 {std::pair{"none", 1}, {"selective", 1}, {"full", 1},
                  {"full", 2}}) {
              if ((Zero && D == 1) || (SP && T == 1))
                continue;
              // Groups of 2 layers: a stage holds whole groups; the search
              // tries them on the SP member only.
              if (Every > 1 && (P * M > Layers / Every || SP != (T > 1)))
                continue;
              Tried X;
              AutoCandidate &C = X.C;
              C.T = T, C.P = P, C.M = M, C.D = D, C.Microbatches = N;
              C.Zero = Zero, C.SP = SP, C.Recompute = Rc;
              C.FullEvery = Every;
              std::unique_ptr<Graph> Copy = G.clone();
              PassContext Ctx = layoutContext(Base, C);
              auto Comp = compileToPlan(*Copy, Ctx, CompileOptions());
              if (!Comp) {
                consumeError(Comp.takeError());
                All.push_back(X);
                continue;
              }
              X.Compiled = true;
              for (int K = 0; K < Comp->P->numStages(); ++K)
                C.PeakBytes =
                    std::max(C.PeakBytes, Comp->P->stage(K).ArenaBytes);
              ParallelLayout Y;
              Y.T = T, Y.P = P, Y.M = M, Y.D = D, Y.Microbatches = N;
              Y.Schedule =
                  M > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
              ClusterSpec Fp32 = Cluster;
              Fp32.PeakFlops = Fp32.Fp32PeakFlops;
              auto E = estimateStep(Fp32, Y, planWork(*Comp->P));
              if (!E)
                report_fatal_error(toString(E.takeError()).c_str());
              C.Step = *E;
              All.push_back(X);
            }
      }
    }
  return All;
}

class AutoPlanCore : public ::testing::TestWithParam<bool> {};

// With the fused attention core (sp-compile's default) and with the
// unfused one (--attention unfused, what the CUDA backend runs).
TEST_P(AutoPlanCore, SearchEqualsBruteForce) {
  std::unique_ptr<Graph> G = tinyModel();
  ClusterSpec Cluster;
  PassContext Base;
  Base.FusedAttention = GetParam();
  std::vector<Tried> All = bruteForce(*G, Cluster, Base);
  std::vector<int64_t> Peaks;
  for (const Tried &X : All)
    if (X.Compiled)
      Peaks.push_back(X.C.PeakBytes);
  ASSERT_GT(Peaks.size(), 20u);
  std::sort(Peaks.begin(), Peaks.end());
  // All fit; the median fits; only the smallest fits.
  int Staged = 0;
  std::vector<int64_t> Budgets = {Peaks.back(), Peaks[Peaks.size() / 2],
                                  Peaks[0]};
  for (size_t K = 1; K < Peaks.size(); ++K) // between two peaks too
    Budgets.push_back((Peaks[K - 1] + Peaks[K]) / 2);
  for (int64_t Budget : Budgets) {
    SCOPED_TRACE(formatv("budget {0} bytes", Budget).str());
    AutoOptions O;
    O.Gpus = 4;
    O.GpuMemory = double(Budget);
    O.Cluster = Cluster;
    auto R = searchLayouts(*G, Base, O);
    ASSERT_TRUE(bool(R)) << toString(R.takeError());
    // A layout the search should find: one that fits, and for full
    // recomputation of groups of layers, only where its family's smallest
    // member (SP, full recomputation of every layer) does not fit.
    auto Expected = [&](const Tried &X) {
      if (!X.Compiled || X.C.PeakBytes > Budget)
        return false;
      if (X.C.FullEvery == 1)
        return true;
      return none_of(All, [&](const Tried &Y) {
        return Y.Compiled && Y.C.FullEvery == 1 && Y.C.Recompute == "full" &&
               Y.C.SP == X.C.SP && Y.C.T == X.C.T && Y.C.P == X.C.P &&
               Y.C.M == X.C.M && Y.C.D == X.C.D && Y.C.Zero == X.C.Zero &&
               Y.C.PeakBytes <= Budget;
      });
    };
    const Tried *Want = nullptr;
    size_t Fit = 0;
    for (const Tried &X : All)
      if (Expected(X)) {
        ++Fit;
        if (!Want || X.C.Step.Seconds < Want->C.Step.Seconds)
          Want = &X;
      }
    ASSERT_TRUE(Want);
    // The brute force has no stage-aware layouts: those the search adds
    // come on top, and may only be faster.
    size_t Uniform = count_if(R->Fits, [](const AutoCandidate &C) {
      return !C.staged();
    });
    EXPECT_EQ(Uniform, Fit);
    // The fastest step (layouts may tie: a one-stage plan whose gradient sum
    // outlasts its backward hides the whole backward under it).
    const AutoCandidate *First = nullptr;
    for (const AutoCandidate &C : R->Fits)
      if (!First && !C.staged())
        First = &C;
    ASSERT_TRUE(First);
    const AutoCandidate &Got = *First;
    EXPECT_EQ(Got.Step.Seconds, Want->C.Step.Seconds);
    EXPECT_LE(R->Fits.front().Step.Seconds, Want->C.Step.Seconds);
    const Tried *Same = nullptr;
    for (const Tried &X : All)
      if (X.Compiled && X.C.describe() == Got.describe())
        Same = &X;
    ASSERT_TRUE(Same) << Got.describe();
    EXPECT_EQ(Got.PeakBytes, Same->C.PeakBytes);
    EXPECT_EQ(Got.Step.Seconds, Same->C.Step.Seconds);
    ASSERT_TRUE(R->Best && R->Best->P && R->BestGraph);
    int64_t BestPeak = 0;
    for (int K = 0; K < R->Best->P->numStages(); ++K)
      BestPeak = std::max(BestPeak, R->Best->P->stage(K).ArenaBytes);
    EXPECT_EQ(BestPeak, R->Fits.front().PeakBytes); // the plan -o writes
    {
      // The best's compilation is the one the search kept, with its
      // reports made afterwards: the same as compiling it from scratch.
      std::unique_ptr<Graph> Copy = G->clone();
      PassContext Ctx = layoutContext(Base, R->Fits.front());
      auto Scratch = compileToPlan(*Copy, Ctx, CompileOptions());
      ASSERT_TRUE(bool(Scratch)) << toString(Scratch.takeError());
      EXPECT_EQ(R->Best->Facts, Scratch->Facts);
      EXPECT_EQ(R->Best->P->Manifest, Scratch->P->Manifest);
      EXPECT_EQ(R->Best->P->Files, Scratch->P->Files);
      ASSERT_EQ(R->Best->P->numStages(), Scratch->P->numStages());
      for (int K = 0; K < Scratch->P->numStages(); ++K)
        EXPECT_EQ(R->Best->P->stage(K).Instrs.size(),
                  Scratch->P->stage(K).Instrs.size());
      EXPECT_EQ(R->BestGraph->numNodes(), Copy->numNodes());
    }
    for (size_t K = 1; K < R->Fits.size(); ++K)
      EXPECT_LE(R->Fits[K - 1].Step.Seconds, R->Fits[K].Step.Seconds);
    // Every uniform layout the search compiled (once through the
    // layout-free passes, then each layout's passes on a copy, families
    // concurrently) has the peak and step of its compile from scratch.
    for (const AutoCandidate &C : R->Fits) {
      if (C.staged()) {
        // A stage-aware layout: its own compile from scratch, with its
        // per-layer modes, has its peak and step, and fits.
        std::unique_ptr<Graph> Copy = G->clone();
        PassContext Ctx = layoutContext(Base, C);
        auto Comp = compileToPlan(*Copy, Ctx, CompileOptions());
        ASSERT_TRUE(bool(Comp)) << toString(Comp.takeError());
        int64_t Peak = 0;
        for (int K = 0; K < Comp->P->numStages(); ++K)
          Peak = std::max(Peak, Comp->P->stage(K).ArenaBytes);
        EXPECT_EQ(C.PeakBytes, Peak) << C.describe();
        EXPECT_LE(C.PeakBytes, Budget) << C.describe();
        ++Staged;
        continue;
      }
      const Tried *X = nullptr;
      for (const Tried &T : All)
        if (T.Compiled && T.C.describe() == C.describe())
          X = &T;
      ASSERT_TRUE(X) << C.describe();
      EXPECT_EQ(C.PeakBytes, X->C.PeakBytes) << C.describe();
      EXPECT_EQ(C.Step.Seconds, X->C.Step.Seconds) << C.describe();
    }
    // The concurrent search gives the same table every time.
    auto Again = searchLayouts(*G, Base, O);
    ASSERT_TRUE(bool(Again)) << toString(Again.takeError());
    ASSERT_EQ(Again->Fits.size(), R->Fits.size());
    for (size_t K = 0; K < R->Fits.size(); ++K)
      EXPECT_EQ(Again->Fits[K].describe(), R->Fits[K].describe());
    EXPECT_EQ(Again->Rejected, R->Rejected);
    EXPECT_EQ(Again->Compiled, R->Compiled);
  }
  // The budgets between two peaks give the unfused core's stage-aware
  // members something to do (the fused core's need a deeper pipeline).
  if (!GetParam()) {
    EXPECT_GE(Staged, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Attention, AutoPlanCore, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool> &I) {
                           return I.param ? "Fused" : "Unfused";
                         });

TEST(AutoPlan, DefaultPassesAreTheLayoutFreeThenTheLayoutPasses) {
  EXPECT_EQ(std::string(DefaultPasses),
            std::string(LayoutFreePasses) + "," + LayoutPasses);
}

/// Below every layout's peak: an error that names the smallest memory a
/// layout needs, even when every layout was pruned before compiling.
TEST(AutoPlan, TooLittleMemoryNamesWhatWouldFit) {
  std::unique_ptr<Graph> G = tinyModel();
  PassContext Base;
  std::vector<Tried> All = bruteForce(*G, ClusterSpec(), Base);
  int64_t Least = std::numeric_limits<int64_t>::max();
  for (const Tried &X : All)
    if (X.Compiled)
      Least = std::min(Least, X.C.PeakBytes);
  for (double Budget : {double(Least - 1), 1000.0}) {
    AutoOptions O;
    O.Gpus = 4;
    O.GpuMemory = Budget;
    auto R = searchLayouts(*G, Base, O);
    ASSERT_FALSE(bool(R));
    std::string Msg = toString(R.takeError());
    EXPECT_NE(Msg.find("no layout of this model on 4 GPUs fits"),
              std::string::npos)
        << Msg;
    ASSERT_LT(Least, 1 << 30);
    EXPECT_NE(Msg.find(formatv("needs {0:F1} MiB", double(Least) / (1 << 20))
                           .str()),
              std::string::npos)
        << Msg;
  }
}

/// Where only full recomputation of groups of layers fits a pipelined
/// family (the paper's 22B, weight-free, global batch 16 on 8 GPUs of
/// 51.5 GiB: t 4, SP, p 2 x 4 chunks in groups of 2), the groups are that
/// family's top stage-aware level: the search compiles the member with
/// rank 0 in groups of 2 and rank 1 storing everything. Its per-layer modes
/// and groups follow the ranks' layers, and the search's compile of it has
/// the peak and step of its compile from scratch.
TEST(AutoPlan, GroupsOfLayersAreAStageAwareLevel) {
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("sp-auto", Dir));
  std::string Model = (Dir + "/gpt-22B.onnx").str();
  std::string Script = SP_SOURCE_DIR "/models/gen_paper_graph.py";
  ASSERT_TRUE(test::runPython({Script, "--model", "22B", "-o", Model}));
  registerOnnxDataLoader();
  auto G = importOnnx(Model, ImportOptions());
  ASSERT_TRUE(bool(G)) << toString(G.takeError());
  PassContext Base; // as sp-compile --dtype fp16 (fused attention)
  Base.ActivationDtype = DType::F16;
  Base.FusedAttention = true;
  AutoOptions O;
  O.Gpus = 8;
  O.GpuMemory = 51.5 * (1 << 30);
  O.GlobalBatch = 16;
  auto R = searchLayouts(**G, Base, O);
  ASSERT_TRUE(bool(R)) << toString(R.takeError());
  ASSERT_EQ(R->Fits.size(), 1u);
  EXPECT_EQ(R->Fits[0].FullEvery, 2);
  const AutoCandidate *Staged = nullptr;
  for (const AutoCandidate &C : R->TooBig)
    if (C.staged() && !C.RankGroups.empty())
      Staged = &C;
  ASSERT_TRUE(Staged);
  EXPECT_EQ(Staged->describe(),
            "t 4 SP, p 2 x m 4, d 1, 4 microbatches, recompute none (full "
            "every 2 on rank 0 of 2)");
  EXPECT_EQ(Staged->RankGroups, (std::vector<int>{2, 1}));
  PassContext Ctx = layoutContext(Base, *Staged);
  ASSERT_EQ(Ctx.Recompute.LayerModes.size(), 48u);
  ASSERT_EQ(Ctx.Recompute.LayerGroups.size(), 48u);
  for (int L = 0; L < 48; ++L) {
    bool First = Staged->LayerRanks[L] == 0;
    EXPECT_EQ(Ctx.Recompute.LayerModes[L],
              First ? RecomputeMode::Full : RecomputeMode::None);
    EXPECT_EQ(Ctx.Recompute.LayerGroups[L], First ? 2 : 1);
  }
  std::unique_ptr<Graph> Copy = (*G)->clone();
  auto Comp = compileToPlan(*Copy, Ctx, CompileOptions());
  ASSERT_TRUE(bool(Comp)) << toString(Comp.takeError());
  int64_t Peak = 0;
  for (int K = 0; K < Comp->P->numStages(); ++K)
    Peak = std::max(Peak, Comp->P->stage(K).ArenaBytes);
  EXPECT_EQ(Peak, Staged->PeakBytes);
  auto E = estimatePlan(O.Cluster, Ctx, *Comp->P);
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  EXPECT_EQ(E->Seconds, Staged->Step.Seconds);
  sys::fs::remove_directories(Dir);
}

TEST(AutoPlan, BadOptionsAreErrors) {
  std::unique_ptr<Graph> G = tinyModel();
  AutoOptions O;
  O.GpuMemory = 1e9;
  std::string Msg = toString(searchLayouts(*G, PassContext(), O).takeError());
  EXPECT_NE(Msg.find("--gpus"), std::string::npos) << Msg;
  O.Gpus = 4;
  O.GlobalBatch = 6;
  Msg = toString(searchLayouts(*G, PassContext(), O).takeError());
  EXPECT_NE(Msg.find("--global-batch 6 is not a multiple of the model's "
                     "batch 4"),
            std::string::npos)
      << Msg;
}

} // namespace
