//===- TrainHarness.cpp - Compile and train a model in-process ------------===//
#include "TrainHarness.h"
#include "frontend/OnnxImporter.h"
#include "passes/MemoryPlan.h"
#include "passes/PassManager.h"
#include "passes/Passes.h"
#include "gtest/gtest.h"
#include <cmath>
#include <mutex>
#include <random>

using namespace llvm;

namespace sp::test {

Expected<Plan> tryCompile(StringRef Model, const PassContext &Ctx) {
  registerOnnxDataLoader();
  auto G = importOnnx(Model, ImportOptions());
  if (!G)
    return G.takeError();
  PassManager PM(PassManagerOptions{});
  if (auto E = PM.addPipeline(DefaultPipeline))
    return std::move(E);
  PassContext C = Ctx;
  if (auto E = PM.run(**G, C))
    return std::move(E);
  Plan P;
  auto Prog = lowerGraph(**G, DType::F32);
  if (!Prog)
    return Prog.takeError();
  P.Prog = std::move(*Prog);
  planMemory(P.Prog);
  P.Manifest = {{"dtype", "f32"}, {"tp", Ctx.TensorParallel}};
  return P;
}

Plan compile(StringRef Model, const PassContext &Ctx) {
  auto P = tryCompile(Model, Ctx);
  if (!P)
    report_fatal_error(Twine("test compile failed: ") +
                       toString(P.takeError()));
  return std::move(*P);
}

RunResult train(const Plan &P, double Dropout, int Steps) {
  std::mt19937 Rng(7);
  // Token ids within the model's vocabulary, sized from the plan.
  int64_t Vocab = 0, Tokens = 0;
  for (const Instruction &I : P.Prog.Instrs)
    if (I.Role == "embed" && I.Op == OpKind::Embedding) {
      const ProgramBuffer &T = P.Prog.Buffers[I.In[0]];
      Vocab = T.Data->type().Shape[0];
      Tokens = P.Prog.Buffers[I.In[1]].Type.numElements();
    }
  std::vector<int64_t> Idx(Tokens), Targets(Tokens);
  for (size_t I = 0; I < Idx.size(); ++I) {
    Idx[I] = Rng() % Vocab;
    Targets[I] = Rng() % Vocab;
  }
  int TP = P.Manifest.value("tp", 1);
  RunResult R;
  std::mutex M;
  Error E = runOnThreadRanks(TP, [&](Communicator &C) -> Error {
    RunOptions O;
    O.Comm = &C;
    O.Dropout = Dropout;
    auto E = Executor::create(P, O);
    if (!E)
      return E.takeError();
    for (int S = 1; S <= Steps; ++S) {
      auto L = (*E)->trainStep(Idx, Targets, 1e-3, S);
      if (!L)
        return L.takeError();
      if (C.rank() == 0)
        R.Losses.push_back(*L);
      if (S > 1)
        continue;
      for (const TensorView &Param : (*E)->parameters()) {
        auto Full = (*E)->gather(*(*E)->gradient(Param.Name));
        if (!Full)
          return Full.takeError();
        std::lock_guard<std::mutex> Lock(M);
        if (C.rank() == 0)
          R.Grads[Param.Name] = std::move(*Full);
      }
    }
    if (C.rank() == 0)
      R.Memory = (*E)->memory();
    return Error::success();
  });
  EXPECT_FALSE(bool(E)) << toString(std::move(E));
  return R;
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
