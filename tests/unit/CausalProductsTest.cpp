//===- CausalProductsTest.cpp - Causal attention products ---------------===//
//
// lower/CausalProducts.cpp and the CPU kernel behind it: the kernel's causal
// row blocks against the whole product masked afterwards (exact, on
// integer-valued data), the pass on a hand-built attention core (what it
// marks, and what it must leave alone), and the default model trained with
// and without the marks in every recompute mode and a pipeline, compared by
// the float32 rounding scale of the unmarked run.
//
//===----------------------------------------------------------------------===//
#include "ProgramRun.h"
#include "TrainHarness.h"
#include "lower/CausalProducts.h"
#include "runtime/cpu/Kernels.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "gtest/gtest.h"
#include <array>
#include <cmath>
#include <limits>

using namespace sp;
using namespace llvm;
using namespace sp::test;

namespace {

/// Small integers: every product and sum below is exact in float32, so the
/// causal blocks and the whole product must agree bit for bit whatever
/// order the GEMM kernels add in.
template <typename T> std::vector<T> integers(int64_t N, unsigned Seed) {
  std::mt19937 Rng(Seed);
  std::uniform_int_distribution<int> D(-4, 4);
  std::vector<T> V(N);
  for (T &X : V)
    X = T(D(Rng));
  return V;
}

template <typename T> void checkKernel() {
  struct Case {
    int64_t M, N, K;
  };
  // Square and not, below, at and past the row block (64), ragged.
  for (Case S : {Case{5, 5, 3}, Case{64, 64, 8}, Case{130, 130, 17},
                 Case{67, 200, 33}, Case{200, 67, 130}, Case{1, 9, 4}})
    for (bool TA : {false, true})
      for (bool TB : {false, true})
        for (auto [Out, ZeroA] :
             {std::pair{true, false}, {false, true}, {true, true}}) {
          const int64_t Batch = 3;
          std::string What = formatv("{0}x{1}x{2} ta {3} tb {4} causal {5} "
                                     "causal_a {6}",
                                     S.M, S.N, S.K, TA, TB, Out, ZeroA);
          std::vector<T> A = integers<T>(Batch * S.M * S.K, 1),
                         B = integers<T>(Batch * S.K * S.N, 2);
          if (ZeroA) { // zero above the stored diagonal
            int64_t R = TA ? S.K : S.M, C = TA ? S.M : S.K;
            for (int64_t P = 0; P < Batch; ++P)
              for (int64_t I = 0; I < R; ++I)
                for (int64_t J = I + 1; J < C; ++J)
                  A[(P * R + I) * C + J] = 0;
          }
          std::vector<T> Want(Batch * S.M * S.N), Got(Want.size(), T(7));
          cpu::batchMatMul(Want.data(), A.data(), B.data(), Batch, S.M, S.N,
                           S.K, TA, TB);
          if (Out)
            for (int64_t P = 0; P < Batch; ++P)
              for (int64_t I = 0; I < S.M; ++I)
                for (int64_t J = I + 1; J < S.N; ++J)
                  Want[(P * S.M + I) * S.N + J] = 0;
          cpu::batchMatMul(Got.data(), A.data(), B.data(), Batch, S.M, S.N, S.K,
                           TA, TB, Out, ZeroA);
          EXPECT_EQ(Got, Want) << What;
        }
}

TEST(CausalProducts, KernelBlocksAreTheMaskedProduct) {
  checkKernel<float>();
  checkKernel<double>();
}

template <typename T> void checkDropout() {
  // [2 (of 4 rows: a microbatch's), 3 (of 9 heads: rank 1 of 3), 37, 37]:
  // the dropout's pieces of 1024 elements start inside rows.
  const std::vector<int64_t> Global{4, 9, 37, 37}, Local{2, 3, 37, 37},
      Offset{2, 3, 0, 0};
  for (bool Whole : {true, false}) {
    cpu::GlobalIndex G = Whole ? cpu::GlobalIndex::whole(Local)
                               : cpu::GlobalIndex::block(Global, Local, Offset);
    int64_t N = 2 * 3 * 37 * 37;
    std::vector<T> X(N);
    std::mt19937 Rng(3);
    std::uniform_real_distribution<double> D(0.5, 1.5);
    for (int64_t E = 0; E < N; ++E) // zero above the diagonal
      X[E] = E % 37 <= E / 37 % 37 ? T(D(Rng)) : T(0);
    cpu::DropoutKey K{99, 2, 1, 5};
    std::vector<T> Y0(N), Y1(N);
    std::vector<uint8_t> M0(N), M1(N, 7);
    ASSERT_TRUE(cpu::dropout(Y0.data(), M0.data(), X.data(), 0.3, K, G).ok());
    ASSERT_TRUE(cpu::dropout(Y1.data(), M1.data(), X.data(), 0.3, K, G,
                             static_cast<const T *>(nullptr), true)
                    .ok());
    int64_t Dropped = 0;
    for (int64_t E = 0; E < N; ++E) {
      bool Above = E % 37 > E / 37 % 37;
      if (Above)
        M0[E] = 0;
      else
        Dropped += !M0[E];
    }
    EXPECT_EQ(M1, M0) << (Whole ? "whole" : "block");
    EXPECT_EQ(Y1, Y0) << (Whole ? "whole" : "block");
    EXPECT_GT(Dropped, 0); // the draws below the diagonal did drop
  }
}

TEST(CausalProducts, CausalDropoutIsTheMaskBelowTheDiagonal) {
  checkDropout<float>();
  checkDropout<double>();
}

struct CoreOptions {
  DType T = DType::F32;
  bool Causal = true;
  double Fill = -std::numeric_limits<double>::infinity();
  bool ScoresOutput = false; // S also a program output
  bool MaskOutput = false;   // the dropout's mask also a program output
  bool WriteBetween = false; // an accumulate into D before O = D v
};

/// A causal attention core and its backward as the lowering writes them
/// (after fuseAttentionSoftmax): S = q k^T, P = softmax {causal} (S),
/// D = dropout (P), O = D v; dD = dO v^T, dV = D^T dO,
/// dS = softmax_grad {causal} (P, dropout_grad (dD)), dQ = dS k,
/// dK = dS^T q. Outputs O, dQ, dK, dV.
Program core(const CoreOptions &O) {
  const DType T = O.T;
  TensorType Head(T, {2, 3, 7, 4}), Scores(T, {2, 3, 7, 7});
  ProgramBuilder B(T);
  int Q = B.addBuffer("q", Head, ProgramBuffer::Input);
  int K = B.addBuffer("k", Head, ProgramBuffer::Input);
  int V = B.addBuffer("v", Head, ProgramBuffer::Input);
  int DO = B.addBuffer("do", Head, ProgramBuffer::Input);
  auto Bmm = [&](int X, int Y, TensorType R, bool TA, bool TB, Phase Ph,
                 const char *Role) {
    AttrList A;
    if (TA)
      A.set("trans_a", int64_t(1));
    if (TB)
      A.set("trans_b", int64_t(1));
    return B.emitRaw(OpKind::BatchMatMul, {X, Y}, {R}, A, tags(Ph, *parseRole(Role)),
                     Role)[0];
  };
  AttrList Soft;
  Soft.set("alpha", 0.5);
  if (O.Causal) {
    Soft.set("causal", int64_t(1));
    Soft.set("fill", O.Fill);
  }
  AttrList Drop;
  Drop.set("ratio", 0.25);
  Drop.set("key", std::vector<int64_t>{4, 5});
  int S = Bmm(Q, K, Scores, false, true, Phase::Forward, "qk");
  int P = B.emitRaw(OpKind::Softmax, {S}, {Scores}, Soft,
                    tags(Phase::Forward, Role::Softmax), "softmax")[0];
  auto D = B.emitRaw(OpKind::Dropout, {P},
                     {Scores, TensorType(DType::U8, Scores.Shape)}, Drop,
                     tags(Phase::Forward, Role::AttnCoreDropout), "dropout");
  if (O.WriteBetween)
    B.emitRaw(OpKind::Accumulate, {D[0], P}, {}, {},
              tags(Phase::Forward, Role::Av), "acc");
  int Out = Bmm(D[0], V, Head, false, false, Phase::Forward, "av");
  int DD = Bmm(DO, V, Scores, false, true, Phase::Backward, "av");
  int DV = Bmm(D[0], DO, Head, true, false, Phase::Backward, "av");
  AttrList DropGrad;
  DropGrad.set("ratio", 0.25);
  int G = B.emitRaw(OpKind::DropoutGrad, {DD, D[1]}, {Scores}, DropGrad,
                    tags(Phase::Backward, Role::AttnCoreDropout), "dgrad")[0];
  AttrList SoftGrad = Soft;
  if (O.Causal)
    SoftGrad.set("fill", 0.0);
  int DS = B.emitRaw(OpKind::SoftmaxGrad, {P, G}, {Scores}, SoftGrad,
                     tags(Phase::Backward, Role::Softmax), "sgrad")[0];
  int DQ = Bmm(DS, K, Head, false, false, Phase::Backward, "qk");
  int DK = Bmm(DS, Q, Head, true, false, Phase::Backward, "qk");
  B.output("o", Out);
  B.output("dq", DQ);
  B.output("dk", DK);
  B.output("dv", DV);
  if (O.ScoresOutput)
    B.output("s", S);
  if (O.MaskOutput)
    B.output("mask", D[1]);
  return B.take();
}

/// (causal, causal_a) of each batch_matmul, and (causal, -1) of each
/// dropout, in program order.
std::vector<std::pair<int, int>> marks(const Program &P) {
  std::vector<std::pair<int, int>> M;
  for (const Instruction &I : P.Instrs)
    if (I.Op == OpKind::BatchMatMul)
      M.push_back({int(attrInt(I.Op, I.Attrs, "causal")),
                   int(attrInt(I.Op, I.Attrs, "causal_a"))});
    else if (I.Op == OpKind::Dropout)
      M.push_back({int(attrInt(I.Op, I.Attrs, "causal")), -1});
  return M;
}

using Marks = std::vector<std::pair<int, int>>;

TEST(CausalProducts, TheAttentionCoreIsMarked) {
  Program P = core({});
  EXPECT_EQ(markCausalProducts(P), 7);
  // qk, dropout, av, dD, dV, dQ, dK
  EXPECT_EQ(marks(P),
            (Marks{{1, 0}, {1, -1}, {0, 1}, {1, 0}, {0, 1}, {0, 1}, {0, 1}}));
  EXPECT_EQ(markCausalProducts(P), 0); // a fixed point
  planMemory(P);
  auto Back = programFromJson(programToJson(P));
  ASSERT_TRUE(bool(Back)) << toString(Back.takeError());
  EXPECT_EQ(marks(*Back), marks(P));
}

TEST(CausalProducts, WhatIsNotKnownStaysUnmarked) {
  auto Count = [](const CoreOptions &O) {
    Program P = core(O);
    int N = markCausalProducts(P);
    return std::pair{N, marks(P)};
  };
  // A finite fill: the masked probabilities need not be 0, so neither the
  // products reading them nor dD (the softmax_grad's y is not known zero)
  // are marked; the scores (read by the causal softmax alone) and dS (its
  // masked gradient is alpha * 0) still are.
  {
    CoreOptions O;
    O.Fill = -1e4;
    EXPECT_EQ(
        Count(O),
        (std::pair{
            3,
            Marks{{1, 0}, {0, -1}, {0, 0}, {0, 0}, {0, 0}, {0, 1}, {0, 1}}}));
  }
  {
    CoreOptions O;
    O.Causal = false;
    EXPECT_EQ(Count(O).first, 0);
  }
  {
    CoreOptions O; // the scores are read by the program's caller too
    O.ScoresOutput = true;
    EXPECT_EQ(
        Count(O),
        (std::pair{
            6,
            Marks{{0, 0}, {1, -1}, {0, 1}, {1, 0}, {0, 1}, {0, 1}, {0, 1}}}));
  }
  {
    CoreOptions O; // the dropout mask is read by the program's caller too
    O.MaskOutput = true;
    EXPECT_EQ(
        Count(O),
        (std::pair{
            6,
            Marks{{1, 0}, {0, -1}, {0, 1}, {1, 0}, {0, 1}, {0, 1}, {0, 1}}}));
  }
  {
    CoreOptions O; // D is written between the dropout and its readers
    O.WriteBetween = true;
    EXPECT_EQ(
        Count(O),
        (std::pair{
            5,
            Marks{{1, 0}, {1, -1}, {0, 0}, {1, 0}, {0, 0}, {0, 1}, {0, 1}}}));
  }
  {
    CoreOptions O; // 16-bit plans keep their bf16 GEMMs
    O.T = DType::BF16;
    EXPECT_EQ(Count(O).first, 0);
  }
}

TEST(CausalProducts, MarkedCoreComputesTheSameValues) {
  // The marked products skip exact zeros and masked scores nobody reads,
  // so they change at most the order of float additions: each result is
  // compared with the unmarked program's by that program's own float32
  // rounding (its distance from the float64 run), as expectEqualRuns does.
  auto Run = [](DType T, bool Mark) {
    Program P = core({T});
    if (Mark) {
      EXPECT_EQ(markCausalProducts(P), 7);
    }
    planMemory(P);
    int64_t N = 2 * 3 * 7 * 4;
    std::map<std::string, std::vector<char>> In;
    unsigned Seed = 1;
    for (const char *Name : {"q", "k", "v", "do"}) {
      // The same values in both types (float32 ones, widened exactly).
      std::vector<char> F = randomBytes<float>(N, Seed++);
      if (T == DType::F64) {
        std::vector<double> D(N);
        for (int64_t I = 0; I < N; ++I)
          D[I] = reinterpret_cast<const float *>(F.data())[I];
        F.assign(reinterpret_cast<const char *>(D.data()),
                 reinterpret_cast<const char *>(D.data() + N));
      }
      In[Name] = std::move(F);
    }
    std::map<std::string, std::vector<double>> Out;
    for (auto &[Name, Bytes] : runOnCpu(P, In)) {
      auto &V = Out[Name];
      if (T == DType::F64)
        V.assign(reinterpret_cast<const double *>(Bytes.data()),
                 reinterpret_cast<const double *>(Bytes.data() + Bytes.size()));
      else
        V.assign(reinterpret_cast<const float *>(Bytes.data()),
                 reinterpret_cast<const float *>(Bytes.data() + Bytes.size()));
    }
    return Out;
  };
  auto Ref32 = Run(DType::F32, false), Ref64 = Run(DType::F64, false);
  auto Got32 = Run(DType::F32, true), Got64 = Run(DType::F64, true);
  for (const char *Name : {"o", "dq", "dk", "dv"}) {
    double Scale =
        std::max(test::relErr(Ref32[Name], Ref64[Name]), std::ldexp(1.0, -24));
    EXPECT_LE(test::relErr(Got32[Name], Ref32[Name]),
              test::ToleranceFactor * Scale)
        << Name;
    EXPECT_LE(test::relErr(Got64[Name], Ref64[Name]),
              test::ToleranceFactor * Scale * std::ldexp(1.0, -29))
        << Name;
  }
}

/// Marks over the plan's programs: causal and causal_a products, causal
/// dropouts.
std::array<int, 3> countMarks(const Plan &P) {
  std::array<int, 3> N{0, 0, 0};
  for (int S = 0; S < P.numStages(); ++S)
    for (const Instruction &I : P.stage(S).Instrs)
      if (I.Op == OpKind::BatchMatMul) {
        N[0] += attrInt(I.Op, I.Attrs, "causal");
        N[1] += attrInt(I.Op, I.Attrs, "causal_a");
      } else if (I.Op == OpKind::Dropout) {
        N[2] += attrInt(I.Op, I.Attrs, "causal");
      }
  return N;
}

/// The plan with every causal mark taken off.
Plan unmarked(Plan P) {
  auto Strip = [](Program &Prog) {
    for (Instruction &I : Prog.Instrs) {
      if (I.Op == OpKind::BatchMatMul)
        I.Attrs.set("causal_a", int64_t(0));
      if (I.Op == OpKind::BatchMatMul || I.Op == OpKind::Dropout)
        I.Attrs.set("causal", int64_t(0));
    }
  };
  Strip(P.Prog);
  for (Program &S : P.Stages)
    Strip(S);
  return P;
}

TEST(CausalProducts, TheDefaultModelTrainsAsUnmarked) {
  struct Form {
    const char *Name;
    RecomputeMode Mode;
    int Stages;
    std::array<int, 3> Want; // over the two layers
  };
  // Per layer: the scores (and recomputed scores) and dD are causal; O, dV,
  // dQ and dK read zeros above the diagonal; the core's dropouts (forward
  // and recomputed) draw below the diagonal only. A pipelined backward
  // reads the forward's probabilities and mask from another template (the
  // slots): marked the same, once the templates are assembled.
  for (Form F : {Form{"none", RecomputeMode::None, 1, {4, 8, 2}},
                 Form{"selective", RecomputeMode::Selective, 1, {6, 8, 4}},
                 Form{"full", RecomputeMode::Full, 1, {6, 10, 4}},
                 Form{"pipeline", RecomputeMode::None, 2, {4, 8, 2}},
                 Form{"pipeline, selective", RecomputeMode::Selective, 2,
                      {6, 8, 4}}}) {
    PassContext Ctx;
    Ctx.Recompute.Mode = F.Mode;
    if (F.Stages > 1) {
      Ctx.Pipeline.Stages = F.Stages;
      Ctx.Pipeline.Microbatches = 2;
    }
    Plan Marked = test::compile(test::TinyModel, Ctx);
    EXPECT_EQ(countMarks(Marked), F.Want) << F.Name;
    Plan Plain = unmarked(Marked);
    EXPECT_EQ(countMarks(Plain), (std::array<int, 3>{0, 0, 0}));
    SCOPED_TRACE(F.Name);
    test::expectEqualRuns(test::trainBoth(Marked, 0.1, 3),
                          test::trainBoth(Plain, 0.1, 3));
  }
}

/// Exports a transformers-style model (models/export_family.py --family
/// Family, 2 layers, h 64, 4 heads, s 32, v 64, b 2, with Extra), expects
/// Want marks in its plan, and trains it marked and unmarked.
void expectExportTrainsAsUnmarked(StringRef Family,
                                  ArrayRef<StringRef> Extra,
                                  std::array<int, 3> Want) {
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("sp-causal-hf", Dir));
  std::string Model = (Dir + "/" + Family + ".onnx").str();
  std::vector<StringRef> Args = {
      SP_SOURCE_DIR "/models/export_family.py", "--family", Family, "-o",
      Model, "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32",
      "--vocab", "64", "--batch", "2"};
  Args.insert(Args.end(), Extra.begin(), Extra.end());
  ASSERT_TRUE(test::runPython(Args))
      << "the torch export failed (is python3-torch installed?)";
  PassContext Ctx;
  Plan Marked = test::compile(Model, Ctx);
  EXPECT_EQ(countMarks(Marked), Want);
  test::expectEqualRuns(test::trainBoth(Marked, 0.1, 3),
                        test::trainBoth(unmarked(Marked), 0.1, 3));
  sys::fs::remove_directories(Dir);
}

TEST(CausalProducts, AnHfGpt2ExportTrainsAsUnmarked) {
  // GPT2LMHeadModel as transformers writes it (models/hf_gpt2.py) masks
  // with torch.finfo(float32).min, not -inf: its masked probabilities need
  // not be exactly 0 (a row whose kept scores all overflowed to -inf would
  // spread over every key), so only the scores (read by the causal softmax
  // alone) and dS k, dS^T q (the gradient's masked half is alpha * 0) are
  // marked.
  expectExportTrainsAsUnmarked("gpt2", {"--dropout", "0.1"}, {2, 4, 0});
}

TEST(CausalProducts, AnHfLlamaExportTrainsAsUnmarked) {
  // LlamaForCausalLM as transformers writes it (models/llama.py), with
  // grouped keys and values (4 query heads over 2, repeat_kv), rotary
  // embeddings, and no dropout: its causal mask is torch.finfo(float32).min
  // too, so the same products as GPT-2's are marked, here over the
  // repeated heads.
  expectExportTrainsAsUnmarked("llama", {"--kv-heads", "2"}, {2, 4, 0});
}

} // namespace
