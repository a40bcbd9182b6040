//===- LazyElementsTest.cpp - Elements of constant subgraphs, one at a time ===//
//
// analysis/LazyElements.h evaluates single elements of a value computed from
// constants without materialising it. Each op it supports is checked here
// against the constant folder (ir/Fold.h), which materialises the same
// values at a small size: every element of every output equal, on a graph
// that builds an HF-style causal mask (Range, Add, Reshape, Less,
// ConstantOfShape, Where) and then passes it through the other ops.
//
//===----------------------------------------------------------------------===//
#include "analysis/LazyElements.h"
#include "ir/AsmFormat.h"
#include "passes/Passes.h"
#include "gtest/gtest.h"
#include <cmath>

using namespace sp;
using namespace llvm;

namespace {

const char *Mask = R"(
graph @lazy {
  const %start : i64[] = dense<0>
  const %limit : i64[] = dense<6>
  const %delta : i64[] = dense<1>
  const %one : i64[] = dense<1>
  const %shape66 : i64[2] = dense<[6, 6]>
  const %shape61 : i64[2] = dense<[6, 1]>
  const %shape366 : i64[3] = dense<[3, 6, 6]>
  const %ax0 : i64[1] = dense<[0]>
  const %zero : f32[] = dense<0.0>
  const %half : f32[] = dense<0.5>
  const %k1 : i64[] = dense<1>
  const %starts : i64[2] = dense<[1, 0]>
  const %ends : i64[2] = dense<[3, 6]>
  const %axes : i64[2] = dense<[1, 2]>
  const %steps : i64[2] = dense<[1, 2]>
  const %w : f32[6] = dense<[1.5, -2.0, 0.25, 3.0, -0.125, 7.0]>
  %r : i64[6] = onnx.Range(%start, %limit, %delta)
  %r1 : i64[6] = onnx.Add(%r, %one)
  %col : i64[6, 1] = onnx.Reshape(%r1, %shape61)
  %lt : bool[6, 6] = onnx.Less(%r, %col)
  %full : f32[6, 6] = onnx.ConstantOfShape(%shape66) {dtype = 1, value = -3.4028234663852886e+38}
  %m : f32[6, 6] = onnx.Where(%lt, %zero, %full)
  %u : f32[1, 6, 6] = onnx.Unsqueeze(%m, %ax0)
  %e : f32[3, 6, 6] = onnx.Expand(%u, %shape366)
  %t : f32[3, 6, 6] = onnx.Trilu(%e, %k1) {upper = 1}
  %tr : f32[6, 3, 6] = onnx.Transpose(%t) {perm = [1, 0, 2]}
  %s : f32[6, 2, 3] = onnx.Slice(%tr, %starts, %ends, %axes, %steps)
  %c : i64[6, 2, 3] = onnx.Cast(%s) {to = 7}
  %wf : f32[6, 6] = onnx.Mul(%m, %zero)
  %x : f32[6, 6] = onnx.Add(%wf, %w)
  %y : f32[6, 6] = onnx.Div(%x, %half)
  %z : f32[6, 6] = onnx.Sub(%y, %w)
  %ng : f32[6, 6] = onnx.Neg(%z)
  %gt : bool[6, 6] = onnx.Greater(%ng, %zero)
  %eq : bool[6, 6] = onnx.Equal(%r, %col)
  %nt : bool[6, 6] = onnx.Not(%eq)
  %an : bool[6, 6] = onnx.And(%nt, %gt)
  %sq : f32[6, 6] = onnx.Squeeze(%u, %ax0)
  output "m" = %m
  output "t" = %t
  output "s" = %s
  output "c" = %c
  output "ng" = %ng
  output "an" = %an
  output "sq" = %sq
}
)";

TEST(LazyElements, EveryElementIsTheFoldersValue) {
  auto Lazy = parseGraph(Mask, "lazy");
  auto Folded = parseGraph(Mask, "folded");
  ASSERT_TRUE(bool(Lazy) && bool(Folded));
  PassContext Ctx;
  ASSERT_FALSE(bool(createConstantFoldPass()->run(**Folded, Ctx)));
  LazyElements L;
  ASSERT_EQ((*Lazy)->outputs().size(), (*Folded)->outputs().size());
  for (size_t K = 0; K < (*Lazy)->outputs().size(); ++K) {
    Value *V = (*Lazy)->outputs()[K].V, *F = (*Folded)->outputs()[K].V;
    SCOPED_TRACE((*Lazy)->outputs()[K].Name);
    ASSERT_FALSE(V->isConst()) << "computed, not folded, in the lazy graph";
    ASSERT_TRUE(F->isConst() && F->data()) << "folded in the other";
    ASSERT_TRUE(L.computable(V));
    ASSERT_FALSE(bool(F->data()->load().takeError()));
    for (int64_t E = 0; E < V->type().numElements(); ++E)
      EXPECT_EQ(L.at(V, E), F->data()->getDouble(E)) << "element " << E;
  }
}

TEST(LazyElements, InputsAndParametersAreNotComputable) {
  auto G = parseGraph(R"(
graph @g {
  input %x : f32[2, 2]
  const %one : f32[] = dense<1.0>
  %y : f32[2, 2] = onnx.Add(%x, %one)
  %z : f32[2, 2] = onnx.Sqrt(%y)
  output "y" = %y
  output "z" = %z
}
)",
                      "g");
  ASSERT_TRUE(bool(G));
  LazyElements L;
  EXPECT_FALSE(L.computable((*G)->outputs()[0].V));
  EXPECT_FALSE(L.computable((*G)->outputs()[1].V));
}

} // namespace
