//===- TrainCompare.h - A few training steps against the CPU's -*- C++ -*-===//
//
// Trains a plan a few steps on one batch and compares another run's losses
// and gradients with the CPU backend's, by the repository's layout rule:
// the other run's difference from the float64 run at most 8 times the CPU's
// own float32 difference from it (EndToEndTest.cpp says why, and which
// steps' gradients that holds for).
//
//===----------------------------------------------------------------------===//
#ifndef SP_TESTS_GPU_TRAINCOMPARE_H
#define SP_TESTS_GPU_TRAINCOMPARE_H

#include "frontend/OnnxImporter.h"
#include "driver/Compile.h"
#include "plan/Plan.h"
#include "runtime/Executor.h"
#include "runtime/comm/ProcessGrid.h"
#include "gtest/gtest.h"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace sp {

/// True under SP_QUICK=1 (tools/dev.sh test): the slowest tests (half a
/// minute or more on 2 cores) skip themselves; tools/dev.sh check and a
/// plain ctest run them.
inline bool quickRun() {
  const char *Q = std::getenv("SP_QUICK");
  return Q && Q[0] == '1' && Q[1] == 0;
}
#define SP_SKIP_IF_QUICK()                                                     \
  if (::sp::quickRun())                                                        \
  GTEST_SKIP() << "slow: tools/dev.sh check runs it (SP_QUICK=1 skips it)"

struct Run {
  std::vector<double> Losses;
  /// Per step, every parameter's gradient in float64.
  std::vector<std::map<std::string, std::vector<double>>> Grads;
  /// Per step, every parameter after the update, in float64.
  std::vector<std::map<std::string, std::vector<double>>> Params;
};

/// The one batch every step trains on: seeded random tokens and targets.
inline TokenBatch oneBatch(const Executor &E) {
  std::mt19937 Rng(7);
  TokenBatch Data;
  for (int64_t I = 0; I < E.batch() * E.seq(); ++I) {
    Data.Tokens.push_back(Rng() % E.vocab());
    Data.Targets.push_back(Rng() % E.vocab());
  }
  return Data;
}

/// Steps training steps of E on oneBatch: losses, gradients and parameters.
inline llvm::Expected<Run> trainRun(Executor &E, int Steps) {
  TokenBatch Data = oneBatch(E);
  Run R;
  for (int S = 1; S <= Steps; ++S) {
    auto L = E.trainStep(Data, 1e-3, S);
    if (!L)
      return L.takeError();
    R.Losses.push_back(*L);
    if (auto Err = E.download())
      return Err;
    auto &Step = R.Grads.emplace_back();
    auto &Values = R.Params.emplace_back();
    for (const TensorView &Param : E.parameters()) {
      auto G = E.gradient(Param.Name);
      if (!G)
        return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "no gradient of " + Param.Name);
      auto Full = E.gather64(*G);
      if (!Full)
        return Full.takeError();
      Step[Param.Name] = std::move(*Full);
      auto Value = E.gather64(Param);
      if (!Value)
        return Value.takeError();
      Values[Param.Name] = std::move(*Value);
    }
  }
  return R;
}

inline double normwise(const std::vector<double> &X,
                       const std::vector<double> &Ref) {
  double D = 0, S = 0;
  for (size_t I = 0; I < X.size(); ++I) {
    D = std::max(D, std::fabs(X[I] - Ref[I]));
    S = std::max(S, std::fabs(Ref[I]));
  }
  return S == 0 ? D : D / S;
}

/// Every step's loss, and the gradients of the first GradSteps steps, of
/// the other run (Gpu; Who names it in the messages) against the CPU's
/// float32 error from the float64 run.
inline void expectMatches(const Run &Gpu, const Run &Cpu, const Run &Ref,
                          int GradSteps, const char *Who = "gpu") {
  const double K = 8, Floor = std::ldexp(1.0, -24);
  for (size_t S = 0; S < Ref.Losses.size(); ++S) {
    double L64 = Ref.Losses[S];
    double CpuErr = std::fabs(Cpu.Losses[S] - L64) / std::fabs(L64);
    double GpuErr = std::fabs(Gpu.Losses[S] - L64) / std::fabs(L64);
    EXPECT_LE(GpuErr, K * std::max(CpuErr, Floor))
        << "loss of step " << S + 1 << ": " << Who << " " << Gpu.Losses[S]
        << ", cpu "
        << Cpu.Losses[S] << ", float64 " << L64;
    std::printf("step %zu: loss error %s %.3g cpu %.3g\n", S + 1, Who,
                GpuErr, CpuErr);
    ASSERT_EQ(Gpu.Grads[S].size(), Ref.Grads[S].size());
    double Worst = 0;
    for (auto &[Name, G64] : Ref.Grads[S]) {
      double C = normwise(Cpu.Grads[S].at(Name), G64);
      double G = normwise(Gpu.Grads[S].at(Name), G64);
      Worst = std::max(Worst, G / std::max(C, Floor));
      if (int(S) < GradSteps) {
        EXPECT_LE(G, K * std::max(C, Floor))
            << "gradient of " << Name << " at step " << S + 1
            << ": " << Who << " error " << G << ", cpu error " << C;
      }
    }
    std::printf("  gradients: largest %s/cpu error ratio %.2f%s\n", Who,
                Worst, int(S) < GradSteps ? "" : " (not compared)");
    if (S < Ref.Params.size() && S < Gpu.Params.size()) {
      double DG = 0, DC = 0;
      for (auto &[Name, P64] : Ref.Params[S])
        for (size_t I = 0; I < P64.size(); ++I) {
          DG = std::max(DG, std::fabs(Gpu.Params[S].at(Name)[I] - P64[I]));
          DC = std::max(DC, std::fabs(Cpu.Params[S].at(Name)[I] - P64[I]));
        }
      std::printf("  parameters after the update: largest difference from "
                  "float64 %s %.3g cpu %.3g\n",
                  Who, DG, DC);
    }
  }
}

/// How a plan is compiled: the layout, the pipeline schedule, the
/// recomputation, the attention core and the activations' dtype.
struct GridLayout {
  const char *Name = "";
  int TP = 1;
  bool SP = false;
  int PP = 1, Microbatches = 1, DP = 1, Zero = 0;
  bool Ring = false; // --tp-comm-overlap
  int CP = 1;        // --cp (needs Fused)
  const char *CpComm = "ring"; // --cp-comm
  int CpA2a = 1;               // --cp-a2a (with "a2a+ring")
  PipelineSchedule Schedule = PipelineSchedule::OneFOneB;
  int Interleave = 1;
  RecomputeMode Recompute = RecomputeMode::None;
  bool Fused = false;
  bool Blockwise = false; // a CUDA backend's attention core (CudaGrid.h)
  bool Epilogues = false; // a CUDA backend's --cuda-epilogues (CudaGrid.h)
  DType Activations = DType::F32;
  double AdamEps = OptimizerOptions().Eps;
};

/// The model at Path compiled for L.
inline llvm::Expected<Plan> compileLayout(llvm::StringRef Path,
                                          const GridLayout &L) {
  registerOnnxDataLoader();
  auto G = importOnnx(Path, ImportOptions());
  if (!G)
    return G.takeError();
  PassContext Ctx;
  Ctx.TensorParallel = L.TP;
  Ctx.SequenceParallel = L.SP;
  Ctx.DataParallel = L.DP;
  Ctx.Zero = L.Zero;
  Ctx.Optimizer.Eps = L.AdamEps;
  Ctx.ActivationDtype = L.Activations;
  Ctx.FusedAttention = L.Fused;
  Ctx.TpCommOverlap = L.Ring;
  Ctx.ContextParallel = L.CP;
  Ctx.ContextComm = L.CpComm;
  Ctx.ContextAllToAll = L.CpA2a;
  Ctx.Recompute.Mode = L.Recompute;
  if (L.PP > 1 || L.Microbatches > 1) {
    Ctx.Pipeline.Stages = L.PP;
    Ctx.Pipeline.Microbatches = L.Microbatches;
    Ctx.Pipeline.Interleave = L.Interleave;
    Ctx.Pipeline.Schedule = L.Schedule;
  }
  auto C = compileToPlan(**G, Ctx, CompileOptions());
  if (!C)
    return C.takeError();
  return std::move(*C->P);
}

/// The default model (models/tiny/gpt-tiny.onnx).
inline const char *const TinyModel = SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx";

/// The default model compiled for a layout (1F1B when PP > 1; the
/// microbatches count only then).
inline Plan compileTiny(int TP = 1, bool SP = false, int PP = 1,
                        int Microbatches = 1, int DP = 1, int Zero = 0,
                        double AdamEps = OptimizerOptions().Eps,
                        DType Activations = DType::F32, bool Fused = false,
                        bool TpCommOverlap = false) {
  GridLayout L;
  L.TP = TP;
  L.SP = SP;
  L.PP = PP;
  L.Microbatches = PP > 1 ? Microbatches : 1;
  L.DP = DP;
  L.Zero = Zero;
  L.AdamEps = AdamEps;
  L.Activations = Activations;
  L.Fused = Fused;
  L.Ring = TpCommOverlap;
  return llvm::cantFail(compileLayout(TinyModel, L));
}

/// A rank's backend on a grid of thread ranks, made from its world
/// communicator and run options (its groups); empty: the CPU backend.
using GridBackend = std::function<llvm::Expected<std::unique_ptr<Backend>>(
    Communicator &World, const RunOptions &O)>;

/// The same plan on DP x PP x CP x TP thread ranks, each on the backend
/// Make makes: the losses and every stage's own parameters' whole gradients
/// (gathered over the tensor group, and with ZeRO over the replicas).
inline llvm::Expected<Run> trainOnGrid(const Plan &P, int TP, int PP, int DP,
                                       const GridBackend &Make, int Steps,
                                       int CP = 1) {
  Run R;
  R.Grads.resize(Steps);
  std::mutex M;
  llvm::Error E = runOnThreadRanks(
      DP * PP * CP * TP, [&](Communicator &World) -> llvm::Error {
        ProcessGrid Grid;
        Grid.Tensor = TP;
        Grid.Pipeline = PP;
        Grid.Data = DP;
        Grid.Context = CP;
        auto Groups = splitGroups(World, Grid);
        if (!Groups)
          return Groups.takeError();
        RunOptions O;
        O.AllowFloat64 = true;
        O.Comm = Groups->Tensor.get();
        O.PipeComm = PP > 1 ? Groups->Pipeline.get() : nullptr;
        O.DataComm = DP * CP > 1 ? Groups->Data.get() : nullptr;
        O.ContextComm = CP > 1 ? Groups->Context.get() : nullptr;
        std::unique_ptr<Backend> Made;
        if (Make) {
          auto B = Make(World, O);
          if (!B)
            return B.takeError();
          Made = std::move(*B);
          O.MakeBackend = [&] { return std::move(Made); };
        }
        auto Ex = Executor::create(P, O);
        if (!Ex)
          return Ex.takeError();
        TokenBatch Data = oneBatch(**Ex);
        for (int S = 1; S <= Steps; ++S) {
          auto L = (*Ex)->trainStep(Data, 1e-3, S);
          if (!L)
            return L.takeError();
          if (auto Err = (*Ex)->download())
            return Err;
          if (World.rank() == 0) {
            std::lock_guard<std::mutex> Lock(M);
            R.Losses.push_back(*L);
          }
          for (const TensorView &Param : (*Ex)->parameters()) {
            if (llvm::StringRef(Param.Name).contains('@')) // another stage's
              continue;
            auto G = (*Ex)->gradient(Param.Name);
            if (!G)
              return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                             "no gradient of " + Param.Name);
            auto Full = (*Ex)->gather64(*G);
            if (!Full)
              return Full.takeError();
            std::lock_guard<std::mutex> Lock(M);
            if (Groups->At.Tensor == 0 && Groups->At.Data == 0)
              R.Grads[S - 1][Param.Name] = std::move(*Full);
          }
        }
        return llvm::Error::success();
      });
  if (E)
    return E;
  return R;
}

/// The ONNX paths, colon-separated, in the environment variable Var (a
/// test script exports the models and sets it); empty when unset.
inline std::vector<std::string> modelsFromEnv(const char *Var) {
  std::vector<std::string> Paths;
  const char *List = std::getenv(Var);
  llvm::SmallVector<llvm::StringRef, 4> Parts;
  llvm::StringRef(List ? List : "").split(Parts, ':', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef P : Parts)
    Paths.push_back(P.str());
  return Paths;
}

/// The exported model families check_expanded_plans.sh passes in
/// SP_EXPANSION_MODELS.
inline std::vector<std::string> exportedFamilyModels() {
  return modelsFromEnv("SP_EXPANSION_MODELS");
}

/// A 16-bit run's losses (Got) against the CPU's of the same plan (Want),
/// by the band of tests/lit/tools/Inputs/precision_band.py with u the
/// format's unit roundoff: step 1 within u L, the mean of each window of
/// Window steps within 4u of the CPU's (Label names the run in the lines
/// printed).
inline void expectLossesWithinBand(const std::vector<double> &Got,
                                   const std::vector<double> &Want, double U,
                                   int Window, const std::string &Label) {
  ASSERT_EQ(Got.size(), Want.size());
  ASSERT_FALSE(Want.empty());
  EXPECT_LE(std::fabs(Got[0] - Want[0]), U * Want[0])
      << "step 1: gpu " << Got[0] << ", cpu " << Want[0];
  for (int K = 0; K + Window <= int(Want.size()); K += Window) {
    double G = 0, C = 0;
    for (int J = K; J < K + Window; ++J) {
      G += Got[J] / Window;
      C += Want[J] / Window;
    }
    EXPECT_LE(std::fabs(G - C), 4 * U * C)
        << "steps " << K + 1 << "-" << K + Window << ": gpu mean " << G
        << ", cpu mean " << C;
    std::printf("%s steps %d-%d: gpu %.6f cpu %.6f (%.3f of 4u)\n",
                Label.c_str(), K + 1, K + Window, G, C,
                std::fabs(G - C) / (4 * U * C));
  }
}
/// Path's plan with the fused attention core, on one device; AdamW's eps
/// at which one step's rounding cannot flip a later update, so that every
/// step's gradients compare (EndToEndTest.cpp).
inline llvm::Expected<Plan> compileFusedPlan(llvm::StringRef Path) {
  registerOnnxDataLoader();
  auto G = importOnnx(Path, ImportOptions());
  if (!G)
    return G.takeError();
  PassContext Ctx;
  Ctx.FusedAttention = true;
  Ctx.Optimizer.Eps = 1e-3;
  auto C = compileToPlan(**G, Ctx, CompileOptions());
  if (!C)
    return C.takeError();
  return std::move(*C->P);
}

/// Steps of P on the backend Make makes (the CPU backend when empty).
inline llvm::Expected<Run>
trainWith(const Plan &P, std::function<std::unique_ptr<Backend>()> Make,
          int Steps) {
  RunOptions O;
  O.AllowFloat64 = true;
  if (Make)
    O.MakeBackend = std::move(Make);
  auto E = Executor::create(P, O);
  if (!E)
    return E.takeError();
  return trainRun(**E, Steps);
}

/// Trains Path's fused plan three steps on the backend Make makes, on the
/// CPU backend and on the CPU backend in float64, and compares (Who names
/// the first). Count, when given, counts the attention instructions the
/// other backend runs: every one of the plan's, every step.
inline void
expectFusedPlanTrainsAsTheCpu(llvm::StringRef Path,
                              std::function<std::unique_ptr<Backend>()> Make,
                              const int *Count, const char *Who) {
  SCOPED_TRACE(Path.str());
  std::printf("%s\n", Path.str().c_str());
  auto Compiled = compileFusedPlan(Path);
  ASSERT_TRUE(bool(Compiled)) << llvm::toString(Compiled.takeError());
  const Plan &P = *Compiled;
  int Attention = 0;
  for (const Instruction &I : P.Prog.Instrs)
    Attention += I.Op == OpKind::Attention || I.Op == OpKind::AttentionGrad;
  ASSERT_GT(Attention, 0) << "the plan has no fused attention";
  const int Steps = 3;
  const int Before = Count ? *Count : 0;
  auto Other = trainWith(P, std::move(Make), Steps);
  ASSERT_TRUE(bool(Other)) << llvm::toString(Other.takeError());
  if (Count) {
    EXPECT_EQ(*Count - Before, Attention * Steps)
        << "attention instructions run by " << Who;
  }
  auto Cpu = trainWith(P, nullptr, Steps);
  ASSERT_TRUE(bool(Cpu)) << llvm::toString(Cpu.takeError());
  auto Ref = trainWith(widenToFloat64(P), nullptr, Steps);
  ASSERT_TRUE(bool(Ref)) << llvm::toString(Ref.takeError());
  expectMatches(*Other, *Cpu, *Ref, Steps, Who);
}

} // namespace sp

#endif // SP_TESTS_GPU_TRAINCOMPARE_H
