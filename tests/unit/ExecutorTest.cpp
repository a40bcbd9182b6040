//===- ExecutorTest.cpp - The CPU executor on the default model -----------===//
#include "frontend/OnnxImporter.h"
#include "lower/MemoryPlan.h"
#include "driver/Compile.h"
#include "runtime/Executor.h"
#include "runtime/cpu/CpuBackend.h"
#include "runtime/cpu/Parallel.h"
#include "llvm/ADT/ScopeExit.h"
#include "gtest/gtest.h"
#include <cmath>
#include <map>
#include <random>

using namespace sp;
using namespace llvm;

namespace {

/// Compiles models/tiny/gpt-tiny.onnx in-process into a plan.
Plan compileTiny() {
  registerOnnxDataLoader();
  auto G = cantFail(
      importOnnx(SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx", ImportOptions()));
  PassContext Ctx;
  return std::move(*cantFail(compileToPlan(*G, Ctx, CompileOptions())).P);
}

std::vector<int64_t> randomTokens(size_t N, int64_t Vocab, unsigned Seed) {
  std::mt19937 Rng(Seed);
  std::vector<int64_t> T(N);
  for (int64_t &X : T)
    X = Rng() % Vocab;
  return T;
}

/// sp-run's note on OpenBLAS's kernels: only where OpenBLAS chose a core
/// without AVX2 (as on a VM that hides the CPU model) on a CPU that has
/// AVX-512 or AVX2 with FMA; the CPU's own cores are left alone.
TEST(CpuBackend, BetterBlasCoreOnlyWhereOpenBlasChoseAnOlderOne) {
  EXPECT_EQ(CpuBackend::betterBlasCore("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(CpuBackend::betterBlasCore("Prescott", false, true), "Haswell");
  EXPECT_EQ(CpuBackend::betterBlasCore("NEHALEM", false, true), "Haswell");
  EXPECT_EQ(CpuBackend::betterBlasCore("Prescott", false, false), "");
  for (const char *Own : {"SkylakeX", "Haswell", "Zen", "Cooperlake",
                          "SapphireRapids"})
    EXPECT_EQ(CpuBackend::betterBlasCore(Own, true, true), "") << Own;
  // This process: whatever OpenBLAS chose is named, and any advice is one
  // of the two.
  std::string Chosen, Better = CpuBackend::betterBlasCore(&Chosen);
  EXPECT_FALSE(Chosen.empty());
  EXPECT_TRUE(Better.empty() || Better == "SkylakeX" || Better == "Haswell")
      << Better;
}

TEST(Executor, TrainsAndMeasuresThePlannedMemory) {
  Plan P = compileTiny();
  auto EE = Executor::create(P, RunOptions{});
  ASSERT_TRUE(bool(EE)) << toString(EE.takeError());
  auto E = std::move(*EE);
  ASSERT_EQ(E->batch(), 4);
  ASSERT_EQ(E->seq(), 64);
  ASSERT_EQ(E->vocab(), 256);
  auto Idx = randomTokens(4 * 64, 256, 1);
  auto Targets = randomTokens(4 * 64, 256, 2);
  // Untrained: close to ln(256).
  double First = cantFail(E->trainStep({Idx, Targets, {}}, 1e-3, 1));
  EXPECT_NEAR(First, std::log(256.0), 0.3);
  double Last = First;
  for (int Step = 2; Step <= 15; ++Step)
    Last = cantFail(E->trainStep({Idx, Targets, {}}, 1e-3, Step));
  EXPECT_LT(Last, First - 0.5) << "the loss must fall on a repeated batch";

  MemoryStats M = E->memory();
  EXPECT_EQ(M.ArenaBytes, P.Prog.ArenaBytes);
  EXPECT_EQ(M.HighWaterBytes, P.Prog.ArenaBytes);
  EXPECT_EQ(M.PeakLiveTempBytes, peakLiveTempBytes(P.Prog));
}

TEST(Executor, EvalIsDeterministicAndGradientsAreExposed) {
  Plan P = compileTiny();
  RunOptions O;
  O.Dropout = 0.0;
  auto E = cantFail(Executor::create(P, O));
  auto Idx = randomTokens(4 * 64, 256, 3);
  double A = cantFail(E->evalLoss({Idx, Idx, {}}));
  double B = cantFail(E->evalLoss({Idx, Idx, {}}));
  EXPECT_EQ(A, B);
  ASSERT_TRUE(E->logits());
  EXPECT_EQ(E->logits()->Type, TensorType(DType::F32, {4, 64, 256}));
  // With dropout off, the training loss of step 1 equals the eval loss.
  double L = cantFail(E->trainStep({Idx, Idx, {}}, 1e-3, 1));
  EXPECT_NEAR(L, A, 1e-6);
  for (const TensorView &Param : E->parameters()) {
    auto G = E->gradient(Param.Name);
    ASSERT_TRUE(G) << Param.Name;
    EXPECT_EQ(G->Type, Param.Type);
    double Norm = 0;
    for (int64_t I = 0; I < G->size(); ++I)
      Norm += double(G->Data[I]) * G->Data[I];
    EXPECT_GT(Norm, 0) << Param.Name;
  }
  EXPECT_EQ(E->optimizerState().size(), 2 * E->parameters().size());
}

/// Targets of IgnoreTarget count for nothing: the loss is the mean cross
/// entropy of the logits over the others (recomputed here in double from
/// the logits evalLoss exposes), and a batch with none gives loss 0 and
/// zero gradients.
TEST(Executor, IgnoredTargetsCountForNothing) {
  Plan P = compileTiny();
  RunOptions O;
  O.Dropout = 0.0;
  auto E = cantFail(Executor::create(P, O));
  auto Idx = randomTokens(4 * 64, 256, 6);
  auto Targets = randomTokens(4 * 64, 256, 7);
  for (size_t I = 0; I < Targets.size(); I += 3)
    Targets[I] = IgnoreTarget;
  double Loss = cantFail(E->evalLoss({Idx, Targets, {}}));
  TensorView Logits = *E->logits();
  double Sum = 0;
  int64_t Counted = 0;
  for (size_t I = 0; I < Targets.size(); ++I) {
    if (Targets[I] == IgnoreTarget)
      continue;
    const float *Row = Logits.Data + I * 256;
    double Max = *std::max_element(Row, Row + 256), Exp = 0;
    for (int J = 0; J < 256; ++J)
      Exp += std::exp(double(Row[J]) - Max);
    Sum += std::log(Exp) + Max - Row[Targets[I]];
    ++Counted;
  }
  EXPECT_NEAR(Loss, Sum / Counted, 1e-6 * Loss);

  std::vector<int64_t> None(Targets.size(), IgnoreTarget);
  EXPECT_EQ(cantFail(E->trainStep({Idx, None, {}}, 1e-3, 1)), 0.0);
  for (const TensorView &Param : E->parameters()) {
    TensorView G = *E->gradient(Param.Name);
    EXPECT_TRUE(std::all_of(G.Data, G.Data + G.size(),
                            [](float X) { return X == 0; }))
        << Param.Name;
  }
}

/// A backend that forwards to the CPU one and counts what it is asked: the
/// executor reaches memory and kernels only through the interface, so the
/// same run through it gives the same bits.
class CountingBackend : public CpuBackend {
public:
  explicit CountingBackend(std::map<std::string, int> &Counts)
      : Counts(Counts) {}
  Error copyToBackend(char *Dst, const void *Src, size_t Bytes) override {
    ++Counts["copy_in"];
    return CpuBackend::copyToBackend(Dst, Src, Bytes);
  }
  Error copyToHost(void *Dst, const char *Src, size_t Bytes) override {
    ++Counts["copy_out"];
    return CpuBackend::copyToHost(Dst, Src, Bytes);
  }
  Error run(const KernelCall &C) override {
    ++Counts[opName(C.I.Op).str()];
    return CpuBackend::run(C);
  }

private:
  std::map<std::string, int> &Counts;
};

TEST(Executor, ABackendFactoryThatMakesNothingIsAnError) {
  Plan P = compileTiny();
  RunOptions O;
  O.MakeBackend = [] { return std::unique_ptr<Backend>(); };
  auto E = Executor::create(P, O);
  ASSERT_FALSE(bool(E));
  EXPECT_NE(toString(E.takeError()).find("MakeBackend made no backend"),
            std::string::npos);
}

TEST(Executor, RunsThroughAnyBackend) {
  Plan P = compileTiny();
  std::map<std::string, int> Counts;
  RunOptions O;
  O.MakeBackend = [&] { return std::make_unique<CountingBackend>(Counts); };
  auto Counted = cantFail(Executor::create(P, O));
  auto Plain = cantFail(Executor::create(P, RunOptions{}));
  int Params = int(Counted->parameters().size());
  int WithData = int(count_if(P.Prog.Buffers,
                              [](const ProgramBuffer &B) { return bool(B.Data); }));
  EXPECT_EQ(Counts["copy_in"], WithData)
      << "one upload per parameter and constant";
  auto Idx = randomTokens(4 * 64, 256, 8);
  for (int Step = 1; Step <= 2; ++Step) {
    EXPECT_EQ(cantFail(Counted->trainStep({Idx, Idx, {}}, 1e-3, Step)),
              cantFail(Plain->trainStep({Idx, Idx, {}}, 1e-3, Step)));
    EXPECT_GT(Plain->lastGradNorm(), 0);
    EXPECT_EQ(Counted->lastGradNorm(), Plain->lastGradNorm());
  }
  size_t Instrs = P.Prog.Instrs.size();
  int Runs = 0;
  for (auto &[Op, N] : Counts)
    if (Op != "copy_in" && Op != "copy_out")
      Runs += N;
  EXPECT_EQ(size_t(Runs), 2 * Instrs) << "every instruction is a backend call";
  EXPECT_EQ(Counts["copy_out"], 4)
      << "the loss and the gradient norm of each step";
  int Inputs = int(count_if(P.Prog.Buffers, [](const ProgramBuffer &B) {
    return B.K == ProgramBuffer::Input;
  }));
  EXPECT_EQ(Counts["copy_in"], WithData + 2 * Inputs) << "and the inputs";
  EXPECT_EQ(Counts["adamw"], 2 * Params);
}

/// A backend whose memory the executor must treat as a device's: it reaches
/// it only through the copies, and its views are a host mirror.
class DeviceMemoryBackend : public CpuBackend {
public:
  bool hostMemory() const override { return false; }
};

/// With device memory, views show the arena after download(), and writes
/// to them reach the backend after upload(); the training itself is
/// bitwise that of the host backend.
TEST(Executor, DeviceMemoryViewsSyncThroughTheCopies) {
  Plan P = compileTiny();
  RunOptions O;
  O.MakeBackend = [] { return std::make_unique<DeviceMemoryBackend>(); };
  auto Dev = cantFail(Executor::create(P, O));
  auto Host = cantFail(Executor::create(P, RunOptions{}));
  auto Idx = randomTokens(4 * 64, 256, 9);
  EXPECT_EQ(cantFail(Dev->trainStep({Idx, Idx, {}}, 1e-3, 1)),
            cantFail(Host->trainStep({Idx, Idx, {}}, 1e-3, 1)));
  std::string Name = Host->parameters()[0].Name;
  auto Values = [](const TensorView &V) {
    return std::vector<float>(V.Data, V.Data + V.size());
  };
  auto HostGrad = Values(*Host->gradient(Name));
  EXPECT_NE(Values(*Dev->gradient(Name)), HostGrad)
      << "the mirror is stale before download()";
  ASSERT_FALSE(bool(Dev->download()));
  EXPECT_EQ(Values(*Dev->gradient(Name)), HostGrad);
  auto DevParams = Dev->parameters(), HostParams = Host->parameters();
  for (size_t K = 0; K < DevParams.size(); ++K) {
    EXPECT_EQ(Values(DevParams[K]), Values(HostParams[K]));
    for (int64_t J = 0; J < DevParams[K].size(); ++J)
      DevParams[K].Data[J] = HostParams[K].Data[J] *= 0.5f;
  }
  ASSERT_FALSE(bool(Dev->upload()));
  EXPECT_EQ(cantFail(Dev->evalLoss({Idx, Idx, {}})),
            cantFail(Host->evalLoss({Idx, Idx, {}})));
}

/// A backend that times its calls "on the device" (here: a clock of its
/// own, one microsecond per call, collectives on stream 1).
class DeviceTimingBackend : public DeviceMemoryBackend {
public:
  bool timesOnDevice() const override { return true; }
  Error startTiming() override {
    Times.clear();
    ++Starts;
    return Error::success();
  }
  Error run(const KernelCall &C) override {
    bool Comm = C.I.Op == OpKind::AllReduce || C.I.Op == OpKind::AllGather ||
                C.I.Op == OpKind::ReduceScatter;
    Times.push_back({double(Times.size()), 1.0, Comm ? 1 : 0});
    return CpuBackend::run(C);
  }
  Expected<std::vector<DeviceTime>> collectTimes() override {
    return std::move(Times);
  }
  std::vector<DeviceTime> Times;
  int Starts = 0;
};

/// With a backend that times on the device, a traced step records what the
/// backend measured for every instruction, in order, with its stream,
/// after the step's start on the host clock; the training is unchanged.
TEST(Executor, TraceTakesTheDevicesTimes) {
  Plan P = compileTiny();
  RunOptions O;
  O.Trace = true;
  DeviceTimingBackend *Dev = nullptr;
  O.MakeBackend = [&] {
    auto B = std::make_unique<DeviceTimingBackend>();
    Dev = B.get();
    return B;
  };
  auto Timed = cantFail(Executor::create(P, O));
  auto Host = cantFail(Executor::create(P, RunOptions{}));
  auto Idx = randomTokens(4 * 64, 256, 10);
  for (int Step = 1; Step <= 2; ++Step)
    EXPECT_EQ(cantFail(Timed->trainStep({Idx, Idx, {}}, 1e-3, Step)),
              cantFail(Host->trainStep({Idx, Idx, {}}, 1e-3, Step)));
  EXPECT_EQ(Dev->Starts, 2) << "once per traced step";
  size_t N = P.Prog.Instrs.size();
  ASSERT_EQ(Timed->trace().size(), 2 * N);
  for (size_t K = 0; K < 2 * N; ++K) {
    const TraceEvent &T = Timed->trace()[K];
    EXPECT_EQ(T.Instruction, int(K % N));
    EXPECT_EQ(T.Step, int64_t(K / N + 1));
    EXPECT_EQ(T.DurationUs, 1.0);
    EXPECT_EQ(T.Stream, 0) << "t = 1: no collective";
    if (K % N) {
      EXPECT_EQ(T.StartUs - Timed->trace()[K - 1].StartUs, 1.0);
    }
  }
}

TEST(Executor, RejectsBadTokensAndPlans) {
  Plan P = compileTiny();
  auto E = cantFail(Executor::create(P, RunOptions{}));
  auto Idx = randomTokens(4 * 64, 256, 4);
  Idx[17] = 300;
  auto L = E->trainStep({Idx, Idx, {}}, 1e-3, 1);
  ASSERT_FALSE(L);
  EXPECT_NE(toString(L.takeError()).find("token id 300 at position 17"),
            std::string::npos);
  P.Manifest["dtype"] = "i8";
  auto Bad = Executor::create(P, RunOptions{});
  ASSERT_FALSE(Bad);
  EXPECT_NE(toString(Bad.takeError())
                .find("sp-run runs fp32, bf16 and fp16 plans"),
            std::string::npos);
  // A mixed-precision plan keeps its parameters in f32.
  P.Manifest["dtype"] = "bf16";
  for (ProgramBuffer &B : P.Prog.Buffers)
    if (B.K == ProgramBuffer::Param) {
      B.Type.Dtype = DType::BF16;
      break;
    }
  auto Half = Executor::create(P, RunOptions{});
  ASSERT_FALSE(Half);
  EXPECT_NE(toString(Half.takeError())
                .find("a mixed-precision plan keeps its parameters, optimizer "
                      "state and inputs in f32"),
            std::string::npos);
}

} // namespace

namespace {

/// The elementwise kernels split their work over a thread pool; each element
/// is computed by the same code, so results are bitwise those of one thread.
TEST(Executor, KernelThreadsDoNotChangeResults) {
  Plan P = compileTiny();
  auto Run = [&](int Threads) {
    cpu::setKernelThreads(Threads);
    auto E = cantFail(Executor::create(P, RunOptions{}));
    auto Idx = randomTokens(4 * 64, 256, 5);
    std::vector<double> L;
    for (int Step = 1; Step <= 3; ++Step)
      L.push_back(cantFail(E->trainStep({Idx, Idx, {}}, 1e-3, Step)));
    std::vector<float> W(E->parameters()[0].Data,
                         E->parameters()[0].Data + E->parameters()[0].size());
    cpu::setKernelThreads(1);
    return std::make_pair(L, W);
  };
  auto One = Run(1), Two = Run(2), Three = Run(3);
  EXPECT_EQ(One.first, Two.first);
  EXPECT_EQ(One.first, Three.first);
  EXPECT_EQ(One.second, Two.second);
  EXPECT_EQ(One.second, Three.second);
}

} // namespace

namespace {

/// No two temporaries that are live at the same instruction share a byte.
void expectDisjointLiveBuffers(const Program &P) {
  std::vector<const ProgramBuffer *> T;
  for (const ProgramBuffer &B : P.Buffers)
    if (!B.isPersistent()) {
      EXPECT_GE(B.Offset, P.PersistentBytes) << B.Name;
      EXPECT_LE(B.Offset + B.Bytes, P.ArenaBytes) << B.Name;
      T.push_back(&B);
    }
  for (size_t I = 0; I < T.size(); ++I)
    for (size_t J = I + 1; J < T.size(); ++J) {
      const ProgramBuffer &A = *T[I], &B = *T[J];
      bool LiveTogether = A.Def <= B.LastUse && B.Def <= A.LastUse;
      bool Overlap = A.Offset < B.Offset + std::max<int64_t>(B.Bytes, 1) &&
                     B.Offset < A.Offset + std::max<int64_t>(A.Bytes, 1);
      ASSERT_FALSE(LiveTogether && Overlap) << A.Name << " and " << B.Name;
    }
}

/// Both placements are valid and give the same training (the layout does
/// not change a result); program order is what large pipelined programs
/// use.
TEST(MemoryPlan, BothPlacementsAreValidAndEquivalent) {
  Plan BySize = compileTiny();
  Plan InOrder = BySize;
  planMemory(BySize.Prog, PlanOrder::BySize);
  planMemory(InOrder.Prog, PlanOrder::Program);
  expectDisjointLiveBuffers(BySize.Prog);
  expectDisjointLiveBuffers(InOrder.Prog);
  EXPECT_GE(InOrder.Prog.ArenaBytes, peakLiveTempBytes(InOrder.Prog));
  auto Idx = randomTokens(4 * 64, 256, 1);
  auto Targets = randomTokens(4 * 64, 256, 2);
  RunOptions O;
  O.Dropout = 0.1;
  auto A = cantFail(Executor::create(BySize, O));
  auto B = cantFail(Executor::create(InOrder, O));
  for (int Step = 1; Step <= 3; ++Step)
    EXPECT_EQ(cantFail(A->trainStep({Idx, Targets, {}}, 1e-3, Step)),
              cantFail(B->trainStep({Idx, Targets, {}}, 1e-3, Step)));
  EXPECT_EQ(B->memory().HighWaterBytes, InOrder.Prog.ArenaBytes);
}

} // namespace

namespace {

/// Collectives communicate over the group they name (the op's default when
/// they name none): the CPU backend resolves "tp", "pp" and "dp" through the
/// call's communicators and refuses a group the run does not have.
TEST(CpuBackend, CollectivesUseTheGroupTheyName) {
  Program P;
  TensorType T(DType::F32, {4});
  for (int K = 0; K < 2; ++K) {
    ProgramBuffer B;
    B.Name = K ? "y" : "x";
    B.Type = T;
    B.Bytes = T.numBytes();
    B.Offset = K * 64;
    P.Buffers.push_back(B);
  }
  P.ArenaBytes = 128;
  // Two ranks, each its own tensor group of one and both in one data
  // group: an all_reduce sums over the ranks only when it names dp.
  auto Body = [&](Communicator &Replicas) -> Error {
    Instruction I;
    I.Op = OpKind::AllReduce;
    I.In = {0};
    I.Out = {1};
    if (collectiveGroup(I.Op, I.Attrs) != "tp")
      return createStringError(inconvertibleErrorCode(), "default not tp");
    CpuBackend B;
    char *Arena = cantFail(B.allocate(P.ArenaBytes));
    auto Free = make_scope_exit([&] { B.release(Arena); });
    float X[4] = {1, 2, 3, 4};
    cantFail(B.copyToBackend(Arena, X, sizeof X));
    auto One = createSingleRankCommunicator();
    auto Sum = [&](Communicator *Data) -> Expected<std::vector<float>> {
      if (auto E = B.run(KernelCall{I, P, Arena, 1, true, std::nullopt, 0,
                                    *One, nullptr, Data}))
        return E;
      std::vector<float> Y(4);
      cantFail(B.copyToHost(Y.data(), Arena + 64, 16));
      return Y;
    };
    auto Tp = Sum(&Replicas);
    if (!Tp || *Tp != std::vector<float>{1, 2, 3, 4})
      return createStringError(inconvertibleErrorCode(),
                               "tp: not this rank's values");
    I.Attrs.set("group", std::string("dp"));
    auto Missing = Sum(nullptr);
    if (Missing || toString(Missing.takeError()) !=
                       "no communicator for group 'dp'")
      return createStringError(inconvertibleErrorCode(),
                               "dp without a data group: not refused");
    auto Dp = Sum(&Replicas);
    if (!Dp)
      return Dp.takeError();
    if (*Dp != std::vector<float>{2, 4, 6, 8})
      return createStringError(inconvertibleErrorCode(),
                               "dp: not summed over the replicas");
    return Error::success();
  };
  EXPECT_EQ(toString(runOnThreadRanks(2, Body)), "");
}

} // namespace
