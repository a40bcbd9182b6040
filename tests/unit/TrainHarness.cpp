//===- TrainHarness.cpp - Compile and train a model in-process ------------===//
#include "TrainHarness.h"
#include "frontend/OnnxImporter.h"
#include "passes/Compile.h"
#include "runtime/comm/ProcessGrid.h"
#include "runtime/cpu/CpuBackend.h"
#include "gtest/gtest.h"
#include <cmath>
#include <mutex>
#include <random>

using namespace llvm;


namespace sp::test {

Expected<Plan> tryCompile(StringRef Model, const PassContext &Ctx,
                          int64_t Batch, int64_t Seq) {
  registerOnnxDataLoader();
  ImportOptions IO;
  IO.Batch = Batch;
  IO.Seq = Seq;
  auto G = importOnnx(Model, IO);
  if (!G)
    return G.takeError();
  PassContext C = Ctx;
  CompileOptions O;
  O.Source = Model.str();
  auto Compiled = compileToPlan(**G, C, O);
  if (!Compiled)
    return Compiled.takeError();
  return std::move(*Compiled->P);
}

Plan compile(StringRef Model, const PassContext &Ctx, int64_t Batch,
             int64_t Seq) {
  auto P = tryCompile(Model, Ctx, Batch, Seq);
  if (!P)
    report_fatal_error(Twine("test compile failed: ") +
                       toString(P.takeError()));
  return std::move(*P);
}

RunResult train(const Plan &P, double Dropout, int Steps) {
  int TP = P.Manifest.value("tp", 1), PP = P.numStages();
  RunResult R;
  std::mutex M;
  // As sp-run does: the process's kernel threads shared by its ranks.
  CpuBackend::setThreads(TP * PP > 1 ? 1 : 2);
  Error E = runOnThreadRanks(TP * PP, [&](Communicator &World) -> Error {
    ProcessGrid Grid;
    Grid.Pipeline = PP;
    Grid.Tensor = TP;
    auto Groups = splitGroups(World, Grid);
    if (!Groups)
      return Groups.takeError();
    int TPRank = Groups->At.Tensor;
    RunOptions O;
    O.Comm = Groups->Tensor.get();
    O.PipeComm = Groups->Pipeline.get();
    O.Dropout = Dropout;
    auto E = Executor::create(P, O);
    if (!E)
      return E.takeError();
    // The same random tokens on every rank.
    std::mt19937 Rng(7);
    TokenBatch Data;
    for (int64_t I = 0; I < (*E)->batch() * (*E)->seq(); ++I) {
      Data.Tokens.push_back(Rng() % (*E)->vocab());
      Data.Targets.push_back(Rng() % (*E)->vocab());
    }
    for (int S = 1; S <= Steps; ++S) {
      auto L = (*E)->trainStep(Data, 1e-3, S);
      if (!L)
        return L.takeError();
      if (World.rank() == 0)
        R.Losses.push_back(*L);
      if (S > 1)
        continue;
      // Every stage's own parameters (not the copies of another stage's).
      for (const TensorView &Param : (*E)->parameters()) {
        if (StringRef(Param.Name).contains('@'))
          continue;
        auto G = (*E)->gradient(Param.Name);
        if (!G)
          return createStringError(inconvertibleErrorCode(),
                                   "no gradient of " + Param.Name);
        auto Full = (*E)->gather(*G);
        if (!Full)
          return Full.takeError();
        std::lock_guard<std::mutex> Lock(M);
        if (TPRank == 0)
          R.Grads[Param.Name] = std::move(*Full);
      }
    }
    if (World.rank() == 0)
      R.Memory = (*E)->memory();
    return Error::success();
  });
  EXPECT_FALSE(bool(E)) << toString(std::move(E));
  return R;
}

void expectEqualRuns(const RunResult &Run, const RunResult &Ref) {
  ASSERT_EQ(Run.Losses.size(), Ref.Losses.size());
  for (size_t S = 0; S < Ref.Losses.size(); ++S)
    EXPECT_NEAR(Run.Losses[S], Ref.Losses[S], 1e-6 * std::abs(Ref.Losses[S]))
        << "step " << S + 1;
  ASSERT_EQ(Run.Grads.size(), Ref.Grads.size());
  for (auto &[Name, G] : Ref.Grads) {
    auto It = Run.Grads.find(Name);
    ASSERT_NE(It, Run.Grads.end()) << Name;
    ASSERT_EQ(It->second.size(), G.size()) << Name;
    EXPECT_LT(relErr(It->second, G), 1e-6) << Name;
  }
}

double relErr(const std::vector<float> &A, const std::vector<float> &B) {
  double Diff = 0, Ref = 0;
  for (size_t I = 0; I < A.size(); ++I) {
    Diff = std::max(Diff, std::abs(double(A[I]) - B[I]));
    Ref = std::max(Ref, std::abs(double(B[I])));
  }
  return Diff / std::max(Ref, 1e-30);
}

} // namespace sp::test
