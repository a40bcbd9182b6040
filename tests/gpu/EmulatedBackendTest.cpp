//===- EmulatedBackendTest.cpp - The CUDA backend on emulated devices -----===//
//
// Tests that only the emulated runtime (EmulatedRuntime.h) can run, on up to
// eight emulated GPUs, each against the same plan on CPU thread ranks and in
// float64 by the rule of EndToEndTest.cpp (expectMatches):
//   - the layouts of EndToEndTest.cpp's multi-GPU test, the forward's
//     all-gather cut into a ring beside its GEMMs (--tp-comm-overlap: NCCL
//     send/recv groups on the communication stream) and the 2 x 2 x 2 grid,
//     with each of a device's two streams in turn running late, so that a
//     read across the streams without the event the stream plan owes it
//     reads stale or unwritten data;
//   - the other schedules (interleaved, ZB-H1), both recomputations and the
//     fused attention core (as unfused ops and by the blockwise kernels) on
//     grids, on an 8-layer GPT that check_emulated_grids.sh exports;
//   - the exported GPT-2, Llama (grouped-query heads, padding mask) and
//     BERT models' fused plans on t = 2 + SP, p = 2 and cp = 2 grids;
//   - context parallelism: the ring and the all-to-all at cp 2 and 4, and
//     with t 2 + SP, p 2, d 2 and ZeRO-1, and in bf16;
//   - bf16 and fp16 grids against the CPU's losses within the format's band;
//   - linear biases in cuBLASLt's epilogue (--cuda-epilogues), float32 by
//     the rule above and bf16 within its band.
//
//===----------------------------------------------------------------------===//
#include "emulator/EmulatedRuntime.h"
#include "CudaGrid.h"
#include "runtime/comm/ProcessGrid.h"
#include "runtime/cuda/CudaBackend.h"
#include "gtest/gtest.h"

using namespace sp;
using namespace llvm;

namespace {

/// The layouts here compile with AdamW's eps at which one step's rounding
/// cannot flip a later update, so that every step's gradients compare
/// (EndToEndTest.cpp).
Expected<Plan> compile(StringRef Path, GridLayout L) {
  L.AdamEps = StableEps;
  return compileLayout(Path, L);
}

Expected<Run> trainGrid(const Plan &P, const GridLayout &L, bool Cuda,
                        int Steps) {
  return trainOnGrid(P, L.TP, L.PP, L.DP,
                     Cuda ? cudaGridBackend(L.Blockwise, L.Epilogues)
                          : GridBackend(),
                     Steps, L.CP);
}

void expectGridMatches(StringRef Path, const GridLayout &L) {
  auto P = compile(Path, L);
  ASSERT_TRUE(bool(P)) << toString(P.takeError());
  const int Steps = 2;
  auto Gpu = trainGrid(*P, L, true, Steps);
  ASSERT_TRUE(bool(Gpu)) << toString(Gpu.takeError());
  auto Cpu = trainGrid(*P, L, false, Steps);
  ASSERT_TRUE(bool(Cpu)) << toString(Cpu.takeError());
  auto Ref = trainGrid(widenToFloat64(*P), L, false, Steps);
  ASSERT_TRUE(bool(Ref)) << toString(Ref.takeError());
  expectMatches(*Gpu, *Cpu, *Ref, Steps);
}

/// A fused plan with --cp CP --cp-comm Comm, on the other axes given.
GridLayout contextLayout(const char *Name, int CP, const char *Comm, int TP = 1,
                         int PP = 1, int DP = 1) {
  GridLayout L{Name, TP, TP > 1, PP, PP, DP, DP > 1 ? 1 : 0};
  L.CP = CP;
  L.CpComm = Comm;
  L.Fused = true;
  return L;
}

/// L with the all-to-all inside pairs of cp ranks (--cp-a2a 2).
GridLayout hierarchical(GridLayout L) {
  L.CpA2a = 2;
  return L;
}

/// Every layout with the compute stream (ordinal 0), then the
/// communication stream (1), running each piece of its work 300 us late.
TEST(EmulatedCuda, GridsMatchTheCpuWithEitherStreamLate) {
  SP_SKIP_IF_QUICK();
  const GridLayout Layouts[] = {
      {"t = 2 + SP", 2, true},
      {"t = 2 + SP, ring all-gathers", 2, true, 1, 1, 1, 0, true},
      {"p = 2, 1F1B, 2 microbatches", 1, false, 2, 2},
      {"d = 2, ZeRO-1", 1, false, 1, 1, 2, 1},
      {"2 x 2 x 2: t = 2 + SP, p = 2, d = 2", 2, true, 2, 2, 2}};
  for (int Late : {-1, 0, 1}) {
    SCOPED_TRACE(Late < 0    ? "no stream late"
                 : Late == 0 ? "compute stream late"
                             : "communication stream late");
    sp::emu::setStreamDelay(Late, Late < 0 ? 0 : 300);
    for (const GridLayout &L : Layouts) {
      SCOPED_TRACE(L.Name);
      expectGridMatches(TinyModel, L);
    }
  }
  sp::emu::setStreamDelay(-1, 0);
}

/// A rank whose peer never comes (here: it made its backend, then
/// returned) fails with an error naming the wait, within --comm-timeout,
/// instead of waiting in an NCCL collective or receive forever: its waits
/// for the device give up and abort NCCL; then its backend ends, with
/// sends in flight to the dead peer on the pipeline.
TEST(EmulatedCuda, ADeadPeerFailsTheRankInsteadOfHangingIt) {
  for (bool Pipeline : {false, true}) {
    SCOPED_TRACE(Pipeline ? "p = 2, 1F1B" : "t = 2 + SP");
    Plan P = Pipeline ? compileTiny(1, false, 2, 2) : compileTiny(2, true);
    std::mutex M;
    std::string Failure;
    Error E = runOnThreadRanks(2, [&](Communicator &World) -> Error {
      World.setTimeout(std::chrono::milliseconds(1000));
      ProcessGrid Grid;
      (Pipeline ? Grid.Pipeline : Grid.Tensor) = 2;
      auto Groups = splitGroups(World, Grid);
      if (!Groups)
        return Groups.takeError();
      RunOptions O;
      O.Comm = Groups->Tensor.get();
      O.PipeComm = Pipeline ? Groups->Pipeline.get() : nullptr;
      auto B = cudaBackendOf(World, O);
      if (!B)
        return B.takeError();
      if (World.rank() == 1)
        return Error::success(); // dead: it never trains
      auto Held = std::make_shared<std::unique_ptr<Backend>>(std::move(*B));
      O.MakeBackend = [Held] { return std::move(*Held); };
      auto Ex = Executor::create(P, O);
      if (!Ex)
        return Ex.takeError();
      auto L = (*Ex)->trainStep(oneBatch(**Ex), 1e-3, 1);
      if (L)
        return createStringError(inconvertibleErrorCode(),
                                 "trained a step without its peer");
      std::lock_guard<std::mutex> Lock(M);
      Failure = toString(L.takeError());
      return Error::success(); // and its backend ends, sends in flight
    });
    ASSERT_FALSE(bool(E)) << toString(std::move(E));
    std::printf("rank 0: %s\n", Failure.c_str());
    EXPECT_NE(Failure.find("timed out after 1.0 s waiting for the "),
              std::string::npos)
        << Failure;
    EXPECT_NE(Failure.find("NCCL aborted (raise the wait with --comm-timeout)"),
              std::string::npos)
        << Failure;
  }
}

TEST(EmulatedCuda, SchedulesRecomputationAndAttentionOnGrids) {
  auto Paths = modelsFromEnv("SP_EMULATED_GPT");
  if (Paths.empty())
    GTEST_SKIP() << "SP_EMULATED_GPT is not set: check_emulated_grids.sh "
                    "exports the 8-layer GPT this test trains";
  GridLayout Layouts[] = {
      {"p = 2 x 2 chunks, interleaved, 4 microbatches", 1, false, 2, 4},
      {"p = 4 x 2 chunks, interleaved, 8 microbatches", 1, false, 4, 8},
      {"p = 2, ZB-H1, 4 microbatches", 1, false, 2, 4},
      {"p = 4, 1F1B, 8 microbatches", 1, false, 4, 8},
      {"p = 4, ZB-H1, 8 microbatches", 1, false, 4, 8},
      {"t = 2 + SP, p = 2, selective recompute", 2, true, 2, 2},
      {"t = 2 + SP, full recompute", 2, true},
      {"t = 2 + SP, fused attention as unfused ops", 2, true},
      {"t = 2 + SP, p = 2, fused attention, blockwise", 2, true, 2, 2}};
  for (int K : {0, 1}) {
    Layouts[K].Schedule = PipelineSchedule::Interleaved;
    Layouts[K].Interleave = 2;
  }
  Layouts[2].Schedule = Layouts[4].Schedule = PipelineSchedule::ZeroBubbleH1;
  Layouts[5].Recompute = RecomputeMode::Selective;
  Layouts[6].Recompute = RecomputeMode::Full;
  Layouts[7].Fused = true;
  Layouts[8].Fused = Layouts[8].Blockwise = true;
  for (const GridLayout &L : Layouts) {
    SCOPED_TRACE(L.Name);
    expectGridMatches(Paths[0], L);
  }
}

TEST(EmulatedCuda, ExportedFamiliesOnGrids) {
  auto Paths = modelsFromEnv("SP_EMULATED_FAMILIES");
  if (Paths.empty())
    GTEST_SKIP() << "SP_EMULATED_FAMILIES is not set: check_emulated_grids.sh "
                    "exports the GPT-2, Llama and BERT models this test trains";
  GridLayout Layouts[] = {
      {"t = 2 + SP, fused attention, blockwise", 2, true},
      {"p = 2, fused attention as unfused ops", 1, false, 2, 2},
      contextLayout("cp 2, ring", 2, "ring"),
      contextLayout("cp 2, all-to-all", 2, "a2a")};
  Layouts[0].Fused = Layouts[0].Blockwise = true;
  Layouts[1].Fused = true;
  for (const std::string &Path : Paths)
    for (const GridLayout &L : Layouts) {
      SCOPED_TRACE(Path + ": " + L.Name);
      expectGridMatches(Path, L);
    }
}

/// Context parallelism (--cp; runtime/cuda/ContextAttention.cpp): the ring,
/// the all-to-all and the all-to-all + ring over NCCL on the blockwise
/// kernels, cp 2 and 4 and with the other axes, by expectMatches; the dropout's
/// draws (the core's and the residual ones, across the zigzag seam) are keyed
/// by global positions, so they are the CPU ranks'.
TEST(EmulatedCuda, ContextParallelGridsMatchTheCpu) {
  const GridLayout Layouts[] = {
      contextLayout("cp 2, ring", 2, "ring"),
      contextLayout("cp 4, ring", 4, "ring"),
      contextLayout("cp 2, all-to-all", 2, "a2a"),
      contextLayout("cp 4, all-to-all", 4, "a2a"),
      contextLayout("cp 2 x t 2 + SP, ring", 2, "ring", 2),
      contextLayout("cp 2 x p 2, ring", 2, "ring", 1, 2),
      contextLayout("cp 2 x d 2, ZeRO-1, all-to-all", 2, "a2a", 1, 1, 2),
      hierarchical(
          contextLayout("cp 4, all-to-all in pairs + ring", 4, "a2a+ring"))};
  for (const GridLayout &L : Layouts) {
    SCOPED_TRACE(L.Name);
    expectGridMatches(TinyModel, L);
  }
  // A bf16 ring within the format's band of the CPU ranks' losses.
  GridLayout B = contextLayout("bf16, cp 2, ring", 2, "ring");
  B.Activations = DType::BF16;
  const int Steps = 10;
  auto P = compile(TinyModel, B);
  ASSERT_TRUE(bool(P)) << toString(P.takeError());
  auto Gpu = trainGrid(*P, B, true, Steps);
  ASSERT_TRUE(bool(Gpu)) << toString(Gpu.takeError());
  auto Cpu = trainGrid(*P, B, false, Steps);
  ASSERT_TRUE(bool(Cpu)) << toString(Cpu.takeError());
  expectLossesWithinBand(Gpu->Losses, Cpu->Losses, 0x1p-8, Steps,
                         "bf16 cp grid");
}

/// bf16 and fp16 grids (16-bit activations and parameter copies, float32
/// masters; fp16 with loss scaling) against the same plan on CPU thread
/// ranks, by EndToEndTest.cpp's MixedPrecisionTracksTheCpu band: step 1
/// within u L, the mean of the 10 steps within 4u (u: the format's unit
/// roundoff).
TEST(EmulatedCuda, MixedPrecisionGridsTrackTheCpu) {
  SP_SKIP_IF_QUICK();
  const int Steps = 10;
  for (auto [T, U] :
       {std::pair<DType, double>{DType::BF16, 0x1p-8}, {DType::F16, 0x1p-11}}) {
    GridLayout L{"t = 2 + SP, p = 2, fused attention, blockwise", 2, true, 2,
                 2};
    L.Fused = L.Blockwise = true;
    L.Activations = T;
    SCOPED_TRACE(dtypeName(T).str() + ", " + L.Name);
    auto P = compile(TinyModel, L);
    ASSERT_TRUE(bool(P)) << toString(P.takeError());
    auto Gpu = trainGrid(*P, L, true, Steps);
    ASSERT_TRUE(bool(Gpu)) << toString(Gpu.takeError());
    auto Cpu = trainGrid(*P, L, false, Steps);
    ASSERT_TRUE(bool(Cpu)) << toString(Cpu.takeError());
    ASSERT_EQ(Gpu->Losses.size(), size_t(Steps));
    expectLossesWithinBand(Gpu->Losses, Cpu->Losses, U, Steps,
                           dtypeName(T).str() + " grid");
  }
}

/// --cuda-epilogues: every linear with a bias one cublasLtMatmul with the
/// bias epilogue (the emulation's count of them shows they ran, and that
/// none was refused for its pointers' alignment), a float32
/// t = 2 + SP grid and GPT-2's exported plan by expectMatches, and a bf16
/// grid within its band of the CPU's losses.
TEST(EmulatedCuda, LinearBiasesInTheEpilogueTrackTheCpu) {
  GridLayout L{"t = 2 + SP, biases in the epilogue", 2, true};
  L.Epilogues = true;
  int64_t Before = sp::emu::ltMatmuls();
  expectGridMatches(TinyModel, L);
  EXPECT_GT(sp::emu::ltMatmuls(), Before) << "no cublasLtMatmul ran";
  EXPECT_EQ(sp::emu::ltRefused(), 0)
      << "the heuristic was told other alignments than the arena's";
  auto Paths = modelsFromEnv("SP_EMULATED_FAMILIES");
  if (!Paths.empty()) { // GPT-2: Conv1D's addmm, its bias, the tanh GELU
    GridLayout G{"GPT-2, p = 2, biases in the epilogue", 1, false, 2, 2};
    G.Fused = G.Epilogues = true;
    SCOPED_TRACE(Paths[0] + ": " + G.Name);
    expectGridMatches(Paths[0], G);
  }
  const int Steps = 10;
  GridLayout B{"bf16, t = 2 + SP, p = 2, biases in the epilogue", 2, true, 2,
               2};
  B.Epilogues = true;
  B.Activations = DType::BF16;
  auto P = compile(TinyModel, B);
  ASSERT_TRUE(bool(P)) << toString(P.takeError());
  Before = sp::emu::ltMatmuls();
  auto Gpu = trainGrid(*P, B, true, Steps);
  ASSERT_TRUE(bool(Gpu)) << toString(Gpu.takeError());
  EXPECT_GT(sp::emu::ltMatmuls(), Before) << "no bf16 cublasLtMatmul ran";
  auto Cpu = trainGrid(*P, B, false, Steps);
  ASSERT_TRUE(bool(Cpu)) << toString(Cpu.takeError());
  expectLossesWithinBand(Gpu->Losses, Cpu->Losses, 0x1p-8, Steps, "bf16 grid");
}

} // namespace
