//===- EndToEndTest.cpp - The default model on the CPU and on the GPU -----===//
//
// Compiles models/tiny/gpt-tiny.onnx (one device, t = 1) and trains it three
// steps on the same batch, seed and dropout keys three times: with the CUDA
// backend (through RunOptions::MakeBackend), with the CPU backend, and with
// the CPU backend on the plan widened to float64 (the reference). After each
// step the loss and every parameter's gradient are compared.
//
// Bound (the rule of the repository's layout tests): the GPU's difference
// from the float64 run must be at most 8 times the CPU's own float32
// difference from it, floored at 2^-24, normwise (max |x - ref| / max |ref|).
// The kernels other than the GEMMs are the CPU's bit for bit
// (tests/gpu/KernelTest.cpp); cuBLAS sums the GEMMs in another order, which
// moves the result by about as much as the CPU's own float32 rounding, and
// that difference grows through the layers as the CPU's does. On an H200
// the first step's gradients measured 0.5 to 1.7 times the CPU's error.
//
// Which steps' gradients are compared. AdamW's first update of an element
// is lr g / (|g| + eps): about lr sign(g) wherever |g| >> eps, whatever g's
// rounding; but an element whose gradient is zero up to rounding noise is
// moved by that noise, by up to lr either way. Two float32 runs that round
// differently therefore leave a few such elements apart after step 1 by
// far more than rounding. That barely moves the loss (dL/dp is about 0
// there) but moves every later gradient. Measured on an H200: after step 1
// the GPU's parameters were up to 1.4e-5 from the float64 run's (the CPU's
// 1.7e-6), its step-2 and step-3 gradients uniformly 8 to 10 times the
// CPU's error, its losses the CPU's to the last digit. So at the default
// eps = 1e-8 the test compares every step's loss and the first step's
// gradients; a second run at eps = 1e-3 (|du/dg| <= 1/eps, so rounding noise
// of 1e-10 moves an update by 1e-7 lr) compares every step's gradients: on
// the H200 its parameters were the CPU's within 1.2e-7 of float64 and the
// gradients' ratios at most 2.07. The parameters' largest difference from
// the float64 run after each step is printed.
//
// Skipped without a CUDA device.
//
//===----------------------------------------------------------------------===//
#include "frontend/OnnxImporter.h"
#include "driver/Compile.h"
#include "plan/Plan.h"
#include "runtime/Executor.h"
#include "runtime/comm/ProcessGrid.h"
#include "runtime/cuda/CudaBackend.h"
#include "CudaGrid.h"
#include "TrainCompare.h"
#include "gtest/gtest.h"
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>

using namespace sp;
using namespace llvm;

namespace {

/// An executor of P on the GPU (Cuda) or on the CPU; Blockwise: the GPU
/// runs the attention core with its blockwise kernels.
Expected<std::unique_ptr<Executor>> makeExecutor(
    const Plan &P, bool Cuda, bool Blockwise = false,
    cuda::Numerics Num = cuda::Numerics::Exact) {
  RunOptions O;
  O.AllowFloat64 = true;
  // The backend is made first, so that a failure is an error here; the
  // executor takes it through MakeBackend (as sp-run --device cuda would).
  std::unique_ptr<Backend> Made;
  if (Cuda) {
    CudaBackendOptions CO;
    CO.Numerics = Num; // Exact: the CPU's bits but the GEMMs'
    CO.BlockwiseAttention = Blockwise;
    auto B = createCudaBackend(CO);
    if (!B)
      return B.takeError();
    Made = std::move(*B);
    O.MakeBackend = [&] { return std::move(Made); };
  }
  return Executor::create(P, O);
}

Expected<Run> train(const Plan &P, bool Cuda, int Steps,
                    bool Blockwise = false,
                    cuda::Numerics Num = cuda::Numerics::Exact) {
  auto E = makeExecutor(P, Cuda, Blockwise, Num);
  if (!E)
    return E.takeError();
  return trainRun(**E, Steps);
}

/// P trained Steps steps on the GPU, on the CPU and on the CPU in float64,
/// compared by expectMatches.
void expectTrainsAsTheCpu(const Plan &P, int Steps, int GradSteps,
                          bool Blockwise = false,
                          cuda::Numerics Num = cuda::Numerics::Exact) {
  auto Gpu = train(P, /*Cuda=*/true, Steps, Blockwise, Num);
  ASSERT_TRUE(bool(Gpu)) << toString(Gpu.takeError());
  auto Cpu = train(P, /*Cuda=*/false, Steps);
  ASSERT_TRUE(bool(Cpu)) << toString(Cpu.takeError());
  auto Ref = train(widenToFloat64(P), /*Cuda=*/false, Steps);
  ASSERT_TRUE(bool(Ref)) << toString(Ref.takeError());
  expectMatches(*Gpu, *Cpu, *Ref, GradSteps);
}

TEST(CudaEndToEnd, DefaultModelMatchesTheCpuBackend) {
  if (Error E = checkCudaDevice())
    GTEST_SKIP() << "no CUDA device is present, skipping the GPU end-to-end "
                    "test: "
                 << toString(std::move(E));
  const int Steps = 3;
  for (double Eps : {OptimizerOptions().Eps, StableEps}) {
    SCOPED_TRACE("AdamW eps " + std::to_string(Eps));
    std::printf("AdamW eps %g\n", Eps);
    expectTrainsAsTheCpu(compileTiny(1, false, 1, 1, 1, 0, Eps), Steps,
                         Eps == StableEps ? Steps : 1);
  }
}

/// The default plan of sp-compile, with the fused attention core: the CUDA
/// backend runs attention and attention_grad as their unfused ops
/// (AttentionPlan.h), or with its blockwise kernels (kernels/Attention.cuh),
/// so its results are the fused CPU kernel's up to the order of the float
/// additions. Dropout on: both draw the same masks.
TEST(CudaEndToEnd, FusedAttentionPlanMatchesTheCpuBackend) {
  if (Error E = checkCudaDevice())
    GTEST_SKIP() << "no CUDA device is present, skipping the GPU end-to-end "
                    "test: "
                 << toString(std::move(E));
  Plan P = compileTiny(1, false, 1, 1, 1, 0, StableEps, DType::F32,
                       /*Fused=*/true);
  ASSERT_TRUE(llvm::any_of(P.Prog.Instrs, [](const Instruction &I) {
    return I.Op == OpKind::Attention;
  }));
  for (bool Blockwise : {false, true}) {
    SCOPED_TRACE(Blockwise ? "blockwise" : "unfused ops");
    expectTrainsAsTheCpu(P, /*Steps=*/3, /*GradSteps=*/3, Blockwise);
  }
}

/// The fast kernels (--cuda-numerics fast, the default): float32 sums in
/// the GPU's order instead of the CPU's double ones, so the same check as
/// the blockwise kernels' reordered sums: every loss, gradient and update
/// as close to the float64 run as the CPU's float32 run is (expectMatches'
/// error ratios), unfused and fused core.
TEST(CudaEndToEnd, FastNumericsTrainAsTheCpu) {
  if (Error E = checkCudaDevice())
    GTEST_SKIP() << "no CUDA device is present, skipping the GPU end-to-end "
                    "test: "
                 << toString(std::move(E));
  for (bool Fused : {false, true}) {
    SCOPED_TRACE(Fused ? "fused core, blockwise" : "unfused core");
    Plan P = compileTiny(1, false, 1, 1, 1, 0, StableEps, DType::F32, Fused);
    expectTrainsAsTheCpu(P, /*Steps=*/3, /*GradSteps=*/3, /*Blockwise=*/Fused,
                         cuda::Numerics::Fast);
  }
}

/// The losses of Steps training steps on one batch (as train's).
Expected<std::vector<double>> trainLosses(
    const Plan &P, bool Cuda, int Steps, bool Blockwise = false,
    cuda::Numerics Num = cuda::Numerics::Exact) {
  auto E = makeExecutor(P, Cuda, Blockwise, Num);
  if (!E)
    return E.takeError();
  TokenBatch Data = oneBatch(**E);
  std::vector<double> Losses;
  for (int S = 1; S <= Steps; ++S) {
    auto L = (*E)->trainStep(Data, 1e-3, S);
    if (!L)
      return L.takeError();
    Losses.push_back(*L);
  }
  return Losses;
}

/// bf16 and fp16 plans (16-bit activations and parameter copies, float32
/// masters; fp16 with dynamic loss scaling) on the GPU against the same
/// plan on the CPU, by the band of tests/lit/tools/Inputs/precision_band.py
/// with u the format's unit roundoff (bf16 2^-8, fp16 2^-11): step 1
/// within u L, each window of 20 steps' mean within 4u. The two differ only
/// in the GEMMs' summation order (the other kernels are the CPU's bits,
/// MixedPrecisionIsTheCpusBits), far less than the 16-bit rounding the band
/// allows for; with the fast kernels also in their float32 sums, which
/// are far inside it too. The fused plan's attention core runs blockwise
/// in 16 bits.
TEST(CudaEndToEnd, MixedPrecisionTracksTheCpu) {
  SP_SKIP_IF_QUICK();
  if (Error E = checkCudaDevice())
    GTEST_SKIP() << "no CUDA device is present, skipping the GPU "
                    "mixed-precision test: "
                 << toString(std::move(E));
  const int Steps = 40, Window = 20;
  for (auto [T, U] :
       {std::pair<DType, double>{DType::BF16, 0x1p-8}, {DType::F16, 0x1p-11}})
    for (bool Fused : {false, true}) {
      SCOPED_TRACE(dtypeName(T).str() + (Fused ? ", fused, blockwise" : ""));
      Plan P =
          compileTiny(1, false, 1, 1, 1, 0, OptimizerOptions().Eps, T, Fused);
      auto Cpu = trainLosses(P, /*Cuda=*/false, Steps);
      ASSERT_TRUE(bool(Cpu)) << toString(Cpu.takeError());
      // The fast kernels in bf16 (fp16's arithmetic in them is the same
      // float32; one format keeps the emulated run's time).
      for (cuda::Numerics Num : {cuda::Numerics::Exact, cuda::Numerics::Fast}) {
        if (Num == cuda::Numerics::Fast && T != DType::BF16)
          continue;
        auto Gpu = trainLosses(P, /*Cuda=*/true, Steps, /*Blockwise=*/Fused,
                               Num);
        ASSERT_TRUE(bool(Gpu)) << toString(Gpu.takeError());
        expectLossesWithinBand(
            *Gpu, *Cpu, U, Window,
            dtypeName(T).str() + (Fused ? " fused" : "") +
                (Num == cuda::Numerics::Fast ? " fast" : ""));
      }
    }
}

/// A traced step on the GPU is timed on the device: one event per
/// instruction, in order, each on the stream the stream plan gives it
/// (everything on the compute stream at t = 1 but nothing overlapping), and
/// the training is the untraced run's bit for bit.
TEST(CudaEndToEnd, TracedStepIsTimedOnTheDevice) {
  if (Error E = checkCudaDevice())
    GTEST_SKIP() << "no CUDA device is present, skipping the GPU trace test: "
                 << toString(std::move(E));
  Plan P = compileTiny();
  std::vector<double> Losses[2];
  for (bool Trace : {false, true}) {
    auto B = createCudaBackend(CudaBackendOptions());
    ASSERT_TRUE(bool(B)) << toString(B.takeError());
    auto Held = std::make_shared<std::unique_ptr<Backend>>(std::move(*B));
    RunOptions O;
    O.Trace = Trace;
    O.MakeBackend = [Held] { return std::move(*Held); };
    auto E = Executor::create(P, O);
    ASSERT_TRUE(bool(E)) << toString(E.takeError());
    std::mt19937 Rng(3);
    TokenBatch Data;
    for (int64_t I = 0; I < (*E)->batch() * (*E)->seq(); ++I) {
      Data.Tokens.push_back(Rng() % (*E)->vocab());
      Data.Targets.push_back(Rng() % (*E)->vocab());
    }
    for (int S = 1; S <= 2; ++S) {
      auto L = (*E)->trainStep(Data, 1e-3, S);
      ASSERT_TRUE(bool(L)) << toString(L.takeError());
      Losses[Trace].push_back(*L);
    }
    if (!Trace)
      continue;
    size_t N = P.Prog.Instrs.size();
    ASSERT_EQ((*E)->trace().size(), 2 * N);
    for (size_t K = 0; K < 2 * N; ++K) {
      const TraceEvent &T = (*E)->trace()[K];
      EXPECT_EQ(T.Instruction, int(K % N));
      EXPECT_EQ(T.Stream, 0);
      EXPECT_GE(T.DurationUs, 0.0);
      if (K % N) {
        EXPECT_GE(T.StartUs, (*E)->trace()[K - 1].StartUs)
            << "one stream runs in order";
      }
    }
  }
  EXPECT_EQ(Losses[0], Losses[1]);
}

/// P on a DP x PP x TP grid of thread ranks, on GPUs (one each) when Cuda.
Expected<Run> trainGrid(const Plan &P, int TP, int PP, bool Cuda, int Steps,
                        int DP = 1) {
  return trainOnGrid(P, TP, PP, DP, Cuda ? cudaGridBackend() : GridBackend(),
                     Steps);
}

/// t = 2 with sequence parallelism, p = 2 (1F1B, 2 microbatches) and d = 2
/// with ZeRO-1 (flat reduce-scatters, chunk updates, in-place gathers): the
/// NCCL collectives, the buffered pipeline sends and the two streams, on
/// two GPUs, against the same plan on CPU thread ranks and in float64, by
/// the rule of DefaultModelMatchesTheCpuBackend.
TEST(CudaEndToEnd, TensorAndPipelineParallelMatchTheCpu) {
  if (Error E = checkCudaDevice())
    GTEST_SKIP() << "no CUDA device is present, skipping the multi-GPU "
                    "end-to-end test: "
                 << toString(std::move(E));
  if (cudaDeviceCount() < 2)
    GTEST_SKIP() << "only " << cudaDeviceCount()
                 << " CUDA device is visible; t = 2 and p = 2 need 2";
  struct Layout {
    const char *Name;
    int TP;
    bool SP;
    int PP, Microbatches, DP = 1, Zero = 0;
  };
  for (Layout L : {Layout{"t = 2 + SP", 2, true, 1, 1},
                   Layout{"p = 2, 1F1B, 2 microbatches", 1, false, 2, 2},
                   Layout{"d = 2, ZeRO-1", 1, false, 1, 1, 2, 1}}) {
    SCOPED_TRACE(L.Name);
    Plan P = compileTiny(L.TP, L.SP, L.PP, L.Microbatches, L.DP, L.Zero,
                         StableEps);
    const int Steps = 2;
    auto Gpu = trainGrid(P, L.TP, L.PP, true, Steps, L.DP);
    ASSERT_TRUE(bool(Gpu)) << toString(Gpu.takeError());
    auto Cpu = trainGrid(P, L.TP, L.PP, false, Steps, L.DP);
    ASSERT_TRUE(bool(Cpu)) << toString(Cpu.takeError());
    auto Ref = trainGrid(widenToFloat64(P), L.TP, L.PP, false, Steps, L.DP);
    ASSERT_TRUE(bool(Ref)) << toString(Ref.takeError());
    expectMatches(*Gpu, *Cpu, *Ref, Steps);
  }
}

} // namespace
