//===- FoldTest.cpp - Constant evaluation of the onnx.* ops ---------------===//
#include "ir/Fold.h"
#include "TestSupport.h"
#include "ir/ShapeInference.h"
#include "gtest/gtest.h"
#include <cmath>
#include <cstring>
#include <limits>

using namespace sp;
using namespace sp::test;
using namespace llvm;

namespace {

template <typename T> std::vector<char> bytesOf(ArrayRef<T> V) {
  std::vector<char> B(V.size() * sizeof(T));
  if (!V.empty())
    std::memcpy(B.data(), V.data(), B.size());
  return B;
}

/// Builds constants in a graph and folds ops over them.
class FoldTest : public ::testing::Test {
protected:
  Value *ints(ArrayRef<int64_t> V, ArrayRef<int64_t> Shape) {
    return G.addInlineConst("i", TensorType(DType::I64, Shape), bytesOf(V));
  }
  Value *ints(ArrayRef<int64_t> V) { return ints(V, {int64_t(V.size())}); }
  Value *scalar(int64_t V) { return ints({V}, {}); }
  Value *floats(ArrayRef<float> V, ArrayRef<int64_t> Shape) {
    return G.addInlineConst("f", TensorType(DType::F32, Shape), bytesOf(V));
  }
  Value *bools(ArrayRef<uint8_t> V, ArrayRef<int64_t> Shape) {
    return G.addInlineConst("b", TensorType(DType::Bool, Shape), bytesOf(V));
  }

  /// Infers the result types and folds; expects success.
  std::vector<std::shared_ptr<TensorData>>
  fold(OpKind Op, ArrayRef<Value *> Operands, const AttrList &Attrs = {}) {
    auto Types = inferTypes(Op, Operands, Attrs);
    if (!Types) {
      ADD_FAILURE() << toString(Types.takeError());
      return {};
    }
    auto R = foldOp(Op, Operands, Attrs, *Types);
    if (!R) {
      ADD_FAILURE() << toString(R.takeError());
      return {};
    }
    if (!*R) {
      ADD_FAILURE() << "did not fold";
      return {};
    }
    for (unsigned I = 0; I < (*R)->size(); ++I)
      EXPECT_EQ((**R)[I]->type(), (*Types)[I]);
    return std::move(**R);
  }

  /// Folds and returns result 0 as int64 (exact) elements.
  std::vector<int64_t> foldInts(OpKind Op, ArrayRef<Value *> Operands,
                                const AttrList &Attrs = {}) {
    auto R = fold(Op, Operands, Attrs);
    return R.empty() ? std::vector<int64_t>() : intsOf(*R[0]);
  }
  std::vector<double> foldDoubles(OpKind Op, ArrayRef<Value *> Operands,
                                  const AttrList &Attrs = {}) {
    auto R = fold(Op, Operands, Attrs);
    return R.empty() ? std::vector<double>() : doublesOf(*R[0]);
  }

  static std::vector<int64_t> intsOf(const TensorData &D) {
    std::vector<int64_t> V;
    for (int64_t I = 0; I < D.type().numElements(); ++I)
      V.push_back(D.getInt(I));
    return V;
  }
  static std::vector<double> doublesOf(const TensorData &D) {
    std::vector<double> V;
    for (int64_t I = 0; I < D.type().numElements(); ++I)
      V.push_back(D.getDouble(I));
    return V;
  }

  /// Folds an op that must not fold (returns std::nullopt).
  void expectNoFold(OpKind Op, ArrayRef<Value *> Operands,
                    ArrayRef<TensorType> Types, const AttrList &Attrs = {}) {
    auto R = foldOp(Op, Operands, Attrs, Types);
    ASSERT_TRUE(bool(R)) << toString(R.takeError());
    EXPECT_FALSE(R->has_value());
  }

  Graph G;
};

using IntVec = std::vector<int64_t>;
using DoubleVec = std::vector<double>;

TEST_F(FoldTest, ShapeOfANonConstantValue) {
  Value *X = G.addInput("x", TensorType(DType::F32, {2, 3, 5, 7}));
  EXPECT_EQ(foldInts(OpKind::OnnxShape, {X}), (IntVec{2, 3, 5, 7}));
  EXPECT_EQ(foldInts(OpKind::OnnxShape, {X},
                     attrs({{"start", int64_t(1)}, {"end", int64_t(-1)}})),
            (IntVec{3, 5}));
  EXPECT_EQ(foldInts(OpKind::OnnxShape, {X}, attrs({{"start", int64_t(-9)}})),
            (IntVec{2, 3, 5, 7}));
}

TEST_F(FoldTest, GatherFromAShape) {
  Value *S = ints({4, 64, 256});
  EXPECT_EQ(foldInts(OpKind::OnnxGather, {S, scalar(1)}), (IntVec{64}));
  EXPECT_EQ(foldInts(OpKind::OnnxGather, {S, scalar(-1)}), (IntVec{256}));
  EXPECT_EQ(foldInts(OpKind::OnnxGather, {S, ints({2, 0})}), (IntVec{256, 4}));
  // Axis 1 of a matrix.
  Value *M = ints({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(foldInts(OpKind::OnnxGather, {M, ints({2, 0})},
                     attrs({{"axis", int64_t(1)}})),
            (IntVec{3, 1, 6, 4}));
}

TEST_F(FoldTest, GatherOutOfRangeIsAnError) {
  Value *S = ints({4, 64});
  Value *Idx = scalar(2);
  auto Types = cantFail(inferTypes(OpKind::OnnxGather, {S, Idx}, {}));
  auto R = foldOp(OpKind::OnnxGather, {S, Idx}, {}, Types);
  ASSERT_FALSE(bool(R));
  EXPECT_EQ(toString(R.takeError()),
            "index 2 is out of range for axis 0 of size 2");
}

TEST_F(FoldTest, UnsqueezeSqueezeReshapeKeepTheElements) {
  Value *X = scalar(I64Max);
  auto U = fold(OpKind::OnnxUnsqueeze, {X, ints({0})});
  ASSERT_EQ(U.size(), 1u);
  EXPECT_EQ(U[0]->type(), TensorType(DType::I64, {1}));
  EXPECT_EQ(intsOf(*U[0]), (IntVec{I64Max}));

  Value *Y = ints({1, 2, 3, 4, 5, 6}, {1, 6, 1});
  auto S = fold(OpKind::OnnxSqueeze, {Y});
  EXPECT_EQ(S[0]->type(), TensorType(DType::I64, {6}));
  auto R = fold(OpKind::OnnxReshape, {Y, ints({0, 3, -1})});
  EXPECT_EQ(R[0]->type(), TensorType(DType::I64, {1, 3, 2}));
  EXPECT_EQ(intsOf(*R[0]), (IntVec{1, 2, 3, 4, 5, 6}));
}

TEST_F(FoldTest, Concat) {
  EXPECT_EQ(foldInts(OpKind::OnnxConcat, {ints({4}), ints({64}), ints({-1})},
                     attrs({{"axis", int64_t(0)}})),
            (IntVec{4, 64, -1}));
  // Axis 1 of matrices.
  Value *A = ints({1, 2, 3, 4}, {2, 2}), *B = ints({5, 6}, {2, 1});
  EXPECT_EQ(
      foldInts(OpKind::OnnxConcat, {A, B}, attrs({{"axis", int64_t(-1)}})),
      (IntVec{1, 2, 5, 3, 4, 6}));
}

TEST_F(FoldTest, ConstantOfShape) {
  auto Z = fold(OpKind::OnnxConstantOfShape, {ints({2, 3})});
  EXPECT_EQ(Z[0]->type(), TensorType(DType::F32, {2, 3}));
  EXPECT_EQ(doublesOf(*Z[0]), DoubleVec(6, 0.0));
  // An int64 value stays exact.
  auto M = fold(OpKind::OnnxConstantOfShape, {ints({2})},
                attrs({{"dtype", int64_t(7)}, {"value", I64Max}}));
  EXPECT_EQ(intsOf(*M[0]), (IntVec{I64Max, I64Max}));
  auto B = fold(OpKind::OnnxConstantOfShape, {ints({1})},
                attrs({{"dtype", int64_t(9)}, {"value", int64_t(1)}}));
  EXPECT_EQ(B[0]->type(), TensorType(DType::Bool, {1}));
  EXPECT_EQ(intsOf(*B[0]), (IntVec{1}));
}

TEST_F(FoldTest, Cast) {
  Value *F = floats({-2.7f, 0.0f, 3.9f}, {3});
  EXPECT_EQ(foldInts(OpKind::OnnxCast, {F}, attrs({{"to", int64_t(7)}})),
            (IntVec{-2, 0, 3}));
  EXPECT_EQ(foldInts(OpKind::OnnxCast, {F}, attrs({{"to", int64_t(9)}})),
            (IntVec{1, 0, 1}));
  Value *B = bools({1, 0}, {2});
  EXPECT_EQ(foldDoubles(OpKind::OnnxCast, {B}, attrs({{"to", int64_t(1)}})),
            (DoubleVec{1.0, 0.0}));
  // i64 -> i32 wraps; i64 -> i64 stays exact.
  Value *Big = ints({I64Max, int64_t(1) << 32 | 5});
  EXPECT_EQ(foldInts(OpKind::OnnxCast, {Big}, attrs({{"to", int64_t(6)}})),
            (IntVec{-1, 5}));
  EXPECT_EQ(foldInts(OpKind::OnnxCast, {Big}, attrs({{"to", int64_t(7)}})),
            (IntVec{I64Max, int64_t(1) << 32 | 5}));
}

TEST_F(FoldTest, CastToHalfPrecision) {
  Value *F = floats({1.0f, 65504.0f, 1e6f, -0.5f, 5.96e-8f}, {5});
  auto H = fold(OpKind::OnnxCast, {F}, attrs({{"to", int64_t(10)}}));
  ArrayRef<uint16_t> Bits = H[0]->as<uint16_t>();
  EXPECT_EQ(Bits[0], 0x3c00);
  EXPECT_EQ(Bits[1], 0x7bff);
  EXPECT_EQ(Bits[2], 0x7c00); // overflow to inf
  EXPECT_EQ(Bits[3], 0xb800);
  EXPECT_EQ(Bits[4], 0x0001); // smallest subnormal
  auto B = fold(OpKind::OnnxCast, {F}, attrs({{"to", int64_t(16)}}));
  EXPECT_EQ(B[0]->as<uint16_t>()[0], 0x3f80);
  EXPECT_EQ(B[0]->getDouble(3), -0.5);
}

TEST_F(FoldTest, Range) {
  EXPECT_EQ(foldInts(OpKind::OnnxRange, {scalar(0), scalar(5), scalar(2)}),
            (IntVec{0, 2, 4}));
  EXPECT_EQ(foldInts(OpKind::OnnxRange, {scalar(3), scalar(-1), scalar(-2)}),
            (IntVec{3, 1}));
  EXPECT_EQ(foldInts(OpKind::OnnxRange, {scalar(3), scalar(3), scalar(1)}),
            IntVec{});
  // Near the int64 limits.
  EXPECT_EQ(foldInts(OpKind::OnnxRange,
                     {scalar(I64Max - 2), scalar(I64Max), scalar(1)}),
            (IntVec{I64Max - 2, I64Max - 1}));
  Value *S = floats({0.5f}, {}), *L = floats({2.0f}, {}),
        *D = floats({0.5f}, {});
  EXPECT_EQ(foldDoubles(OpKind::OnnxRange, {S, L, D}),
            (DoubleVec{0.5, 1.0, 1.5}));
}

TEST_F(FoldTest, ExpandBroadcasts) {
  Value *X = ints({1, 2, 3}, {3, 1});
  auto R = fold(OpKind::OnnxExpand, {X, ints({2, 1, 2})});
  EXPECT_EQ(R[0]->type(), TensorType(DType::I64, {2, 3, 2}));
  EXPECT_EQ(intsOf(*R[0]), (IntVec{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
}

TEST_F(FoldTest, SliceClampsInt64Extremes) {
  Value *X = ints({0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  // x[2:]
  EXPECT_EQ(foldInts(OpKind::OnnxSlice, {X, ints({2}), ints({I64Max})}),
            (IntVec{2, 3, 4, 5, 6, 7, 8, 9}));
  // x[:-7]
  EXPECT_EQ(foldInts(OpKind::OnnxSlice, {X, ints({I64Min}), ints({-7})}),
            (IntVec{0, 1, 2}));
  // x[::-1]: start INT64_MAX, end INT64_MIN, step -1.
  EXPECT_EQ(foldInts(OpKind::OnnxSlice, {X, ints({I64Max}), ints({I64Min}),
                                         ints({0}), ints({-1})}),
            (IntVec{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  // x[8:1:-3]
  EXPECT_EQ(foldInts(OpKind::OnnxSlice,
                     {X, ints({8}), ints({1}), ints({0}), ints({-3})}),
            (IntVec{8, 5, 2}));
  // Huge steps take one element.
  EXPECT_EQ(foldInts(OpKind::OnnxSlice,
                     {X, ints({1}), ints({I64Max}), ints({0}), ints({I64Max})}),
            (IntVec{1}));
  EXPECT_EQ(foldInts(OpKind::OnnxSlice, {X, ints({-1}), ints({I64Min}),
                                         ints({0}), ints({I64Min})}),
            (IntVec{9}));
  // Empty results.
  EXPECT_EQ(foldInts(OpKind::OnnxSlice, {X, ints({5}), ints({2})}), IntVec{});
  // The values themselves are exact.
  Value *E = ints({I64Min, I64Max, -1});
  EXPECT_EQ(foldInts(OpKind::OnnxSlice, {E, ints({0}), ints({2})}),
            (IntVec{I64Min, I64Max}));
}

TEST_F(FoldTest, SliceOfAMatrixAlongOneAxis) {
  // A 4x4 matrix, rows 1..2 of every column, columns with step 2.
  std::vector<int64_t> V(16);
  for (int I = 0; I < 16; ++I)
    V[I] = I;
  Value *M = ints(V, {4, 4});
  EXPECT_EQ(foldInts(OpKind::OnnxSlice, {M, ints({1, 0}), ints({3, I64Max}),
                                         ints({0, -1}), ints({1, 2})}),
            (IntVec{4, 6, 8, 10}));
}

TEST_F(FoldTest, Transpose) {
  Value *M = ints({1, 2, 3, 4, 5, 6}, {2, 3});
  auto R = fold(OpKind::OnnxTranspose, {M});
  EXPECT_EQ(R[0]->type(), TensorType(DType::I64, {3, 2}));
  EXPECT_EQ(intsOf(*R[0]), (IntVec{1, 4, 2, 5, 3, 6}));
  std::vector<int64_t> V(24);
  for (int I = 0; I < 24; ++I)
    V[I] = I;
  auto P = fold(OpKind::OnnxTranspose, {ints(V, {2, 3, 4})},
                attrs({{"perm", IntVec{1, 2, 0}}}));
  EXPECT_EQ(P[0]->type(), TensorType(DType::I64, {3, 4, 2}));
  EXPECT_EQ(intsOf(*P[0])[1], 12);
  EXPECT_EQ(intsOf(*P[0])[2], 1);
}

TEST_F(FoldTest, Identity) {
  EXPECT_EQ(foldInts(OpKind::OnnxIdentity, {ints({I64Min, 7})}),
            (IntVec{I64Min, 7}));
}

TEST_F(FoldTest, LogicAndWhereBroadcast) {
  Value *A = ints({1, 2, 3}, {3});
  Value *B = ints({2}, {1});
  EXPECT_EQ(foldInts(OpKind::OnnxEqual, {A, B}), (IntVec{0, 1, 0}));
  Value *C = bools({1, 0}, {2, 1});
  Value *D = bools({1, 1, 0}, {3});
  EXPECT_EQ(foldInts(OpKind::OnnxAnd, {C, D}), (IntVec{1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(foldInts(OpKind::OnnxNot, {D}), (IntVec{0, 0, 1}));
  Value *X = floats({-INFINITY}, {});
  Value *Y = floats({1, 2, 3}, {3});
  EXPECT_EQ(foldDoubles(OpKind::OnnxWhere, {C, X, Y}),
            (DoubleVec{-INFINITY, -INFINITY, -INFINITY, 1, 2, 3}));
}

TEST_F(FoldTest, Trilu) {
  Value *Ones = ints(IntVec(9, 1), {3, 3});
  EXPECT_EQ(foldInts(OpKind::OnnxTrilu, {Ones}),
            (IntVec{1, 1, 1, 0, 1, 1, 0, 0, 1}));
  EXPECT_EQ(foldInts(OpKind::OnnxTrilu, {Ones}, attrs({{"upper", int64_t(0)}})),
            (IntVec{1, 0, 0, 1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(foldInts(OpKind::OnnxTrilu, {Ones, scalar(1)}),
            (IntVec{0, 1, 1, 0, 0, 1, 0, 0, 0}));
  EXPECT_EQ(foldInts(OpKind::OnnxTrilu, {Ones, scalar(-1)},
                     attrs({{"upper", int64_t(0)}})),
            (IntVec{0, 0, 0, 1, 0, 0, 1, 1, 0}));
}

// torch's repeat (GPT-J's sin/cos table repeated over the batch).
TEST_F(FoldTest, TileRepeatsEachAxis) {
  Value *X = ints({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(foldInts(OpKind::OnnxTile, {X, ints({2, 1}, {2})}),
            (IntVec{1, 2, 3, 4, 1, 2, 3, 4}));
  EXPECT_EQ(foldInts(OpKind::OnnxTile, {X, ints({1, 2}, {2})}),
            (IntVec{1, 2, 1, 2, 3, 4, 3, 4}));
}

// torch.gather: each element from its own row of the axis.
TEST_F(FoldTest, GatherElementsAlongAnAxis) {
  Value *X = ints({1, 2, 3, 4, 5, 6}, {3, 2});
  EXPECT_EQ(
      foldInts(OpKind::OnnxGatherElements, {X, ints({2, 0, -1, 1}, {2, 2})}),
      (IntVec{5, 2, 5, 4}));
  EXPECT_EQ(foldInts(OpKind::OnnxGatherElements, {X, ints({1, 0, 0}, {3, 1})},
                     attrs({{"axis", int64_t(1)}})),
            (IntVec{2, 3, 5}));
}

TEST_F(FoldTest, IntegerArithmeticIsExact) {
  Value *A = ints({I64Max - 1, -7, 7, I64Min});
  EXPECT_EQ(foldInts(OpKind::OnnxAdd, {A, ints({1})}),
            (IntVec{I64Max, -6, 8, I64Min + 1}));
  EXPECT_EQ(foldInts(OpKind::OnnxSub, {A, ints({1})}),
            (IntVec{I64Max - 2, -8, 6, I64Max})); // wraps
  EXPECT_EQ(foldInts(OpKind::OnnxMul, {ints({3, -4}), ints({5})}),
            (IntVec{15, -20}));
  // Integer Div truncates toward zero.
  EXPECT_EQ(foldInts(OpKind::OnnxDiv, {ints({-7, 7, 64}), ints({2})}),
            (IntVec{-3, 3, 32}));
  EXPECT_EQ(foldInts(OpKind::OnnxDiv, {ints({I64Min}), ints({-1})}),
            (IntVec{I64Min}));
  EXPECT_EQ(foldInts(OpKind::OnnxPow, {ints({2, 3, -2}), ints({10})}),
            (IntVec{1024, 59049, 1024}));
  EXPECT_EQ(foldInts(OpKind::OnnxNeg, {ints({5, I64Min})}),
            (IntVec{-5, I64Min}));
}

TEST_F(FoldTest, IntegerDivisionByZeroIsAnError) {
  Value *A = ints({1}), *Z = ints({0});
  auto Types = cantFail(inferTypes(OpKind::OnnxDiv, {A, Z}, {}));
  auto R = foldOp(OpKind::OnnxDiv, {A, Z}, {}, Types);
  ASSERT_FALSE(bool(R));
  EXPECT_EQ(toString(R.takeError()), "integer division by zero");
}

TEST_F(FoldTest, FloatArithmeticBroadcasts) {
  Value *A = floats({1, 2}, {2, 1});
  Value *B = floats({10, 20, 30}, {3});
  EXPECT_EQ(foldDoubles(OpKind::OnnxAdd, {A, B}),
            (DoubleVec{11, 21, 31, 12, 22, 32}));
  EXPECT_EQ(foldDoubles(OpKind::OnnxDiv, {B, floats({4}, {})}),
            (DoubleVec{2.5, 5, 7.5}));
  EXPECT_EQ(foldDoubles(OpKind::OnnxPow, {A, floats({3}, {})}),
            (DoubleVec{1, 8}));
  EXPECT_EQ(foldDoubles(OpKind::OnnxSqrt, {floats({16, 2}, {2})})[0], 4.0);
  EXPECT_EQ(foldDoubles(OpKind::OnnxSqrt, {floats({16, 2}, {2})})[1],
            double(std::sqrt(2.0f)));
  EXPECT_EQ(foldDoubles(OpKind::OnnxNeg, {A}), (DoubleVec{-1, -2}));
  EXPECT_EQ(foldDoubles(OpKind::OnnxErf, {floats({0}, {})}), (DoubleVec{0}));
  EXPECT_FLOAT_EQ(foldDoubles(OpKind::OnnxErf, {floats({1}, {})})[0],
                  std::erf(1.0f));
  EXPECT_FLOAT_EQ(foldDoubles(OpKind::OnnxTanh, {floats({0.5f}, {})})[0],
                  std::tanh(0.5f));
  // Pow of an integer base by a float exponent keeps the base's type.
  EXPECT_EQ(foldInts(OpKind::OnnxPow, {ints({3}), floats({2}, {})}),
            (IntVec{9}));
}

TEST_F(FoldTest, Split) {
  Value *X = ints({1, 2, 3, 4, 5, 6}, {2, 3});
  auto R =
      fold(OpKind::OnnxSplit, {X, ints({1, 2})}, attrs({{"axis", int64_t(1)}}));
  ASSERT_EQ(R.size(), 2u);
  EXPECT_EQ(intsOf(*R[0]), (IntVec{1, 4}));
  EXPECT_EQ(intsOf(*R[1]), (IntVec{2, 3, 5, 6}));
  auto E = fold(OpKind::OnnxSplit, {X}, attrs({{"num_outputs", int64_t(2)}}));
  ASSERT_EQ(E.size(), 2u);
  EXPECT_EQ(intsOf(*E[1]), (IntVec{4, 5, 6}));
}

TEST_F(FoldTest, WhatDoesNotFold) {
  // A parameter or an input is not a constant.
  TensorType T(DType::F32, {2});
  Value *P =
      G.addParam("p", T, TensorData::makeInline(T, bytesOf<float>({1, 2})));
  Value *X = G.addInput("x", T);
  Value *C = floats({1, 2}, {2});
  expectNoFold(OpKind::OnnxAdd, {P, C}, {T});
  expectNoFold(OpKind::OnnxAdd, {X, C}, {T});
  // Data that cannot be loaded means "cannot fold", not an error.
  DataRef Missing;
  Missing.K = DataRef::External;
  Missing.Path = "/nonexistent/sp/weights.bin";
  Missing.Length = T.numBytes();
  Value *Lazy = G.addConst("lazy", T, TensorData::makeRef(T, Missing));
  expectNoFold(OpKind::OnnxAdd, {Lazy, C}, {T});
  // Too large a result.
  Value *Big = ints({2048, 1024});
  expectNoFold(OpKind::OnnxConstantOfShape, {Big},
               {TensorType(DType::F32, {2048, 1024})});
  // Not an evaluable op.
  EXPECT_FALSE(isFoldable(OpKind::OnnxDropout));
  EXPECT_FALSE(isFoldable(OpKind::OnnxMatMul));
  expectNoFold(OpKind::OnnxSoftmax, {C}, {T});
}

TEST_F(FoldTest, MismatchedResultTypesAreAnError) {
  Value *A = ints({1, 2});
  auto R = foldOp(OpKind::OnnxNeg, {A}, {}, {TensorType(DType::I64, {3})});
  ASSERT_FALSE(bool(R));
  consumeError(R.takeError());
}

} // namespace
