//===- FuseSoftmaxTest.cpp - The attention core's fused softmax ----------===//
//
// lower/FuseSoftmax.cpp on hand-built programs (what fuses, what is left
// alone, the compaction of buffers and live ranges), the CPU backend's fused
// kernels against the unfused sequence bit for bit (float32 and float64),
// and the compiled default model in its forward, selective and full
// recompute, and pipelined forms.
//
//===----------------------------------------------------------------------===//
#include "ProgramRun.h"
#include "frontend/OnnxImporter.h"
#include "lower/FuseSoftmax.h"
#include "lower/MemoryPlan.h"
#include "lower/ProgramBuilder.h"
#include "driver/Compile.h"
#include "llvm/ADT/ScopeExit.h"
#include "gtest/gtest.h"

using namespace sp;
using namespace llvm;
using namespace sp::test;

namespace {

AttrList floatAttr(const char *Name, double V) {
  AttrList A;
  A.set(Name, V);
  return A;
}

const TensorType Scores(DType::F32, {2, 3, 5, 5});

/// The attention core's forward and backward as autodiff lowers them:
/// y = softmax(causal_mask(scale(x))), dx = scale(causal_mask(
/// softmax_grad(y, dy))); outputs y and dx.
Program attentionCore(DType T = DType::F32) {
  TensorType S(T, Scores.Shape);
  ProgramBuilder B(T);
  int X = B.addBuffer("x", S, ProgramBuffer::Input);
  int DY = B.addBuffer("dy", S, ProgramBuffer::Input);
  int S1 = B.emitRaw(OpKind::Scale, {X}, {S}, floatAttr("alpha", 0.125),
                     tags(Phase::Forward, Role::Scale), "scale")[0];
  int M1 = B.emitRaw(OpKind::CausalMask, {S1}, {S},
                     floatAttr("fill", -INFINITY),
                     tags(Phase::Forward, Role::Mask), "mask")[0];
  int Y = B.emitRaw(OpKind::Softmax, {M1}, {S}, {},
                    tags(Phase::Forward, Role::Softmax), "softmax")[0];
  int G = B.emitRaw(OpKind::SoftmaxGrad, {Y, DY}, {S}, {},
                    tags(Phase::Backward, Role::Softmax), "softmax")[0];
  int M2 = B.emitRaw(OpKind::CausalMask, {G}, {S}, floatAttr("fill", 0.0),
                     tags(Phase::Backward, Role::Mask), "mask")[0];
  int DX = B.emitRaw(OpKind::Scale, {M2}, {S}, floatAttr("alpha", 0.125),
                     tags(Phase::Backward, Role::Scale), "scale")[0];
  B.output("y", Y);
  B.output("dx", DX);
  return B.take();
}

TEST(FuseSoftmax, ForwardAndBackwardChainsBecomeOneInstructionEach) {
  Program P = attentionCore();
  ASSERT_EQ(P.Instrs.size(), 6u);
  ASSERT_EQ(P.Buffers.size(), 8u);
  EXPECT_EQ(fuseAttentionSoftmax(P), 4);
  ASSERT_EQ(P.Instrs.size(), 2u);
  // The four intermediates are gone: x, dy, y, dx remain.
  ASSERT_EQ(P.Buffers.size(), 4u);
  const Instruction &F = P.Instrs[0], &B = P.Instrs[1];
  EXPECT_EQ(F.Op, OpKind::Softmax);
  EXPECT_EQ(F.Ph, Phase::Forward);
  EXPECT_EQ(P.Buffers[F.In[0]].Name, "x");
  EXPECT_EQ(attrFloat(F.Op, F.Attrs, "alpha"), 0.125);
  EXPECT_EQ(attrInt(F.Op, F.Attrs, "causal"), 1);
  EXPECT_EQ(attrFloat(F.Op, F.Attrs, "fill"), -INFINITY);
  EXPECT_EQ(B.Op, OpKind::SoftmaxGrad);
  EXPECT_EQ(B.Ph, Phase::Backward);
  EXPECT_EQ(B.In[0], F.Out[0]);
  EXPECT_EQ(P.Buffers[B.In[1]].Name, "dy");
  EXPECT_EQ(attrFloat(B.Op, B.Attrs, "alpha"), 0.125);
  EXPECT_EQ(attrInt(B.Op, B.Attrs, "causal"), 1);
  EXPECT_EQ(attrFloat(B.Op, B.Attrs, "fill"), 0.0);
  EXPECT_EQ(P.Outputs[0].second, F.Out[0]);
  EXPECT_EQ(P.Outputs[1].second, B.Out[0]);
  expectSettled(P, fuseAttentionSoftmax);
}

TEST(FuseSoftmax, CpuKernelsGiveTheUnfusedBits) {
  for (DType T : {DType::F32, DType::F64}) {
    Program Ref = attentionCore(T), Fused = attentionCore(T);
    ASSERT_EQ(fuseAttentionSoftmax(Fused), 4);
    planMemory(Ref);
    planMemory(Fused);
    int64_t N = Scores.numElements();
    std::map<std::string, std::vector<char>> In;
    In["x"] = T == DType::F32 ? randomBytes<float>(N, 1)
                              : randomBytes<double>(N, 1);
    In["dy"] = T == DType::F32 ? randomBytes<float>(N, 2)
                               : randomBytes<double>(N, 2);
    auto Want = runOnCpu(Ref, In), Got = runOnCpu(Fused, In);
    EXPECT_EQ(Got["y"], Want["y"]) << dtypeName(T).str();
    EXPECT_EQ(Got["dx"], Want["dx"]) << dtypeName(T).str();
    // Fewer temporaries: the arena does not grow.
    EXPECT_LE(Fused.ArenaBytes, Ref.ArenaBytes);
  }
}

TEST(FuseSoftmax, ScaleOrMaskAloneFuses) {
  ProgramBuilder B(DType::F32);
  int X = B.addBuffer("x", Scores, ProgramBuffer::Input);
  int S = B.emitRaw(OpKind::Scale, {X}, {Scores}, floatAttr("alpha", 0.5),
                    tags(Phase::Recompute, Role::Scale), "scale")[0];
  int Y = B.emitRaw(OpKind::Softmax, {S}, {Scores}, {},
                    tags(Phase::Recompute, Role::Softmax), "softmax")[0];
  int M = B.emitRaw(OpKind::CausalMask, {X}, {Scores}, floatAttr("fill", -1e4),
                    tags(Phase::Forward, Role::Mask), "mask")[0];
  int Z = B.emitRaw(OpKind::Softmax, {M}, {Scores}, {},
                    tags(Phase::Forward, Role::Softmax), "softmax")[0];
  B.output("y", Y);
  B.output("z", Z);
  Program P = B.take();
  Program Ref = P;
  EXPECT_EQ(fuseAttentionSoftmax(P), 2);
  ASSERT_EQ(P.Instrs.size(), 2u);
  EXPECT_EQ(P.Instrs[0].Ph, Phase::Recompute);
  EXPECT_EQ(attrFloat(OpKind::Softmax, P.Instrs[0].Attrs, "alpha"), 0.5);
  EXPECT_FALSE(P.Instrs[0].Attrs.has("causal"));
  EXPECT_FALSE(P.Instrs[1].Attrs.has("alpha"));
  EXPECT_EQ(attrInt(OpKind::Softmax, P.Instrs[1].Attrs, "causal"), 1);
  expectConsistent(P);
  planMemory(P);
  planMemory(Ref);
  std::map<std::string, std::vector<char>> In{
      {"x", randomBytes<float>(Scores.numElements(), 3)}};
  auto Want = runOnCpu(Ref, In), Got = runOnCpu(P, In);
  EXPECT_EQ(Got["y"], Want["y"]);
  EXPECT_EQ(Got["z"], Want["z"]);
}

TEST(FuseSoftmax, UnfusableChainsAreLeftAlone) {
  // The scale's result has a second reader; the mask's result is an output;
  // a padding mask sits between the scale and the softmax; the backward
  // softmax_grad's result has a second reader. (A chain stops at the first
  // intermediate with two readers: with the backward mask's result read
  // twice, softmax_grad and the mask would fuse, the scale not.)
  ProgramBuilder B(DType::F32);
  int X = B.addBuffer("x", Scores, ProgramBuffer::Input);
  int Keep = B.addBuffer("keep", TensorType(DType::I64, {2, 5}),
                         ProgramBuffer::Input);
  int DY = B.addBuffer("dy", Scores, ProgramBuffer::Input);
  Tags F = tags(Phase::Forward, Role::None), Bw = tags(Phase::Backward, Role::None);
  int S1 = B.emitRaw(OpKind::Scale, {X}, {Scores}, floatAttr("alpha", 2), F,
                     "s1")[0];
  int Y1 = B.emitRaw(OpKind::Softmax, {S1}, {Scores}, {}, F, "y1")[0];
  int A1 = B.emitRaw(OpKind::Add, {S1, Y1}, {Scores}, {}, F, "a1")[0];
  int M2 = B.emitRaw(OpKind::CausalMask, {X}, {Scores}, floatAttr("fill", -9),
                     F, "m2")[0];
  int Y2 = B.emitRaw(OpKind::Softmax, {M2}, {Scores}, {}, F, "y2")[0];
  int S3 = B.emitRaw(OpKind::Scale, {X}, {Scores}, floatAttr("alpha", 2), F,
                     "s3")[0];
  int P3 = B.emitRaw(OpKind::PaddingMask, {S3, Keep}, {Scores},
                     floatAttr("fill", -9), F, "p3")[0];
  int Y3 = B.emitRaw(OpKind::Softmax, {P3}, {Scores}, {}, F, "y3")[0];
  int G4 = B.emitRaw(OpKind::SoftmaxGrad, {Y3, DY}, {Scores}, {}, Bw, "g4")[0];
  int M4 = B.emitRaw(OpKind::CausalMask, {G4}, {Scores}, floatAttr("fill", 0),
                     Bw, "m4")[0];
  int D4 = B.emitRaw(OpKind::Scale, {M4}, {Scores}, floatAttr("alpha", 2), Bw,
                     "d4")[0];
  int E4 = B.emitRaw(OpKind::Add, {G4, D4}, {Scores}, {}, Bw, "e4")[0];
  B.output("a1", A1);
  B.output("m2", M2);
  B.output("y2", Y2);
  B.output("e4", E4);
  Program P = B.take();
  Program Before = P;
  EXPECT_EQ(fuseAttentionSoftmax(P), 0);
  EXPECT_EQ(programToJson(P), programToJson(Before));
}

TEST(FuseSoftmax, PhasesAreNotMixed) {
  // A forward scale feeding a recompute softmax stays two instructions.
  ProgramBuilder B(DType::F32);
  int X = B.addBuffer("x", Scores, ProgramBuffer::Input);
  int S = B.emitRaw(OpKind::Scale, {X}, {Scores}, floatAttr("alpha", 0.5),
                    tags(Phase::Forward, Role::Scale), "scale")[0];
  int Y = B.emitRaw(OpKind::Softmax, {S}, {Scores}, {},
                    tags(Phase::Recompute, Role::Softmax), "softmax")[0];
  B.output("y", Y);
  Program P = B.take();
  EXPECT_EQ(fuseAttentionSoftmax(P), 0);
}

/// The default model compiled with Ctx: no scale or causal_mask is left,
/// every softmax and softmax_grad is fused, the program is consistent.
void expectFusedModel(PassContext &Ctx, int WantSoftmax, int WantGrad) {
  int Softmax = 0, Grad = 0;
  for (const Program &Flat : defaultModelPrograms(Ctx)) {
    for (const Instruction &I : Flat.Instrs) {
      EXPECT_NE(I.Op, OpKind::Scale);
      EXPECT_NE(I.Op, OpKind::CausalMask);
      if (I.Op != OpKind::Softmax && I.Op != OpKind::SoftmaxGrad)
        continue;
      (I.Op == OpKind::Softmax ? Softmax : Grad) += 1;
      EXPECT_EQ(attrFloat(I.Op, I.Attrs, "alpha"), 0.25);
      EXPECT_EQ(attrInt(I.Op, I.Attrs, "causal"), 1);
      EXPECT_EQ(attrFloat(I.Op, I.Attrs, "fill"),
                I.Op == OpKind::Softmax ? -INFINITY : 0.0);
    }
  }
  EXPECT_EQ(Softmax, WantSoftmax);
  EXPECT_EQ(Grad, WantGrad);
}

TEST(FuseSoftmax, TheDefaultModelInEveryForm) {
  // Two layers: two forward softmaxes, two backward.
  {
    PassContext Ctx;
    expectFusedModel(Ctx, 2, 2);
  }
  for (RecomputeMode M : {RecomputeMode::Selective, RecomputeMode::Full}) {
    PassContext Ctx;
    Ctx.Recompute.Mode = M;
    // The forward's and the recompute's.
    expectFusedModel(Ctx, 4, 2);
  }
  {
    // Two stages, two microbatches: every microbatch's forward and
    // backward of each stage's layer.
    PassContext Ctx;
    Ctx.Pipeline.Stages = 2;
    Ctx.Pipeline.Microbatches = 2;
    expectFusedModel(Ctx, 4, 4);
  }
}

} // namespace
