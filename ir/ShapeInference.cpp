//===- ShapeInference.cpp - Result types of every op ----------------------===//
//
// The core ops' shape rules are in their definitions (ir/ops/); the onnx.*
// ops' in ir/OnnxShapes.cpp.
//
//===----------------------------------------------------------------------===//
#include "ir/ShapeInference.h"
#include "ir/OpDef.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

Expected<SmallVector<int64_t, 4>> broadcastShapes(ArrayRef<int64_t> A,
                                                  ArrayRef<int64_t> B) {
  size_t R = std::max(A.size(), B.size());
  SmallVector<int64_t, 4> Out(R);
  for (size_t I = 0; I < R; ++I) {
    int64_t DA = I < R - A.size() ? 1 : A[I - (R - A.size())];
    int64_t DB = I < R - B.size() ? 1 : B[I - (R - B.size())];
    if (DA != DB && DA != 1 && DB != 1)
      return makeError(formatv("shapes [{0}] and [{1}] do not broadcast",
                               make_range(A.begin(), A.end()),
                               make_range(B.begin(), B.end())));
    Out[I] = DA == 1 ? DB : DA;
  }
  return Out;
}

Expected<std::vector<int64_t>> constInts(const Value *V) {
  if (!V->isConst() || !V->data() || !V->data()->isLoaded())
    return makeError("operand must be a constant known at compile time");
  std::vector<int64_t> R;
  for (int64_t I = 0, N = V->type().numElements(); I < N; ++I)
    R.push_back(V->data()->getInt(I));
  return R;
}

std::optional<std::vector<int64_t>> knownConstInts(const Value *V) {
  auto R = constInts(V);
  if (!R) {
    consumeError(R.takeError());
    return std::nullopt;
  }
  return std::move(*R);
}

/// The operand count the definition declares, each operand present.
static Error checkOperands(const OpDef &D, ArrayRef<Value *> Ops) {
  unsigned Min = D.MinOperands, Max = D.MaxOperands;
  if (Ops.size() < Min || Ops.size() > Max)
    return makeError(
        Min == Max
            ? formatv("expected {0} operands, got {1}", Min, Ops.size()).str()
        : Max == OpDef::Variadic
            ? formatv("expected at least {0} operands, got {1}", Min,
                      Ops.size())
                  .str()
            : formatv("expected {0} to {1} operands, got {2}", Min, Max,
                      Ops.size())
                  .str());
  for (unsigned I = 0; I < Ops.size(); ++I)
    if (!Ops[I])
      return makeError(formatv("operand {0} is missing", I));
  return Error::success();
}

Expected<TypeList> inferTypes(OpKind Op, ArrayRef<Value *> Operands,
                              const AttrList &Attrs) {
  if (isOnnxOp(Op))
    return inferOnnxTypes(Op, Operands, Attrs);
  const OpDef &D = opDef(Op);
  if (!D.Shape)
    return makeError(Twine(opName(Op)) +
                     " exists only in lowered programs, not in graphs");
  if (auto E = checkOperands(D, Operands))
    return E;
  return D.Shape(ShapeArgs{Op, Operands, Attrs});
}

Expected<Node *> buildNode(Graph &G, Graph::iterator InsertPt, OpKind Op,
                           ArrayRef<Value *> Operands, AttrList Attrs,
                           std::string Name, unsigned MaxResults) {
  auto Types = inferTypes(Op, Operands, Attrs);
  if (!Types)
    return Types.takeError();
  if (Types->size() > MaxResults)
    Types->resize(MaxResults);
  Node *N = G.create(InsertPt, Op, Operands, *Types, std::move(Name));
  N->attrs() = std::move(Attrs);
  return N;
}

} // namespace sp
