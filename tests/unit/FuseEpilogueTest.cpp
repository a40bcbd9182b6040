//===- FuseEpilogueTest.cpp - GELU in the GEMM's epilogue -----------------===//
//
// lower/FuseEpilogue.cpp on hand-built programs (what fuses, what is left
// alone, the compaction), the CPU backend's fused kernels against the
// unfused pair bit for bit (float32 and float64, both GELU forms, shapes
// the GEMM runs as one block and as tiles with ragged edges), and the
// compiled default model in its forms.
//
//===----------------------------------------------------------------------===//
#include "ProgramRun.h"
#include "frontend/OnnxImporter.h"
#include "lower/FuseEpilogue.h"
#include "lower/MemoryPlan.h"
#include "lower/ProgramBuilder.h"
#include "passes/Compile.h"
#include "llvm/Support/FormatVariadic.h"
#include "gtest/gtest.h"

using namespace sp;
using namespace llvm;
using namespace sp::testing;

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
                    tags(Phase::Forward, "fc1"), "fc1")[0];
  int Y = B.emitRaw(OpKind::Gelu, {Z}, {Hid}, geluAttrs(Approx),
                    tags(Phase::Forward, "gelu"), "gelu")[0];
  int D = B.emitRaw(OpKind::Linear, {DY, W2}, {Hid}, linearAttrs(!S.TransW),
                    tags(Back, "fc2"), "fc2")[0];
  int DZ = B.emitRaw(OpKind::GeluGrad, {Z, D}, {Hid}, geluAttrs(Approx),
                     tags(Back, "gelu"), "gelu")[0];
  B.output("z", Z);
  B.output("y", Y);
  B.output("dz", DZ);
  return B.take();
}

TEST(FuseEpilogue, LinearAndGeluBecomeOneInstructionEachWay) {
  Program P = mlp({6, 4, 10, true}, "tanh");
  ASSERT_EQ(P.Instrs.size(), 4u);
  size_t Buffers = P.Buffers.size();
  EXPECT_EQ(fuseGeluEpilogues(P), 2);
  ASSERT_EQ(P.Instrs.size(), 2u);
  // The backward's intermediate d is gone; z is kept for the gradient.
  EXPECT_EQ(P.Buffers.size(), Buffers - 1);
  const Instruction &F = P.Instrs[0], &B = P.Instrs[1];
  EXPECT_EQ(F.Op, OpKind::LinearGelu);
  EXPECT_EQ(F.Role, "fc1");
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
  expectConsistent(P);
  EXPECT_EQ(fuseGeluEpilogues(P), 0);
  // The fused ops' shape rules accept what the pass wrote.
  planMemory(P);
  auto Back = programFromJson(programToJson(P));
  ASSERT_TRUE(bool(Back)) << toString(Back.takeError());
  EXPECT_EQ(Back->Instrs.size(), 2u);
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
        ASSERT_EQ(fuseGeluEpilogues(Fused), 2) << What;
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
    EXPECT_EQ(fuseGeluEpilogues(P), 0) << What;
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
    EXPECT_EQ(fuseGeluEpilogues(P), 1) << "d read twice";
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
    EXPECT_EQ(fuseGeluEpilogues(P), 1) << "accumulate between";
    EXPECT_EQ(P.Instrs.back().Op, OpKind::GeluGrad);
  }
}

/// The default model (two layers) compiled with Ctx: every gelu and
/// gelu_grad is fused, Want[0] linear_gelu and Want[1] linear_gelu_grad.
void expectFusedModel(PassContext &Ctx, int WantForward, int WantBackward) {
  registerOnnxDataLoader();
  auto G = cantFail(
      importOnnx(SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx", ImportOptions()));
  auto C = compileToPlan(*G, Ctx, CompileOptions());
  ASSERT_TRUE(bool(C)) << toString(C.takeError());
  const Plan &Pl = *C->P;
  int Forward = 0, Backward = 0;
  for (int S = 0; S < Pl.numStages(); ++S) {
    auto Flat = expandProgram(Pl.stage(S));
    ASSERT_TRUE(bool(Flat)) << toString(Flat.takeError());
    for (const Instruction &I : Flat->Instrs) {
      EXPECT_NE(I.Op, OpKind::Gelu);
      EXPECT_NE(I.Op, OpKind::GeluGrad);
      Forward += I.Op == OpKind::LinearGelu;
      Backward += I.Op == OpKind::LinearGeluGrad;
    }
    expectConsistent(*Flat);
  }
  EXPECT_EQ(Forward, WantForward);
  EXPECT_EQ(Backward, WantBackward);
}

TEST(FuseEpilogue, TheDefaultModelInEveryForm) {
  {
    PassContext Ctx;
    expectFusedModel(Ctx, 2, 2);
  }
  {
    // Selective recomputes the attention core only; full the whole layer,
    // its MLP's linear and GELU too.
    PassContext Ctx;
    Ctx.Recompute.Mode = RecomputeMode::Selective;
    expectFusedModel(Ctx, 2, 2);
  }
  {
    PassContext Ctx;
    Ctx.Recompute.Mode = RecomputeMode::Full;
    expectFusedModel(Ctx, 4, 2);
  }
  {
    PassContext Ctx;
    Ctx.Pipeline.Stages = 2;
    Ctx.Pipeline.Microbatches = 2;
    expectFusedModel(Ctx, 4, 4);
  }
}

} // namespace
