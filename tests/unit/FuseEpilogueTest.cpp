//===- FuseEpilogueTest.cpp - GELU in the GEMM's epilogue -----------------===//
//
// lower/FuseEpilogue.cpp on hand-built programs (what fuses, what is left
// alone, the compaction), the CPU backend's fused kernels against the
// unfused pairs bit for bit (float32 and float64; both GELU forms, shapes
// the GEMM runs as one block and as tiles with ragged edges; dropout + add
// with the residual on either side), and the compiled default model in its
// forms.
//
//===----------------------------------------------------------------------===//
#include "ProgramRun.h"
#include "frontend/OnnxImporter.h"
#include "lower/FuseEpilogue.h"
#include "lower/MemoryPlan.h"
#include "lower/ProgramBuilder.h"
#include "driver/Compile.h"
#include "llvm/Support/FormatVariadic.h"
#include "gtest/gtest.h"
#include <algorithm>

using namespace sp;
using namespace llvm;
using namespace sp::test;

namespace {

struct MlpShape {
  int64_t Rows, In, Hidden;
  bool TransW;
};

AttrList linearAttrs(bool TransW) {
  AttrList A;
  A.set("trans_w", int64_t(TransW));
  return A;
}

AttrList geluAttrs(const char *Approx) {
  AttrList A;
  A.set("approximate", std::string(Approx));
  return A;
}

/// An MLP's first linear and GELU, and their backward as autodiff lowers
/// it: z = linear(x, w1, b1), y = gelu(z); d = linear(dy, w2) (the second
/// linear's input gradient), dz = gelu_grad(z, d). Outputs z, y, dz.
Program mlp(const MlpShape &S, const char *Approx, DType T = DType::F32,
            Phase Back = Phase::Backward) {
  ProgramBuilder B(T);
  auto W = [&](int64_t A, int64_t C) {
    return S.TransW ? TensorType(T, {C, A}) : TensorType(T, {A, C});
  };
  TensorType Hid(T, {S.Rows, S.Hidden}), Io(T, {S.Rows, S.In});
  int X = B.addBuffer("x", Io, ProgramBuffer::Input);
  int W1 = B.addBuffer("w1", W(S.In, S.Hidden), ProgramBuffer::Input);
  int B1 = B.addBuffer("b1", TensorType(T, {S.Hidden}), ProgramBuffer::Input);
  // The second linear maps hidden -> in; its input gradient maps back.
  int W2 = B.addBuffer("w2", W(S.Hidden, S.In), ProgramBuffer::Input);
  int DY = B.addBuffer("dy", Io, ProgramBuffer::Input);
  int Z = B.emitRaw(OpKind::Linear, {X, W1, B1}, {Hid}, linearAttrs(S.TransW),
                    tags(Phase::Forward, Role::Fc1), "fc1")[0];
  int Y = B.emitRaw(OpKind::Gelu, {Z}, {Hid}, geluAttrs(Approx),
                    tags(Phase::Forward, Role::Act), "gelu")[0];
  int D = B.emitRaw(OpKind::Linear, {DY, W2}, {Hid}, linearAttrs(!S.TransW),
                    tags(Back, Role::Fc2), "fc2")[0];
  int DZ = B.emitRaw(OpKind::GeluGrad, {Z, D}, {Hid}, geluAttrs(Approx),
                     tags(Back, Role::Act), "gelu")[0];
  B.output("z", Z);
  B.output("y", Y);
  B.output("dz", DZ);
  return B.take();
}

TEST(FuseEpilogue, LinearAndGeluBecomeOneInstructionEachWay) {
  Program P = mlp({6, 4, 10, true}, "tanh");
  ASSERT_EQ(P.Instrs.size(), 4u);
  size_t Buffers = P.Buffers.size();
  EXPECT_EQ(fuseEpilogues(P), 2);
  ASSERT_EQ(P.Instrs.size(), 2u);
  // The backward's intermediate d is gone; z is kept for the gradient.
  EXPECT_EQ(P.Buffers.size(), Buffers - 1);
  const Instruction &F = P.Instrs[0], &B = P.Instrs[1];
  EXPECT_EQ(F.Op, OpKind::LinearGelu);
  EXPECT_EQ(F.Role, Role::Fc1);
  ASSERT_EQ(F.In.size(), 3u);
  ASSERT_EQ(F.Out.size(), 2u);
  EXPECT_EQ(P.Buffers[F.In[0]].Name, "x");
  EXPECT_EQ(P.Buffers[F.In[2]].Name, "b1");
  EXPECT_EQ(attrInt(F.Op, F.Attrs, "trans_w"), 1);
  EXPECT_EQ(attrString(F.Op, F.Attrs, "approximate"), "tanh");
  EXPECT_EQ(B.Op, OpKind::LinearGeluGrad);
  EXPECT_EQ(B.Ph, Phase::Backward);
  ASSERT_EQ(B.In.size(), 3u);
  EXPECT_EQ(P.Buffers[B.In[0]].Name, "dy");
  EXPECT_EQ(P.Buffers[B.In[1]].Name, "w2");
  EXPECT_EQ(B.In[2], F.Out[0]); // z
  EXPECT_EQ(attrInt(B.Op, B.Attrs, "trans_w"), 0);
  EXPECT_EQ(P.Outputs[0].second, F.Out[0]);
  EXPECT_EQ(P.Outputs[1].second, F.Out[1]);
  EXPECT_EQ(P.Outputs[2].second, B.Out[0]);
  expectSettled(P, fuseEpilogues);
}

TEST(FuseEpilogue, CpuKernelsGiveTheUnfusedBits) {
  // One block (6 x 10), and tiles with ragged edges (300 x 260, K 64:
  // cpu::gemmTiles cuts it into 256 + 44 rows).
  for (MlpShape S : {MlpShape{6, 4, 10, true}, MlpShape{6, 4, 10, false},
                     MlpShape{300, 64, 260, true},
                     MlpShape{300, 260, 64, false}})
    for (DType T : {DType::F32, DType::F64})
      for (const char *Approx : {"none", "tanh"}) {
        std::string What = formatv("{0}x{1}x{2} trans_w {3} {4} {5}", S.Rows,
                                   S.In, S.Hidden, S.TransW, dtypeName(T),
                                   Approx);
        Program Ref = mlp(S, Approx, T), Fused = mlp(S, Approx, T);
        ASSERT_EQ(fuseEpilogues(Fused), 2) << What;
        planMemory(Ref);
        planMemory(Fused);
        auto Random = [&](int64_t N, unsigned Seed) {
          return T == DType::F32 ? randomBytes<float>(N, Seed)
                                 : randomBytes<double>(N, Seed);
        };
        std::map<std::string, std::vector<char>> In{
            {"x", Random(S.Rows * S.In, 1)},
            {"w1", Random(S.In * S.Hidden, 2)},
            {"b1", Random(S.Hidden, 3)},
            {"w2", Random(S.Hidden * S.In, 4)},
            {"dy", Random(S.Rows * S.In, 5)}};
        auto Want = runOnCpu(Ref, In), Got = runOnCpu(Fused, In);
        for (const char *Name : {"z", "y", "dz"})
          EXPECT_EQ(Got[Name], Want[Name]) << What << ": " << Name;
        // One temporary fewer: the arena does not grow.
        EXPECT_LE(Fused.ArenaBytes, Ref.ArenaBytes) << What;
      }
}

TEST(FuseEpilogue, UnfusablePairsAreLeftAlone) {
  MlpShape S{6, 4, 10, true};
  auto Unchanged = [](Program P, const char *What) {
    Program Before = P;
    EXPECT_EQ(fuseEpilogues(P), 0) << What;
    EXPECT_EQ(programToJson(P), programToJson(Before)) << What;
  };
  // bf16: z is rounded to 16 bits before the GELU reads it.
  Unchanged(mlp(S, "none", DType::BF16), "bf16");
  {
    // The linear's result read again: the backward's d has a second
    // reader, the forward's z a reader before the gelu (which stays fused:
    // z is kept anyway).
    Program P = mlp(S, "none");
    P.Outputs.push_back({"d", P.Instrs[2].Out[0]});
    EXPECT_EQ(fuseEpilogues(P), 1) << "d read twice";
    EXPECT_EQ(P.Instrs[0].Op, OpKind::LinearGelu);
    EXPECT_EQ(P.Instrs[2].Op, OpKind::GeluGrad);
  }
  {
    // The forward linear and gelu, and the backward pair, in different
    // phases.
    Program P = mlp(S, "none", DType::F32, Phase::Recompute);
    P.Instrs[3].Ph = Phase::Backward;
    P.Instrs[1].Ph = Phase::Recompute;
    Unchanged(P, "phases");
  }
  {
    // A vocabulary-parallel head's linear (valid_vocab).
    Program P = mlp(S, "none");
    P.Instrs[0].Attrs.set("valid_vocab", int64_t(8));
    P.Instrs[2].Attrs.set("valid_vocab", int64_t(3));
    Unchanged(P, "valid_vocab");
  }
  {
    // An accumulate between the backward pair writes the linear's dy.
    Program P = mlp(S, "none");
    Instruction Acc;
    Acc.Op = OpKind::Accumulate;
    int DY = P.findBuffer("dy");
    Acc.In = {DY, DY};
    Acc.Ph = Phase::Backward;
    P.Instrs.insert(P.Instrs.begin() + 3, Acc);
    computeLiveRanges(P);
    EXPECT_EQ(fuseEpilogues(P), 1) << "accumulate between";
    EXPECT_EQ(P.Instrs.back().Op, OpKind::GeluGrad);
  }
}

/// A dropout and a residual add: d, mask = dropout(x), h = add(d, r) (or
/// add(r, d) with ResidualFirst); outputs h and the mask. R is the residual's
/// shape (a broadcast when it is not x's).
Program dropoutAdd(DType T, bool ResidualFirst, std::vector<int64_t> R = {}) {
  TensorType X(T, {5, 3, 40});
  TensorType Res = R.empty() ? X : TensorType(T, R);
  ProgramBuilder B(T);
  int In = B.addBuffer("x", X, ProgramBuffer::Input);
  int Rb = B.addBuffer("r", Res, ProgramBuffer::Input);
  AttrList A;
  A.set("ratio", 0.25);
  A.set("key", std::vector<int64_t>{2, 3});
  auto D = B.emitRaw(OpKind::Dropout, {In},
                     {X, TensorType(DType::U8, X.Shape)}, A,
                     tags(Phase::Forward, Role::MlpDropout), "dropout");
  SmallVector<int, 2> Ops = {D[0], Rb};
  if (ResidualFirst)
    std::swap(Ops[0], Ops[1]);
  int H = B.emitRaw(OpKind::Add, Ops, {X}, {}, tags(Phase::Forward, Role::Residual2),
                    "add")[0];
  B.output("h", H);
  B.output("mask", D[1]);
  return B.take();
}

TEST(FuseEpilogue, DropoutAndResidualAddBecomeOneInstruction) {
  for (DType T : {DType::F32, DType::F64})
    for (bool ResidualFirst : {false, true}) {
      std::string What = formatv("{0} residual {1}", dtypeName(T),
                                 ResidualFirst ? "first" : "second");
      Program Ref = dropoutAdd(T, ResidualFirst), P = Ref;
      size_t Buffers = P.Buffers.size();
      ASSERT_EQ(fuseEpilogues(P), 1) << What;
      ASSERT_EQ(P.Instrs.size(), 1u);
      const Instruction &F = P.Instrs[0];
      EXPECT_EQ(F.Op, OpKind::DropoutAdd);
      EXPECT_EQ(F.Role, Role::MlpDropout);
      EXPECT_EQ(P.Buffers[F.In[0]].Name, "x");
      EXPECT_EQ(P.Buffers[F.In[1]].Name, "r");
      EXPECT_EQ(attrFloat(F.Op, F.Attrs, "ratio"), 0.25);
      EXPECT_EQ(attrInts(F.Op, F.Attrs, "key"), (std::vector<int64_t>{2, 3}));
      // The dropped-out d is gone.
      EXPECT_EQ(P.Buffers.size(), Buffers - 1);
      EXPECT_EQ(P.Outputs[0].second, F.Out[0]);
      EXPECT_EQ(P.Outputs[1].second, F.Out[1]);
      expectSettled(P, fuseEpilogues);
      planMemory(Ref);
      EXPECT_LT(P.ArenaBytes, Ref.ArenaBytes);
      int64_t N = 5 * 3 * 40;
      auto Random = [&](unsigned Seed) {
        return T == DType::F32 ? randomBytes<float>(N, Seed)
                               : randomBytes<double>(N, Seed);
      };
      std::map<std::string, std::vector<char>> In{{"x", Random(1)},
                                                  {"r", Random(2)}};
      auto Want = runOnCpu(Ref, In), Got = runOnCpu(P, In);
      EXPECT_EQ(Got["h"], Want["h"]) << What;
      EXPECT_EQ(Got["mask"], Want["mask"]) << What;
      // Dropout did drop (the test would not see a missing mask otherwise).
      EXPECT_NE(std::count(Want["mask"].begin(), Want["mask"].end(), 0), 0);
    }
}

TEST(FuseEpilogue, UnfusableDropoutAddsAreLeftAlone) {
  auto Unchanged = [](Program P, const char *What) {
    Program Before = P;
    EXPECT_EQ(fuseEpilogues(P), 0) << What;
    EXPECT_EQ(programToJson(P), programToJson(Before)) << What;
  };
  Unchanged(dropoutAdd(DType::BF16, false), "bf16");
  Unchanged(dropoutAdd(DType::F32, false, {40}), "broadcast residual");
  {
    Program P = dropoutAdd(DType::F32, false);
    P.Outputs.push_back({"d", P.Instrs[0].Out[0]});
    Unchanged(P, "dropped-out value read twice");
  }
  {
    // The mask read between the two.
    Program P = dropoutAdd(DType::F32, false);
    Instruction Grad;
    Grad.Op = OpKind::DropoutGrad;
    Grad.In = {P.findBuffer("x"), P.Instrs[0].Out[1]};
    Grad.Out = {P.findBuffer("r")};
    Grad.Ph = Phase::Forward;
    P.Instrs.insert(P.Instrs.begin() + 1, Grad);
    Unchanged(P, "mask read between");
  }
}

/// The default model (two layers) compiled with Ctx: every gelu and
/// gelu_grad is fused, into WantForward linear_gelu and WantBackward
/// linear_gelu_grad, and WantDropAdd dropout_add.
void expectFusedModel(PassContext &Ctx, int WantForward, int WantBackward,
                      int WantDropAdd) {
  int Forward = 0, Backward = 0, DropAdd = 0;
  for (const Program &Flat : defaultModelPrograms(Ctx)) {
    for (const Instruction &I : Flat.Instrs) {
      EXPECT_NE(I.Op, OpKind::Gelu);
      EXPECT_NE(I.Op, OpKind::GeluGrad);
      Forward += I.Op == OpKind::LinearGelu;
      Backward += I.Op == OpKind::LinearGeluGrad;
      DropAdd += I.Op == OpKind::DropoutAdd;
    }
  }
  EXPECT_EQ(Forward, WantForward);
  EXPECT_EQ(Backward, WantBackward);
  EXPECT_EQ(DropAdd, WantDropAdd);
}

TEST(FuseEpilogue, TheDefaultModelInEveryForm) {
  // Each layer's two residual branches end in dropout + add.
  {
    PassContext Ctx;
    expectFusedModel(Ctx, 2, 2, 4);
  }
  {
    // Selective recomputes the attention core only; full the whole layer,
    // its MLP's linear and GELU too, and the attention branch's dropout +
    // add (the MLP branch's dropout is recomputed for its mask alone: the
    // layer's output is kept, so its add is not recomputed).
    PassContext Ctx;
    Ctx.Recompute.Mode = RecomputeMode::Selective;
    expectFusedModel(Ctx, 2, 2, 4);
  }
  {
    PassContext Ctx;
    Ctx.Recompute.Mode = RecomputeMode::Full;
    expectFusedModel(Ctx, 4, 2, 6);
  }
  {
    PassContext Ctx;
    Ctx.Pipeline.Stages = 2;
    Ctx.Pipeline.Microbatches = 2;
    expectFusedModel(Ctx, 4, 4, 8);
  }
}

} // namespace
