//===- OverlapTest.cpp - Collectives placed beside their GEMMs ------------===//
//
// lower/Overlap.h on hand-built programs (where each collective may move,
// and where it must stop) and on compiled ones (the live ranges it
// recomputes are the lowering's own where nothing moved); the data-parallel
// gradient buckets of lower/GradientBuckets.h.
//
//===----------------------------------------------------------------------===//
#include "TrainHarness.h"
#include "frontend/OnnxImporter.h"
#include "lower/FuseSoftmax.h"
#include "lower/GradientBuckets.h"
#include "lower/LowerGraph.h"
#include "lower/MemoryPlan.h"
#include "lower/Overlap.h"
#include "driver/Compile.h"
#include "gtest/gtest.h"

using namespace sp;
using namespace sp::test;

namespace {

struct Builder {
  Program P;
  int temp() {
    ProgramBuffer B;
    B.Name = "%" + std::to_string(P.Buffers.size());
    B.Type = TensorType(DType::F32, {4});
    B.Bytes = 16;
    P.Buffers.push_back(B);
    return int(P.Buffers.size()) - 1;
  }
  int instr(OpKind Op, std::initializer_list<int> In,
            std::initializer_list<int> Out, std::string Name,
            Phase Ph = Phase::Backward, std::string Group = "") {
    Instruction I;
    I.Op = Op;
    I.In.assign(In.begin(), In.end());
    I.Out.assign(Out.begin(), Out.end());
    I.Name = std::move(Name);
    I.Ph = Ph;
    if (!Group.empty())
      I.Attrs.set("group", Group);
    P.Instrs.push_back(I);
    return int(P.Instrs.size()) - 1;
  }
  std::vector<std::string> order() const {
    std::vector<std::string> R;
    for (const Instruction &I : P.Instrs)
      R.push_back(I.Name);
    return R;
  }
};

using Names = std::vector<std::string>;

/// The backward of a column-parallel linear under SP, as the lowering emits
/// it, becomes Megatron-Core's overlapped order.
TEST(Overlap, ColumnParallelBackwardUnderSP) {
  Builder B;
  int DY = B.temp(), W = B.temp(), XS = B.temp(), DX = B.temp(),
      XG = B.temp(), DW = B.temp(), DXS = B.temp(), Next = B.temp();
  B.instr(OpKind::Linear, {DY, W}, {DX}, "dgrad");
  B.instr(OpKind::AllGather, {XS}, {XG}, "regather");
  B.instr(OpKind::LinearGradW, {XG, DY}, {DW}, "wgrad");
  B.instr(OpKind::ReduceScatter, {DX}, {DXS}, "scatter");
  B.instr(OpKind::Gelu, {DXS}, {Next}, "after");
  B.P.Outputs = {{"grad:w", DW}, {"next", Next}};
  computeLiveRanges(B.P);
  placeCollectives(B.P);
  EXPECT_EQ(B.order(),
            (Names{"regather", "dgrad", "scatter", "wgrad", "after"}));
  EXPECT_EQ(B.P.Instrs[0].Beside, 1) << "the re-gather beside dgrad";
  EXPECT_EQ(B.P.Instrs[2].Beside, 3) << "the reduce-scatter beside wgrad";
  EXPECT_EQ(B.P.Instrs[1].Beside, -1);
  // The operands stay live until the GEMM beside them: dgrad's result may
  // not take the saved shard's bytes, nor wgrad's those of dX.
  EXPECT_EQ(B.P.Buffers[XS].LastUse, 1);
  EXPECT_EQ(B.P.Buffers[DX].Def, 1);
  EXPECT_EQ(B.P.Buffers[DX].LastUse, 3);
  EXPECT_EQ(B.P.Buffers[XG].Def, 0);
  EXPECT_EQ(B.P.Buffers[XG].LastUse, 3);
  EXPECT_EQ(B.P.Buffers[DXS].LastUse, 4);
  EXPECT_EQ(B.P.Buffers[DW].LastUse, 5) << "an output: past the end";
}

/// A collective never passes what it depends on, another instruction that
/// communicates, or a phase boundary; data-parallel collectives stay.
TEST(Overlap, StopsWhereItMust) {
  Builder B;
  int A = B.temp(), W = B.temp(), X = B.temp(), Y = B.temp(), Z = B.temp(),
      G = B.temp(), S = B.temp(), T = B.temp(), U = B.temp(), V = B.temp();
  B.instr(OpKind::Linear, {A, W}, {X}, "gemm0");
  B.instr(OpKind::AllReduce, {X}, {Y}, "needs-gemm0"); // RAW: stays
  B.instr(OpKind::Linear, {A, W}, {Z}, "gemm1");
  B.instr(OpKind::AllReduce, {A}, {G}, "past-comm"); // to gemm1, not past needs-gemm0
  B.instr(OpKind::Linear, {A, W}, {S}, "gemm2", Phase::Forward);
  B.instr(OpKind::AllReduce, {A}, {T}, "other-phase"); // gemm2 is forward
  B.instr(OpKind::Linear, {A, W}, {U}, "gemm3");
  B.instr(OpKind::AllReduce, {A}, {V}, "dp", Phase::Backward, "dp");
  B.P.Outputs = {{"x", Y}, {"z", Z}, {"g", G}, {"s", S}, {"t", T},
                 {"u", U}, {"v", V}};
  computeLiveRanges(B.P);
  placeCollectives(B.P);
  EXPECT_EQ(B.order(),
            (Names{"gemm0", "needs-gemm0", "past-comm", "gemm1", "gemm2",
                   "other-phase", "gemm3", "dp"}));
  EXPECT_EQ(B.P.Instrs[1].Beside, -1);
  EXPECT_EQ(B.P.Instrs[2].Beside, 3) << "moved above gemm1, not further";
  EXPECT_EQ(B.P.Instrs[5].Beside, -1);
  EXPECT_EQ(B.P.Instrs[7].Beside, -1) << "the data-parallel group";
}

/// The data-parallel sums become buckets in the order the backward
/// finishes their gradients, each placed right after its last gradient's
/// writer; a gradient larger than the bucket size is a bucket alone.
TEST(GradientBuckets, InFinishingOrderAfterTheLastWriter) {
  Builder B;
  std::vector<int> G, S;
  for (int K = 0; K < 4; ++K) {
    G.push_back(B.temp());
    S.push_back(B.temp());
  }
  B.P.Buffers[G[2]].Bytes = 64; // larger than a bucket
  int X = B.temp();
  B.instr(OpKind::Gelu, {X}, {G[1]}, "make1");
  B.instr(OpKind::Gelu, {X}, {G[0]}, "make0");
  B.instr(OpKind::Gelu, {X}, {G[2]}, "make2");
  B.instr(OpKind::Gelu, {X}, {G[3]}, "make3");
  B.instr(OpKind::Gelu, {G[3]}, {G[3]}, "accumulate3"); // its last writer
  for (int K = 0; K < 4; ++K) {
    int I = B.instr(OpKind::AllReduce, {G[K]}, {S[K]}, "sum" + std::to_string(K),
                    Phase::Optimizer, "dp");
    B.P.Instrs[I].Attrs.set("bucket_bytes", int64_t(32));
  }
  B.instr(OpKind::GradNorm, {S[0], S[1], S[2], S[3]}, {X}, "norm",
          Phase::Optimizer);
  B.P.Outputs = {{"norm", X}};
  computeLiveRanges(B.P);
  EXPECT_EQ(bucketGradientSums(B.P), 3);
  EXPECT_EQ(B.order(), (Names{"make1", "make0", "dp_bucket.0", "make2",
                              "dp_bucket.1", "make3", "accumulate3",
                              "dp_bucket.2", "norm"}));
  const Instruction &First = B.P.Instrs[2];
  EXPECT_EQ(First.In, (llvm::SmallVector<int, 4>{G[1], G[0]}));
  EXPECT_EQ(First.Out, (llvm::SmallVector<int, 4>{S[1], S[0]}));
  EXPECT_EQ(First.Ph, Phase::Backward) << "in the backward, where it is";
  EXPECT_EQ(B.P.Instrs[4].In, (llvm::SmallVector<int, 4>{G[2]}));
  EXPECT_EQ(B.P.Buffers[G[0]].LastUse, 2) << "a gradient dies at its sum";
  EXPECT_EQ(B.P.Buffers[S[0]].LastUse, 8);
}

/// The default model's training graph after the passes, lowered (one
/// program: no pipeline), with the fusion applied: what finalizeProgram
/// starts from.
Program lowerTiny(int TP, bool SP, int DP) {
  registerOnnxDataLoader();
  auto G = llvm::cantFail(importOnnx(TinyModel, ImportOptions()));
  PassContext Ctx;
  Ctx.TensorParallel = TP;
  Ctx.SequenceParallel = SP;
  Ctx.DataParallel = DP;
  llvm::cantFail(runPasses(*G, Ctx, CompileOptions()));
  Program P = llvm::cantFail(lowerGraph(*G, DType::F32));
  fuseAttentionSoftmax(P);
  return P;
}

/// What docs/passes.md ("Collectives beside GEMMs") says placing the collectives costs in memory, measured
/// by planning the same program without and with the placement: on the
/// default model at t = 2 + SP, 32 KiB, the saved sequence shard
/// [b, s/t, h] of one column-parallel linear (4 x 32 x 64 floats), which
/// now lives until the dgrad GEMM that its re-gather runs beside; nothing
/// without SP (the all-reduce of dX moves before wgrad, whose operands are
/// live anyway).
TEST(Overlap, MemoryCostOfThePlacement) {
  for (bool SP : {true, false}) {
    SCOPED_TRACE(SP ? "t = 2 + SP" : "t = 2");
    Program Plain = lowerTiny(2, SP, 1), Placed = Plain;
    planMemory(Plain);
    placeCollectives(Placed);
    planMemory(Placed);
    EXPECT_EQ(Placed.ArenaBytes - Plain.ArenaBytes,
              SP ? int64_t(4) * 32 * 64 * 4 : 0);
  }
}

/// What docs/parallelism.md ("Data parallelism") says the data-parallel buckets cost in memory: nothing,
/// at the default bucket size, on the default model at d = 2 and
/// d = 2 x t = 2 + SP (each gradient dies at its sum instead of living
/// until the optimizer).
TEST(GradientBuckets, CostNoMemory) {
  for (int TP : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "d = 2, t = " << TP);
    Program Plain = lowerTiny(TP, TP > 1, 2), Bucketed = Plain;
    planMemory(Plain);
    EXPECT_EQ(bucketGradientSums(Bucketed), 1);
    planMemory(Bucketed);
    EXPECT_EQ(Bucketed.ArenaBytes, Plain.ArenaBytes);
  }
}

/// Where nothing moves, the live ranges computed from the order are the
/// ones the lowering (and the pipeline unroller) gave.
TEST(Overlap, LiveRangesAreTheLoweringsWhereNothingMoved) {
  for (int Stages : {1, 2}) {
    PassContext Ctx;
    Ctx.Pipeline.Stages = Stages;
    Ctx.Pipeline.Microbatches = Stages == 1 ? 1 : 4;
    Plan P = compile(TinyModel, Ctx);
    for (int S = 0; S < P.numStages(); ++S) {
      Program Copy = P.stage(S);
      for (const Instruction &I : Copy.Instrs)
        ASSERT_EQ(I.Beside, -1) << "t = 1 has no collective to move";
      computeLiveRanges(Copy);
      for (size_t B = 0; B < Copy.Buffers.size(); ++B) {
        EXPECT_EQ(Copy.Buffers[B].Def, P.stage(S).Buffers[B].Def) << B;
        EXPECT_EQ(Copy.Buffers[B].LastUse, P.stage(S).Buffers[B].LastUse)
            << B;
      }
    }
  }
}

} // namespace
