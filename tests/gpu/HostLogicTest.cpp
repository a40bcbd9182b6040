//===- HostLogicTest.cpp - The CUDA backend's host-side logic -------------===//
//
// What the CUDA backend decides on the host, tested on any machine (no GPU,
// no driver, or a build without CUDA): the launch geometry of the kernels,
// the chunking of the multi-tensor AdamW into launches, the stream and
// event plan of a program (on hand-made programs and on
// random ones, checked against a happens-before simulation), how pipeline
// messages are posted to NCCL (every compiled schedule completes), which
// buffers a 16-bit instruction copies to float32 (MixedPlan.h), the
// unfused expansion of the fused attention core (AttentionPlan.h, run here
// by the CPU backend against the fused CPU kernel), the local-rank and
// device selection, and the error a machine without a usable device gives.
//
//===----------------------------------------------------------------------===//
#include "AttentionCase.h"
#include "frontend/OnnxImporter.h"
#include "ir/OpDef.h"
#include "driver/Compile.h"
#include "runtime/comm/Communicator.h"
#include "runtime/cpu/CpuBackend.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/AttentionPlan.h"
#include "runtime/cuda/CudaBackend.h"
#include "runtime/cuda/DeviceSelect.h"
#include "runtime/cuda/LaunchGeometry.h"
#include "runtime/cuda/MixedPlan.h"
#include "runtime/cuda/MultiTensor.h"
#include "runtime/cuda/StreamPlan.h"
#include "gtest/gtest.h"
#include <map>
#include <random>

using namespace sp;
using namespace sp::cuda;
using namespace llvm;

namespace {

//===----------------------------------------------------------------------===//
// Launch geometry
//===----------------------------------------------------------------------===//

TEST(DevicePeak, MatchesTheDataSheets) {
  // A100 SXM: 108 SMs at 1410 MHz: 312 TFLOP/s bf16/fp16, 19.5 fp32, 156
  // TF32; V100: 80 SMs at 1530 MHz: 125 fp16, 15.7 fp32, no bf16.
  EXPECT_NEAR(gpuPeakFlops(8, 0, 108, 1410000, "bf16", false), 312e12, 0.5e12);
  EXPECT_NEAR(gpuPeakFlops(8, 0, 108, 1410000, "f16", false), 312e12, 0.5e12);
  EXPECT_NEAR(gpuPeakFlops(8, 0, 108, 1410000, "f32", false), 19.5e12, 0.1e12);
  EXPECT_NEAR(gpuPeakFlops(8, 0, 108, 1410000, "f32", true), 156e12, 0.5e12);
  EXPECT_NEAR(gpuPeakFlops(7, 0, 80, 1530000, "f16", false), 125e12, 0.5e12);
  EXPECT_EQ(gpuPeakFlops(7, 0, 80, 1530000, "bf16", false), 0);
  // H100 SXM at the data sheet's 1830 MHz: 989 bf16, 61.8 fp32.
  EXPECT_NEAR(gpuPeakFlops(9, 0, 132, 1830000, "bf16", false), 989e12, 1e12);
  // Unknown architectures and types: unknown.
  EXPECT_EQ(gpuPeakFlops(6, 1, 28, 1500000, "f32", false), 0);
  EXPECT_EQ(gpuPeakFlops(8, 0, 108, 1410000, "f64", false), 0);
}

TEST(LaunchGeometry, ElementwiseCoversAndCaps) {
  EXPECT_EQ(elementwiseLaunch(0).Blocks, 0) << "nothing to launch";
  EXPECT_EQ(elementwiseLaunch(-3).Blocks, 0);
  EXPECT_EQ(elementwiseLaunch(1).Blocks, 1);
  EXPECT_EQ(elementwiseLaunch(256).Blocks, 1);
  EXPECT_EQ(elementwiseLaunch(257).Blocks, 2);
  // Capped (grid-stride loops cover the rest).
  EXPECT_EQ(elementwiseLaunch(int64_t(1) << 40).Blocks, MaxBlocks);
  for (int64_t N : {1, 255, 256, 1000, 1 << 20}) {
    Launch L = elementwiseLaunch(N);
    EXPECT_GE(L.Blocks * L.Threads, std::min<int64_t>(N, MaxBlocks * 256));
    EXPECT_LT((L.Blocks - 1) * L.Threads, N) << "no block is wholly idle";
  }
}

TEST(LaunchGeometry, ColumnSumsAreTheCpusBlocks) {
  // The CUDA kernels' blocks of rows are the CPU's (their bits depend on it).
  static_assert(cuda::ColumnRows == cpu::ColumnRows);
  EXPECT_EQ(columnParts(1), 1);
  EXPECT_EQ(columnParts(64), 1);
  EXPECT_EQ(columnParts(65), 2);
  EXPECT_EQ(columnParts(8192), 128);
}

TEST(LaunchGeometry, LaneRowsGiveEightThreadsPerRow) {
  EXPECT_EQ(RowLanes * RowsPerBlock, BlockThreads);
  EXPECT_EQ(RowLanes % 32 == 0 || 32 % RowLanes == 0, true)
      << "a row's lanes stay inside one warp (the shuffles)";
  EXPECT_EQ(laneRowsLaunch(0).Blocks, 0);
  EXPECT_EQ(laneRowsLaunch(1).Blocks, 1);
  EXPECT_EQ(laneRowsLaunch(RowsPerBlock).Blocks, 1);
  EXPECT_EQ(laneRowsLaunch(RowsPerBlock + 1).Blocks, 2);
  EXPECT_EQ(laneRowsLaunch(int64_t(1) << 40).Blocks, MaxBlocks);
}

TEST(LaunchGeometry, SumSquaresGridIsFixedBySize) {
  EXPECT_EQ(sumSquaresLaunch(0).Blocks, 0);
  EXPECT_EQ(sumSquaresLaunch(100).Blocks, 1);
  EXPECT_EQ(sumSquaresLaunch(int64_t(1) << 30).Blocks, SumBlocks);
}

/// Every element of every tensor is covered exactly once, in order, and
/// every launch respects its table's limits.
void expectCovers(const std::vector<int64_t> &Sizes,
                  const std::vector<MultiTensorLaunch> &L, int64_t Chunk,
                  int MaxTensors, int MaxBlocks) {
  std::vector<std::pair<int, int64_t>> Seen; // (tensor, chunk) in order
  for (const MultiTensorLaunch &X : L) {
    EXPECT_FALSE(X.Blocks.empty()) << "no empty launch";
    EXPECT_LE(int(X.Tensors.size()), MaxTensors);
    EXPECT_LE(int(X.Blocks.size()), MaxBlocks);
    for (size_t K = 1; K < X.Tensors.size(); ++K)
      EXPECT_LT(X.Tensors[K - 1], X.Tensors[K]);
    std::vector<bool> Used(X.Tensors.size(), false);
    for (const MultiTensorBlock &B : X.Blocks) {
      ASSERT_GE(B.Slot, 0);
      ASSERT_LT(B.Slot, int(X.Tensors.size()));
      Used[B.Slot] = true;
      Seen.push_back({X.Tensors[B.Slot], B.Chunk});
    }
    for (bool U : Used)
      EXPECT_TRUE(U) << "every slot has a block";
  }
  std::vector<std::pair<int, int64_t>> Want;
  for (size_t T = 0; T < Sizes.size(); ++T)
    for (int64_t C = 0; C * Chunk < Sizes[T]; ++C)
      Want.push_back({int(T), C});
  EXPECT_EQ(Seen, Want);
}

TEST(MultiTensor, LaunchesCoverEveryChunkOnce) {
  // The default limits: small tensors share a launch, a large one spans
  // several, empty ones are skipped.
  std::vector<int64_t> Sizes = {1000, 0, 3, 65536, 65537, 30000000, 7};
  auto L = planMultiTensor(Sizes);
  expectCovers(Sizes, L, MultiTensorChunk, MultiTensorMaxTensors,
               MultiTensorMaxBlocks);
  ASSERT_EQ(L.size(), 2u); // 1 + 1 + 1 + 2 + 458 + 1 = 464 blocks
  EXPECT_EQ(L[0].Tensors, (std::vector<int>{0, 2, 3, 4, 5}));
  EXPECT_EQ(L[1].Tensors, (std::vector<int>{5, 6})) << "the large one goes on";
  EXPECT_EQ(L[0].Blocks.size(), 320u);
  EXPECT_EQ(L[1].Blocks.size(), 144u);
  EXPECT_TRUE(planMultiTensor({}).empty());
  EXPECT_TRUE(planMultiTensor({0, 0}).empty());
  // Many tensors: a new launch when the table's tensor slots are full.
  std::vector<int64_t> Many(100, 5);
  auto M = planMultiTensor(Many);
  expectCovers(Many, M, MultiTensorChunk, MultiTensorMaxTensors,
               MultiTensorMaxBlocks);
  EXPECT_EQ(M.size(), 3u); // 36 + 36 + 28
  // Random sizes and small limits.
  std::mt19937 Rng(7);
  for (int Trial = 0; Trial < 200; ++Trial) {
    std::vector<int64_t> S(Rng() % 12);
    for (int64_t &X : S)
      X = Rng() % 4 == 0 ? 0 : int64_t(Rng() % 100);
    int64_t Chunk = 1 + Rng() % 9;
    int MaxT = 1 + Rng() % 4, MaxB = 1 + Rng() % 6;
    expectCovers(S, planMultiTensor(S, Chunk, MaxT, MaxB), Chunk, MaxT, MaxB);
  }
}

TEST(MultiTensor, ALaunchIsSharedByItsInstructionsInATrace) {
  // 16 instructions in one launch of 1.1 ms would each show 1.1 ms: their
  // shares are consecutive, by elements, and sum to the launch.
  auto S = shareLaunch(100.0, 1100.0, {300, 100, 0, 600});
  ASSERT_EQ(S.size(), 4u);
  EXPECT_DOUBLE_EQ(S[0].Start, 100.0);
  EXPECT_DOUBLE_EQ(S[0].Duration, 330.0);
  EXPECT_DOUBLE_EQ(S[1].Start, 430.0);
  EXPECT_DOUBLE_EQ(S[1].Duration, 110.0);
  EXPECT_DOUBLE_EQ(S[2].Duration, 0.0) << "a ZeRO rank's empty chunk";
  EXPECT_DOUBLE_EQ(S[3].Start, 540.0);
  EXPECT_DOUBLE_EQ(S[3].Start + S[3].Duration, 1200.0);
  auto Even = shareLaunch(0.0, 3.0, {0, 0, 0});
  for (size_t K = 0; K < 3; ++K)
    EXPECT_DOUBLE_EQ(Even[K].Duration, 1.0);
  EXPECT_TRUE(shareLaunch(0.0, 1.0, {}).empty());
}

TEST(MultiTensor, TheTableFitsAKernelArgument) {
  // kernels/AdamW.cuh's AdamwTable: six arrays of 8 bytes per tensor, an int
  // and a byte per block, within CUDA's 4 KiB of kernel arguments.
  EXPECT_LE(MultiTensorMaxTensors * 6 * 8 + MultiTensorMaxBlocks * 5 + 64,
            4096);
  EXPECT_LE(MultiTensorMaxTensors, 256) << "slots are bytes";
}

/// The device's row reduction assigns element j to lane j mod 8 and sums
/// each lane in order, then combines the lanes as
/// ((0+1)+(2+3))+((4+5)+(6+7)) (kernels/Common.cuh). Emulated here, it must
/// be the CPU's laneSum bit for bit (cpu::sumSquares is a laneSum of
/// squares up to SquaresChunk elements), or the "bitwise equal" claims of
/// the kernels would not hold.
TEST(LaunchGeometry, LaneOrderIsTheCpuOrder) {
  std::mt19937 Rng(5);
  std::normal_distribution<float> D(0, 3);
  for (int64_t N : {1, 7, 8, 9, 63, 64, 1000, 4097}) {
    std::vector<float> G(N);
    for (float &X : G)
      X = D(Rng);
    double Lane[RowLanes] = {};
    for (int K = 0; K < RowLanes; ++K)
      for (int64_t J = K; J < N; J += RowLanes)
        Lane[K] += double(G[J]) * G[J];
    double Device = ((Lane[0] + Lane[1]) + (Lane[2] + Lane[3])) +
                    ((Lane[4] + Lane[5]) + (Lane[6] + Lane[7]));
    EXPECT_EQ(Device, cpu::sumSquares(G.data(), N)) << "N = " << N;
  }
}

//===----------------------------------------------------------------------===//
// Stream plan
//===----------------------------------------------------------------------===//

/// A program over buffers of Floats floats at the given offsets (floats).
struct ProgramBuilder {
  Program P;
  int buffer(int64_t OffsetFloats, int64_t Floats) {
    ProgramBuffer B;
    B.Name = "%" + std::to_string(P.Buffers.size());
    B.Type = TensorType(DType::F32, {Floats});
    B.Offset = OffsetFloats * 4;
    B.Bytes = Floats * 4;
    P.Buffers.push_back(B);
    return int(P.Buffers.size()) - 1;
  }
  int instr(OpKind Op, std::initializer_list<int> In,
            std::initializer_list<int> Out) {
    Instruction I;
    I.Op = Op;
    I.In.assign(In.begin(), In.end());
    I.Out.assign(Out.begin(), Out.end());
    P.Instrs.push_back(I);
    return int(P.Instrs.size()) - 1;
  }
};

/// Checks that every pair of conflicting instructions on different streams
/// is ordered by the plan: simulating the streams, when j starts, the last
/// instruction known complete on the other stream (through the events it
/// waits for, transitively) is at or after every conflicting i before j.
/// Returns the first violation, or "".
std::string checkOrdered(const Program &P, const StreamPlan &Plan) {
  size_t N = P.Instrs.size();
  // Known[j][s]: the highest instruction of stream s complete before j
  // starts (-1: none).
  std::vector<std::array<int, NumStreams>> Known(N);
  std::array<int, NumStreams> Last = {-1, -1}; // last issued per stream
  std::vector<std::array<int, NumStreams>> Done(N); // known after j ends
  for (size_t J = 0; J < N; ++J) {
    int S = int(Plan.Steps[J].Stream);
    std::array<int, NumStreams> K = {-1, -1};
    if (Last[S] >= 0)
      K = Done[Last[S]]; // in order on its stream
    for (int W : Plan.Steps[J].WaitFor) {
      if (!Plan.Steps[W].RecordEvent)
        return "instruction " + std::to_string(J) + " waits for " +
               std::to_string(W) + ", which records no event";
      for (int T = 0; T < NumStreams; ++T)
        K[T] = std::max(K[T], Done[W][T]);
    }
    Known[J] = K;
    Done[J] = K;
    Done[J][S] = int(J);
    Last[S] = int(J);
  }
  std::vector<ByteRange> RI, WI, RJ, WJ;
  auto Any = [](const std::vector<ByteRange> &A,
                const std::vector<ByteRange> &B) {
    for (auto &X : A)
      for (auto &Y : B)
        if (X.overlaps(Y))
          return true;
    return false;
  };
  for (size_t J = 0; J < N; ++J) {
    instructionRanges(P, P.Instrs[J], RJ, WJ);
    for (size_t I = 0; I < J; ++I) {
      int SI = int(Plan.Steps[I].Stream);
      if (SI == int(Plan.Steps[J].Stream))
        continue;
      instructionRanges(P, P.Instrs[I], RI, WI);
      bool Conflict = Any(WI, RJ) || Any(WI, WJ) || Any(RI, WJ);
      if (Conflict && Known[J][SI] < int(I))
        return "instruction " + std::to_string(J) + " may run before " +
               std::to_string(I) + ", which it conflicts with";
    }
  }
  return "";
}

TEST(StreamPlan, CollectivesGoOnTheCommunicationStream) {
  EXPECT_TRUE(isCommunication(OpKind::AllGather));
  EXPECT_TRUE(isCommunication(OpKind::ReduceScatter));
  EXPECT_TRUE(isCommunication(OpKind::AllReduce));
  EXPECT_TRUE(isCommunication(OpKind::Send));
  EXPECT_TRUE(isCommunication(OpKind::Recv));
  EXPECT_TRUE(isCommunication(OpKind::PipeAllReduce));
  EXPECT_FALSE(isCommunication(OpKind::SpSplit)) << "a local copy";
  EXPECT_FALSE(isCommunication(OpKind::GradNorm));
  EXPECT_FALSE(isCommunication(OpKind::Linear));
}

TEST(StreamPlan, WaitsOnlyWhereBytesConflict) {
  ProgramBuilder B;
  int X = B.buffer(0, 16), H = B.buffer(16, 16), G = B.buffer(32, 32),
      U = B.buffer(64, 16), Y = B.buffer(80, 32);
  int Reused = B.buffer(32, 8); // G's bytes, after G's last use
  int L0 = B.instr(OpKind::Gelu, {X}, {H});           // compute
  int C1 = B.instr(OpKind::AllGather, {H}, {G});      // comm: reads H
  int L2 = B.instr(OpKind::Gelu, {X}, {U});           // compute: overlaps C1
  int L3 = B.instr(OpKind::Add, {G, G}, {Y});         // compute: needs C1
  int L4 = B.instr(OpKind::Gelu, {U}, {Reused});      // covered by L3's wait
  int C5 = B.instr(OpKind::AllReduce, {U}, {H});      // WAR on H? no: H read
  StreamPlan Plan = planStreams(B.P);
  ASSERT_EQ(Plan.Steps.size(), 6u);
  EXPECT_EQ(Plan.Steps[C1].Stream, StreamKind::Comm);
  EXPECT_EQ(Plan.Steps[L2].Stream, StreamKind::Compute);
  EXPECT_EQ(Plan.Steps[C1].WaitFor, std::vector<int>{L0}) << "RAW on H";
  EXPECT_TRUE(Plan.Steps[L2].WaitFor.empty()) << "independent: overlaps";
  EXPECT_EQ(Plan.Steps[L3].WaitFor, std::vector<int>{C1}) << "RAW on G";
  EXPECT_TRUE(Plan.Steps[L4].WaitFor.empty())
      << "WAW on G's bytes, already ordered by L3's wait";
  // C5 reads U (written by L2, compute) and writes H, which C1 read on its
  // own stream and L0 wrote: one wait for the latest compute conflict.
  EXPECT_EQ(Plan.Steps[C5].WaitFor, std::vector<int>{L4 > L2 ? L2 : L4});
  EXPECT_TRUE(Plan.Steps[L0].RecordEvent);
  EXPECT_TRUE(Plan.Steps[C1].RecordEvent);
  EXPECT_EQ(checkOrdered(B.P, Plan), "");
}

TEST(StreamPlan, WriteAfterReadAcrossStreams) {
  ProgramBuilder B;
  int A = B.buffer(0, 8), G = B.buffer(8, 16), Y = B.buffer(24, 8);
  int C0 = B.instr(OpKind::AllGather, {A}, {G}); // comm reads A
  int L1 = B.instr(OpKind::Gelu, {Y}, {A});      // compute overwrites A
  StreamPlan Plan = planStreams(B.P);
  EXPECT_EQ(Plan.Steps[L1].WaitFor, std::vector<int>{C0})
      << "the gather must have read A before it is overwritten";
  EXPECT_EQ(checkOrdered(B.P, Plan), "");
}

TEST(StreamPlan, AdamWWritesItsInputs) {
  ProgramBuilder B;
  int P = B.buffer(0, 8), G = B.buffer(8, 8), M = B.buffer(16, 8),
      V = B.buffer(24, 8), N = B.buffer(32, 1), Lr = B.buffer(33, 1),
      St = B.buffer(34, 1), Out = B.buffer(40, 8);
  int C0 = B.instr(OpKind::AllGather, {P}, {Out});
  int A1 = B.instr(OpKind::AdamW, {P, G, M, V, N, Lr, St}, {});
  StreamPlan Plan = planStreams(B.P);
  EXPECT_EQ(Plan.Steps[A1].WaitFor, std::vector<int>{C0})
      << "adamw overwrites the parameter the gather reads";
}

TEST(StreamPlan, GatherParamWritesItsParameter) {
  // ZeRO: the update of this rank's chunk (compute), the in-place gather of
  // every chunk (communication), then a forward reading the parameter.
  ProgramBuilder B;
  int P = B.buffer(0, 8), G = B.buffer(8, 4), M = B.buffer(12, 4),
      V = B.buffer(16, 4), N = B.buffer(20, 1), Lr = B.buffer(21, 1),
      St = B.buffer(22, 1), X = B.buffer(24, 8), Y = B.buffer(32, 8);
  int A0 = B.instr(OpKind::AdamW, {P, G, M, V, N, Lr, St}, {});
  int C1 = B.instr(OpKind::GatherParam, {P}, {});
  int L2 = B.instr(OpKind::Add, {X, P}, {Y});
  StreamPlan Plan = planStreams(B.P);
  EXPECT_TRUE(isCommunication(OpKind::GatherParam));
  EXPECT_EQ(Plan.Steps[C1].Stream, StreamKind::Comm);
  EXPECT_EQ(Plan.Steps[C1].WaitFor, std::vector<int>{A0})
      << "the gather sends the chunk the update wrote";
  EXPECT_EQ(Plan.Steps[L2].WaitFor, std::vector<int>{C1})
      << "the forward reads what the gather wrote";
  EXPECT_EQ(checkOrdered(B.P, Plan), "");
}

TEST(StreamPlan, WithoutOverlapEverythingIsOneStream) {
  ProgramBuilder B;
  int X = B.buffer(0, 8), Y = B.buffer(8, 8);
  B.instr(OpKind::Gelu, {X}, {Y});
  B.instr(OpKind::AllReduce, {Y}, {X});
  StreamPlan Plan = planStreams(B.P, /*Overlap=*/false);
  for (const StreamStep &S : Plan.Steps) {
    EXPECT_EQ(S.Stream, StreamKind::Compute);
    EXPECT_TRUE(S.WaitFor.empty());
    EXPECT_FALSE(S.RecordEvent);
  }
}

/// Random programs with overlapping buffers: every conflict across streams
/// is ordered, and no instruction waits twice on one stream.
TEST(StreamPlan, RandomProgramsAreOrdered) {
  std::mt19937 Rng(11);
  const OpKind Ops[] = {OpKind::Gelu, OpKind::Add, OpKind::AllGather,
                        OpKind::ReduceScatter, OpKind::AllReduce,
                        OpKind::Send, OpKind::Linear};
  for (int Trial = 0; Trial < 200; ++Trial) {
    ProgramBuilder B;
    int NumBufs = 4 + Rng() % 12;
    for (int K = 0; K < NumBufs; ++K)
      B.buffer(Rng() % 64, 1 + Rng() % 16);
    int NumInstrs = 1 + Rng() % 40;
    for (int K = 0; K < NumInstrs; ++K) {
      Instruction I;
      I.Op = Ops[Rng() % std::size(Ops)];
      int NIn = Rng() % 3, NOut = Rng() % 2 + (I.Op == OpKind::Send ? 0 : 1);
      for (int E = 0; E < NIn; ++E)
        I.In.push_back(Rng() % NumBufs);
      for (int E = 0; E < NOut; ++E)
        I.Out.push_back(Rng() % NumBufs);
      B.P.Instrs.push_back(I);
    }
    StreamPlan Plan = planStreams(B.P);
    ASSERT_EQ(checkOrdered(B.P, Plan), "") << "trial " << Trial;
    for (const StreamStep &S : Plan.Steps)
      ASSERT_LE(S.WaitFor.size(), size_t(NumStreams - 1));
  }
}

//===----------------------------------------------------------------------===//
// Local rank and device
//===----------------------------------------------------------------------===//

struct FakeEnv {
  std::map<std::string, std::string> Vars;
  const char *operator()(const char *Name) const {
    auto It = Vars.find(Name);
    return It == Vars.end() ? nullptr : It->second.c_str();
  }
};

TEST(DeviceSelect, LauncherVariablesInOrder) {
  FakeEnv Env;
  auto None = cantFail(localRankFromEnvironment(std::ref(Env)));
  EXPECT_FALSE(None.has_value());
  Env.Vars["SLURM_LOCALID"] = "3";
  auto Slurm = cantFail(localRankFromEnvironment(std::ref(Env)));
  ASSERT_TRUE(Slurm.has_value());
  EXPECT_EQ(Slurm->Rank, 3);
  EXPECT_EQ(Slurm->Source, "SLURM_LOCALID");
  Env.Vars["OMPI_COMM_WORLD_LOCAL_RANK"] = "1";
  auto Ompi = cantFail(localRankFromEnvironment(std::ref(Env)));
  EXPECT_EQ(Ompi->Rank, 1) << "mpirun's variable wins over Slurm's";
  EXPECT_EQ(Ompi->Source, "OMPI_COMM_WORLD_LOCAL_RANK");
  FakeEnv Mpich;
  Mpich.Vars["MPI_LOCALRANKID"] = "2";
  EXPECT_EQ(cantFail(localRankFromEnvironment(std::ref(Mpich)))->Rank, 2);
}

TEST(DeviceSelect, MalformedVariableIsAnErrorNamingIt) {
  FakeEnv Env;
  Env.Vars["OMPI_COMM_WORLD_LOCAL_RANK"] = "zero";
  Env.Vars["SLURM_LOCALID"] = "0";
  auto R = localRankFromEnvironment(std::ref(Env));
  ASSERT_FALSE(bool(R));
  std::string Msg = toString(R.takeError());
  EXPECT_NE(Msg.find("OMPI_COMM_WORLD_LOCAL_RANK='zero'"), std::string::npos)
      << Msg;
  Env.Vars["OMPI_COMM_WORLD_LOCAL_RANK"] = "-1";
  EXPECT_FALSE(bool(localRankFromEnvironment(std::ref(Env))));
  consumeError(localRankFromEnvironment(std::ref(Env)).takeError());
}

TEST(DeviceSelect, LocalRankFromHostNames) {
  std::vector<std::string> Hosts = {"a", "b", "a", "a", "b"};
  EXPECT_EQ(localRankFromHosts(Hosts, 0), 0);
  EXPECT_EQ(localRankFromHosts(Hosts, 1), 0);
  EXPECT_EQ(localRankFromHosts(Hosts, 2), 1);
  EXPECT_EQ(localRankFromHosts(Hosts, 3), 2);
  EXPECT_EQ(localRankFromHosts(Hosts, 4), 1);
}

TEST(DeviceSelect, FallbackGathersHostNamesOverTheWorld) {
  FakeEnv Env; // no launcher variables
  std::vector<int> Local(4, -1);
  std::vector<std::string> Source(4);
  ASSERT_FALSE(bool(runOnThreadRanks(4, [&](Communicator &C) -> Error {
    auto L = findLocalRank(std::ref(Env), &C);
    if (!L)
      return L.takeError();
    Local[C.rank()] = L->Rank;
    Source[C.rank()] = L->Source;
    return Error::success();
  })));
  for (int R = 0; R < 4; ++R) {
    EXPECT_EQ(Local[R], R) << "one host: the local rank is the rank";
    EXPECT_EQ(Source[R], "host names");
  }
  EXPECT_EQ(cantFail(findLocalRank(std::ref(Env), nullptr)).Rank, 0);
}

TEST(DeviceSelect, DeviceOfALocalRank) {
  LocalRank L{1, "SLURM_LOCALID"};
  EXPECT_EQ(cantFail(chooseDevice(L, 2, std::nullopt)), 1);
  EXPECT_EQ(cantFail(chooseDevice(L, 2, 0)), 0) << "an explicit device wins";
  LocalRank Over{2, "OMPI_COMM_WORLD_LOCAL_RANK"};
  auto E = chooseDevice(Over, 2, std::nullopt);
  ASSERT_FALSE(bool(E));
  std::string Msg = toString(E.takeError());
  EXPECT_NE(Msg.find("local rank 2 (from OMPI_COMM_WORLD_LOCAL_RANK) has no "
                     "GPU"),
            std::string::npos)
      << Msg;
  EXPECT_NE(Msg.find("start at most 2 rank(s) per node"), std::string::npos);
  auto Bad = chooseDevice(L, 2, 5);
  ASSERT_FALSE(bool(Bad));
  EXPECT_NE(toString(Bad.takeError()).find("--device cuda:5"),
            std::string::npos);
  auto NoDev = chooseDevice(L, 0, std::nullopt);
  ASSERT_FALSE(bool(NoDev));
  EXPECT_NE(toString(NoDev.takeError()).find("no CUDA device is visible"),
            std::string::npos);
}

TEST(DeviceSelect, NoDeviceMessageIsOneActionableLine) {
  std::string M = noDeviceMessage("cudaErrorNoDevice: no CUDA-capable device "
                                  "is detected");
  EXPECT_EQ(M, "--device cuda: no CUDA device is visible (cudaGetDeviceCount: "
               "cudaErrorNoDevice: no CUDA-capable device is detected); run "
               "on a machine with an NVIDIA GPU or use --device cpu");
  EXPECT_EQ(M.find('\n'), std::string::npos);
}

/// On this machine: either a device is usable, or checkCudaDevice and
/// createCudaBackend fail with the one-line message (no crash without a
/// driver, and none in a build without CUDA).
TEST(DeviceSelect, NoDeviceErrorOnThisMachine) {
  Error E = checkCudaDevice();
  if (!E) {
    EXPECT_GT(cudaDeviceCount(), 0);
    GTEST_SKIP() << "a CUDA device is present: the no-device error is not "
                    "reachable here";
  }
  std::string Msg = toString(std::move(E));
  EXPECT_EQ(cudaDeviceCount(), 0);
  if (cudaBackendBuilt())
    EXPECT_EQ(Msg.rfind("--device cuda: no CUDA device is visible "
                        "(cudaGetDeviceCount: ",
                        0),
              0u)
        << Msg;
  else
    EXPECT_EQ(Msg.rfind("--device cuda: this sp was built without the CUDA "
                        "backend",
                        0),
              0u)
        << Msg;
  EXPECT_NE(Msg.find("use --device cpu"), std::string::npos);
  EXPECT_EQ(Msg.find('\n'), std::string::npos);
  auto B = createCudaBackend(CudaBackendOptions());
  ASSERT_FALSE(bool(B));
  EXPECT_EQ(toString(B.takeError()), Msg);
}

/// cuBLAS is not linked (its start-up costs half a second) but opened when
/// a backend is made: it must be found, without a GPU too.
TEST(DeviceSelect, CublasLoadsAtRunTime) {
  if (!cudaBackendBuilt())
    GTEST_SKIP() << "built without the CUDA backend";
  Error E = loadCudaLibraries();
  EXPECT_FALSE(bool(E)) << toString(std::move(E));
}

} // namespace

namespace {

/// The overlaps the plan states (lower/Overlap.h) are ones the streams run:
/// each collective is on the communication stream, its GEMM on the compute
/// stream, and the GEMM waits for no communication issued from the
/// collective on, so the two run at the same time. Megatron-Core's backward
/// pattern: with sequence parallelism the re-all-gather beside the dgrad
/// GEMM and the reduce-scatter of dX beside the wgrad GEMM, for every
/// column-parallel linear (QKV, fc1 and the LM head); without it, the
/// all-reduce of dX beside the wgrad GEMM.
TEST(StreamPlan, StatedOverlapsRunWithoutEvents) {
  struct Case {
    int Stages, Microbatches, TP;
    bool SP, Ring = false; // Ring: --tp-comm-overlap
  };
  for (Case C : {Case{1, 1, 2, true}, Case{1, 1, 2, false},
                 Case{2, 4, 2, true}, Case{1, 1, 2, true, true},
                 Case{2, 4, 2, true, true}}) {
    SCOPED_TRACE(::testing::Message()
                 << "t = " << C.TP << (C.SP ? " + SP" : "")
                 << ", p = " << C.Stages << (C.Ring ? ", ring" : ""));
    registerOnnxDataLoader();
    auto G = cantFail(importOnnx(SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx",
                                 ImportOptions()));
    PassContext Ctx;
    Ctx.TensorParallel = C.TP;
    Ctx.SequenceParallel = C.SP;
    Ctx.TpCommOverlap = C.Ring;
    Ctx.Pipeline.Stages = C.Stages;
    Ctx.Pipeline.Microbatches = C.Microbatches;
    Plan P = std::move(*cantFail(compileToPlan(*G, Ctx, CompileOptions())).P);
    int Layers = 2, ColumnLinears = 0; // the default model: 2 layers
    std::map<std::string, int> Pairs;  // "all_gather/linear" -> count
    for (int S = 0; S < P.numStages(); ++S) {
      // As the backend runs it: a compact program's steps written out.
      const Program Prog = cantFail(expandProgram(P.stage(S)));
      StreamPlan Plan = planStreams(Prog);
      EXPECT_EQ(checkOrdered(Prog, Plan), "");
      for (size_t K = 0; K < Prog.Instrs.size(); ++K) {
        const Instruction &I = Prog.Instrs[K];
        if (I.Beside < 0)
          continue;
        ASSERT_GT(I.Beside, int(K));
        const Instruction &Gemm = Prog.Instrs[I.Beside];
        ++Pairs[opName(I.Op).str() + "/" + opName(Gemm.Op).str()];
        // The backward's collectives; the forward's ring shifts.
        EXPECT_EQ(I.Ph, I.Op == OpKind::RingShift ? Phase::Forward
                                                  : Phase::Backward)
            << K;
        EXPECT_EQ(Plan.Steps[K].Stream, StreamKind::Comm) << K;
        EXPECT_EQ(Plan.Steps[I.Beside].Stream, StreamKind::Compute) << K;
        for (int W : Plan.Steps[I.Beside].WaitFor)
          EXPECT_LT(W, int(K)) << "instruction " << I.Beside << " ("
                               << Gemm.Name << ") waits for " << W
                               << ", issued with or after the collective "
                               << K << " beside it";
      }
    }
    // QKV and fc1 of every layer, on every microbatch, and the LM head.
    ColumnLinears = (2 * Layers + 1) * C.Microbatches;
    if (C.SP) {
      EXPECT_EQ(Pairs["all_gather/linear"], ColumnLinears);
      EXPECT_EQ(Pairs["reduce_scatter/linear_grad_w"], ColumnLinears);
      // The forward's all-gathers of the same linears, as t - 1 shifts.
      if (C.Ring) {
        EXPECT_EQ(Pairs["ring_shift/linear"], ColumnLinears * (C.TP - 1));
      }
      EXPECT_EQ(Pairs.size(), C.Ring ? 3u : 2u);
    } else {
      EXPECT_EQ(Pairs["all_reduce/linear_grad_w"], ColumnLinears);
      EXPECT_EQ(Pairs.size(), 1u);
    }
  }
}

//===----------------------------------------------------------------------===//
// Mixed precision
//===----------------------------------------------------------------------===//

std::vector<ProgramBuffer> typed(std::vector<TensorType> Types) {
  std::vector<ProgramBuffer> Bufs;
  for (TensorType &T : Types) {
    ProgramBuffer B;
    B.Name = "%"; // (appended: GCC 12's -Wrestrict misfires on "%" + ...)
    B.Name += std::to_string(Bufs.size());
    B.Type = T;
    B.Bytes = T.numBytes();
    B.Offset = int64_t(Bufs.size()) * 4096;
    Bufs.push_back(B);
  }
  return Bufs;
}

Instruction instr(OpKind Op, std::vector<int> In, std::vector<int> Out) {
  Instruction I;
  I.Op = Op;
  I.In.assign(In.begin(), In.end());
  I.Out.assign(Out.begin(), Out.end());
  return I;
}

TEST(MixedPlan, OnlyInstructionsWith16BitBuffersAreMixed) {
  auto Bufs = typed({TensorType(DType::F32, {4, 8}), TensorType(DType::F32, {8}),
                     TensorType(DType::BF16, {4, 8}), TensorType(DType::I64, {4})});
  EXPECT_FALSE(touches16Bit(instr(OpKind::Add, {0, 0}, {1}), Bufs));
  EXPECT_TRUE(touches16Bit(instr(OpKind::Cast, {0}, {2}), Bufs));
  EXPECT_TRUE(touches16Bit(instr(OpKind::Gelu, {2}, {0}), Bufs));
}

TEST(MixedPlan, MemoryBoundKernelsRead16BitInPlace) {
  auto Bufs = typed({TensorType(DType::BF16, {4, 8}), TensorType(DType::BF16, {8}),
                     TensorType(DType::F32, {4}), TensorType(DType::F32, {4, 8}),
                     TensorType(DType::F16, {4, 8}), TensorType(DType::BF16, {4})});
  EXPECT_TRUE(runsIn16Bit(instr(OpKind::Add, {0, 0}, {0}), Bufs));
  EXPECT_FALSE(runsIn16Bit(instr(OpKind::Add, {0, 1}, {0}), Bufs))
      << "a broadcast runs on copies";
  EXPECT_TRUE(runsIn16Bit(instr(OpKind::Dropout, {0}, {0}), Bufs));
  EXPECT_TRUE(runsIn16Bit(instr(OpKind::Softmax, {0}, {0}), Bufs));
  EXPECT_TRUE(runsIn16Bit(instr(OpKind::LayerNorm, {0, 1, 1}, {0, 2, 2}), Bufs));
  EXPECT_FALSE(runsIn16Bit(instr(OpKind::LayerNorm, {0, 1, 1}, {0, 5, 5}), Bufs))
      << "16-bit statistics";
  EXPECT_TRUE(
      runsIn16Bit(instr(OpKind::LayerNormGrad, {0, 0, 1, 2, 2}, {0, 3, 3}), Bufs));
  EXPECT_FALSE(
      runsIn16Bit(instr(OpKind::LayerNormGrad, {0, 0, 1, 5, 5}, {0, 3, 3}), Bufs));
  EXPECT_TRUE(runsIn16Bit(instr(OpKind::Cast, {3}, {0}), Bufs));
  EXPECT_TRUE(runsIn16Bit(instr(OpKind::Cast, {0}, {3}), Bufs));
  EXPECT_FALSE(runsIn16Bit(instr(OpKind::Cast, {0}, {4}), Bufs))
      << "bf16 to fp16 goes through float32";
  EXPECT_FALSE(runsIn16Bit(instr(OpKind::Add, {0, 3}, {0}), Bufs))
      << "bf16 + f32: one storage per kernel";
  EXPECT_FALSE(runsIn16Bit(instr(OpKind::Softmax, {4}, {0}), Bufs));
  EXPECT_FALSE(
      runsIn16Bit(instr(OpKind::LayerNormGrad, {0, 4, 1, 2, 2}, {0, 1, 1}), Bufs));
  EXPECT_FALSE(
      runsIn16Bit(instr(OpKind::LayerNormGrad, {0, 0, 1, 2, 2}, {0, 1, 1}), Bufs))
      << "bf16 parameter gradients";
  EXPECT_TRUE(runsIn16Bit(instr(OpKind::BiasGrad, {0}, {3}), Bufs));
  EXPECT_FALSE(runsIn16Bit(instr(OpKind::BiasGrad, {0}, {1}), Bufs));
  EXPECT_TRUE(runsIn16Bit(instr(OpKind::Linear, {0, 0}, {0}), Bufs))
      << "cuBLAS writes the 16-bit result";
  EXPECT_TRUE(runsIn16Bit(instr(OpKind::Linear, {0, 0, 1}, {0}), Bufs))
      << "a bias of the result's type is broadcast in place";
  EXPECT_FALSE(runsIn16Bit(instr(OpKind::Linear, {0, 0, 2}, {0}), Bufs))
      << "a float32 bias: copies";
  EXPECT_FALSE(runsIn16Bit(instr(OpKind::Linear, {0, 0}, {3}), Bufs))
      << "a float32 result: copies";
  EXPECT_FALSE(runsIn16Bit(instr(OpKind::Linear, {4, 4}, {0}), Bufs));
  EXPECT_TRUE(runsIn16Bit(instr(OpKind::BatchMatMul, {0, 0}, {0}), Bufs));
  Instruction Causal = instr(OpKind::BatchMatMul, {0, 0}, {0});
  Causal.Attrs.set("causal", int64_t(1));
  EXPECT_FALSE(runsIn16Bit(Causal, Bufs)) << "the causal mask is float32's";
  EXPECT_TRUE(runsIn16Bit(instr(OpKind::SplitHeads, {0}, {0, 0, 0}), Bufs));
  EXPECT_FALSE(runsIn16Bit(instr(OpKind::MergeHeads, {0}, {3}), Bufs));
  EXPECT_FALSE(runsIn16Bit(instr(OpKind::Rope, {0}, {0}), Bufs));
}

TEST(MixedPlan, A16BitLinearReadsItsOperandsInPlace) {
  // y[bf16] = linear(x[bf16], w[bf16], b[bf16]): x and w on the tensor
  // cores where they are; the bias widened, y rounded back.
  auto Bufs = typed({TensorType(DType::BF16, {33, 96}),
                     TensorType(DType::BF16, {40, 96}),
                     TensorType(DType::BF16, {40}),
                     TensorType(DType::BF16, {33, 40})});
  MixedPlan P = planMixed(instr(OpKind::Linear, {0, 1, 2}, {3}), Bufs, false);
  EXPECT_TRUE(P.Gemm16);
  ASSERT_EQ(P.Buffers.size(), 4u);
  EXPECT_EQ(P.Buffers[0].Offset, -1);
  EXPECT_EQ(P.Buffers[1].Offset, -1);
  EXPECT_FALSE(P.Buffers[0].Widen || P.Buffers[1].Widen);
  EXPECT_EQ(P.LocalProgram.Buffers[0].Type.Dtype, DType::BF16);
  EXPECT_EQ(P.Buffers[2].Offset, 0);
  EXPECT_TRUE(P.Buffers[2].Widen && !P.Buffers[2].Narrow);
  EXPECT_EQ(P.Buffers[3].Offset, 256) << "40 floats, 256-byte aligned";
  EXPECT_TRUE(!P.Buffers[3].Widen && P.Buffers[3].Narrow);
  EXPECT_EQ(P.LocalProgram.Buffers[3].Type, TensorType(DType::F32, {33, 40}));
  EXPECT_EQ(P.RegionBytes, 256 + 33 * 40 * 4 / 256 * 256 + 256);
  EXPECT_EQ(P.Local.In, (SmallVector<int, 4>{0, 1, 2}));
  EXPECT_EQ(P.Local.Out, (SmallVector<int, 2>{3}));
}

TEST(MixedPlan, OperandsOfTwoTypesAreBothWidened) {
  // A bf16 activation times an f32 weight, and an fp16 x bf16 pair: no
  // tensor-core GEMM of one type, so the 16-bit operands are copied.
  auto Bufs = typed({TensorType(DType::BF16, {4, 8}),
                     TensorType(DType::F32, {8, 8}),
                     TensorType(DType::F16, {8, 8}),
                     TensorType(DType::F32, {4, 8})});
  for (int W : {1, 2}) {
    MixedPlan P = planMixed(instr(OpKind::Linear, {0, W}, {3}), Bufs, false);
    EXPECT_FALSE(P.Gemm16);
    EXPECT_TRUE(P.Buffers[0].Widen);
    EXPECT_EQ(P.Buffers[1].Widen, W == 2);
    EXPECT_EQ(P.Buffers[2].Offset, -1) << "the f32 result stays in place";
  }
}

TEST(MixedPlan, ABufferUsedTwiceIsCopiedOnce) {
  // x * x, and an in-place accumulation (side effects: converted both ways).
  auto Bufs = typed({TensorType(DType::F16, {64}), TensorType(DType::F16, {64}),
                     TensorType(DType::F16, {64})});
  MixedPlan Sq = planMixed(instr(OpKind::Mul, {0, 0}, {1}), Bufs, false);
  ASSERT_EQ(Sq.Buffers.size(), 2u);
  EXPECT_EQ(Sq.Local.In, (SmallVector<int, 4>{0, 0}));
  EXPECT_EQ(Sq.RegionBytes, 512);
  bool SideEffects = opDef(OpKind::Accumulate).SideEffects;
  ASSERT_TRUE(SideEffects);
  MixedPlan Acc =
      planMixed(instr(OpKind::Accumulate, {2, 1}, {}), Bufs, SideEffects);
  for (const MixedBuffer &B : Acc.Buffers)
    EXPECT_TRUE(B.Widen && B.Narrow) << "buffer " << B.Id;
}

//===----------------------------------------------------------------------===//
// The fused attention core as unfused ops (AttentionPlan.h)
//===----------------------------------------------------------------------===//

TEST(AttentionPlan, CausalCoreMatchesTheFusedKernel) {
  AttentionCase().check();
}

TEST(AttentionPlan, GroupedMergedWithDropoutMatchesTheFusedKernel) {
  AttentionCase C;
  C.G = 2;
  C.Merged = true;
  C.Dropout = true;
  C.check();
}

TEST(AttentionPlan, PaddingInBothOrdersMatchesTheFusedKernel) {
  for (bool PadFirst : {false, true})
    for (bool Where : {false, true}) {
      SCOPED_TRACE(std::string(PadFirst ? "pad first" : "causal first") +
                   (Where ? ", where" : ", additive"));
      // Fills small enough that masked scores still count, so the two
      // orders give different probabilities (a padded, causally masked
      // score is the causal fill, or the fill plus the padding's).
      AttentionCase C;
      C.Pad = true;
      C.PadFirst = PadFirst;
      C.PadWhere = Where;
      C.Sq = 16;
      C.Dropout = true;
      C.Fill = -2;
      C.PadFill = Where ? -INFINITY : -3;
      C.check();
      // And the fills models use.
      C.Fill = PadFirst ? -INFINITY : -10000;
      C.PadFill = Where ? -INFINITY : -10000;
      C.check();
    }
}

TEST(AttentionPlan, PackedQkvMatchesTheFusedKernel) {
  // attention {packed}: split_heads into the workspace first, and
  // split_heads_grad of dq, dk, dv into dqkv last; with and without the
  // padding mask.
  for (bool Pad : {false, true}) {
    SCOPED_TRACE(Pad ? "padding" : "causal");
    AttentionCase C;
    C.Packed = C.Merged = C.Dropout = true;
    C.Pad = Pad;
    C.check();
    for (bool Forward : {true, false}) {
      std::vector<std::vector<double>> Fwd = {{}, {}};
      std::vector<int> Res;
      AttentionCase::Run R = C.make(Forward, DType::F32, &Fwd, Res);
      auto Plan = planAttention(R.P.Instrs[0], R.P.Buffers);
      ASSERT_TRUE(bool(Plan)) << toString(Plan.takeError());
      EXPECT_EQ(Forward ? Plan->Local.Instrs.front().Op
                        : Plan->Local.Instrs.back().Op,
                Forward ? OpKind::SplitHeads : OpKind::SplitHeadsGrad);
    }
  }
}

TEST(AttentionPlan, NonCausalUnequalLengths) {
  AttentionCase C;
  C.Causal = false;
  C.Sq = 9;
  C.Sk = 30;
  C.G = 1;
  C.check();
}

TEST(AttentionPlan, AcrossBlocksMatchesTheFusedKernel) {
  // The cases of CudaKernels.FusedAttentionAcrossBlocks, through the
  // expansion here: they hold within check()'s bound in another summation
  // order than the fused kernel's.
  for (const AttentionCase &C : acrossBlocksCases())
    C.check();
}

TEST(AttentionPlan, ExpansionIsDescribed) {
  // Forward, causal, 2 groups, merged: repeats, the scores, their mask,
  // the softmax, the output and its merge; the workspace holds the
  // repeated k and v, the scores and the unmerged output (dropout, when
  // on, works in place).
  AttentionCase C;
  C.G = 2;
  C.Merged = true;
  std::vector<int> Res;
  AttentionCase::Run R = C.make(true, DType::F32, nullptr, Res);
  auto Plan = planAttention(R.P.Instrs[0], R.P.Buffers);
  ASSERT_TRUE(bool(Plan)) << toString(Plan.takeError());
  std::vector<std::string> Ops;
  for (const Instruction &I : Plan->Local.Instrs)
    Ops.push_back(opName(I.Op).str());
  EXPECT_EQ(Ops, (std::vector<std::string>{
                     "repeat_heads", "repeat_heads", "batch_matmul", "scale",
                     "causal_mask", "softmax", "batch_matmul", "merge_heads"}));
  EXPECT_EQ(Plan->LseAfter, 4);
  EXPECT_TRUE(Plan->LseMerged);
  int64_t Score = C.B * C.A * C.Sq * C.Sk * 4, Heads = C.B * C.A * C.Sk * C.D * 4;
  EXPECT_EQ(Plan->WorkspaceBytes, 2 * Heads + Score + C.B * C.A * C.Sq * C.D * 4);
  AttentionCase Bad;
  Bad.G = 3;
  AttentionCase::Run RB = Bad.make(true, DType::F32, nullptr, Res);
  auto Refused = planAttention(RB.P.Instrs[0], RB.P.Buffers);
  EXPECT_FALSE(bool(Refused));
  consumeError(Refused.takeError());
}

} // namespace

//===----------------------------------------------------------------------===//
// The blockwise kernels' plan (AttentionPlan.h, planBlockwise)
//===----------------------------------------------------------------------===//

namespace {

/// The forward and backward instructions of C in dtype T, planned.
std::pair<AttentionCase::Run, AttentionCase::Run>
attentionRuns(const AttentionCase &C, DType T) {
  std::vector<int> Res;
  std::vector<std::vector<double>> Fwd = {
      std::vector<double>(C.B * C.Sq * C.A * C.D),
      std::vector<double>(C.B * C.Sq * C.A)};
  return {C.make(true, T, nullptr, Res), C.make(false, T, &Fwd, Res)};
}

TEST(BlockwiseAttention, PackedMergedLayoutsAreStrides) {
  // GPT's core: q, k, v read in place from qkv [b, s, 3, a, d]; o and lse
  // merged [b, s, a, d] and [b, s, a]; dqkv written in place.
  AttentionCase C;
  C.A = C.G = 3;
  C.D = 8;
  C.Packed = C.Merged = C.Dropout = C.Pad = true;
  auto [F, B] = attentionRuns(C, DType::F32);
  auto P = planBlockwise(F.P.Instrs[0], F.P.Buffers);
  ASSERT_TRUE(bool(P)) << toString(P.takeError());
  const int64_t H = C.A * C.D;
  EXPECT_TRUE(P->Forward);
  EXPECT_TRUE(P->Dropout);
  EXPECT_EQ(std::vector<int64_t>(P->G.Q, P->G.Q + 3),
            (std::vector<int64_t>{C.Sq * 3 * H, C.D, 3 * H}));
  EXPECT_EQ(std::vector<int64_t>(P->G.K, P->G.K + 3),
            (std::vector<int64_t>{C.Sq * 3 * H, C.D, 3 * H}));
  EXPECT_EQ(std::vector<int64_t>(P->G.O, P->G.O + 3),
            (std::vector<int64_t>{C.Sq * H, C.D, H}));
  EXPECT_EQ(std::vector<int64_t>(P->G.L, P->G.L + 3),
            (std::vector<int64_t>{C.Sq * C.A, 1, C.A}));
  const Instruction &I = F.P.Instrs[0];
  EXPECT_EQ(P->Q.Id, I.In[0]);
  EXPECT_EQ(P->K.Id, I.In[0]);
  EXPECT_EQ(P->V.Id, I.In[0]);
  EXPECT_EQ(P->K.Offset, H);
  EXPECT_EQ(P->V.Offset, 2 * H);
  EXPECT_EQ(P->Keep, I.In[1]);
  EXPECT_EQ(P->O.Id, I.Out[0]);
  EXPECT_EQ(P->Lse.Id, I.Out[1]);
  auto PB = planBlockwise(B.P.Instrs[0], B.P.Buffers);
  ASSERT_TRUE(bool(PB)) << toString(PB.takeError());
  const Instruction &IB = B.P.Instrs[0];
  EXPECT_FALSE(PB->Forward);
  EXPECT_EQ(PB->DO.Id, IB.In[0]);
  EXPECT_EQ(PB->Q.Id, IB.In[1]);
  EXPECT_EQ(PB->O.Id, IB.In[2]);
  EXPECT_EQ(PB->Lse.Id, IB.In[3]);
  EXPECT_EQ(PB->Keep, IB.In[4]);
  for (const BlockwiseOperand *Op : {&PB->DQ, &PB->DK, &PB->DV})
    EXPECT_EQ(Op->Id, IB.Out[0]);
  EXPECT_EQ(PB->DV.Offset, 2 * H);
}

TEST(BlockwiseAttention, GroupedHeadsAndTheRefusals) {
  AttentionCase C; // q [b, 4, s, d], k and v [b, 2, t, d]
  C.G = 2;
  C.Sk = 30;
  C.Causal = false;
  auto [F, B] = attentionRuns(C, DType::F32);
  auto P = planBlockwise(F.P.Instrs[0], F.P.Buffers);
  ASSERT_TRUE(bool(P)) << toString(P.takeError());
  EXPECT_EQ(P->G.KvHeads, 2);
  EXPECT_EQ(std::vector<int64_t>(P->G.Q, P->G.Q + 3),
            (std::vector<int64_t>{C.A * C.Sq * C.D, C.Sq * C.D, C.D}));
  EXPECT_EQ(std::vector<int64_t>(P->G.K, P->G.K + 3),
            (std::vector<int64_t>{2 * C.Sk * C.D, C.Sk * C.D, C.D}));
  EXPECT_EQ(std::vector<int64_t>(P->G.L, P->G.L + 3),
            (std::vector<int64_t>{C.A * C.Sq, C.Sq, 1}));
  EXPECT_FALSE(P->G.Causal);
  EXPECT_FLOAT_EQ(P->G.Scale, float(1 / std::sqrt(double(C.D))));
  EXPECT_EQ(P->Keep, -1);
  EXPECT_TRUE(runsBlockwise(B.P.Instrs[0], B.P.Buffers));
  // Heads above 128 run as the expansion.
  AttentionCase Large;
  Large.D = 160;
  auto [LF, LB] = attentionRuns(Large, DType::F32);
  EXPECT_FALSE(runsBlockwise(LF.P.Instrs[0], LF.P.Buffers));
  auto Refused = planBlockwise(LF.P.Instrs[0], LF.P.Buffers);
  ASSERT_FALSE(bool(Refused));
  EXPECT_NE(toString(Refused.takeError()).find("heads of 160"),
            std::string::npos);
  EXPECT_TRUE(bool(planAttention(LF.P.Instrs[0], LF.P.Buffers)));
  // A 16-bit core runs in place; mixed q and k types do not run blockwise.
  auto [HF, HB] = attentionRuns(C, DType::BF16);
  EXPECT_TRUE(runsBlockwise(HF.P.Instrs[0], HF.P.Buffers));
  EXPECT_TRUE(runsIn16Bit(HF.P.Instrs[0], HF.P.Buffers));
  EXPECT_TRUE(runsIn16Bit(HB.P.Instrs[0], HB.P.Buffers));
  HF.P.Buffers[HF.P.Instrs[0].In[1]].Type.Dtype = DType::F32;
  EXPECT_FALSE(runsBlockwise(HF.P.Instrs[0], HF.P.Buffers));
  EXPECT_FALSE(runsIn16Bit(HF.P.Instrs[0], HF.P.Buffers));
  // A log-sum-exp kept in float32 by a 16-bit plan is fine.
  HB.P.Buffers[HB.P.Instrs[0].In[5]].Type.Dtype = DType::F32;
  EXPECT_TRUE(runsBlockwise(HB.P.Instrs[0], HB.P.Buffers));
}

TEST(BlockwiseAttention, ProbabilitiesBlockOfTheWholeTensor) {
  // Heads split over two tensor ranks (rank 1), microbatch 1 of 2, data
  // replica 1 of 2: the probabilities are batch rows [3 b, 4 b) of 4 b,
  // heads [a, 2 a) of 2 a, as the dropout op finds them.
  AttentionCase C;
  C.Dropout = true;
  auto [F, B] = attentionRuns(C, DType::F32);
  Instruction &I = F.P.Instrs[0];
  I.Attrs.set("microbatch", int64_t(1));
  I.Attrs.set("microbatches", int64_t(2));
  Sharding &S = F.P.Buffers[I.In[0]].Shard;
  S.K = Sharding::Split;
  S.Dim = 1;
  S.Parts = 2;
  auto P = planBlockwise(I, F.P.Buffers);
  ASSERT_TRUE(bool(P)) << toString(P.takeError());
  AttentionGeometry G = P->G;
  ASSERT_FALSE(bool(probsBlock(I, F.P.Buffers, 1, 1, 2, G)));
  EXPECT_EQ(std::vector<int64_t>(G.ProbGlobal, G.ProbGlobal + 4),
            (std::vector<int64_t>{4 * C.B, 2 * C.A, C.Sq, C.Sk}));
  EXPECT_EQ(std::vector<int64_t>(G.ProbOffset, G.ProbOffset + 4),
            (std::vector<int64_t>{3 * C.B, C.A, 0, 0}));
  S.Dim = 2; // split along the rows: refused
  Error E = probsBlock(I, F.P.Buffers, 1, 0, 1, G);
  ASSERT_TRUE(bool(E));
  EXPECT_NE(toString(std::move(E)).find("other than its heads"),
            std::string::npos);
}

} // namespace
