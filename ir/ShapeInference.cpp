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
  case OpKind::Add:
  case OpKind::Mul: {
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
    // y, and the statistics the backward uses (mean, 1/std per row, f32).
    TensorType Stat(DType::F32, ArrayRef<int64_t>(Ops[0]->type().Shape).drop_back());
    return TypeList{Ops[0]->type(), Stat, Stat};
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
  case OpKind::RmsNorm: {
    if (auto E = expectOperands(Ops, 2, 2))
      return std::move(E);
    if (auto E = expectRank(Ops[0], 0, 1))
      return std::move(E);
    int64_t H = Ops[0]->type().dim(-1);
    if (!Ops[1]->type().hasShape({H}))
      return typeError(formatv("operand 1 must have shape [{0}]", H));
    // y, and 1/rms per row (f32) for the backward.
    TensorType Stat(DType::F32,
                    ArrayRef<int64_t>(Ops[0]->type().Shape).drop_back());
    return TypeList{Ops[0]->type(), Stat};
  }
  case OpKind::RmsNormGrad: {
    if (auto E = expectOperands(Ops, 4, 4))
      return std::move(E);
    const TensorType &X = Ops[1]->type();
    return TypeList{X, TensorType(X.Dtype, {X.dim(-1)})};
  }
  case OpKind::ToHeads: {
    if (auto E = expectOperands(Ops, 1, 1))
      return std::move(E);
    const TensorType &X = Ops[0]->type();
    int64_t Heads = Attrs.getInt("heads", 0);
    if (X.rank() != 3 || Heads <= 0 || X.Shape[2] % Heads)
      return typeError("to_heads expects [batch, seq, heads * head size] and "
                       "a positive 'heads' dividing the last axis");
    return TypeList{TensorType(
        X.Dtype, {X.Shape[0], Heads, X.Shape[1], X.Shape[2] / Heads})};
  }
  case OpKind::Rope:
  case OpKind::RopeGrad: {
    if (auto E = expectOperands(Ops, 3, 3))
      return std::move(E);
    const TensorType &X = Ops[0]->type();
    if (X.rank() != 4 || X.Shape[3] % 2)
      return typeError("rope expects [batch, heads, seq, head size] with an "
                       "even head size");
    for (unsigned I : {1u, 2u}) {
      const TensorType &T = Ops[I]->type();
      if (T.rank() != 3 || (T.Shape[0] != 1 && T.Shape[0] != X.Shape[0]) ||
          T.Shape[1] != X.Shape[2] || T.Shape[2] != X.Shape[3] ||
          T.Dtype != X.Dtype)
        return typeError(formatv("rope table {0} must be [1 or {1}, {2}, {3}], "
                                 "got {4}",
                                 I, X.Shape[0], X.Shape[2], X.Shape[3],
                                 T.str()));
    }
    return TypeList{X};
  }
  case OpKind::RepeatHeads:
  case OpKind::RepeatHeadsGrad: {
    if (auto E = expectOperands(Ops, 1, 1))
      return std::move(E);
    TensorType T = Ops[0]->type();
    int64_t R = Attrs.getInt("repeats", 0);
    if (T.rank() != 4 || R < 1)
      return typeError("repeat_heads expects [batch, heads, seq, head size] "
                       "and 'repeats' >= 1");
    if (Op == OpKind::RepeatHeads) {
      T.Shape[1] *= R;
    } else {
      if (T.Shape[1] % R)
        return typeError("repeat_heads_grad: heads not divisible by repeats");
      T.Shape[1] /= R;
    }
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
    bool TransA = Attrs.getInt("trans_a", 0);
    bool TransB = Attrs.getInt("trans_b", 0);
    int64_t M = TransA ? A.dim(-1) : A.dim(-2);
    int64_t KA = TransA ? A.dim(-2) : A.dim(-1);
    int64_t K = TransB ? B.dim(-1) : B.dim(-2);
    int64_t N = TransB ? B.dim(-2) : B.dim(-1);
    if (KA != K)
      return typeError(formatv("contraction sizes differ: {0} and {1}",
                               A.str(), B.str()));
    auto Batch = broadcastShapes(ArrayRef<int64_t>(A.Shape).drop_back(2),
                                 ArrayRef<int64_t>(B.Shape).drop_back(2));
    if (!Batch)
      return Batch.takeError();
    TensorType T(A.Dtype, *Batch);
    T.Shape.push_back(M);
    T.Shape.push_back(N);
    return TypeList{T};
  }
  case OpKind::CausalMask: {
    auto T = Same(1, 1);
    if (T && (*T)[0].rank() < 2)
      return typeError("causal_mask expects rank >= 2 scores");
    return T;
  }
  case OpKind::PaddingMask: {
    // The attention mask of padded batches: keep[b, k] (any numeric or bool
    // type; 1 attends, 0 is padding) broadcast over heads and queries.
    if (auto E = expectOperands(Ops, 2, 2))
      return std::move(E);
    const TensorType &X = Ops[0]->type(), &M = Ops[1]->type();
    if (X.rank() < 2 || !isFloat(X.Dtype) || M.rank() != 2 ||
        M.Shape[0] != X.Shape[0] || M.Shape[1] != X.dim(-1))
      return typeError(formatv("padding_mask expects scores [b, .., k] and a "
                               "mask [b, k]; got {0} and {1}",
                               X.str(), M.str()));
    return TypeList{X};
  }
  case OpKind::Gelu:
  case OpKind::Scale:
  case OpKind::Softmax:
  case OpKind::Silu:
    return Same(1, 1);
  case OpKind::Dropout: {
    auto T = Same(1, 1);
    if (T) // y, and the 1-byte keep mask the backward uses
      T->push_back(TensorType(DType::U8, Ops[0]->type().Shape));
    return T;
  }
  case OpKind::CrossEntropy: {
    if (auto E = expectOperands(Ops, 2, 2))
      return std::move(E);
    const TensorType &L = Ops[0]->type(), &T = Ops[1]->type();
    if (L.rank() < 1 || ArrayRef<int64_t>(L.Shape).drop_back() != ArrayRef<int64_t>(T.Shape) ||
        isFloat(T.Dtype))
      return typeError(formatv("targets {0} must be integers shaped like the "
                               "logits {1} without the vocabulary axis",
                               T.str(), L.str()));
    return TypeList{TensorType(DType::F32, {})};
  }
  case OpKind::CrossEntropyGrad:
    return Same(3, 3);
  case OpKind::EmbeddingGrad: {
    if (auto E = expectOperands(Ops, 2, 2))
      return std::move(E);
    int64_t V = Attrs.getInt("vocab", 0);
    if (V <= 0)
      return typeError("embedding_grad needs a positive 'vocab' attribute");
    return TypeList{TensorType(Ops[1]->type().Dtype, {V, Ops[1]->type().dim(-1)})};
  }
  case OpKind::ReduceTo: {
    if (auto E = expectOperands(Ops, 1, 1))
      return std::move(E);
    auto Shape = Attrs.getInts("shape");
    auto B = broadcastShapes(Shape, Ops[0]->type().Shape);
    if (!B)
      return B.takeError();
    if (ArrayRef<int64_t>(*B) != ArrayRef<int64_t>(Ops[0]->type().Shape))
      return typeError("reduce_to: the target shape must broadcast to the "
                       "operand's shape");
    return TypeList{TensorType(Ops[0]->type().Dtype, Shape)};
  }
  case OpKind::LayerNormGrad: {
    if (auto E = expectOperands(Ops, 5, 5))
      return std::move(E);
    const TensorType &X = Ops[1]->type();
    TensorType Vec(X.Dtype, {X.dim(-1)});
    return TypeList{X, Vec, Vec};
  }
  case OpKind::LinearGradW: {
    if (auto E = expectOperands(Ops, 2, 2))
      return std::move(E);
    int64_t In = Ops[0]->type().dim(-1), Out = Ops[1]->type().dim(-1);
    if (Attrs.getInt("trans_w", 0))
      return TypeList{TensorType(Ops[0]->type().Dtype, {Out, In})};
    return TypeList{TensorType(Ops[0]->type().Dtype, {In, Out})};
  }
  case OpKind::BiasGrad: {
    if (auto E = expectOperands(Ops, 1, 1))
      return std::move(E);
    return TypeList{TensorType(Ops[0]->type().Dtype, {Ops[0]->type().dim(-1)})};
  }
  case OpKind::GeluGrad:
  case OpKind::SoftmaxGrad:
  case OpKind::DropoutGrad:
  case OpKind::SiluGrad:
    return Same(2, 2);
  case OpKind::SplitHeadsGrad: {
    if (auto E = expectOperands(Ops, 3, 3))
      return std::move(E);
    const TensorType &Q = Ops[0]->type();
    if (Q.rank() != 4)
      return typeError("split_heads_grad expects [batch, heads, seq, head size]");
    return TypeList{TensorType(
        Q.Dtype, {Q.Shape[0], Q.Shape[2], 3 * Q.Shape[1] * Q.Shape[3]})};
  }
  case OpKind::MergeHeadsGrad: {
    if (auto E = expectOperands(Ops, 1, 1))
      return std::move(E);
    const TensorType &Y = Ops[0]->type();
    int64_t Heads = Attrs.getInt("heads", 0);
    if (Y.rank() != 3 || Heads <= 0 || Y.Shape[2] % Heads)
      return typeError("merge_heads_grad expects [batch, seq, heads * head "
                       "size] and a 'heads' attribute");
    return TypeList{TensorType(
        Y.Dtype, {Y.Shape[0], Heads, Y.Shape[1], Y.Shape[2] / Heads})};
  }
  case OpKind::GradNorm:
    if (Ops.empty())
      return typeError("grad_norm needs at least one gradient");
    return TypeList{TensorType(DType::F32, {})};
  case OpKind::AdamW: {
    if (auto E = expectOperands(Ops, 7, 7))
      return std::move(E);
    for (unsigned I = 1; I < 4; ++I)
      if (Ops[I]->type() != Ops[0]->type())
        return typeError(formatv("operand {0} must have the parameter's type "
                                 "{1}",
                                 I, Ops[0]->type().str()));
    for (unsigned I = 4; I < 7; ++I)
      if (Ops[I]->type() != TensorType(DType::F32, {}))
        return typeError(formatv("operand {0} must be an f32 scalar", I));
    return TypeList{};
  }
  case OpKind::TpCopy:
  case OpKind::TpReduce:
  case OpKind::AllReduce:
  case OpKind::PipeAllReduce:
    return Same(1, 1);
  case OpKind::SpGather:
  case OpKind::AllGather:
  case OpKind::SpScatter:
  case OpKind::SpSplit:
  case OpKind::ReduceScatter: {
    if (auto E = expectOperands(Ops, 1, 1))
      return std::move(E);
    TensorType T = Ops[0]->type();
    int64_t Dim = Attrs.getInt("dim", -1), Parts = Attrs.getInt("parts", 0);
    if (Dim < 0 || Dim >= int64_t(T.rank()) || Parts < 1)
      return typeError(formatv("needs 'dim' in [0, {0}) and 'parts' >= 1",
                               T.rank()));
    if (Op == OpKind::SpGather || Op == OpKind::AllGather) {
      T.Shape[Dim] *= Parts;
    } else {
      if (T.Shape[Dim] % Parts)
        return typeError(formatv("dimension {0} of size {1} is not divisible "
                                 "by {2}",
                                 Dim, T.Shape[Dim], Parts));
      T.Shape[Dim] /= Parts;
    }
    return TypeList{T};
  }
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
