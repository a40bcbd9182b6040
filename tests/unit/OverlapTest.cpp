//===- OverlapTest.cpp - Collectives placed beside their GEMMs ------------===//
//
// lower/Overlap.h on hand-built programs (where each collective may move,
// and where it must stop) and on compiled ones (the live ranges it
// recomputes are the lowering's own where nothing moved).
//
//===----------------------------------------------------------------------===//
#include "TrainHarness.h"
#include "lower/MemoryPlan.h"
#include "lower/Overlap.h"
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
