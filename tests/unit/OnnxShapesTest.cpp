//===- OnnxShapesTest.cpp - Type rules of the onnx.* ops ------------------===//
#include "TestSupport.h"
#include "ir/ShapeInference.h"
#include "gtest/gtest.h"
#include <cstring>
#include <limits>

using namespace sp;
using namespace sp::test;
using namespace llvm;

namespace {

class OnnxShapesTest : public ::testing::Test {
protected:
  Value *in(DType D, ArrayRef<int64_t> Shape) {
    return G.addInput("x" + std::to_string(G.inputs().size()),
                      TensorType(D, Shape));
  }
  Value *f32(ArrayRef<int64_t> Shape) { return in(DType::F32, Shape); }
  Value *ints(ArrayRef<int64_t> V) {
    std::vector<char> B(V.size() * 8);
    if (!V.empty())
      std::memcpy(B.data(), V.data(), B.size());
    return G.addInlineConst("c", TensorType(DType::I64, {int64_t(V.size())}),
                            std::move(B));
  }

  /// The result types, or the error message prefixed by "error: ".
  std::vector<std::string> infer(OpKind Op, ArrayRef<Value *> Ops,
                                 const AttrList &Attrs = {}) {
    auto Types = inferTypes(Op, Ops, Attrs);
    if (!Types)
      return {"error: " + toString(Types.takeError())};
    std::vector<std::string> R;
    for (const TensorType &T : *Types)
      R.push_back(T.str());
    return R;
  }

  Graph G;
};

using Strs = std::vector<std::string>;

TEST_F(OnnxShapesTest, ElementwiseBroadcasting) {
  EXPECT_EQ(infer(OpKind::OnnxAdd, {f32({4, 1, 8}), f32({3, 1})}),
            Strs{"f32[4, 3, 8]"});
  EXPECT_EQ(infer(OpKind::OnnxEqual, {f32({2}), f32({})}), Strs{"bool[2]"});
  EXPECT_EQ(infer(OpKind::OnnxWhere,
                  {in(DType::Bool, {1, 1, 4, 4}), f32({}), f32({2, 3, 4, 4})}),
            Strs{"f32[2, 3, 4, 4]"});
  EXPECT_EQ(infer(OpKind::OnnxAdd, {f32({3}), f32({4})}),
            Strs{"error: shapes [3] and [4] do not broadcast"});
  EXPECT_EQ(infer(OpKind::OnnxMul, {f32({3}), in(DType::I64, {3})}),
            Strs{"error: operands 0 and 1 have different element types: "
                 "f32[3] and i64[3]"});
  EXPECT_EQ(infer(OpKind::OnnxNot, {f32({3})}),
            Strs{"error: operand 0 must be bool, it is f32[3]"});
  EXPECT_EQ(infer(OpKind::OnnxAdd, {f32({3})}),
            Strs{"error: expected 2 operands, got 1"});
}

TEST_F(OnnxShapesTest, MatMulAndGemm) {
  EXPECT_EQ(infer(OpKind::OnnxMatMul, {f32({4, 64, 64}), f32({64, 192})}),
            Strs{"f32[4, 64, 192]"});
  EXPECT_EQ(infer(OpKind::OnnxMatMul, {f32({2, 1, 5, 6}), f32({3, 6, 7})}),
            Strs{"f32[2, 3, 5, 7]"});
  EXPECT_EQ(infer(OpKind::OnnxMatMul, {f32({6}), f32({6, 7})}), Strs{"f32[7]"});
  EXPECT_EQ(infer(OpKind::OnnxMatMul, {f32({5, 6}), f32({6})}), Strs{"f32[5]"});
  EXPECT_EQ(infer(OpKind::OnnxMatMul, {f32({5, 6}), f32({5, 6})}),
            Strs{"error: contraction sizes differ: f32[5, 6] and f32[5, 6]"});
  EXPECT_EQ(infer(OpKind::OnnxGemm, {f32({8, 4}), f32({16, 4}), f32({16})},
                  attrs({{"transB", int64_t(1)}})),
            Strs{"f32[8, 16]"});
  EXPECT_EQ(infer(OpKind::OnnxGemm, {f32({4, 8}), f32({4, 16})},
                  attrs({{"transA", int64_t(1)}})),
            Strs{"f32[8, 16]"});
  EXPECT_EQ(infer(OpKind::OnnxGemm, {f32({8, 4}), f32({4, 16}), f32({8})}),
            Strs{"error: operand 2 f32[8] does not broadcast to [8, 16]"});
}

TEST_F(OnnxShapesTest, ReshapeWithZeroAndMinusOne) {
  Value *X = f32({4, 64, 192});
  EXPECT_EQ(infer(OpKind::OnnxReshape, {X, ints({0, 0, 3, -1})}),
            Strs{"f32[4, 64, 3, 64]"});
  EXPECT_EQ(infer(OpKind::OnnxReshape, {X, ints({-1, 192})}),
            Strs{"f32[256, 192]"});
  EXPECT_EQ(infer(OpKind::OnnxReshape, {f32({0, 4}), ints({0, 4})},
                  attrs({{"allowzero", int64_t(1)}})),
            Strs{"f32[0, 4]"});
  EXPECT_EQ(infer(OpKind::OnnxReshape, {X, ints({-1, -1})}),
            Strs{"error: shape [-1, -1] has more than one -1"});
  EXPECT_EQ(infer(OpKind::OnnxReshape, {X, ints({5, -1})}),
            Strs{"error: cannot reshape f32[4, 64, 192] to [5, -1]"});
  // The shape must be known at compile time.
  Value *Shape = in(DType::I64, {2});
  EXPECT_EQ(infer(OpKind::OnnxReshape, {X, Shape}),
            Strs{"error: operand 1 (shape) must be a constant known at "
                 "compile time"});
}

TEST_F(OnnxShapesTest, SliceClamping) {
  Value *X = f32({1, 1, 64, 64});
  EXPECT_EQ(infer(OpKind::OnnxSlice,
                  {X, ints({0}), ints({32}), ints({2}), ints({1})}),
            Strs{"f32[1, 1, 32, 64]"});
  EXPECT_EQ(infer(OpKind::OnnxSlice, {X, ints({1, I64Min}),
                                      ints({I64Max, I64Max}), ints({-1, 2})}),
            Strs{"f32[1, 1, 64, 63]"});
  EXPECT_EQ(infer(OpKind::OnnxSlice,
                  {X, ints({I64Max}), ints({I64Min}), ints({3}), ints({-2})}),
            Strs{"f32[1, 1, 64, 32]"});
  EXPECT_EQ(infer(OpKind::OnnxSlice, {X, ints({10}), ints({5}), ints({3})}),
            Strs{"f32[1, 1, 64, 0]"});
  EXPECT_EQ(
      infer(OpKind::OnnxSlice, {X, ints({0}), ints({5}), ints({3}), ints({0})}),
      Strs{"error: slice steps cannot be 0"});
  EXPECT_EQ(infer(OpKind::OnnxSlice, {X, ints({0}), ints({5}), ints({4})}),
            Strs{"error: axis 4 is out of range for rank 4"});
  EXPECT_EQ(infer(OpKind::OnnxSlice, {X, ints({0, 0}), ints({5})}),
            Strs{"error: starts, ends, axes and steps must have the same "
                 "length"});
}

TEST_F(OnnxShapesTest, MultiResultOps) {
  Value *X = f32({4, 64, 256});
  EXPECT_EQ(infer(OpKind::OnnxLayerNormalization, {X, f32({256}), f32({256})}),
            (Strs{"f32[4, 64, 256]", "f32[4, 64, 1]", "f32[4, 64, 1]"}));
  EXPECT_EQ(infer(OpKind::OnnxLayerNormalization, {X, f32({64, 256})},
                  attrs({{"axis", int64_t(1)}})),
            (Strs{"f32[4, 64, 256]", "f32[4, 1, 1]", "f32[4, 1, 1]"}));
  EXPECT_EQ(infer(OpKind::OnnxLayerNormalization, {X, f32({64})}),
            Strs{"error: operand 1 f32[64] does not broadcast to the "
                 "normalized shape [256]"});
  EXPECT_EQ(infer(OpKind::OnnxDropout, {X, f32({}), in(DType::Bool, {})}),
            (Strs{"f32[4, 64, 256]", "bool[4, 64, 256]"}));
  EXPECT_EQ(infer(OpKind::OnnxSplit, {X, ints({64, 64, 128})},
                  attrs({{"axis", int64_t(2)}})),
            (Strs{"f32[4, 64, 64]", "f32[4, 64, 64]", "f32[4, 64, 128]"}));
  EXPECT_EQ(infer(OpKind::OnnxSplit, {f32({5})},
                  attrs({{"num_outputs", int64_t(2)}})),
            (Strs{"f32[3]", "f32[2]"}));
  EXPECT_EQ(infer(OpKind::OnnxSplit, {X, ints({64, 64})},
                  attrs({{"axis", int64_t(2)}})),
            Strs{"error: split sizes [64, 64] do not add up to dimension 2 "
                 "of size 256"});
  EXPECT_EQ(infer(OpKind::OnnxSplit, {X}),
            Strs{"error: split needs a 'split' operand or 'num_outputs'"});
}

TEST_F(OnnxShapesTest, AxesOperands) {
  Value *X = f32({4, 1, 8});
  EXPECT_EQ(infer(OpKind::OnnxUnsqueeze, {X, ints({0, -1})}),
            Strs{"f32[1, 4, 1, 8, 1]"});
  EXPECT_EQ(infer(OpKind::OnnxUnsqueeze, {X, ints({1, 1})}),
            Strs{"error: axis 1 appears twice"});
  EXPECT_EQ(infer(OpKind::OnnxSqueeze, {X}), Strs{"f32[4, 8]"});
  EXPECT_EQ(infer(OpKind::OnnxSqueeze, {X, ints({-2})}), Strs{"f32[4, 8]"});
  EXPECT_EQ(infer(OpKind::OnnxSqueeze, {X, ints({0})}),
            Strs{"error: cannot squeeze axis 0 of size 4"});
  EXPECT_EQ(infer(OpKind::OnnxReduceMean, {X},
                  attrs({{"axes", std::vector<int64_t>{-1}}})),
            Strs{"f32[4, 1, 1]"});
  EXPECT_EQ(
      infer(OpKind::OnnxReduceMean, {X}, attrs({{"keepdims", int64_t(0)}})),
      Strs{"f32[]"});
  EXPECT_EQ(infer(OpKind::OnnxTranspose, {X}), Strs{"f32[8, 1, 4]"});
  EXPECT_EQ(infer(OpKind::OnnxTranspose, {X},
                  attrs({{"perm", std::vector<int64_t>{0, 0, 1}}})),
            Strs{"error: perm [0, 0, 1] is not a permutation"});
  EXPECT_EQ(
      infer(OpKind::OnnxGather, {f32({256, 64}), in(DType::I64, {4, 64})}),
      Strs{"f32[4, 64, 64]"});
  EXPECT_EQ(infer(OpKind::OnnxGather, {f32({2, 3, 4}), in(DType::I64, {})},
                  attrs({{"axis", int64_t(1)}})),
            Strs{"f32[2, 4]"});
}

TEST_F(OnnxShapesTest, GeneratorsAndCasts) {
  EXPECT_EQ(infer(OpKind::OnnxConstantOfShape, {ints({2, 3})}),
            Strs{"f32[2, 3]"});
  EXPECT_EQ(infer(OpKind::OnnxConstantOfShape, {ints({2})},
                  attrs({{"dtype", int64_t(9)}, {"value", int64_t(1)}})),
            Strs{"bool[2]"});
  EXPECT_EQ(infer(OpKind::OnnxExpand, {f32({3, 1}), ints({2, 1, 4})}),
            Strs{"f32[2, 3, 4]"});
  Value *Zero = G.addInlineConst("z", TensorType(DType::I64, {}),
                                 std::vector<char>(8, 0));
  std::vector<char> TenBytes(8, 0);
  int64_t Ten = 10;
  std::memcpy(TenBytes.data(), &Ten, 8);
  Value *TenV = G.addInlineConst("t", TensorType(DType::I64, {}), TenBytes);
  int64_t Three = 3;
  std::vector<char> ThreeBytes(8);
  std::memcpy(ThreeBytes.data(), &Three, 8);
  Value *ThreeV = G.addInlineConst("s", TensorType(DType::I64, {}), ThreeBytes);
  EXPECT_EQ(infer(OpKind::OnnxRange, {Zero, TenV, ThreeV}), Strs{"i64[4]"});
  EXPECT_EQ(infer(OpKind::OnnxRange, {TenV, Zero, ThreeV}), Strs{"i64[0]"});
  EXPECT_EQ(infer(OpKind::OnnxRange, {Zero, in(DType::I64, {}), ThreeV}),
            Strs{"error: operand 1 (limit) must be a constant known at "
                 "compile time"});
  EXPECT_EQ(infer(OpKind::OnnxCast, {f32({2})}, attrs({{"to", int64_t(7)}})),
            Strs{"i64[2]"});
  EXPECT_EQ(infer(OpKind::OnnxCast, {f32({2})}, attrs({{"to", int64_t(8)}})),
            Strs{"error: cast to ONNX data type 8 is not supported"});
  EXPECT_EQ(infer(OpKind::OnnxCast, {f32({2})}),
            Strs{"error: cast needs the attribute 'to'"});
  EXPECT_EQ(infer(OpKind::OnnxShape, {f32({2, 3, 4})}), Strs{"i64[3]"});
  EXPECT_EQ(infer(OpKind::OnnxShape, {f32({2, 3, 4})},
                  attrs({{"start", int64_t(-2)}})),
            Strs{"i64[2]"});
  EXPECT_EQ(infer(OpKind::OnnxTrilu, {f32({4})}),
            Strs{"error: trilu needs an operand of rank >= 2"});
}

TEST_F(OnnxShapesTest, Concat) {
  EXPECT_EQ(infer(OpKind::OnnxConcat, {f32({2, 3}), f32({2, 5})},
                  attrs({{"axis", int64_t(-1)}})),
            Strs{"f32[2, 8]"});
  EXPECT_EQ(infer(OpKind::OnnxConcat, {f32({2, 3}), f32({3, 5})},
                  attrs({{"axis", int64_t(1)}})),
            Strs{"error: operand 1 f32[3, 5] does not fit operand 0 f32[2, "
                 "3] along axis 1"});
  EXPECT_EQ(infer(OpKind::OnnxConcat, {f32({2})}),
            Strs{"error: concat needs the attribute 'axis'"});
}

} // namespace
