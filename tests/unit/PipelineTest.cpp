//===- PipelineTest.cpp - Pipelined runs equal one device -----------------===//
//
// A torch export with a symbolic batch (8 layers) is compiled once for one
// device over the whole batch of 8, and for p in {1, 2, 4} pipeline stages,
// M in {1, 2} model chunks, t in {1, 2} with sequence parallelism, recompute
// none and selective, over 4 microbatches of 2. Every run must give the
// one-device losses (3 steps, dropout on) and first-step gradients, within
// 1e-6 relative: the microbatches sum their gradients in another order than
// one GEMM over the whole batch, and nothing else differs (the dropout masks
// are keyed by the element's index in the whole batch).
//
// AdamW's epsilon is 1e-6 here instead of 1e-8: the gradient of the key
// bias is zero in exact arithmetic (softmax ignores a shift of a score row),
// so in floating point it is rounding noise of about 1e-9, which AdamW with
// a tiny epsilon turns into lr-sized steps of random sign. Any change of
// summation order (here: microbatches) then moves those biases by about
// 0.5% per step and the loss by about 1e-5 after two updates, in torch as
// much as here. With epsilon 1e-6 the noise moves them by 1e-3 of a step.
//
//===----------------------------------------------------------------------===//
#include "TrainHarness.h"
#include "reports/MemoryReport.h"
#include "driver/LowerTraining.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "gtest/gtest.h"

using namespace sp;
using namespace sp::test;
using namespace llvm;

namespace {

constexpr int Microbatches = 4, MicroBatchSize = 2, Seq = 16, Steps = 20;
constexpr double Dropout = 0.1;

/// The exported model, shared by the tests of this file.
const std::string &model() {
  static std::string Path = [] {
    SmallString<128> Dir;
    if (sys::fs::createUniqueDirectory("sp-pipeline", Dir))
      report_fatal_error("cannot create a temporary directory");
    std::string Model = (Dir + "/gpt8.onnx").str();
    std::string Script = SP_SOURCE_DIR "/models/export_gpt.py";
    if (!runPython({Script, "-o", Model, "--layers", "8", "--hidden", "32",
                    "--heads", "4", "--seq", "16", "--vocab", "64",
                    "--batch", "2", "--dynamic", "--dropout", "0.1"}))
      report_fatal_error("the torch export failed (is python3-torch "
                         "installed?)");
    return Model;
  }();
  return Path;
}

PassContext baseContext() {
  PassContext Ctx;
  Ctx.Optimizer.Eps = 1e-6;
  return Ctx;
}

const RunPair &reference() {
  static RunPair R = trainBoth(compile(model(), baseContext(),
                                       Microbatches * MicroBatchSize, Seq),
                               Dropout, Steps);
  return R;
}

struct PipelineConfig {
  int P, M, T;
  RecomputeMode Recompute;
};

PassContext context(const PipelineConfig &C) {
  PassContext Ctx = baseContext();
  Ctx.TensorParallel = C.T;
  Ctx.SequenceParallel = C.T > 1;
  Ctx.Recompute.Mode = C.Recompute;
  Ctx.Pipeline.Stages = C.P;
  Ctx.Pipeline.Interleave = C.M;
  Ctx.Pipeline.Microbatches = Microbatches;
  Ctx.Pipeline.Schedule = C.M > 1 ? PipelineSchedule::Interleaved
                                  : PipelineSchedule::OneFOneB;
  return Ctx;
}

class PipelineEqualsOneDevice
    : public ::testing::TestWithParam<PipelineConfig> {};

TEST_P(PipelineEqualsOneDevice, LossAndGradients) {
  const RunPair &Ref = reference();
  Plan P = compile(model(), context(GetParam()), MicroBatchSize, Seq);
  expectEqualRuns(trainBoth(P, Dropout, Steps), Ref);
}

std::vector<PipelineConfig> configs() {
  std::vector<PipelineConfig> C;
  for (int P : {1, 2, 4})
    for (int M : {1, 2})
      for (int T : {1, 2})
        for (RecomputeMode R : {RecomputeMode::None, RecomputeMode::Selective})
          if (M == 1 || P > 1) // interleaving needs stages
            C.push_back({P, M, T, R});
  return C;
}

INSTANTIATE_TEST_SUITE_P(
    Grid, PipelineEqualsOneDevice, ::testing::ValuesIn(configs()),
    [](const auto &Info) {
      const PipelineConfig &C = Info.param;
      return "p" + std::to_string(C.P) + "_m" + std::to_string(C.M) + "_t" +
             std::to_string(C.T) +
             (C.Recompute == RecomputeMode::Selective ? "_selective" : "");
    });

/// Stage-aware recomputation with per-layer groups (as the planner makes
/// them): layers 0-6 fully recomputed in groups of 4 (0-3 and 4-6), layer 7
/// storing everything. Without groups the partition cuts after layer 5 (the
/// last rank also holds the LM head), inside the second group; it must keep
/// each group on one rank (a group split over two deadlocks the schedule),
/// and the run equals one device.
TEST(Pipeline, PerLayerRecomputeGroupsStayOnOneRank) {
  using RM = RecomputeMode;
  PassContext Ctx = context({2, 1, 1, RM::None});
  Ctx.Recompute.LayerModes = {RM::Full, RM::Full, RM::Full, RM::Full,
                              RM::Full, RM::Full, RM::Full, RM::None};
  Ctx.Recompute.LayerGroups = {4, 4, 4, 4, 4, 4, 4, 1};
  Plan P = compile(model(), Ctx, MicroBatchSize, Seq);
  std::vector<std::set<int>> RanksOf(8);
  for (int K = 0; K < P.numStages(); ++K)
    for (const Instruction &I : P.stage(K).Instrs)
      if (I.Ph == Phase::Forward && I.Layer >= 0 && I.Op != OpKind::Recv &&
          I.Op != OpKind::Send) // a receive carries its sender's layer
        RanksOf.at(I.Layer).insert(K);
  for (int L = 0; L < 8; ++L)
    EXPECT_EQ(RanksOf[L].size(), 1u) << "layer " << L;
  EXPECT_EQ(RanksOf[0], RanksOf[3]);
  EXPECT_EQ(RanksOf[4], RanksOf[6]);
  EXPECT_NE(RanksOf[0], RanksOf[7]);
  expectEqualRuns(trainBoth(P, Dropout, Steps), reference());
}

/// The first stage keeps P microbatches in flight under 1F1B, so its
/// stored activations are P microbatches' worth of its layers.
TEST(Pipeline, FirstStageHoldsPMicrobatches) {
  PipelineConfig C{4, 1, 1, RecomputeMode::None};
  PassContext Ctx = context(C);
  Plan P = compile(model(), Ctx, MicroBatchSize, Seq);
  ASSERT_EQ(P.numStages(), 4);
  auto L = buildSchedule(ScheduleKind::OneFOneB, 4, 1, Microbatches);
  ASSERT_TRUE(bool(L));
  EXPECT_EQ(maxInFlight(*L, 0), 4);
  EXPECT_EQ(maxInFlight(*L, 3), 1);
  // Measured equals planned on every stage.
  RunResult R = train(P, Dropout, 1);
  EXPECT_EQ(R.Memory.HighWaterBytes, P.Prog.ArenaBytes);
  auto Flat = expandProgram(P.Prog);
  ASSERT_TRUE(bool(Flat)) << toString(Flat.takeError());
  EXPECT_EQ(R.Memory.StoredActivationBytes,
            analyzeActivations(*Flat).StoredPeakBytes);
}

/// ZB-H1 runs 1F1B's instructions in another order (each backward split
/// into its input- and weight-gradient parts, the latter delayed), and
/// every gradient still sums the microbatches in order: the losses and
/// gradients are 1F1B's bit for bit. Its peak over the ranks is 1F1B's
/// (the compiler lowers a rank's delay where the default would exceed it),
/// and the first rank measures what its plan promises.
TEST(Pipeline, ZeroBubbleIsBitwiseOneFOneB) {
  for (PipelineConfig C : {PipelineConfig{2, 1, 1, RecomputeMode::None},
                           PipelineConfig{4, 1, 1, RecomputeMode::None},
                           PipelineConfig{2, 1, 2, RecomputeMode::Selective}}) {
    SCOPED_TRACE(formatv("p {0} t {1}", C.P, C.T).str());
    PassContext Base = context(C);
    Plan OneF = compile(model(), Base, MicroBatchSize, Seq);
    PassContext Zb = context(C);
    Zb.Pipeline.Schedule = PipelineSchedule::ZeroBubbleH1;
    Plan Zero = compile(model(), Zb, MicroBatchSize, Seq);
    ASSERT_EQ(Zero.numStages(), C.P);
    int64_t PeakOneF = 0, PeakZero = 0;
    for (int K = 0; K < C.P; ++K) {
      PeakOneF = std::max(PeakOneF, OneF.stage(K).ArenaBytes);
      PeakZero = std::max(PeakZero, Zero.stage(K).ArenaBytes);
    }
    EXPECT_LE(PeakZero, PeakOneF);
    RunResult A = train(OneF, Dropout, 3), B = train(Zero, Dropout, 3);
    EXPECT_EQ(A.Losses, B.Losses);
    ASSERT_EQ(A.Grads.size(), B.Grads.size());
    for (auto &[Name, G] : A.Grads)
      EXPECT_TRUE(B.Grads.count(Name) && B.Grads.at(Name) == G) << Name;
    EXPECT_EQ(B.Memory.HighWaterBytes, Zero.Prog.ArenaBytes);
  }
}

} // namespace

namespace {

/// A compact program that the reader or a bad edit got wrong is refused
/// before it runs, naming what is wrong: a microbatch out of range, a
/// region with fewer slots than the schedule keeps in flight, slots laid
/// over the parameters (two live buffers sharing bytes), and (stepping
/// through the templates) an instance outside the arena. Written out
/// (expandProgram) or walked for the executor's run (prepareCompactRun),
/// the same error.
TEST(Pipeline, CompactProgramsAreChecked) {
  PipelineConfig C{2, 1, 1, RecomputeMode::None};
  Plan P = compile(model(), context(C), MicroBatchSize, Seq);
  const Program &Good = P.Stages[0];
  ASSERT_TRUE(Good.compact());
  ASSERT_FALSE(Good.Slots.empty());
  auto Flat = expandProgram(Good);
  ASSERT_TRUE(bool(Flat)) << toString(Flat.takeError());
  EXPECT_FALSE(bool(checkNoOverlap(*Flat)));
  auto Run = prepareCompactRun(Good);
  ASSERT_TRUE(bool(Run)) << toString(Run.takeError());
  EXPECT_EQ(Run->positions(), int(Flat->Instrs.size()));
  EXPECT_EQ(Run->Instances.size(), Flat->Buffers.size());
  for (size_t N = 0; N < Flat->Buffers.size(); ++N) {
    const ProgramBuffer &B = Flat->Buffers[N];
    EXPECT_EQ(Run->Instances[N].Offset, B.Offset) << B.Name;
    if (B.K == ProgramBuffer::Temp) {
      EXPECT_EQ(Run->Instances[N].Def, B.Def) << B.Name;
      EXPECT_EQ(Run->Instances[N].LastUse, B.LastUse) << B.Name;
    }
  }
  auto BothRefuse = [](const Program &Bad, StringRef Want) {
    std::string Msg = toString(expandProgram(Bad).takeError());
    EXPECT_NE(Msg.find(Want.str()), std::string::npos) << Msg;
    Msg = toString(prepareCompactRun(Bad).takeError());
    EXPECT_NE(Msg.find(Want.str()), std::string::npos) << Msg;
  };

  Program Mb = Good;
  Mb.Steps[1].Microbatch = Microbatches;
  BothRefuse(Mb, "step 1 (forward) has microbatch 4 of 4");

  Program Few = Good;
  int R = 0;
  while (Few.Slots[R].Count < 2)
    ++R;
  ASSERT_LT(R, int(Few.Slots.size()));
  Few.Slots[R].Count = 1;
  BothRefuse(Few, "which has 1");

  // The region moved onto the parameters: the activations would overwrite
  // them.
  Program Laid = Good;
  Laid.Slots[R].Offset = 0;
  BothRefuse(Laid, "are live together");

  // The scratch region past the arena's end (the written-out program is
  // refused by the executor, which checks every buffer's place).
  Program Past = Good;
  for (ProgramBuffer &B : Past.Buffers)
    if (B.Scope == BufferScope::Step)
      B.Offset += Past.ArenaBytes;
  std::string Msg = toString(prepareCompactRun(Past).takeError());
  EXPECT_NE(Msg.find("lies outside the arena"), std::string::npos) << Msg;
}

/// The compiler's report walks each rank's compact program over its steps
/// (runStats) instead of writing it out: the instruction and buffer counts,
/// the peak of live temporaries and the stored activations' peak equal
/// those of the written-out program, on every rank of 1F1B, interleaved
/// (with t = 2, SP and selective recomputation) and ZB-H1 plans.
TEST(Pipeline, RunStatsWalkEqualsTheWrittenOutProgram) {
  struct Case {
    PipelineConfig C;
    PipelineSchedule S;
  };
  for (Case X :
       {Case{{2, 1, 1, RecomputeMode::None}, PipelineSchedule::OneFOneB},
        Case{{2, 2, 2, RecomputeMode::Selective}, PipelineSchedule::Interleaved},
        Case{{4, 1, 1, RecomputeMode::Full}, PipelineSchedule::ZeroBubbleH1}}) {
    PassContext Ctx = context(X.C);
    Ctx.Pipeline.Schedule = X.S;
    Plan P = compile(model(), Ctx, MicroBatchSize, Seq);
    for (int K = 0; K < P.numStages(); ++K) {
      SCOPED_TRACE(formatv("p {0} M {1} rank {2}", X.C.P, X.C.M, K).str());
      ASSERT_TRUE(P.stage(K).compact());
      auto Walk = runStats(P.stage(K));
      ASSERT_TRUE(bool(Walk)) << toString(Walk.takeError());
      auto Flat = expandProgram(P.stage(K));
      ASSERT_TRUE(bool(Flat)) << toString(Flat.takeError());
      auto Want = runStats(*Flat);
      ASSERT_TRUE(bool(Want));
      EXPECT_EQ(Walk->Instructions, int64_t(Flat->Instrs.size()));
      EXPECT_EQ(Walk->Buffers, int64_t(Flat->Buffers.size()));
      EXPECT_EQ(Walk->PeakLiveTempBytes, Want->PeakLiveTempBytes);
      EXPECT_EQ(Walk->StoredPeakBytes, Want->StoredPeakBytes);
      EXPECT_GT(Walk->StoredPeakBytes, 0);
    }
  }
}

/// The executor runs a compact program step by step over its templates
/// (each step's buffer instances through KernelCall::Where, its tags,
/// microbatch and first accumulate bound per step); written out, the same
/// program makes the same calls in the same order. So the two runs agree
/// bit for bit: 3 training steps' losses, the first step's gradients, the
/// evaluation loss and logits, and every rank's measured memory, on 1F1B,
/// interleaved (t = 2, SP, selective), ZB-H1 (full recompute) and a bf16
/// mixed-precision 1F1B plan.
TEST(Pipeline, StepsOverTemplatesEqualTheWrittenOutProgram) {
  struct Case {
    PipelineConfig C;
    PipelineSchedule S;
    DType Activations;
  };
  for (Case X : {Case{{2, 1, 1, RecomputeMode::None},
                      PipelineSchedule::OneFOneB, DType::F32},
                 Case{{2, 2, 2, RecomputeMode::Selective},
                      PipelineSchedule::Interleaved, DType::F32},
                 Case{{4, 1, 1, RecomputeMode::Full},
                      PipelineSchedule::ZeroBubbleH1, DType::F32},
                 Case{{2, 1, 1, RecomputeMode::Selective},
                      PipelineSchedule::OneFOneB, DType::BF16}}) {
    SCOPED_TRACE(formatv("p {0} M {1} t {2} {3}", X.C.P, X.C.M, X.C.T,
                         dtypeName(X.Activations))
                     .str());
    PassContext Ctx = context(X.C);
    Ctx.Pipeline.Schedule = X.S;
    Ctx.ActivationDtype = X.Activations;
    Plan P = compile(model(), Ctx, MicroBatchSize, Seq);
    ASSERT_TRUE(P.stage(0).compact());
    RunResult Steps = train(P, Dropout, 3);
    RunResult Flat = train(P, Dropout, 3, /*ExpandCompact=*/true);
    ASSERT_EQ(Steps.Losses.size(), 3u);
    EXPECT_EQ(Steps.Losses, Flat.Losses);
    EXPECT_EQ(Steps.Grads.size(), Flat.Grads.size());
    EXPECT_FALSE(Steps.Grads.empty());
    for (const auto &[Name, G] : Flat.Grads) {
      auto It = Steps.Grads.find(Name);
      ASSERT_NE(It, Steps.Grads.end()) << Name;
      EXPECT_EQ(It->second, G) << Name;
    }
    EXPECT_EQ(Steps.EvalLoss, Flat.EvalLoss);
    EXPECT_FALSE(Steps.Logits.empty());
    EXPECT_EQ(Steps.Logits, Flat.Logits);
    ASSERT_EQ(Steps.RankMemory.size(), Flat.RankMemory.size());
    for (size_t R = 0; R < Flat.RankMemory.size(); ++R) {
      const MemoryStats &A = Steps.RankMemory[R], &B = Flat.RankMemory[R];
      SCOPED_TRACE(formatv("rank {0}", R).str());
      EXPECT_EQ(A.ArenaBytes, B.ArenaBytes);
      EXPECT_EQ(A.HighWaterBytes, B.HighWaterBytes);
      EXPECT_EQ(A.PeakLiveTempBytes, B.PeakLiveTempBytes);
      EXPECT_EQ(A.StoredActivationBytes, B.StoredActivationBytes);
      EXPECT_EQ(A.StoredActivationBytesByLayer, B.StoredActivationBytesByLayer);
      EXPECT_GT(A.StoredActivationBytes, 0);
    }
  }
}

/// The programs' own check: reordering two receives of a rank, or dropping
/// one, is caught before anything runs, in the compact programs (their
/// steps) and in the same programs written out.
TEST(Pipeline, VerifierCatchesDeadlocksAndLostMessages) {
  PipelineConfig C{2, 1, 1, RecomputeMode::None};
  Plan P = compile(model(), context(C), MicroBatchSize, Seq);
  ASSERT_EQ(P.numStages(), 2);
  ASSERT_TRUE(P.Stages[0].compact());
  EXPECT_FALSE(bool(verifyPipelinePrograms(P.Stages)));

  // Rank 0 waits for the last microbatch's gradient before the first's;
  // rank 1 makes it only after rank 0 sends an activation that comes after
  // that wait: neither can move.
  std::vector<Program> Swapped = P.Stages;
  std::vector<int> Backwards;
  for (size_t K = 0; K < Swapped[0].Steps.size(); ++K)
    if (Swapped[0].Templates[Swapped[0].Steps[K].Template].Kind ==
        TemplateKind::Backward)
      Backwards.push_back(K);
  ASSERT_EQ(Backwards.size(), size_t(Microbatches));
  std::swap(Swapped[0].Steps[Backwards.front()].Microbatch,
            Swapped[0].Steps[Backwards.back()].Microbatch);
  std::string Msg = toString(verifyPipelinePrograms(Swapped));
  EXPECT_NE(Msg.find("deadlocks"), std::string::npos) << Msg;
  EXPECT_NE(Msg.find("rank 0 in step 3 (backward of chunk 0, microbatch 3)"),
            std::string::npos)
      << Msg;
  EXPECT_NE(Msg.find("rank 1 in step"), std::string::npos) << Msg;

  // A gradient nobody receives: rank 0 never runs its last backward.
  std::vector<Program> Lost = P.Stages;
  Lost[0].Steps.erase(Lost[0].Steps.begin() + Backwards.back());
  Msg = toString(verifyPipelinePrograms(Lost));
  EXPECT_NE(Msg.find("never receives it"), std::string::npos) << Msg;

  // The same checks on the programs written out.
  std::vector<Program> Flat;
  for (const Program &S : P.Stages) {
    auto F = expandProgram(S);
    ASSERT_TRUE(bool(F)) << toString(F.takeError());
    Flat.push_back(std::move(*F));
  }
  EXPECT_FALSE(bool(verifyPipelinePrograms(Flat)));
  std::vector<int> Recvs;
  for (size_t I = 0; I < Flat[0].Instrs.size(); ++I)
    if (Flat[0].Instrs[I].Op == OpKind::Recv)
      Recvs.push_back(I);
  ASSERT_EQ(Recvs.size(), size_t(Microbatches));
  std::swap(Flat[0].Instrs[Recvs.front()].Attrs,
            Flat[0].Instrs[Recvs.back()].Attrs);
  Msg = toString(verifyPipelinePrograms(Flat));
  EXPECT_NE(Msg.find("deadlocks"), std::string::npos) << Msg;
  EXPECT_NE(Msg.find("rank 0 at instruction"), std::string::npos) << Msg;
  EXPECT_NE(Msg.find("rank 1 at instruction"), std::string::npos) << Msg;
  Flat[0].Instrs.erase(Flat[0].Instrs.begin() + Recvs.front());
  Msg = toString(verifyPipelinePrograms(Flat));
  EXPECT_NE(Msg.find("never receives it"), std::string::npos) << Msg;
}

} // namespace
