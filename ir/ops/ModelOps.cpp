//===- ModelOps.cpp - The Transformer's ops and their gradient ops --------===//
//
// Each op's definition (ir/OpDef.h), its gradient op beside it. The
// activations without attributes (silu, relu) are SP_UNARY_OP lines of
// ir/Ops.def and need nothing here.
//
//===----------------------------------------------------------------------===//
#include "ir/ops/OpTable.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

using namespace ops;

namespace {

/// A split on axis Dim.
bool isSplit(const Sharding &S, int Dim) {
  return S.K == Sharding::Split && S.Dim == Dim;
}

Sharding layoutOf(const Node &N, unsigned I) {
  return N.operand(I)->sharding();
}

/// A linear's result: x [.., in] times w ([in, out], or [out, in] with
/// trans_w), with a bias [out] as operand 2 when Bias.
Expected<TensorType> linearResult(const ShapeArgs &A, bool Bias) {
  if (auto E = expectRank(A, 0, 1))
    return E;
  const TensorType &X = A.type(0), &W = A.type(1);
  if (W.rank() != 2)
    return makeError("the weight of a linear must have rank 2");
  bool TransW = A.attrInt("trans_w");
  int64_t In = TransW ? W.Shape[1] : W.Shape[0];
  int64_t Out = TransW ? W.Shape[0] : W.Shape[1];
  if (X.dim(-1) != In)
    return makeError(formatv("input feature size {0} does not match "
                             "the weight {1} (trans_w = {2})",
                             X.dim(-1), W.str(), int(TransW)));
  if (Bias && !A.type(2).hasShape({Out}))
    return makeError(formatv("the bias must have shape [{0}]", Out));
  TensorType T = X;
  T.Shape.back() = Out;
  return T;
}

/// (x, w, b?) -> y, broadcasting; the grad of each is reduced to its shape.
Expected<TypeList> broadcastShape(const ShapeArgs &A) {
  if (A.type(0).Dtype != A.type(1).Dtype)
    return makeError("operands have different element types");
  auto S = broadcastShapes(A.type(0).Shape, A.type(1).Shape);
  if (!S)
    return S.takeError();
  return TypeList{TensorType(A.type(0).Dtype, *S)};
}

/// An add or mul of a split and a replicated value (the position embedding)
/// is split.
Sharding broadcastLayout(const Node &N) {
  if (layoutOf(N, 0).K != Sharding::Split &&
      layoutOf(N, 1).K == Sharding::Split)
    return elementwiseLayout(layoutOf(N, 1));
  return keepLayout(N);
}

/// The statistics of a row-wise norm: one f32 per row.
TensorType rowStat(const TensorType &X) {
  return TensorType(DType::F32, ArrayRef<int64_t>(X.Shape).drop_back());
}

/// Head layouts: [b, s, h] split on the features becomes [b, a, s, d] split
/// on the heads.
Sharding toHeadsLayout(const Node &N) {
  if (layoutOf(N, 0).K == Sharding::Split)
    return Sharding::split(1, layoutOf(N, 0).Parts);
  return layoutOf(N, 0);
}

/// attention {packed = 1}: (qkv [b, s, 3 a d], keep [b, s]?) {heads = a,
/// merged = 1} -> o [b, s, a d], lse [b, s, a].
Expected<TypeList> packedAttentionTypes(const ShapeArgs &A) {
  if (A.Operands.size() > 2)
    return makeError("attention {packed} expects (qkv, keep?)");
  const TensorType &X = A.type(0);
  int64_t Heads = A.attrInt("heads");
  if (X.rank() != 3 || Heads <= 0 || X.Shape[2] % (3 * Heads) ||
      !isFloat(X.Dtype))
    return makeError(formatv("attention {{packed} expects qkv [b, s, 3 * "
                             "heads * d] with heads = {0}; got {1}",
                             Heads, X.str()));
  if (!A.attrInt("merged"))
    return makeError("attention {packed} writes its output merged: it needs "
                     "merged = 1");
  if (A.attrInt("cp") > 1)
    return makeError("attention {packed} reads one rank's whole sequence; "
                     "under context parallelism q, k and v are separate");
  if (A.Operands.size() > 1) {
    const TensorType &M = A.type(1);
    if (M.rank() != 2 || M.Shape[0] != X.Shape[0] || M.Shape[1] != X.Shape[1])
      return makeError(formatv("attention's padding mask must be [b, t] = "
                               "[{0}, {1}]; got {2}",
                               X.Shape[0], X.Shape[1], M.str()));
  }
  return TypeList{TensorType(X.Dtype, {X.Shape[0], X.Shape[1], X.Shape[2] / 3}),
                  TensorType(DType::F32, {X.Shape[0], X.Shape[1], Heads})};
}

Expected<TypeList> ropeShape(const ShapeArgs &A) {
  const TensorType &X = A.type(0);
  if (X.rank() != 4)
    return makeError("rope expects [batch, heads, seq, head size]");
  // Tables narrower than the head (R < d) rotate only its first R dims and
  // pass the rest through: GPT-NeoX's partial rotary.
  int64_t Rot = A.type(1).rank() == 3 ? A.type(1).Shape[2] : 0;
  for (unsigned I : {1u, 2u}) {
    const TensorType &T = A.type(I);
    if (T.rank() != 3 || (T.Shape[0] != 1 && T.Shape[0] != X.Shape[0]) ||
        T.Shape[1] != X.Shape[2] || T.Shape[2] != Rot || Rot % 2 || Rot <= 0 ||
        Rot > X.Shape[3] || T.Dtype != X.Dtype)
      return makeError(formatv("rope table {0} must be [1 or {1}, {2}, R], R "
                               "even and at most the head size {3}, the same "
                               "for both tables; got {4}",
                               I, X.Shape[0], X.Shape[2], X.Shape[3], T.str()));
  }
  return TypeList{X};
}

/// merge_heads and split_heads_grad: each operand [b, a, s, d] becomes
/// [b, s, a d], and the operands are concatenated (dq, dk, dv -> dqkv).
Expected<TypeList> mergeHeadsShape(const ShapeArgs &A) {
  const TensorType &X = A.type(0);
  if (X.rank() != 4)
    return makeError(opName(A.Op) + " expects [batch, heads, seq, head size]");
  int64_t Parts = A.Operands.size();
  return TypeList{TensorType(
      X.Dtype, {X.Shape[0], X.Shape[2], Parts * X.Shape[1] * X.Shape[3]})};
}

/// to_heads and merge_heads_grad: [b, s, n d] {heads = n} -> [b, n, s, d].
Expected<TypeList> toHeadsShape(const ShapeArgs &A) {
  const TensorType &X = A.type(0);
  int64_t Heads = A.attrInt("heads");
  if (X.rank() != 3 || Heads <= 0 || X.Shape[2] % Heads)
    return makeError(opName(A.Op) +
                     " expects [batch, seq, heads * head size] and a "
                     "positive 'heads' dividing the last axis");
  return TypeList{
      TensorType(X.Dtype, {X.Shape[0], Heads, X.Shape[1], X.Shape[2] / Heads})};
}

Expected<TypeList> repeatHeadsShape(const ShapeArgs &A) {
  TensorType T = A.type(0);
  int64_t R = A.attrInt("repeats");
  if (T.rank() != 4 || R < 1)
    return makeError("repeat_heads expects [batch, heads, seq, head size] "
                     "and 'repeats' >= 1");
  if (A.Op == OpKind::RepeatHeads) {
    T.Shape[1] *= R;
  } else {
    if (T.Shape[1] % R)
      return makeError("repeat_heads_grad: heads not divisible by repeats");
    T.Shape[1] /= R;
  }
  return TypeList{T};
}

} // namespace

void addModelOps(OpTable &T) {
  T[size_t(OpKind::Embedding)] = {
      .MinOperands = 2, // (table[V, h], ids[...]) -> [..., h]
      .MaxOperands = 2,
      // This rank holds rows [r V, (r + 1) V).
      .Attrs = {{"vocab_parallel", attr::Int(0)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        const TensorType &Table = A.type(0), &Ids = A.type(1);
        if (Table.rank() != 2)
          return makeError("the embedding table must have rank 2");
        if (isFloat(Ids.Dtype))
          return makeError("embedding ids must be integers");
        TensorType T(Table.Dtype, Ids.Shape);
        T.Shape.push_back(Table.Shape[1]);
        return TypeList{T};
      },
      .Saved = [](const Node &N) -> SmallVector<Value *, 4> {
        return {N.operand(1)}; // the ids
      },
      .Grad = [](GradBuilder &B) -> Error {
        const Node &N = B.N;
        AttrList A;
        A.set("vocab", N.operand(0)->type().Shape[0]);
        if (attrInt(N.op(), N.attrs(), "vocab_parallel"))
          A.set("vocab_parallel", int64_t(1));
        B.accumulate(N.operand(0),
                     B.emit(OpKind::EmbeddingGrad, {N.operand(1), B.grad(0)}, A)
                         ->result());
        return Error::success();
      },
      .Layout =
          [](const Node &N) {
            return attrInt(N.op(), N.attrs(), "vocab_parallel")
                       ? Sharding::partial()
                       : Sharding::replicated();
          },
  };
  T[size_t(OpKind::EmbeddingGrad)] = {
      .MinOperands = 2, // (ids, dy) {vocab} -> dtable[V, h]
      .MaxOperands = 2,
      .Attrs = {{"vocab", attr::RequiredInt}, {"vocab_parallel", attr::Int(0)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        int64_t V = A.attrInt("vocab");
        if (V <= 0)
          return makeError("embedding_grad needs a positive 'vocab' attribute");
        return TypeList{TensorType(A.type(1).Dtype, {V, A.type(1).dim(-1)})};
      },
  };

  T[size_t(OpKind::Add)] = {
      .MinOperands = 2,
      .MaxOperands = 2,
      .Shape = broadcastShape,
      .Grad = [](GradBuilder &B) -> Error {
        B.accumulate(B.N.operand(0), B.grad(0));
        B.accumulate(B.N.operand(1), B.grad(0));
        return Error::success();
      },
      .Layout = broadcastLayout,
  };
  T[size_t(OpKind::Mul)] = {
      .MinOperands = 2,
      .MaxOperands = 2,
      .Shape = broadcastShape,
      .Saved = [](const Node &N) -> SmallVector<Value *, 4> {
        return {N.operand(0), N.operand(1)}; // each gradient reads the other
      },
      .Grad = [](GradBuilder &B) -> Error {
        // d(a b) = b da + a db; accumulate reduces broadcasts.
        const Node &N = B.N;
        for (unsigned I : {0u, 1u})
          if (B.requiresGrad(N.operand(I)))
            B.accumulate(
                N.operand(I),
                B.emit(OpKind::Mul, {B.grad(0), N.operand(1 - I)})->result());
        return Error::success();
      },
      .Layout = broadcastLayout,
  };
  T[size_t(OpKind::ReduceTo)] = {
      .MinOperands = 1, // (dy) {shape}: sum over the broadcast axes
      .MaxOperands = 1,
      .Attrs = {{"shape", attr::RequiredInts}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        auto Shape = A.attrInts("shape");
        auto B = broadcastShapes(Shape, A.type(0).Shape);
        if (!B)
          return B.takeError();
        if (ArrayRef<int64_t>(*B) != ArrayRef<int64_t>(A.type(0).Shape))
          return makeError("reduce_to: the target shape must broadcast to the "
                           "operand's shape");
        return TypeList{TensorType(A.type(0).Dtype, Shape)};
      },
  };

  T[size_t(OpKind::LayerNorm)] = {
      .MinOperands = 3, // (x, gamma, beta) -> y [, mean, rstd], last axis
      .MaxOperands = 3,
      .Attrs = {{"epsilon", attr::Float(1e-5)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        if (auto E = expectRank(A, 0, 1))
          return E;
        int64_t H = A.type(0).dim(-1);
        for (unsigned I : {1u, 2u})
          if (!A.type(I).hasShape({H}))
            return makeError(
                formatv("operand {0} must have shape [{1}]", I, H));
        // y, and the statistics the backward uses (mean, 1/std per row).
        return TypeList{A.type(0), rowStat(A.type(0)), rowStat(A.type(0))};
      },
      .Saved = [](const Node &N) -> SmallVector<Value *, 4> {
        // input, gamma, mean, 1/std
        return {N.operand(0), N.operand(1), N.result(1), N.result(2)};
      },
      .Grad = [](GradBuilder &B) -> Error {
        const Node &N = B.N;
        Node *D = B.emit(
            OpKind::LayerNormGrad,
            {B.grad(0), N.operand(0), N.operand(1), N.result(1), N.result(2)});
        for (unsigned I : {0u, 1u, 2u})
          B.accumulate(N.operand(I), D->result(I));
        return Error::success();
      },
  };
  T[size_t(OpKind::LayerNormGrad)] = {
      .MinOperands = 5, // (dy, x, gamma, mean, rstd) -> dx, dgamma, dbeta
      .MaxOperands = 5,
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        const TensorType &X = A.type(1);
        TensorType Vec(X.Dtype, {X.dim(-1)});
        return TypeList{X, Vec, Vec};
      },
  };
  T[size_t(OpKind::RmsNorm)] = {
      .MinOperands = 2, // (x, gamma) -> y [, rstd], last axis
      .MaxOperands = 2,
      .Attrs = {{"epsilon", attr::Float(1e-6)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        if (auto E = expectRank(A, 0, 1))
          return E;
        int64_t H = A.type(0).dim(-1);
        if (!A.type(1).hasShape({H}))
          return makeError(formatv("operand 1 must have shape [{0}]", H));
        // y, and 1/rms per row for the backward.
        return TypeList{A.type(0), rowStat(A.type(0))};
      },
      .Saved = [](const Node &N) -> SmallVector<Value *, 4> {
        return {N.operand(0), N.operand(1), N.result(1)}; // x, gamma, 1/rms
      },
      .Grad = [](GradBuilder &B) -> Error {
        const Node &N = B.N;
        Node *D = B.emit(OpKind::RmsNormGrad,
                         {B.grad(0), N.operand(0), N.operand(1), N.result(1)});
        B.accumulate(N.operand(0), D->result(0));
        B.accumulate(N.operand(1), D->result(1));
        return Error::success();
      },
  };
  T[size_t(OpKind::RmsNormGrad)] = {
      .MinOperands = 4, // (dy, x, gamma, rstd) -> dx, dgamma
      .MaxOperands = 4,
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        const TensorType &X = A.type(1);
        return TypeList{X, TensorType(X.Dtype, {X.dim(-1)})};
      },
  };

  T[size_t(OpKind::Linear)] = {
      .MinOperands = 2, // (x, w, bias?)
      .MaxOperands = 3,
      .Attrs = {{"trans_w",
                 attr::Int(0)}, // w is [out, in] (else [in, out])
                                // lm head: columns past it are padding
                {"valid_vocab", attr::Int(0)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        auto T = linearResult(A, A.Operands.size() == 3);
        if (!T)
          return T.takeError();
        return TypeList{*T};
      },
      .Saved = [](const Node &N) -> SmallVector<Value *, 4> {
        // Under sequence parallelism the input of a column-parallel linear
        // is all-gathered (g); the backward gathers it again from the saved
        // shard.
        if (const Node *G = regatheredInput(N))
          return {G->operand(0), N.operand(1)};
        return {N.operand(0), N.operand(1)}; // input, weight
      },
      .Grad = [](GradBuilder &B) -> Error {
        const Node &N = B.N;
        Value *DY = B.grad(0);
        int64_t TransW = attrInt(N.op(), N.attrs(), "trans_w");
        AttrList AX, AW;
        AX.set("trans_w", int64_t(!TransW));
        AW.set("trans_w", TransW);
        if (B.requiresGrad(N.operand(0)))
          B.accumulate(
              N.operand(0),
              B.emit(OpKind::Linear, {DY, N.operand(1)}, AX)->result());
        // The full input for dW: saved, or gathered again from the shard.
        const Node *G = regatheredInput(N);
        Value *X = G ? B.regathered(*G) : N.operand(0);
        B.accumulate(N.operand(1),
                     B.emit(OpKind::LinearGradW, {X, DY}, AW)->result());
        if (N.numOperands() == 3)
          B.accumulate(N.operand(2), B.emit(OpKind::BiasGrad, {DY})->result());
        return Error::success();
      },
      .Layout =
          [](const Node &N) {
            // Column-parallel (w split on its outputs): split features;
            // row-parallel (split on its inputs): partial sums.
            const Sharding &W = layoutOf(N, 1);
            if (W.K != Sharding::Split)
              return layoutOf(N, 0);
            int OutDim = attrInt(N.op(), N.attrs(), "trans_w") ? 0 : 1;
            if (W.Dim == OutDim)
              return Sharding::split(N.result()->type().rank() - 1, W.Parts);
            return Sharding::partial();
          },
  };
  T[size_t(OpKind::LinearGradW)] = {
      .MinOperands = 2, // (x, dy) {trans_w} -> dW
      .MaxOperands = 2,
      .Attrs = {{"trans_w", attr::Int(0)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        int64_t In = A.type(0).dim(-1), Out = A.type(1).dim(-1);
        if (A.attrInt("trans_w"))
          return TypeList{TensorType(A.type(0).Dtype, {Out, In})};
        return TypeList{TensorType(A.type(0).Dtype, {In, Out})};
      },
  };
  // The epilogue fusions of a lowered program (lower/FuseEpilogue.h); no
  // graph has them, so they have no gradient or layout rule.
  T[size_t(OpKind::LinearGelu)] = {
      .MinOperands = 2, // (x, w, bias?) -> z, gelu(z)
      .MaxOperands = 3,
      .Attrs = {{"trans_w", attr::Int(0)},
                {"approximate", attr::String("none")}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        auto T = linearResult(A, A.Operands.size() == 3);
        if (!T)
          return T.takeError();
        return TypeList{*T, *T};
      },
  };
  T[size_t(OpKind::LinearGeluGrad)] = {
      .MinOperands = 3, // (dy, w, z) -> gelu_grad(z, linear(dy, w))
      .MaxOperands = 3,
      .Attrs = {{"trans_w", attr::Int(0)},
                {"approximate", attr::String("none")}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        auto T = linearResult(A, /*Bias=*/false);
        if (!T)
          return T.takeError();
        if (A.type(2) != *T)
          return makeError(formatv("the GELU input {0} is not the linear's "
                                   "result {1}",
                                   A.type(2).str(), T->str()));
        return TypeList{*T};
      },
  };
  T[size_t(OpKind::BiasGrad)] = {
      .MinOperands = 1, // (dy) -> db, summed over all but the last axis
      .MaxOperands = 1,
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        return TypeList{TensorType(A.type(0).Dtype, {A.type(0).dim(-1)})};
      },
  };

  // GELU has an attribute, so it is written out; its rules are the unary
  // ones.
  T[size_t(OpKind::Gelu)] =
      unaryOp({{"approximate", attr::String("none")}}); // "none" (erf), "tanh"
  T[size_t(OpKind::GeluGrad)] =
      unaryGradOp({{"approximate", attr::String("none")}});

  // Attention.
  T[size_t(OpKind::SplitHeads)] = {
      .MinOperands = 1, // [b, s, 3h] -> q, k, v [b, a, s, d]
      .MaxOperands = 1,
      // per_head: GPT-NeoX's [a, 3, d] columns, else q | k | v blocks.
      .Attrs = {{"heads", attr::RequiredInt}, {"per_head", attr::Int(0)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        const TensorType &X = A.type(0);
        int64_t Heads = A.attrInt("heads");
        if (X.rank() != 3)
          return makeError("split_heads expects [batch, seq, 3 * hidden]");
        if (Heads <= 0 || X.Shape[2] % (3 * Heads))
          return makeError(formatv("feature size {0} is not 3 * heads ({1}) "
                                   "* head size",
                                   X.Shape[2], Heads));
        TensorType T(X.Dtype,
                     {X.Shape[0], Heads, X.Shape[1], X.Shape[2] / (3 * Heads)});
        return TypeList{T, T, T};
      },
      .Grad = [](GradBuilder &B) -> Error {
        for (unsigned I = 0; I < 3; ++I)
          if (!B.grad(I))
            return B.error(formatv("result {0} has no gradient", I));
        AttrList A;
        A.set("per_head", attrInt(B.N.op(), B.N.attrs(), "per_head"));
        B.accumulate(
            B.N.operand(0),
            B.emit(OpKind::SplitHeadsGrad, {B.grad(0), B.grad(1), B.grad(2)}, A)
                ->result());
        return Error::success();
      },
      .Layout = toHeadsLayout,
  };
  T[size_t(OpKind::SplitHeadsGrad)] = {
      .MinOperands = 3, // (dq, dk, dv) -> dqkv[b, s, 3h]
      .MaxOperands = 3,
      .Attrs = {{"per_head", attr::Int(0)}},
      .Shape = mergeHeadsShape,
  };
  T[size_t(OpKind::ToHeads)] = {
      .MinOperands = 1, // [b, s, n d] -> [b, n, s, d]
      .MaxOperands = 1,
      .Attrs = {{"heads", attr::RequiredInt}},
      .Shape = toHeadsShape,
      .Grad = [](GradBuilder &B) -> Error {
        B.accumulate(B.N.operand(0),
                     B.emit(OpKind::MergeHeads, {B.grad(0)})->result());
        return Error::success();
      },
      .Layout = toHeadsLayout,
  };
  T[size_t(OpKind::MergeHeads)] = {
      .MinOperands = 1, // [b, a, s, d] -> [b, s, a d]
      .MaxOperands = 1,
      .Shape = mergeHeadsShape,
      .Grad = [](GradBuilder &B) -> Error {
        AttrList A;
        A.set("heads", B.N.operand(0)->type().Shape[1]);
        B.accumulate(B.N.operand(0),
                     B.emit(OpKind::MergeHeadsGrad, {B.grad(0)}, A)->result());
        return Error::success();
      },
      .Layout =
          [](const Node &N) {
            if (isSplit(layoutOf(N, 0), 1))
              return Sharding::split(2, layoutOf(N, 0).Parts);
            return layoutOf(N, 0);
          },
  };
  T[size_t(OpKind::MergeHeadsGrad)] = {
      .MinOperands = 1, // (dy[b, s, h]) {heads} -> [b, a, s, d]
      .MaxOperands = 1,
      .Attrs = {{"heads", attr::RequiredInt}},
      .Shape = toHeadsShape,
  };
  T[size_t(OpKind::RepeatHeads)] = {
      .MinOperands = 1, // [b, g, s, d] -> [b, g r, s, d]: head g r + i is g
      .MaxOperands = 1,
      .Attrs = {{"repeats", attr::RequiredInt}},
      .Shape = repeatHeadsShape,
      .Grad = [](GradBuilder &B) -> Error {
        B.accumulate(B.N.operand(0),
                     B.emit(OpKind::RepeatHeadsGrad, {B.grad(0)}, B.N.attrs())
                         ->result());
        return Error::success();
      },
  };
  T[size_t(OpKind::RepeatHeadsGrad)] = {
      .MinOperands = 1, // (dy) {repeats} -> [b, g, s, d], summed
      .MaxOperands = 1,
      .Attrs = {{"repeats", attr::RequiredInt}},
      .Shape = repeatHeadsShape,
  };
  T[size_t(OpKind::Rope)] = {
      .MinOperands = 3, // (x[b, a, s, d], cos, sin [1|b, s, d])
      .MaxOperands = 3,
      // GPT-J pairs (2i, 2i + 1), else halves.
      .Attrs = {{"interleaved", attr::Int(0)}},
      .Shape = ropeShape,
      .Saved = [](const Node &N) -> SmallVector<Value *, 4> {
        return {N.operand(1), N.operand(2)}; // the cos and sin tables
      },
      .Grad = [](GradBuilder &B) -> Error {
        const Node &N = B.N;
        if (B.requiresGrad(N.operand(1)) || B.requiresGrad(N.operand(2)))
          return B.error("its cos/sin tables depend on a parameter; only "
                         "fixed rotary tables are supported");
        B.accumulate(N.operand(0),
                     B.emit(OpKind::RopeGrad,
                            {B.grad(0), N.operand(1), N.operand(2)}, N.attrs())
                         ->result());
        return Error::success();
      },
  };
  T[size_t(OpKind::RopeGrad)] = {
      .MinOperands = 3, // (dy, cos, sin) {interleaved} -> dx
      .MaxOperands = 3,
      .Attrs = {{"interleaved", attr::Int(0)}},
      .Shape = ropeShape,
  };

  T[size_t(OpKind::BatchMatMul)] = {
      .MinOperands = 2, // (a, b), batched on the leading dims
      .MaxOperands = 2,
      // causal: only the causal lower triangle of each [M, N] result (j <=
      // i) is computed, the rest is 0; causal_a: the first operand, as
      // stored, is zero above its diagonal (a causal softmax's result, or
      // its gradient). Both are set on lowered programs only
      // (lower/CausalProducts.h).
      .Attrs = {{"trans_a", attr::Int(0)},
                {"trans_b", attr::Int(0)},
                {"causal", attr::Int(0)},
                {"causal_a", attr::Int(0)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        if (auto E = expectRank(A, 0, 2))
          return E;
        if (auto E = expectRank(A, 1, 2))
          return E;
        const TensorType &X = A.type(0), &Y = A.type(1);
        bool TransA = A.attrInt("trans_a"), TransB = A.attrInt("trans_b");
        int64_t M = TransA ? X.dim(-1) : X.dim(-2);
        int64_t KA = TransA ? X.dim(-2) : X.dim(-1);
        int64_t K = TransB ? Y.dim(-1) : Y.dim(-2);
        int64_t N = TransB ? Y.dim(-2) : Y.dim(-1);
        if (KA != K)
          return makeError(formatv("contraction sizes differ: {0} and {1}",
                                   X.str(), Y.str()));
        auto Batch = broadcastShapes(ArrayRef<int64_t>(X.Shape).drop_back(2),
                                     ArrayRef<int64_t>(Y.Shape).drop_back(2));
        if (!Batch)
          return Batch.takeError();
        TensorType T(X.Dtype, *Batch);
        T.Shape.push_back(M);
        T.Shape.push_back(N);
        return TypeList{T};
      },
      .Saved = [](const Node &N) -> SmallVector<Value *, 4> {
        return {N.operand(0), N.operand(1)};
      },
      .Grad = [](GradBuilder &B) -> Error {
        const Node &N = B.N;
        if (attrInt(N.op(), N.attrs(), "trans_a"))
          return B.error("batch_matmul with trans_a is not differentiable "
                         "yet");
        if (attrInt(N.op(), N.attrs(), "causal") ||
            attrInt(N.op(), N.attrs(), "causal_a"))
          return B.error("batch_matmul with causal or causal_a (attributes "
                         "of lowered programs) is not differentiable");
        int64_t TransB = attrInt(N.op(), N.attrs(), "trans_b");
        Value *X = N.operand(0), *Y = N.operand(1), *DY = B.grad(0);
        AttrList DA, DB;
        DA.set("trans_b", int64_t(!TransB));
        DB.set("trans_a", int64_t(1));
        // C = A op(B): dA = dC op(B)^T; dB = A^T dC, or dC^T A when B is
        // stored transposed.
        if (B.requiresGrad(X))
          B.accumulate(X, B.emit(OpKind::BatchMatMul, {DY, Y}, DA)->result());
        if (B.requiresGrad(Y))
          B.accumulate(Y, (TransB ? B.emit(OpKind::BatchMatMul, {DY, X}, DB)
                                  : B.emit(OpKind::BatchMatMul, {X, DY}, DB))
                              ->result());
        return Error::success();
      },
      .Layout =
          [](const Node &N) {
            const Sharding &X = layoutOf(N, 0), &Y = layoutOf(N, 1);
            if (isSplit(X, 1) || isSplit(Y, 1))
              return Sharding::split(1, isSplit(X, 1) ? X.Parts : Y.Parts);
            return X;
          },
  };
  T[size_t(OpKind::Scale)] = {
      .MinOperands = 1, // x * alpha
      .MaxOperands = 1,
      .Attrs = {{"alpha", attr::Float(1.0)}},
      .Shape = sameAsOperand0,
      .Grad = [](GradBuilder &B) -> Error {
        B.accumulate(B.N.operand(0),
                     B.emit(OpKind::Scale, {B.grad(0)}, B.N.attrs())->result());
        return Error::success();
      },
  };
  T[size_t(OpKind::CausalMask)] = {
      .MinOperands = 1, // fill above the diagonal
      .MaxOperands = 1,
      .Attrs = {{"fill", attr::Float(0.0)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        if (A.type(0).rank() < 2)
          return makeError("causal_mask expects rank >= 2 scores");
        return TypeList{A.type(0)};
      },
      .Grad = [](GradBuilder &B) -> Error {
        AttrList A;
        A.set("fill", 0.0);
        B.accumulate(B.N.operand(0),
                     B.emit(OpKind::CausalMask, {B.grad(0)}, A)->result());
        return Error::success();
      },
  };
  T[size_t(OpKind::PaddingMask)] = {
      // (x[b, .., k], keep[b, k]): x + (1 - keep) * fill, or with where = 1,
      // x + (keep != 1 ? fill : 0).
      .MinOperands = 2,
      .MaxOperands = 2,
      .Attrs = {{"fill", attr::Float(0.0)}, {"where", attr::Int(0)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        // The attention mask of padded batches: keep[b, k] (any numeric or
        // bool type; 1 attends, 0 is padding) broadcast over heads and
        // queries.
        const TensorType &X = A.type(0), &M = A.type(1);
        if (X.rank() < 2 || !isFloat(X.Dtype) || M.rank() != 2 ||
            M.Shape[0] != X.Shape[0] || M.Shape[1] != X.dim(-1))
          return makeError(formatv("padding_mask expects scores [b, .., k] "
                                   "and a mask [b, k]; got {0} and {1}",
                                   X.str(), M.str()));
        return TypeList{X};
      },
      .Grad = [](GradBuilder &B) -> Error {
        B.accumulate(B.N.operand(0), B.grad(0)); // x + bias
        return Error::success();
      },
  };
  // The attention core's scale and causal mask fused in
  // (lower/FuseSoftmax.cpp sets them on the lowered program): softmax(x) {alpha,
  // causal, fill} is softmax(causal_mask {fill} (scale {alpha} (x))), the
  // mask only when causal = 1; softmax_grad {alpha, causal, fill} is
  // scale {alpha} (causal_mask {fill} (softmax_grad (y, dy))).
  static const std::vector<OpAttrDecl> SoftmaxAttrs = {
      {"alpha", attr::Float(1.0)},
      {"causal", attr::Int(0)},
      {"fill", attr::Float(0.0)}};
  T[size_t(OpKind::Softmax)] = {
      .MinOperands = 1, // along the last axis
      .MaxOperands = 1,
      .Attrs = SoftmaxAttrs,
      .Shape = sameAsOperand0,
      .Saved = [](const Node &N) -> SmallVector<Value *, 4> {
        return {N.result(0)};
      },
      .Grad = [](GradBuilder &B) -> Error {
        // The fused form's gradient: the mask's gradient fills with 0.
        AttrList A;
        for (const char *Name : {"alpha", "causal"})
          if (const Attribute *V = B.N.attrs().find(Name))
            A.set(Name, *V);
        if (A.has("causal"))
          A.set("fill", 0.0);
        B.accumulate(B.N.operand(0),
                     B.emit(OpKind::SoftmaxGrad, {B.N.result(), B.grad(0)}, A)
                         ->result());
        return Error::success();
      },
  };
  T[size_t(OpKind::SoftmaxGrad)] = {
      .MinOperands = 2, // (y, dy) -> dx
      .MaxOperands = 2,
      .Attrs = SoftmaxAttrs,
      .Shape = sameAsOperand0,
  };
  static const std::vector<OpAttrDecl> DropoutAttrs = {
      {"ratio", attr::Float(0.0)},
      {"key", attr::Ints()}, // Philox key [layer + 1, site]
      // Which rows of the batch (unrolled plans).
      {"microbatch", attr::Int(0)},
      {"microbatches", attr::Int(1)},
      // The input is zero above the diagonal of its last two dimensions
      // and the mask there is 0, not drawn (lower/CausalProducts.h; set on
      // lowered programs only).
      {"causal", attr::Int(0)},
      // Context parallelism: axis cp_dim is this rank's cp positions of the
      // sequence (ir/ContextLayout.h), so the keep mask is drawn at their
      // global indices.
      {"cp", attr::Int(1)},
      {"cp_zigzag", attr::Int(0)},
      {"cp_dim", attr::Int(-1)}};
  T[size_t(OpKind::Dropout)] = {
      .MinOperands = 1, // x -> y [, keep mask u8]
      .MaxOperands = 1,
      .Attrs = DropoutAttrs,
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        // y, and the 1-byte keep mask the backward uses.
        return TypeList{A.type(0), TensorType(DType::U8, A.type(0).Shape)};
      },
      .Saved = [](const Node &N) -> SmallVector<Value *, 4> {
        return {N.result(1)}; // the mask
      },
      .Grad = [](GradBuilder &B) -> Error {
        const Node &N = B.N;
        AttrList A;
        A.set("ratio", attrFloat(N.op(), N.attrs(), "ratio"));
        B.accumulate(
            N.operand(0),
            B.emit(OpKind::DropoutGrad, {B.grad(0), N.result(1)}, A)->result());
        return Error::success();
      },
  };
  // A dropout and the residual add after it (lower/FuseEpilogue.h): only
  // in lowered programs, so no gradient or layout rule.
  T[size_t(OpKind::DropoutAdd)] = {
      .MinOperands = 2, // (x, r) -> dropout(x) + r [, keep mask u8]
      .MaxOperands = 2,
      .Attrs = DropoutAttrs,
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        if (A.type(1) != A.type(0))
          return makeError(formatv("the residual {0} is not the dropout's "
                                   "input type {1}",
                                   A.type(1).str(), A.type(0).str()));
        return TypeList{A.type(0), TensorType(DType::U8, A.type(0).Shape)};
      },
  };
  T[size_t(OpKind::DropoutGrad)] = {
      .MinOperands = 2, // (dy, mask) {ratio} -> dx
      .MaxOperands = 2,
      .Attrs = {{"ratio", attr::Float(0.0)}},
      .Shape = sameAsOperand0,
  };
  // The attention core in one op (runtime/cpu/Attention.h): per head,
  // o = dropout(softmax(mask(scale q k^T))) v, with the per-row log-sum-exp
  // of the masked scores as a second result; the [s, t] scores and
  // probabilities are never stored. The attributes are those of the unfused
  // ops it stands for: scale {alpha}, causal_mask {fill} when causal = 1,
  // padding_mask {fill, where} (pad_fill, pad_where) when keep is given, and
  // dropout {ratio, key, microbatch, microbatches} when dropout = 1 (a site
  // of the layer's dropout keys, as the dropout it replaced was). With
  // packed = 1 it reads q, k, v from the QKV projection's [b, s, 3 h] output
  // as split_heads {heads} would cut it (operands (qkv, keep?)), and its
  // gradient writes one dqkv: the split_heads copies in and out are gone.
  static const std::vector<OpAttrDecl> AttentionAttrs = {
      {"scale", attr::Float(1.0)},
      {"causal", attr::Int(0)},
      {"fill", attr::Float(-10000.0)},
      {"pad_fill", attr::Float(0.0)},
      {"pad_where", attr::Int(0)},
      {"pad_first", attr::Int(0)}, // padding_mask before causal_mask
      // o [b, s, a d] and lse [b, s, a]: merge_heads of the output absorbed
      {"merged", attr::Int(0)},
      // (qkv [b, s, 3 h], keep?) read as split_heads {heads} cuts it
      {"packed", attr::Int(0)},
      {"heads", attr::Int(0)},
      {"dropout", attr::Int(0)},
      {"ratio", attr::Float(0.0)},
      {"key", attr::Ints()},
      {"microbatch", attr::Int(0)},
      {"microbatches", attr::Int(1)},
      // Context parallelism (passes/ContextParallel.cpp): q, k, v, o and
      // lse are this rank's cp positions (ir/ContextLayout.h), keep covers
      // every key of the sequence, and the keys come from the cp group by
      // cp_comm ("ring": blocks passed around it; "a2a": heads traded for
      // positions; "a2a+ring": the all-to-all inside groups of cp_a2a
      // consecutive ranks, the ring across them).
      {"cp", attr::Int(1)},
      {"cp_zigzag", attr::Int(0)},
      {"cp_comm", attr::String("ring")},
      {"cp_a2a", attr::Int(1)}};
  T[size_t(OpKind::Attention)] = {
      .MinOperands = 1,
      .MaxOperands = 4,
      .Attrs = AttentionAttrs,
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        if (A.attrInt("packed"))
          return packedAttentionTypes(A);
        if (A.Operands.size() < 3)
          return makeError("attention expects (q, k, v, keep?), or with "
                           "packed = 1 (qkv, keep?)");
        const TensorType &Q = A.type(0), &K = A.type(1), &V = A.type(2);
        if (Q.rank() != 4 || K.rank() != 4 || V.rank() != 4 ||
            K.Shape != V.Shape || K.Shape[0] != Q.Shape[0] ||
            K.Shape[3] != Q.Shape[3] || K.Shape[1] <= 0 ||
            Q.Shape[1] % K.Shape[1] != 0 || !isFloat(Q.Dtype))
          return makeError(formatv("attention expects q [b, a, s, d] and k, v "
                                   "[b, g, t, d] with g dividing a; got {0}, "
                                   "{1}, {2}",
                                   Q.str(), K.str(), V.str()));
        if (A.Operands.size() > 3) {
          const TensorType &M = A.type(3);
          // Under cp the mask covers the whole sequence's keys.
          const int64_t Keys =
              K.Shape[2] * std::max<int64_t>(1, A.attrInt("cp"));
          if (M.rank() != 2 || M.Shape[0] != Q.Shape[0] || M.Shape[1] != Keys)
            return makeError(formatv("attention's padding mask must be [b, "
                                     "t] = [{0}, {1}]; got {2}",
                                     Q.Shape[0], Keys, M.str()));
        }
        if (A.attrInt("merged"))
          return TypeList{
              TensorType(Q.Dtype,
                         {Q.Shape[0], Q.Shape[2], Q.Shape[1] * Q.Shape[3]}),
              TensorType(DType::F32, {Q.Shape[0], Q.Shape[2], Q.Shape[1]})};
        return TypeList{Q, TensorType(DType::F32, {Q.Shape[0], Q.Shape[1],
                                                   Q.Shape[2]})};
      },
      .Saved = [](const Node &N) -> SmallVector<Value *, 4> {
        // q, k, v (or qkv), o, lse and keep.
        unsigned Qkv = attentionInputs(N);
        SmallVector<Value *, 4> S;
        for (unsigned I = 0; I < Qkv; ++I)
          S.push_back(N.operand(I));
        S.append({N.result(0), N.result(1)});
        if (N.numOperands() > Qkv)
          S.push_back(N.operand(Qkv));
        return S;
      },
      .Grad = [](GradBuilder &B) -> Error {
        const Node &N = B.N;
        unsigned Qkv = attentionInputs(N);
        SmallVector<Value *, 8> In = {B.grad(0)};
        for (unsigned I = 0; I < Qkv; ++I)
          In.push_back(N.operand(I));
        In.append({N.result(0), N.result(1)});
        if (N.numOperands() > Qkv)
          In.push_back(N.operand(Qkv));
        Node *G = B.emit(OpKind::AttentionGrad, In, N.attrs());
        for (unsigned I = 0; I < Qkv; ++I)
          B.accumulate(N.operand(I), G->result(I));
        return Error::success();
      },
      // Heads split over the tensor group: so are o and lse, along their
      // heads axis (the last but one merged, as merge_heads lays it out).
      .Layout =
          [](const Node &N) {
            // (Packed: qkv's heads are its last axis, as o's and lse's.)
            bool Packed = attrInt(N.op(), N.attrs(), "packed");
            if (attrInt(N.op(), N.attrs(), "merged") &&
                isSplit(layoutOf(N, 0), Packed ? 2 : 1))
              return Sharding::split(2, layoutOf(N, 0).Parts);
            return keepLayout(N);
          },
  };
  T[size_t(OpKind::AttentionGrad)] = {
      // (do, q, k, v, o, lse, keep?) -> dq, dk, dv; packed:
      // (do, qkv, o, lse, keep?) -> dqkv
      .MinOperands = 4,
      .MaxOperands = 7,
      .Attrs = AttentionAttrs,
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        // The forward's operands must be valid ones, and do, o and lse of
        // the shapes it computes (the kernels index by them).
        const unsigned Qkv = A.attrInt("packed") ? 1 : 3;
        const size_t N = A.Operands.size();
        if (N < Qkv + 3 || N > Qkv + 4)
          return makeError(Qkv == 1 ? "attention_grad {packed} expects (do, "
                                      "qkv, o, lse, keep?)"
                                    : "attention_grad expects (do, q, k, v, "
                                      "o, lse, keep?)");
        SmallVector<Value *, 4> Fwd(A.Operands.begin() + 1,
                                    A.Operands.begin() + 1 + Qkv);
        if (N == Qkv + 4)
          Fwd.push_back(A.Operands.back());
        auto Out = opDef(OpKind::Attention)
                       .Shape(ShapeArgs{OpKind::Attention, Fwd, A.Attrs});
        if (!Out)
          return Out.takeError();
        const TensorType &O = (*Out)[0], &Lse = (*Out)[1];
        if (A.type(0).Shape != O.Shape || A.type(Qkv + 1).Shape != O.Shape ||
            A.type(Qkv + 2).Shape != Lse.Shape)
          return makeError(formatv("attention_grad: do, o and lse must be "
                                   "the forward's {0}, {0} and {1}; got {2}, "
                                   "{3}, {4}",
                                   O.str(), Lse.str(), A.type(0).str(),
                                   A.type(Qkv + 1).str(),
                                   A.type(Qkv + 2).str()));
        TypeList R;
        for (unsigned I = 0; I < Qkv; ++I)
          R.push_back(A.type(1 + I));
        return R;
      },
      // dq, dk, dv are laid out as q, k, v (do may be merged).
      .Layout = [](const Node &N) { return layoutOf(N, 1); },
  };
}

} // namespace sp
