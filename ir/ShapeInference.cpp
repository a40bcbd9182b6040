//===- ShapeInference.cpp - Result types of the core ops ------------------===//
#include "ir/ShapeInference.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

static Error typeError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), Msg);
}

Expected<SmallVector<int64_t, 4>> broadcastShapes(ArrayRef<int64_t> A,
                                                  ArrayRef<int64_t> B) {
  size_t R = std::max(A.size(), B.size());
  SmallVector<int64_t, 4> Out(R);
  for (size_t I = 0; I < R; ++I) {
    int64_t DA = I < R - A.size() ? 1 : A[I - (R - A.size())];
    int64_t DB = I < R - B.size() ? 1 : B[I - (R - B.size())];
    if (DA != DB && DA != 1 && DB != 1)
      return typeError(formatv("shapes [{0}] and [{1}] do not broadcast",
                               make_range(A.begin(), A.end()),
                               make_range(B.begin(), B.end())));
    Out[I] = DA == 1 ? DB : DA;
  }
  return Out;
}

Expected<std::vector<int64_t>> constInts(const Value *V) {
  if (!V->isConst() || !V->data() || !V->data()->isLoaded())
    return typeError("operand must be a constant known at compile time");
  std::vector<int64_t> R;
  for (int64_t I = 0, N = V->type().numElements(); I < N; ++I)
    R.push_back(V->data()->getInt(I));
  return R;
}

namespace {

Error expectOperands(ArrayRef<Value *> Ops, unsigned Min, unsigned Max) {
  if (Ops.size() < Min || Ops.size() > Max)
    return typeError(
        Min == Max
            ? formatv("expected {0} operands, got {1}", Min, Ops.size()).str()
            : formatv("expected {0} to {1} operands, got {2}", Min, Max,
                      Ops.size())
                  .str());
  for (unsigned I = 0; I < Ops.size(); ++I)
    if (!Ops[I])
      return typeError(formatv("operand {0} is missing", I));
  return Error::success();
}

Error expectRank(const Value *V, unsigned Operand, unsigned MinRank) {
  if (V->type().rank() < MinRank)
    return typeError(formatv("operand {0} has rank {1}, expected at least {2}",
                             Operand, V->type().rank(), MinRank));
  return Error::success();
}

Expected<TypeList> inferCoreTypes(OpKind Op, ArrayRef<Value *> Ops,
                                  const AttrList &Attrs) {
  auto Same = [&](unsigned Min, unsigned Max) -> Expected<TypeList> {
    if (auto E = expectOperands(Ops, Min, Max))
      return std::move(E);
    return TypeList{Ops[0]->type()};
  };
  switch (Op) {
  case OpKind::Embedding: {
    if (auto E = expectOperands(Ops, 2, 2))
      return std::move(E);
    const TensorType &Table = Ops[0]->type(), &Ids = Ops[1]->type();
    if (Table.rank() != 2)
      return typeError("the embedding table must have rank 2");
    if (isFloat(Ids.Dtype))
      return typeError("embedding ids must be integers");
    TensorType T(Table.Dtype, Ids.Shape);
    T.Shape.push_back(Table.Shape[1]);
    return TypeList{T};
  }
  case OpKind::Add: {
    if (auto E = expectOperands(Ops, 2, 2))
      return std::move(E);
    if (Ops[0]->type().Dtype != Ops[1]->type().Dtype)
      return typeError("operands have different element types");
    auto S = broadcastShapes(Ops[0]->type().Shape, Ops[1]->type().Shape);
    if (!S)
      return S.takeError();
    return TypeList{TensorType(Ops[0]->type().Dtype, *S)};
  }
  case OpKind::LayerNorm: {
    if (auto E = expectOperands(Ops, 3, 3))
      return std::move(E);
    if (auto E = expectRank(Ops[0], 0, 1))
      return std::move(E);
    int64_t H = Ops[0]->type().dim(-1);
    for (unsigned I : {1u, 2u})
      if (!Ops[I]->type().hasShape({H}))
        return typeError(formatv("operand {0} must have shape [{1}]", I, H));
    return TypeList{Ops[0]->type()};
  }
  case OpKind::Linear: {
    if (auto E = expectOperands(Ops, 2, 3))
      return std::move(E);
    if (auto E = expectRank(Ops[0], 0, 1))
      return std::move(E);
    const TensorType &X = Ops[0]->type(), &W = Ops[1]->type();
    if (W.rank() != 2)
      return typeError("the weight of a linear must have rank 2");
    bool TransW = Attrs.getInt("trans_w", 0);
    int64_t In = TransW ? W.Shape[1] : W.Shape[0];
    int64_t Out = TransW ? W.Shape[0] : W.Shape[1];
    if (X.dim(-1) != In)
      return typeError(formatv("input feature size {0} does not match the "
                               "weight {1} (trans_w = {2})",
                               X.dim(-1), W.str(), int(TransW)));
    if (Ops.size() == 3 && !Ops[2]->type().hasShape({Out}))
      return typeError(formatv("the bias must have shape [{0}]", Out));
    TensorType T = X;
    T.Shape.back() = Out;
    return TypeList{T};
  }
  case OpKind::SplitHeads: {
    if (auto E = expectOperands(Ops, 1, 1))
      return std::move(E);
    const TensorType &X = Ops[0]->type();
    int64_t Heads = Attrs.getInt("heads", 0);
    if (X.rank() != 3)
      return typeError("split_heads expects [batch, seq, 3 * hidden]");
    if (Heads <= 0 || X.Shape[2] % (3 * Heads))
      return typeError(formatv("feature size {0} is not 3 * heads ({1}) * "
                               "head size",
                               X.Shape[2], Heads));
    TensorType T(X.Dtype, {X.Shape[0], Heads, X.Shape[1],
                           X.Shape[2] / (3 * Heads)});
    return TypeList{T, T, T};
  }
  case OpKind::MergeHeads: {
    if (auto E = expectOperands(Ops, 1, 1))
      return std::move(E);
    const TensorType &X = Ops[0]->type();
    if (X.rank() != 4)
      return typeError("merge_heads expects [batch, heads, seq, head size]");
    return TypeList{TensorType(
        X.Dtype, {X.Shape[0], X.Shape[2], X.Shape[1] * X.Shape[3]})};
  }
  case OpKind::BatchMatMul: {
    if (auto E = expectOperands(Ops, 2, 2))
      return std::move(E);
    if (auto E = expectRank(Ops[0], 0, 2))
      return std::move(E);
    if (auto E = expectRank(Ops[1], 1, 2))
      return std::move(E);
    const TensorType &A = Ops[0]->type(), &B = Ops[1]->type();
    bool TransB = Attrs.getInt("trans_b", 0);
    int64_t K = TransB ? B.dim(-1) : B.dim(-2);
    int64_t N = TransB ? B.dim(-2) : B.dim(-1);
    if (A.dim(-1) != K)
      return typeError(formatv("contraction sizes differ: {0} and {1}",
                               A.str(), B.str()));
    auto Batch = broadcastShapes(ArrayRef<int64_t>(A.Shape).drop_back(2),
                                 ArrayRef<int64_t>(B.Shape).drop_back(2));
    if (!Batch)
      return Batch.takeError();
    TensorType T(A.Dtype, *Batch);
    T.Shape.push_back(A.dim(-2));
    T.Shape.push_back(N);
    return TypeList{T};
  }
  case OpKind::CausalMask: {
    auto T = Same(1, 1);
    if (T && (*T)[0].rank() < 2)
      return typeError("causal_mask expects rank >= 2 scores");
    return T;
  }
  case OpKind::Gelu:
  case OpKind::Scale:
  case OpKind::Softmax:
  case OpKind::Dropout:
    return Same(1, 1);
  default:
    break;
  }
  llvm_unreachable("not a core op");
}

} // namespace

Expected<TypeList> inferTypes(OpKind Op, ArrayRef<Value *> Operands,
                              const AttrList &Attrs) {
  if (isOnnxOp(Op))
    return inferOnnxTypes(Op, Operands, Attrs);
  return inferCoreTypes(Op, Operands, Attrs);
}

Expected<Node *> buildNode(Graph &G, Graph::iterator InsertPt, OpKind Op,
                           ArrayRef<Value *> Operands, AttrList Attrs,
                           std::string Name) {
  auto Types = inferTypes(Op, Operands, Attrs);
  if (!Types)
    return Types.takeError();
  Node *N = G.create(InsertPt, Op, Operands, *Types, std::move(Name));
  N->attrs() = std::move(Attrs);
  return N;
}

} // namespace sp
