//===- CostModelTest.cpp - The planner's cost model by hand ---------------===//
//
// Every number below is worked out by hand from the formulas stated in
// planner/CostModel.h; the tolerances are a few float64 roundings of sums of
// a dozen terms (1e-12 relative).
//
//===----------------------------------------------------------------------===//
#include "TrainHarness.h"
#include "planner/CostModel.h"
#include "llvm/Support/FormatVariadic.h"
#include "gtest/gtest.h"

using namespace sp;
using namespace sp::test;
using namespace llvm;

namespace {

constexpr double Rel = 1e-12;
/// The default cluster's GEMM rate: 75% of 312 TFLOP/s.
constexpr double Rate = 312e12 * 0.75;

/// A stage of 1 TFLOP forward and 2 TFLOP backward per microbatch.
StageWork layerWork() {
  StageWork W;
  W.ForwardFlops = 1e12;
  W.BackwardFlops = 2e12;
  return W;
}

void expectNear(double Want, double Got) {
  EXPECT_NEAR(Got, Want, Rel * std::abs(Want)) << "want " << Want;
}

TEST(CostModel, RingCollectives) {
  Link NvLink{300e9, 5e-6};
  // 2 (7/8) 1 GB / 300 GB/s + 14 x 5 us.
  expectNear(1.75e9 / 300e9 + 14 * 5e-6, allReduceSeconds(1e9, 8, NvLink));
  // (7/8) 1 GB / 300 GB/s + 7 x 5 us.
  expectNear(0.875e9 / 300e9 + 7 * 5e-6, allGatherSeconds(1e9, 8, NvLink));
  expectNear(0.875e9 / 300e9 + 7 * 5e-6, reduceScatterSeconds(1e9, 8, NvLink));
  EXPECT_EQ(allReduceSeconds(1e9, 1, NvLink), 0);
  EXPECT_EQ(allGatherSeconds(1e9, 1, NvLink), 0);
}

TEST(CostModel, GroupsInsideOrAcrossNodes) {
  ClusterSpec C; // 8 GPUs per node
  auto Inside = [&](int Stride, int N) {
    return groupLink(C, Stride, N).Bandwidth == C.IntraNodeBandwidth;
  };
  EXPECT_TRUE(Inside(1, 8));   // t = 8: one node
  EXPECT_FALSE(Inside(1, 16)); // t = 16 crosses nodes
  EXPECT_FALSE(Inside(1, 3));  // t = 3: some group straddles two nodes
  EXPECT_FALSE(Inside(8, 2));  // stages of t = 8 are on different nodes
  EXPECT_TRUE(Inside(4, 2));   // t = 4, p = 2: one node
  EXPECT_TRUE(Inside(2, 2));   // t = 2, p = 2: half a node
  EXPECT_TRUE(Inside(64, 1));  // one replica: no link at all
  EXPECT_EQ(groupLink(C, 8, 2).Latency, C.InterNodeLatency);
}

/// One GPU, one microbatch: the forward and backward GEMMs at 75% of 312
/// TFLOP/s, then the optimizer's 2.039 GB at 2.039 TB/s (1 ms).
TEST(CostModel, OneDevice) {
  ClusterSpec C;
  StageWork W = layerWork();
  W.OptimizerBytes = 2.039e9;
  auto E = estimateStep(C, ParallelLayout{}, {W});
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  expectNear(3e12 / Rate, E->PipelineSeconds);
  expectNear(1e-3, E->OptimizerSeconds);
  expectNear(3e12 / Rate + 1e-3, E->Seconds);
  expectNear(3e12 / Rate, E->ComputeSeconds);
  EXPECT_EQ(E->TensorCommSeconds, 0);
  EXPECT_EQ(E->BubbleFraction, 0);
  expectNear(3e12, E->ModelFlops);
  expectNear(3e12 / (312e12 * E->Seconds), E->Mfu);
}

/// t = 8: a 100 MB all-reduce in the forward and one in the backward, on
/// NVLink, with no GEMMs.
TEST(CostModel, TensorCollectives) {
  ClusterSpec C;
  StageWork W;
  W.ForwardComm.AllReduce = 1e8;
  W.ForwardComm.AllReduceCalls = 1;
  W.BackwardComm.AllReduce = 1e8;
  W.BackwardComm.AllReduceCalls = 1;
  ParallelLayout Y;
  Y.T = 8;
  auto E = estimateStep(C, Y, {W});
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  double One = 2 * 7.0 / 8 * 1e8 / 300e9 + 14 * 5e-6;
  expectNear(2 * One, E->TensorCommSeconds);
  expectNear(2 * One, E->Seconds);
  // t = 16 crosses nodes: the same bytes on the network.
  Y.T = 16;
  E = estimateStep(C, Y, {W});
  ASSERT_TRUE(bool(E));
  expectNear(2 * (2 * 15.0 / 16 * 1e8 / 25e9 + 30 * 10e-6), E->Seconds);
  // Two calls moving the same bytes pay the latency twice.
  W.ForwardComm.AllReduceCalls = 2;
  E = estimateStep(C, Y, {W});
  ASSERT_TRUE(bool(E));
  expectNear(2 * (2 * 15.0 / 16 * 1e8 / 25e9 + 30 * 10e-6) + 30 * 10e-6,
             E->Seconds);
}

/// Equal stages without messages: 1F1B's makespan is (N + P - 1)(F + B), its
/// bubble (P - 1) / N, and MFU the GEMM efficiency times N / (N + P - 1);
/// interleaved with M chunks, the bubble is (P - 1) / (N M).
TEST(CostModel, PipelineBubble) {
  ClusterSpec C;
  C.IntraNodeLatency = C.InterNodeLatency = 0; // messages of 0 bytes
  StageWork W = layerWork();
  ParallelLayout Y;
  Y.P = 4;
  Y.Microbatches = 8;
  std::vector<StageWork> Stages(4, W);
  auto E = estimateStep(C, Y, Stages);
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  expectNear(11 * 3e12 / Rate, E->Seconds);
  expectNear(3.0 / 8, E->BubbleFraction);
  expectNear(8 * 3e12 / Rate, E->ComputeSeconds);
  expectNear(8 * 3e12 * 4, E->ModelFlops);
  expectNear(0.75 * 8 / 11, E->Mfu);

  Y.P = 2;
  Y.M = 2;
  Y.Microbatches = 4;
  Y.Schedule = ScheduleKind::Interleaved;
  W.ForwardFlops = 0.5e12;
  W.BackwardFlops = 1e12;
  E = estimateStep(C, Y, std::vector<StageWork>(4, W));
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  expectNear(1.0 / 8, E->BubbleFraction);
}

/// A message between stages of t = 8 crosses nodes: 10 MB at 25 GB/s plus
/// 10 us. With one microbatch on two stages, the step is F, the message,
/// F, B, the gradient's message, B.
TEST(CostModel, StageMessages) {
  ClusterSpec C;
  StageWork W = layerWork();
  W.MessageBytes = 1e7;
  ParallelLayout Y;
  Y.T = 8;
  Y.P = 2;
  auto E = estimateStep(C, Y, {W, W});
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  double Message = 1e7 / 25e9 + 10e-6;
  expectNear(2 * 3e12 / Rate + 2 * Message, E->Seconds);
}

/// The gradients' sum over d = 2 replicas on NVLink: on one stage it hides
/// behind the last microbatch's backward (2e12 FLOPs) and only the rest
/// shows; pipelined, all of it shows.
TEST(CostModel, DataParallelOverlap) {
  ClusterSpec C;
  StageWork W = layerWork();
  W.GradientBytes = 4.7e9;
  ParallelLayout Y;
  Y.D = 2;
  Y.Microbatches = 2;
  auto E = estimateStep(C, Y, {W});
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  double Sum = 4.7e9 / 300e9 + 2 * 5e-6;
  expectNear(Sum - 2e12 / Rate, E->DataParallelSeconds);
  expectNear(2 * 3e12 / Rate + Sum - 2e12 / Rate, E->Seconds);
  expectNear(2 * 3e12 * 2, E->ModelFlops); // both replicas' work

  Y.P = 2;
  Y.T = 2; // the replicas are 4 ranks apart: still one node
  E = estimateStep(C, Y, {W, W});
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  expectNear(Sum, E->DataParallelSeconds);
  Y.T = 8; // 16 apart: across nodes
  E = estimateStep(C, Y, {W, W});
  ASSERT_TRUE(bool(E));
  expectNear(4.7e9 / 25e9 + 2 * 10e-6, E->DataParallelSeconds);
}

/// Recomputation costs time and counts as hardware FLOPs, not model FLOPs.
TEST(CostModel, RecomputeIsHardwareFlops) {
  ClusterSpec C;
  StageWork W = layerWork();
  W.RecomputeFlops = 1e12;
  auto E = estimateStep(C, ParallelLayout{}, {W});
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  expectNear(4e12 / (312e12 * 0.75), E->Seconds);
  expectNear(3e12, E->ModelFlops);
  expectNear(4e12, E->HardwareFlops);
  expectNear(0.75, E->Hfu);
  expectNear(0.75 * 3 / 4, E->Mfu);
}

/// Norms, activations and the like move their operands' bytes through HBM:
/// 2.039 GB at 2.039 TB/s is 1 ms in the forward, 2 in the backward.
TEST(CostModel, MemoryBoundInstructions) {
  ClusterSpec C;
  StageWork W;
  W.ForwardBytes = 2.039e9;
  W.BackwardBytes = 2 * 2.039e9;
  auto E = estimateStep(C, ParallelLayout{}, {W});
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  expectNear(3e-3, E->Seconds);
  expectNear(3e-3, E->MemoryBoundSeconds);
  EXPECT_EQ(E->ComputeSeconds, 0);
  // Four microbatches: four times the per-microbatch work, once the
  // per-step work (a pipelined rank's parameter copies).
  W.StepBytes = 2.039e9;
  ParallelLayout Y;
  Y.Microbatches = 4;
  E = estimateStep(C, Y, {W});
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  expectNear(4 * 3e-3 + 1e-3, E->Seconds);
  expectNear(1e-3, E->OptimizerSeconds);
}

/// The work read off compiled plans of the default model adds up to the
/// plan's own FLOP report: every GEMM is counted once, on its stage.
TEST(CostModel, PlanWorkIsThePlansFlops) {
  struct Case {
    int T, P, M, N;
    PipelineSchedule S;
    DType Dtype = DType::F32;
  };
  // (The default model has 2 layers: at most 2 stages.)
  for (Case X : {Case{2, 1, 1, 1, PipelineSchedule::OneFOneB},
                 Case{2, 2, 1, 4, PipelineSchedule::OneFOneB, DType::BF16},
                 Case{1, 2, 1, 4, PipelineSchedule::OneFOneB},
                 Case{2, 2, 1, 4, PipelineSchedule::ZeroBubbleH1},
                 Case{1, 1, 2, 4, PipelineSchedule::Interleaved}}) {
    SCOPED_TRACE(formatv("t {0} p {1} m {2}", X.T, X.P, X.M).str());
    PassContext Ctx;
    Ctx.ActivationDtype = X.Dtype;
    Ctx.TensorParallel = X.T;
    Ctx.SequenceParallel = X.T > 1;
    if (X.N > 1) {
      Ctx.Pipeline.Stages = X.P;
      Ctx.Pipeline.Interleave = X.M;
      Ctx.Pipeline.Microbatches = X.N;
      Ctx.Pipeline.Schedule = X.S;
      // ZB-H1 without 1F1B's cap: rank 1 keeps its W one backward late.
      if (X.S == PipelineSchedule::ZeroBubbleH1)
        Ctx.Recompute.MemoryBudget = int64_t(1) << 40;
    }
    Plan P = compile(SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx", Ctx);
    std::vector<StageWork> Work = planWork(P);
    ASSERT_EQ(int(Work.size()), X.P * X.M);
    double Model = 0, Recompute = 0;
    bool Weights = false;
    for (const StageWork &W : Work) {
      Model += W.ForwardFlops + W.BackwardFlops + W.WeightGradFlops;
      Weights |= W.WeightGradFlops > 0;
      Recompute += W.RecomputeFlops;
      EXPECT_GT(W.ForwardFlops, 0);
      EXPECT_GT(W.ForwardBytes, 0);
      EXPECT_EQ(W.ForwardComm.AllGatherCalls > 0, X.T > 1);
    }
    const nlohmann::json &F = P.Manifest["flops"];
    expectNear(F["model_flops_per_iteration"].get<double>(),
               Model * X.N * X.T);
    EXPECT_NEAR(F["recompute_flops_per_iteration"].get<double>(),
                Recompute * X.N * X.T, 1e-12 * Model * X.N * X.T);
    // Every rank updates its parameters; the last stage sends nothing on.
    // The 16-bit parameter copies of a pipelined rank run once per step, in
    // its prologue.
    for (int R = 0; R < X.P; ++R) {
      EXPECT_GT(Work[R].OptimizerBytes, 0);
      EXPECT_EQ(Work[R].StepBytes > 0, X.Dtype != DType::F32 && X.N > 1);
    }
    EXPECT_EQ(Work.back().MessageBytes, 0);
    if (X.P * X.M > 1) {
      EXPECT_GT(Work[0].MessageBytes, 0);
    }
    // ZB-H1's weight-gradient templates are counted apart (rank 0 runs its
    // W right after its B: one unsplit backward).
    EXPECT_EQ(Weights, X.S == PipelineSchedule::ZeroBubbleH1);
  }
}

/// Hierarchical context parallelism (a2a+ring) at c = 16, all-to-all
/// groups of 8: the all-to-all inside a node (NVLink, exposed), the ring
/// across the 2 groups on the network (exposed beyond its GEMMs: none
/// here). Plain a2a over 16 ranks and the plain ring cross nodes.
TEST(CostModel, HierarchicalContextParallelLinks) {
  ClusterSpec C; // 8 GPUs per node
  StageWork W;
  W.RingForwardBytes = 1e9;
  W.RingForwardMessages = 1;
  W.AllToAllForwardBytes = 7e8;
  W.AllToAllForwardMessages = 7;
  ParallelLayout Y;
  Y.C = 16;
  Y.CpAllToAll = 8;
  auto E = estimateStep(C, Y, {W});
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  const double Ring = 1e9 / C.InterNodeBandwidth + C.InterNodeLatency,
               A2aIntra = 7e8 / C.IntraNodeBandwidth + 7 * C.IntraNodeLatency,
               A2aInter = 7e8 / C.InterNodeBandwidth + 7 * C.InterNodeLatency;
  expectNear(Ring + A2aIntra, E->TensorCommSeconds);
  StageWork A2a = W, Plain = W;
  A2a.RingForwardBytes = A2a.RingForwardMessages = 0;
  Y.CpAllToAll = 16;
  E = estimateStep(C, Y, {A2a});
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  expectNear(A2aInter, E->TensorCommSeconds);
  Plain.AllToAllForwardBytes = Plain.AllToAllForwardMessages = 0;
  Y.CpAllToAll = 1;
  E = estimateStep(C, Y, {Plain});
  ASSERT_TRUE(bool(E)) << toString(E.takeError());
  expectNear(Ring, E->TensorCommSeconds);
  // Groups of 3 do not divide 16.
  Y.CpAllToAll = 3;
  std::string Msg = toString(estimateStep(C, Y, {W}).takeError());
  EXPECT_NE(Msg.find("all-to-all groups of 3"), std::string::npos) << Msg;
}

TEST(CostModel, BadLayoutsAreErrors) {
  ClusterSpec C;
  StageWork W;
  ParallelLayout Y;
  Y.P = 2;
  std::string Msg = toString(estimateStep(C, Y, {W}).takeError());
  EXPECT_NE(Msg.find("1 stages of work for p 2 x m 1 = 2"), std::string::npos)
      << Msg;
  Y.T = 0;
  Msg = toString(estimateStep(C, Y, {W, W}).takeError());
  EXPECT_NE(Msg.find("every size must be positive"), std::string::npos) << Msg;
  Y.T = 1;
  Y.M = 2;
  Y.Microbatches = 3;
  Y.Schedule = ScheduleKind::Interleaved;
  EXPECT_FALSE(bool(estimateStep(C, Y, std::vector<StageWork>(4, W))));
}

TEST(CostModel, ClusterDescriptions) {
  auto H100 = readClusterSpec(SP_SOURCE_DIR "/models/clusters/h100-dgx.json");
  ASSERT_TRUE(bool(H100)) << toString(H100.takeError());
  EXPECT_EQ(H100->GpusPerNode, 8);
  EXPECT_EQ(H100->PeakFlops, 989e12);
  auto A100 = readClusterSpec(SP_SOURCE_DIR "/models/clusters/a100-dgx.json");
  ASSERT_TRUE(bool(A100)) << toString(A100.takeError());
  ClusterSpec D;
  EXPECT_EQ(A100->PeakFlops, D.PeakFlops); // the file says what the defaults are
  EXPECT_EQ(A100->InterNodeBandwidth, D.InterNodeBandwidth);
  EXPECT_EQ(A100->MemoryBytes, D.MemoryBytes);

  auto Some = parseClusterSpec(R"({"gpus_per_node": 4, "peak_flops": 1e14})");
  ASSERT_TRUE(bool(Some)) << toString(Some.takeError());
  EXPECT_EQ(Some->GpusPerNode, 4);
  EXPECT_EQ(Some->HbmBandwidth, D.HbmBandwidth); // the rest stay

  auto Error = [](StringRef Json) {
    auto C = parseClusterSpec(Json);
    return C ? std::string("accepted") : toString(C.takeError());
  };
  EXPECT_NE(Error(R"({"peak_flop": 1})").find("unknown cluster field "
                                              "'peak_flop'"),
            std::string::npos);
  EXPECT_NE(Error(R"({"hbm_bandwidth": -1})").find("'hbm_bandwidth' must be "
                                                   "a positive number"),
            std::string::npos);
  EXPECT_NE(Error(R"({"gemm_efficiency": 1.5})").find("at most 1"),
            std::string::npos);
  EXPECT_NE(Error(R"({"gpus_per_node": 0})").find("positive integer"),
            std::string::npos);
  EXPECT_NE(Error(R"({"name": 3})").find("'name' must be a string"),
            std::string::npos);
  EXPECT_NE(Error("[1, 2]").find("a JSON object"), std::string::npos);
  EXPECT_NE(Error("{").find("a JSON object"), std::string::npos);
  EXPECT_EQ(Error(R"({"inter_node_latency": 0})"), "accepted");
  auto Missing = readClusterSpec("/nonexistent/cluster.json");
  ASSERT_FALSE(bool(Missing));
  EXPECT_NE(toString(Missing.takeError()).find("cannot read cluster "
                                               "description"),
            std::string::npos);
}

} // namespace
