//===- Layers.cpp - canonicalize: linears, heads, embeddings, rotary ---===//
//
// One phase of the canonicalize pass (passes/Canonicalize.cpp says what
// each phase rewrites and why they run in this order).
//
//===----------------------------------------------------------------------===//
#include "passes/canonicalize/Rewriter.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>
#include <charconv>

namespace sp::canonicalize {

namespace {

//===----------------------------------------------------------------------===//
// Phase 2: layers
//===----------------------------------------------------------------------===//

/// W as a linear weight: a rank-2 parameter, or the [1, 0] Transpose of one.
/// Sets TransW when the weight is used transposed ([out, in] storage).
Value *linearWeight(Value *W, bool &TransW) {
  if (isWeight(W, 2)) {
    TransW = false;
    return W;
  }
  if (Node *T = def(W, OpKind::OnnxTranspose)) {
    auto Perm = T->attrs().getInts("perm");
    if (isWeight(T->operand(0), 2) &&
        (Perm.empty() || Perm == std::vector<int64_t>{1, 0})) {
      TransW = true;
      return T->operand(0);
    }
  }
  return nullptr;
}

/// Whether V is a constant holding the integers Want.
bool isInts(const Value *V, ArrayRef<int64_t> Want) {
  if (!V->isConst())
    return false;
  auto I = knownConstInts(V);
  return I && ArrayRef<int64_t>(*I) == Want;
}

/// Adds a following bias Add into the linear's operands if there is one.
Value *absorbBias(Value *Out, int64_t Features, Value *&Bias) {
  Node *Add = singleUser(Out, OpKind::OnnxAdd);
  Value *B = Add ? other(Add, Out) : nullptr;
  if (!B || !isWeight(B, 1) || B->type().Shape[0] != Features ||
      Add->result()->type() != Out->type())
    return Out;
  Bias = B;
  return Add->result();
}

Node *buildLinear(Rewriter &R, Node *At, Value *X, Value *W, Value *Bias,
                  bool TransW) {
  AttrList A;
  A.set("trans_w", int64_t(TransW));
  SmallVector<Value *, 3> Ops{X, W};
  if (Bias)
    Ops.push_back(Bias);
  return R.build(At, OpKind::Linear, Ops, A);
}

bool matmulLinear(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxMatMul || N.operand(0)->type().rank() < 2)
    return false;
  bool TransW;
  Value *W = linearWeight(N.operand(1), TransW);
  if (!W || N.operand(0)->isConst())
    return false;
  Value *Bias = nullptr;
  Value *Out = absorbBias(N.result(), N.result()->type().dim(-1), Bias);
  Node *L = buildLinear(R, Out->producer(), N.operand(0), W, Bias, TransW);
  R.replace(Out, L->result());
  return true;
}

bool gemmLinear(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxGemm || N.attrs().getInt("transA", 0) ||
      N.attrs().getFloat("alpha", 1.0) != 1.0 ||
      N.attrs().getFloat("beta", 1.0) != 1.0)
    return false;
  bool TransW;
  Value *W = linearWeight(N.operand(1), TransW);
  if (!W)
    return false;
  TransW ^= bool(N.attrs().getInt("transB", 0));
  int64_t Out = N.result()->type().dim(-1);
  Value *Bias = nullptr;
  if (N.numOperands() == 3) {
    Bias = N.operand(2);
    if (!isWeight(Bias, 1) || Bias->type().Shape[0] != Out)
      return false;
  }
  Node *L = buildLinear(R, &N, N.operand(0), W, Bias, TransW);
  R.replace(N.result(), L->result());
  return true;
}

/// Reshape(linear(Reshape(x, [-1, in])), [..., out]) -> linear(x): undoes
/// the flattening that 2-D Gemm exports need.
bool unflattenLinear(Rewriter &R, Node &N) {
  if (N.op() != OpKind::Linear)
    return false;
  Node *Flat = def(N.operand(0), OpKind::OnnxReshape);
  Node *Unflat = singleUser(N.result(), OpKind::OnnxReshape);
  if (!Flat || !Unflat)
    return false;
  Value *X = Flat->operand(0);
  TensorType Want = X->type();
  if (Want.rank() < 2 || N.operand(0)->type().rank() != 2)
    return false;
  Want.Shape.back() = N.result()->type().dim(-1);
  if (Unflat->result()->type() != Want)
    return false;
  SmallVector<Value *, 3> Ops(N.operands().begin(), N.operands().end());
  Ops[0] = X;
  Node *L = R.build(Unflat, OpKind::Linear, Ops, N.attrs());
  L->setName(N.name());
  R.replace(Unflat->result(), L->result());
  return true;
}

/// The [B, S, a, d] Reshape followed by the [0, 2, 1, 3] (or, for keys,
/// [0, 2, 3, 1]) Transpose applied to one Split output. Returns the
/// Transpose and the head count.
Node *headLayout(Value *Part, int64_t &Heads, bool &KeyLayout) {
  Node *Re = singleUser(Part, OpKind::OnnxReshape);
  Node *Tr = Re ? singleUser(Re->result(), OpKind::OnnxTranspose) : nullptr;
  if (!Tr)
    return nullptr;
  const TensorType &In = Part->type(), &Mid = Re->result()->type();
  if (In.rank() != 3 || Mid.rank() != 4 || Mid.Shape[0] != In.Shape[0] ||
      Mid.Shape[1] != In.Shape[1] || Mid.Shape[2] * Mid.Shape[3] != In.Shape[2])
    return nullptr;
  auto Perm = Tr->attrs().getInts("perm");
  KeyLayout = Perm == std::vector<int64_t>{0, 2, 3, 1};
  if (Perm != std::vector<int64_t>{0, 2, 1, 3} && !KeyLayout)
    return nullptr;
  Heads = Mid.Shape[2];
  return Tr;
}

bool splitHeads(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxSplit || N.numResults() != 3)
    return false;
  Value *X = N.operand(0);
  if (X->type().rank() != 3 ||
      normAxis(N.attrs().getInt("axis", 0), 3) != 2)
    return false;
  int64_t Part = X->type().dim(-1) / 3;
  SmallVector<Node *, 3> Trs;
  SmallVector<bool, 3> KeyLayouts;
  int64_t Heads = 0;
  for (unsigned I = 0; I < 3; ++I) {
    if (N.result(I)->type().dim(-1) != Part)
      return false;
    int64_t H;
    bool Key;
    Node *Tr = headLayout(N.result(I), H, Key);
    if (!Tr || (Heads && H != Heads))
      return false;
    Heads = H;
    Trs.push_back(Tr);
    KeyLayouts.push_back(Key);
  }
  AttrList A;
  A.set("heads", Heads);
  Node *SH = R.build(&N, OpKind::SplitHeads, {X}, A);
  for (unsigned I = 0; I < 3; ++I) {
    Value *V = SH->result(I);
    if (KeyLayouts[I]) { // keys already transposed for QK^T
      AttrList P;
      P.set("perm", std::vector<int64_t>{0, 1, 3, 2});
      V = R.build(Trs[I], OpKind::OnnxTranspose, {V}, P)->result();
    }
    R.replace(Trs[I]->result(), V);
  }
  return true;
}

/// V's Slice of its input's last axis with step 1, as [Start, End) clamped
/// to the axis, or nullptr.
Node *lastAxisSlice(Value *V, int64_t &Start, int64_t &End) {
  Node *Sl = def(V, OpKind::OnnxSlice);
  if (!Sl || Sl->numOperands() < 4)
    return nullptr;
  const TensorType &X = Sl->operand(0)->type();
  int64_t Rank = X.rank();
  auto Starts = knownConstInts(Sl->operand(1)),
       Ends = knownConstInts(Sl->operand(2)),
       Axes = knownConstInts(Sl->operand(3));
  if (!Starts || !Ends || !Axes || Starts->size() != 1 || Ends->size() != 1 ||
      Axes->size() != 1 || normAxis((*Axes)[0], Rank) != Rank - 1 ||
      (Sl->numOperands() >= 5 && !isInts(Sl->operand(4), {1})))
    return nullptr;
  int64_t Dim = X.dim(-1);
  auto Clamp = [Dim](int64_t I) {
    return std::clamp(I < 0 ? I + Dim : I, int64_t(0), Dim);
  };
  Start = Clamp((*Starts)[0]);
  End = Clamp((*Ends)[0]);
  return End - Start == V->type().dim(-1) ? Sl : nullptr;
}

/// GPT-NeoX's per-head fused projection: Reshape [b, s, 3h] -> [b, s, a,
/// 3d], then q, k and v as the Slices [0, d), [d, 2d) and [2d, 3d) of the
/// last axis, each Transposed [0, 2, 1, 3] -> split_heads {per_head = 1}.
bool splitHeadsPerHead(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxReshape || N.result()->users().size() != 3)
    return false;
  const TensorType &X = N.operand(0)->type(), &Y = N.result()->type();
  if (X.rank() != 3 || Y.rank() != 4 || Y.Shape[0] != X.Shape[0] ||
      Y.Shape[1] != X.Shape[1] || Y.Shape[3] % 3 ||
      Y.Shape[2] * Y.Shape[3] != X.Shape[2] || N.parent()->isOutput(N.result()))
    return false;
  int64_t D = Y.Shape[3] / 3;
  Node *Trs[3] = {nullptr, nullptr, nullptr};
  for (const Use &U : N.result()->users()) {
    int64_t Start, End;
    if (!lastAxisSlice(U.User->result(), Start, End) || End - Start != D ||
        Start % D)
      return false;
    Node *Tr = singleUser(U.User->result(), OpKind::OnnxTranspose);
    if (!Tr ||
        Tr->attrs().getInts("perm") != std::vector<int64_t>{0, 2, 1, 3} ||
        Trs[Start / D])
      return false;
    Trs[Start / D] = Tr;
  }
  AttrList A;
  A.set("heads", Y.Shape[2]);
  A.set("per_head", int64_t(1));
  Node *SH = R.build(Trs[0], OpKind::SplitHeads, {N.operand(0)}, A);
  for (unsigned I = 0; I < 3; ++I)
    R.replace(Trs[I]->result(), SH->result(I));
  return true;
}

bool mergeHeads(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxTranspose || N.operand(0)->type().rank() != 4 ||
      N.attrs().getInts("perm") != std::vector<int64_t>{0, 2, 1, 3})
    return false;
  Node *Re = singleUser(N.result(), OpKind::OnnxReshape);
  if (!Re)
    return false;
  const TensorType &In = N.operand(0)->type();
  TensorType Want(In.Dtype, {In.Shape[0], In.Shape[2], In.Shape[1] * In.Shape[3]});
  if (Re->result()->type() != Want)
    return false;
  Node *M = R.build(Re, OpKind::MergeHeads, {N.operand(0)});
  R.replace(Re->result(), M->result());
  return true;
}

/// Reshape [b, s, n*d] -> [b, s, n, d] then Transpose [0, 2, 1, 3]: one
/// projection's heads (Llama's separate q, k and v), the layout headLayout
/// checks for split_heads.
bool toHeads(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxReshape)
    return false;
  int64_t Heads;
  bool KeyLayout;
  Node *Tr = headLayout(N.operand(0), Heads, KeyLayout);
  if (!Tr)
    return false;
  AttrList A;
  A.set("heads", Heads);
  Value *V = R.build(Tr, OpKind::ToHeads, {N.operand(0)}, A)->result();
  if (KeyLayout) { // BERT's keys, transposed for QK^T: batchMatMul absorbs it
    AttrList P;
    P.set("perm", std::vector<int64_t>{0, 1, 3, 2});
    V = R.build(Tr, OpKind::OnnxTranspose, {V}, P)->result();
  }
  R.replace(Tr->result(), V);
  return true;
}

/// GQA's repeat_kv: Reshape(Expand(Unsqueeze(x [b,g,s,d], 2), [b,g,r,s,d]),
/// [b, g*r, s, d]) -> repeat_heads {repeats = r}.
bool repeatHeads(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxReshape)
    return false;
  Node *Ex = def(N.operand(0), OpKind::OnnxExpand);
  Node *Un = Ex ? def(Ex->operand(0), OpKind::OnnxUnsqueeze) : nullptr;
  if (!Un || Ex->result()->users().size() != 1 ||
      Un->result()->users().size() != 1)
    return false;
  const TensorType &X = Un->operand(0)->type(), &E = Ex->result()->type(),
                   &Y = N.result()->type();
  if (X.rank() != 4 || E.rank() != 5 || Y.rank() != 4 ||
      Un->result()->type().Shape[2] != 1 || E.Shape[0] != X.Shape[0] ||
      E.Shape[1] != X.Shape[1] || E.Shape[3] != X.Shape[2] ||
      E.Shape[4] != X.Shape[3] || Y.Shape[0] != X.Shape[0] ||
      Y.Shape[1] != X.Shape[1] * E.Shape[2] || Y.Shape[2] != X.Shape[2] ||
      Y.Shape[3] != X.Shape[3])
    return false;
  AttrList A;
  A.set("repeats", E.Shape[2]);
  Node *H = R.build(&N, OpKind::RepeatHeads, {Un->operand(0)}, A);
  R.replace(N.result(), H->result());
  return true;
}

/// A Slice of half the last axis of X from Start (x[..., Start::Step]; a
/// step other than 1 must be spelled on the last axis).
bool isHalfSlice(Value *V, Value *X, int64_t Start, int64_t Step) {
  Node *Sl = def(V, OpKind::OnnxSlice);
  if (!Sl || Sl->operand(0) != X || !isInts(Sl->operand(1), {Start}) ||
      V->type().dim(-1) != X->type().dim(-1) / 2)
    return false;
  if (Step == 1)
    return true;
  int64_t Rank = X->type().rank();
  return Sl->numOperands() >= 5 &&
         (isInts(Sl->operand(3), {-1}) || isInts(Sl->operand(3), {Rank - 1})) &&
         isInts(Sl->operand(4), {Step});
}

/// A Concat along V's last axis.
Node *lastAxisConcat(Value *V) {
  Node *Cat = def(V, OpKind::OnnxConcat);
  unsigned Rank = V->type().rank();
  if (!Cat || Rank < 1 ||
      normAxis(Cat->attrs().getInt("axis", 0), Rank) != int64_t(Rank) - 1)
    return nullptr;
  return Cat;
}

/// Unsqueeze(V, last axis): V as [.., k, 1].
Value *unsqueezedLast(Value *U) {
  Node *Un = def(U, OpKind::OnnxUnsqueeze);
  if (!Un || U->type().rank() != Un->operand(0)->type().rank() + 1 ||
      U->type().dim(-1) != 1)
    return nullptr;
  return Un->operand(0);
}

/// GPT-J's rotate_every_two(x) = stack(-x[..., 1::2], x[..., ::2],
/// -1).flatten(-2): Reshape(Concat(Unsqueeze(Neg(Slice)), Unsqueeze(Slice))).
bool isRotateEveryTwo(Value *Rot, Value *X) {
  Node *Re = def(Rot, OpKind::OnnxReshape);
  Node *Cat = Re ? lastAxisConcat(Re->operand(0)) : nullptr;
  if (!Cat || Cat->numOperands() != 2 || Rot->type() != X->type())
    return false;
  Value *A = unsqueezedLast(Cat->operand(0)), *B = unsqueezedLast(Cat->operand(1));
  Node *Neg = A ? def(A, OpKind::OnnxNeg) : nullptr;
  return Neg && B && isHalfSlice(Neg->operand(0), X, 1, 2) &&
         isHalfSlice(B, X, 0, 2);
}

/// The [.., k] value whose every element V repeats twice in a row
/// (repeat_interleave(t, 2, dim=-1), which torch 1.13 exports as a Split
/// into k columns, each Unsqueezed, Expanded to 2 and Reshaped, then a
/// Concat), or nullptr.
Value *repeatedPairs(Value *V) {
  Node *Cat = lastAxisConcat(V);
  if (!Cat)
    return nullptr;
  unsigned Rank = V->type().rank();
  Node *Split = nullptr;
  for (unsigned I = 0; I < Cat->numOperands(); ++I) {
    Value *Piece = Cat->operand(I);
    Node *Re = def(Piece, OpKind::OnnxReshape);
    Node *Ex = Re ? def(Re->operand(0), OpKind::OnnxExpand) : nullptr;
    Value *Col = Ex ? unsqueezedLast(Ex->operand(0)) : nullptr;
    Node *Sp = Col ? Col->producer() : nullptr;
    if (!Sp || Sp->op() != OpKind::OnnxSplit || (Split && Sp != Split) ||
        Sp->numResults() != Cat->numOperands() || Sp->result(I) != Col ||
        Col->type().dim(-1) != 1 || Piece->type().dim(-1) != 2 ||
        normAxis(Sp->attrs().getInt("axis", 0), Rank) != int64_t(Rank) - 1)
      return nullptr;
    Split = Sp;
  }
  return Split ? Split->operand(0) : nullptr;
}

/// The lookup, by E's ids, of the pairs table of columns [Offset, Offset +
/// K) of E's constant float32 table [P, w] (each value twice: the
/// repeat_interleave'd form rope's interleaved tables take), the table made
/// once per Key and the lookup once per table and ids, shared by q's and
/// k's rope; built at At. nullptr when the table is not such a constant.
Value *pairsLookup(Rewriter &R, Node *At, Node *E, int64_t Offset, int64_t K,
                   int Key) {
  Value *Tab = E->operand(0);
  if (!Tab->isConst() || !Tab->data() || Tab->type().Dtype != DType::F32 ||
      Tab->type().rank() != 2 || Offset + K > Tab->type().Shape[1])
    return nullptr;
  Value *Pairs = R.memo(Tab, Key, [&]() -> Value * {
    auto D = Tab->data()->load();
    if (!D) {
      consumeError(D.takeError());
      return nullptr;
    }
    int64_t Rows = Tab->type().Shape[0], W = Tab->type().Shape[1];
    std::vector<char> Bytes(Rows * K * 2 * 4);
    for (int64_t P = 0; P < Rows; ++P)
      for (int64_t J = 0; J < K; ++J)
        for (int64_t C : {0, 1})
          std::memcpy(Bytes.data() + (P * 2 * K + 2 * J + C) * 4,
                      D->data() + (P * W + Offset + J) * 4, 4);
    return R.G.addInlineConst("rope_pairs_table",
                              TensorType(DType::F32, {Rows, 2 * K}),
                              std::move(Bytes));
  });
  if (!Pairs)
    return nullptr;
  for (const Use &U : Pairs->users())
    if (U.User->op() == OpKind::Embedding && !U.User->isDead() &&
        U.User->operand(1) == E->operand(1))
      return U.User->result();
  return R.build(At, OpKind::Embedding, {Pairs, E->operand(1)})->result();
}

/// A rotary table as rope takes it, [1 or b, s, d] for X [b, a, s, d]: the
/// [b, s, d] lookup under an Unsqueeze(., 1), or a constant [1, 1, s, d],
/// [1, s, d] or [s, d] (made once per constant), or nullptr.
Value *ropeTable(Rewriter &R, Value *V, const TensorType &X) {
  Value *Table = nullptr;
  if (Value *Half = repeatedPairs(V)) {
    // GPT-J's tables, repeat_interleave'd from [.., d/2] in the graph: a
    // lookup of a constant half table becomes a lookup of its pairs table.
    Node *Un = def(Half, OpKind::OnnxUnsqueeze);
    Node *E = Un ? def(Un->operand(0), OpKind::Embedding) : nullptr;
    if (!E || Half->type().rank() != 4 || Half->type().Shape[1] != 1 ||
        E->operand(0)->type().rank() != 2)
      return nullptr;
    Table = pairsLookup(R, E, E, 0, E->operand(0)->type().Shape[1], PairsTable);
    if (!Table)
      return nullptr;
  } else if (Node *Un = def(V, OpKind::OnnxUnsqueeze)) {
    if (V->type().rank() == 4 && V->type().Shape[1] == 1)
      Table = Un->operand(0);
  } else if (V->isConst() && V->data()) {
    Table = R.memo(V, RopeTable, [&]() -> Value * {
      const TensorType &T = V->type();
      if (T.rank() < 2 || T.rank() > 4 || (T.rank() == 4 && T.Shape[1] != 1) ||
          T.numElements() != T.dim(-1) * T.dim(-2) * (T.rank() > 2 ? T.Shape[0] : 1))
        return nullptr;
      auto D = V->data()->load();
      if (!D) {
        consumeError(D.takeError());
        return nullptr;
      }
      TensorType Tab(T.Dtype, {T.rank() > 2 ? T.Shape[0] : 1, T.dim(-2),
                               T.dim(-1)});
      return R.G.addInlineConst("rope_table", Tab,
                                std::vector<char>(D->begin(), D->end()));
    });
  }
  // What rope's shape rule accepts; anything else is not this pattern.
  if (!Table)
    return nullptr;
  const TensorType &T = Table->type();
  bool Fits = T.rank() == 3 && (T.Shape[0] == 1 || T.Shape[0] == X.Shape[0]) &&
              T.Shape[1] == X.Shape[2] && T.Shape[2] == X.Shape[3] &&
              T.Dtype == X.Dtype;
  return Fits ? Table : nullptr;
}

/// rotate_half(x) = Concat(Neg(x[..., d/2:]), x[..., :d/2]) on the last axis.
bool isRotateHalf(Value *Rot, Value *X) {
  Node *Cat = lastAxisConcat(Rot);
  if (!Cat || Cat->numOperands() != 2)
    return false;
  Node *Neg = def(Cat->operand(0), OpKind::OnnxNeg);
  int64_t D = X->type().dim(-1);
  return Neg && isHalfSlice(Neg->operand(0), X, D / 2, 1) &&
         isHalfSlice(Cat->operand(1), X, 0, 1);
}

/// Rotary embedding, x * cos + rot(x) * sin with rot HF's rotate_half or
/// GPT-J's rotate_every_two (interleaved).
bool rope(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxAdd)
    return false;
  for (unsigned I : {0u, 1u}) {
    Node *MC = def(N.operand(I), OpKind::OnnxMul);
    Node *MS = def(N.operand(1 - I), OpKind::OnnxMul);
    if (!MC || !MS)
      continue;
    for (unsigned J : {0u, 1u})
      for (unsigned K : {0u, 1u}) {
        Value *X = MC->operand(J), *Cos = MC->operand(1 - J);
        Value *Rot = MS->operand(K), *Sin = MS->operand(1 - K);
        if (X->type().rank() != 4 || X->type() != N.result()->type())
          continue;
        bool Interleaved = isRotateEveryTwo(Rot, X);
        if (!Interleaved && !isRotateHalf(Rot, X))
          continue;
        Value *C = ropeTable(R, Cos, X->type()), *S = ropeTable(R, Sin, X->type());
        if (!C || !S || C->type() != S->type())
          continue;
        AttrList A;
        A.set("interleaved", int64_t(Interleaved));
        Node *Ro = R.build(&N, OpKind::Rope, {X, C, S}, A);
        R.replace(N.result(), Ro->result());
        return true;
      }
  }
  return false;
}

/// Partial rotary (GPT-NeoX's rotary_pct, GPT-J's rotary_dim):
/// Concat(rope(x[..., :r]), x[..., r:]) on the last axis -> rope(x) with
/// the [.., r] tables, which rotates the first r dims and passes the rest.
bool partialRope(Rewriter &R, Node &N) {
  Node *Cat = lastAxisConcat(N.result());
  if (Cat != &N || N.numOperands() != 2)
    return false;
  Node *Ro = def(N.operand(0), OpKind::Rope);
  int64_t RotStart, RotEnd, PassStart, PassEnd;
  Node *Rot = Ro ? lastAxisSlice(Ro->operand(0), RotStart, RotEnd) : nullptr;
  Node *Pass = lastAxisSlice(N.operand(1), PassStart, PassEnd);
  if (!Rot || !Pass || Rot->operand(0) != Pass->operand(0) || RotStart != 0 ||
      PassStart != RotEnd || N.result()->type() != Rot->operand(0)->type() ||
      PassEnd != N.result()->type().dim(-1))
    return false;
  Node *Whole =
      R.build(&N, OpKind::Rope,
              {Rot->operand(0), Ro->operand(1), Ro->operand(2)}, Ro->attrs());
  R.replace(N.result(), Whole->result());
  return true;
}

/// GPT-J's sin/cos lookup, `torch.gather(table.repeat(n, 1, 1), 1,
/// ids.unsqueeze(-1).repeat(1, 1, r))`: GatherElements(C, Tile(Unsqueeze(ids
/// [b, s], -1), [1, 1, r])) {axis = 1} with C a constant [n, P, r] whose n
/// rows are one table T -> embedding(T, ids) [b, s, r]. Other
/// GatherElements stay, and the importer's op check names them.
bool gatherLookup(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxGatherElements ||
      normAxis(N.attrs().getInt("axis", 0), 3) != 1 ||
      N.operand(0)->type().rank() != 3)
    return false;
  Value *C = N.operand(0);
  const TensorType &CT = C->type(), &IT = N.operand(1)->type();
  Node *Tile = def(N.operand(1), OpKind::OnnxTile);
  if (!C->isConst() || !C->data() || !Tile ||
      !isInts(Tile->operand(1), {1, 1, CT.Shape[2]}) ||
      IT.Shape[2] != CT.Shape[2] || IT.Shape[0] > CT.Shape[0])
    return false;
  Value *Z = Tile->operand(0);
  if (Node *Ex = def(Z, OpKind::OnnxExpand);
      Ex && Ex->operand(0)->type() == Z->type())
    Z = Ex->operand(0);
  Node *Un = def(Z, OpKind::OnnxUnsqueeze);
  if (!Un || Z->type().rank() != 3 || Z->type().Shape[2] != 1 ||
      Z->type().Shape[0] != IT.Shape[0] || Z->type().Shape[1] != IT.Shape[1])
    return false;
  Value *Ids = Un->operand(0);
  Value *Table = R.memo(C, SameRows, [&]() -> Value * {
    auto D = C->data()->load();
    if (!D) {
      consumeError(D.takeError());
      return nullptr;
    }
    size_t Row = CT.numBytes() / CT.Shape[0];
    for (int64_t I = 1; I < CT.Shape[0]; ++I)
      if (std::memcmp(D->data(), D->data() + I * Row, Row))
        return nullptr;
    return R.G.addInlineConst("gathered_table",
                              TensorType(CT.Dtype, {CT.Shape[1], CT.Shape[2]}),
                              std::vector<char>(D->data(), D->data() + Row));
  });
  if (!Table)
    return false;
  Node *E = R.build(&N, OpKind::Embedding, {Table, Ids});
  R.replace(N.result(), E->result());
  return true;
}

/// A rotary table of heads laid out [b, s, a, d] (GPT-J's, applied before
/// the permute), [1 or b, s, 1, r] with every element of a [.., r/2]
/// table twice in a row, as an interleaved rope takes it for heads [b, a,
/// s, d]: [1 or b, s, r]. Either a constant, or the repeat_interleave of an
/// Unsqueeze(., 2) of a last-axis Split piece of a lookup embedding(T, ids)
/// of a constant T: then a lookup of T's pairs table of those columns.
Value *headsLayoutTable(Rewriter &R, Node *At, Value *V, int64_t Batch,
                        int64_t Seq) {
  const TensorType &T = V->type();
  if (T.rank() != 4 || T.Shape[2] != 1 || T.Shape[1] != Seq ||
      (T.Shape[0] != 1 && T.Shape[0] != Batch) || T.Dtype != DType::F32)
    return nullptr;
  if (V->isConst() && V->data())
    return R.memo(V, HeadsLayoutTable, [&]() -> Value * {
      auto D = V->data()->load();
      if (!D) {
        consumeError(D.takeError());
        return nullptr;
      }
      return R.G.addInlineConst(
          "rope_table",
          TensorType(T.Dtype, {T.Shape[0], T.Shape[1], T.Shape[3]}),
          std::vector<char>(D->begin(), D->end()));
    });
  Value *Half = repeatedPairs(V);
  Node *Un = Half ? def(Half, OpKind::OnnxUnsqueeze) : nullptr;
  Value *Piece = Un ? Un->operand(0) : nullptr;
  Node *Sp = Piece ? Piece->producer() : nullptr;
  if (!Sp || Sp->op() != OpKind::OnnxSplit || Piece->type().rank() != 3 ||
      normAxis(Sp->attrs().getInt("axis", 0), 3) != 2)
    return nullptr;
  Node *E = def(Sp->operand(0), OpKind::Embedding);
  if (!E)
    return nullptr;
  int64_t Offset = 0, K = Piece->type().Shape[2];
  for (unsigned I = 0; Sp->result(I) != Piece; ++I)
    Offset += Sp->result(I)->type().Shape[2];
  return pairsLookup(R, At, E, Offset, K, PairsColumns + int(Offset));
}

/// GPT-J's rotary, applied to heads laid out [b, s, a, d] before their
/// permute: Transpose(rot, [0, 2, 1, 3]) where rot is x·cos + rotate(x)·sin
/// of x = Reshape(p [b, s, a·d]) (rotate_every_two, or rotate_half), or,
/// partial (rotary_dim < d), Concat(that of x[..., :r], x[..., r:]) on the
/// last axis, with [1 or b, s, 1, r] tables (headsLayoutTable) ->
/// rope(to_heads(p), cos, sin) with [1 or b, s, r] tables: the rope of the
/// permuted heads, which rotates the first r dims of each and passes the
/// rest, as partialRope's.
bool ropeBeforeHeads(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxTranspose || N.operand(0)->type().rank() != 4 ||
      N.attrs().getInts("perm") != std::vector<int64_t>{0, 2, 1, 3})
    return false;
  Value *Y = N.operand(0);
  const TensorType &YT = Y->type();
  Node *Add = def(Y, OpKind::OnnxAdd);
  Value *Whole = nullptr; // x, the [b, s, a, d] heads
  int64_t Rotary = YT.dim(-1);
  if (Node *Cat = lastAxisConcat(Y); Cat && Cat->numOperands() == 2) {
    Add = def(Cat->operand(0), OpKind::OnnxAdd);
    int64_t PassStart, PassEnd;
    Node *Pass = lastAxisSlice(Cat->operand(1), PassStart, PassEnd);
    if (!Add || !Pass || PassEnd != YT.dim(-1) ||
        Pass->operand(0)->type() != YT)
      return false;
    Whole = Pass->operand(0);
    Rotary = PassStart;
  }
  if (!Add || Add->result()->type().rank() != 4 ||
      Add->result()->type().dim(-1) != Rotary)
    return false;
  for (unsigned I : {0u, 1u}) {
    Node *MC = def(Add->operand(I), OpKind::OnnxMul);
    Node *MS = def(Add->operand(1 - I), OpKind::OnnxMul);
    if (!MC || !MS)
      continue;
    for (unsigned J : {0u, 1u})
      for (unsigned K : {0u, 1u}) {
        Value *X = MC->operand(J), *Cos = MC->operand(1 - J);
        Value *Rot = MS->operand(K), *Sin = MS->operand(1 - K);
        if (X->type() != Add->result()->type())
          continue;
        bool Interleaved = isRotateEveryTwo(Rot, X);
        if (!Interleaved && !isRotateHalf(Rot, X))
          continue;
        Value *Heads = X;
        if (Whole) { // x[..., :r] of the whole heads
          int64_t Start, End;
          Node *Sl = lastAxisSlice(X, Start, End);
          if (!Sl || Sl->operand(0) != Whole || Start != 0 || End != Rotary)
            continue;
          Heads = Whole;
        }
        Node *Re = def(Heads, OpKind::OnnxReshape);
        const TensorType &HT = Heads->type();
        if (!Re || HT != YT || Re->operand(0)->type().rank() != 3 ||
            Re->operand(0)->type().Shape[0] != HT.Shape[0] ||
            Re->operand(0)->type().Shape[1] != HT.Shape[1])
          continue;
        Value *C = headsLayoutTable(R, &N, Cos, HT.Shape[0], HT.Shape[1]);
        Value *S = headsLayoutTable(R, &N, Sin, HT.Shape[0], HT.Shape[1]);
        if (!C || !S || C->type() != S->type() || C->type().dim(-1) != Rotary)
          continue;
        AttrList HA;
        HA.set("heads", HT.Shape[2]);
        Node *H = R.build(&N, OpKind::ToHeads, {Re->operand(0)}, HA);
        AttrList A;
        A.set("interleaved", int64_t(Interleaved));
        Node *Ro = R.build(&N, OpKind::Rope, {H->result(), C, S}, A);
        R.replace(N.result(), Ro->result());
        return true;
      }
  }
  return false;
}

bool batchMatMul(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxMatMul || N.operand(0)->type().rank() < 3 ||
      N.operand(1)->type().rank() < 3)
    return false;
  Value *B = N.operand(1);
  bool TransB = false;
  if (Node *T = def(B, OpKind::OnnxTranspose)) {
    auto Perm = T->attrs().getInts("perm");
    unsigned Rank = B->type().rank();
    bool SwapsLastTwo = Perm.size() == Rank;
    for (unsigned I = 0; I < Rank && SwapsLastTwo; ++I)
      SwapsLastTwo = Perm[I] == (I + 2 < Rank   ? int64_t(I)
                                 : I + 2 == Rank ? int64_t(Rank - 1)
                                                 : int64_t(Rank - 2));
    if (SwapsLastTwo) {
      B = T->operand(0);
      TransB = true;
    }
  }
  AttrList A;
  A.set("trans_b", int64_t(TransB));
  Node *M = R.build(&N, OpKind::BatchMatMul, {N.operand(0), B}, A);
  R.replace(N.result(), M->result());
  return true;
}

bool embedding(Rewriter &R, Node &N) {
  // A parameter table, or a constant float table looked up by ids that are
  // not constant (rotary tables indexed by position ids).
  Value *Table = N.operand(0);
  bool ConstTable = Table->isConst() && Table->type().rank() == 2 &&
                    isFloat(Table->type().Dtype) && !N.operand(1)->isConst();
  if (N.op() != OpKind::OnnxGather || N.attrs().getInt("axis", 0) != 0 ||
      (!isWeight(Table, 2) && !ConstTable))
    return false;
  Node *E = R.build(&N, OpKind::Embedding, {N.operand(0), N.operand(1)});
  R.replace(N.result(), E->result());
  return true;
}


} // namespace

std::vector<Pattern> layerPatterns() {
  return {matmulLinear, gemmLinear,        unflattenLinear,
          splitHeads,   splitHeadsPerHead, toHeads,
          repeatHeads,  mergeHeads,        batchMatMul,
          embedding,    gatherLookup,      ropeBeforeHeads,
          rope,         partialRope};
}

} // namespace sp::canonicalize
