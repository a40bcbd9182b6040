//===- Pointwise.cpp - canonicalize: scales, masks, softmax, dropout ---===//
//
// One phase of the canonicalize pass (passes/Canonicalize.cpp says what
// each phase rewrites and why they run in this order).
//
//===----------------------------------------------------------------------===//
#include "passes/canonicalize/Rewriter.h"
#include "llvm/Support/FormatVariadic.h"
#include <charconv>

namespace sp::canonicalize {

namespace {

//===----------------------------------------------------------------------===//
// Phase 3: pointwise
//===----------------------------------------------------------------------===//

bool scaleOp(Rewriter &R, Node &N) {
  bool IsDiv = N.op() == OpKind::OnnxDiv;
  if (!IsDiv && N.op() != OpKind::OnnxMul)
    return false;
  for (unsigned I : {1u, 0u}) {
    if (IsDiv && I == 0)
      break;
    auto C = scalar(N.operand(I));
    Value *X = N.operand(1 - I);
    if (!C || X->isConst() || !isFloat(X->type().Dtype) ||
        N.result()->type() != X->type() || (IsDiv && *C == 0))
      continue;
    AttrList A;
    A.set("alpha", IsDiv ? 1.0 / *C : *C);
    Node *S = R.build(&N, OpKind::Scale, {X}, A);
    R.replace(N.result(), S->result());
    return true;
  }
  return false;
}

/// Whether Buf's leading block of Block's shape is a lower triangle of
/// nonzeros in each [rows, cols] matrix: nonzero exactly where col <= row.
/// isTriangle would read the same elements through the Slices, one at a
/// time; this direct read is 5x faster on GPT-2's per-layer buffers (12
/// layers at s 1100: 0.16 s against 0.89 s of sp-compile), which a 96-layer
/// model at s 2048 would feel.
bool isTrilBlock(const Value *Buf, const TensorType &Block) {
  const TensorType &T = Buf->type();
  int Rank = T.rank();
  if (int(Block.rank()) != Rank || Block.dim(-1) != Block.dim(-2))
    return false;
  std::vector<int64_t> Stride(Rank, 1);
  for (int I = Rank - 2; I >= 0; --I)
    Stride[I] = Stride[I + 1] * T.dim(I + 1);
  int64_t N = Block.dim(-1);
  for (int64_t L = 0, Lead = Block.numElements() / (N * N); L < Lead; ++L) {
    int64_t Off = 0;
    for (int64_t I = Rank - 3, Rem = L; I >= 0; --I) {
      Off += Rem % Block.dim(I) * Stride[I];
      Rem /= Block.dim(I);
    }
    for (int64_t Row = 0; Row < N; ++Row)
      for (int64_t Col = 0; Col < N; ++Col)
        if ((Buf->data()->getDouble(Off + Row * Stride[Rank - 2] + Col) !=
             0) != (Col <= Row))
          return false;
  }
  return true;
}

/// Whether Sliced is the leading [S, S] block of a square constant buffer
/// whose lower triangle (with the diagonal) is set: one Slice per sliced
/// axis (torch writes one for each), starts 0 and steps 1 (GPT-2's causal
/// "bias", past the folder's limit at n_positions > 1024). When the
/// buffer's data can be read, the block must be the lower triangle by
/// value; weight-free graphs (no data) are taken by this form alone.
bool isTrilBufferSlice(Value *Sliced) {
  Value *Buf = Sliced;
  unsigned Slices = 0;
  while (Node *Slice = Buf ? def(Buf, OpKind::OnnxSlice) : nullptr) {
    auto Starts = knownConstInts(Slice->operand(1));
    if (!Starts || !all_of(*Starts, [](int64_t S) { return S == 0; }))
      return false;
    if (Slice->numOperands() > 4) {
      auto Steps = knownConstInts(Slice->operand(4));
      if (!Steps || !all_of(*Steps, [](int64_t S) { return S == 1; }))
        return false;
    }
    Buf = Slice->operand(0);
    ++Slices;
  }
  if (!Slices || !Buf->isConst() || !Buf->data() || Buf->type().rank() < 2 ||
      Buf->type().dim(-1) != Buf->type().dim(-2))
    return false;
  if (auto D = Buf->data()->load(); !D) {
    consumeError(D.takeError());
    return true; // no data (a weight-free graph)
  }
  return isTrilBlock(Buf, Sliced->type());
}

/// Where's condition masking the strict upper triangle: such a slice tested
/// for zero (Equal(., 0), or Not of a bool Cast; nanoGPT's ~bias[..]).
bool isTrilBufferTest(Value *Cond) {
  Node *Test = Cond->producer();
  if (!Test)
    return false;
  Value *Sliced = nullptr;
  if (Test->op() == OpKind::OnnxEqual && isScalar(Test->operand(1), 0.0))
    Sliced = Test->operand(0);
  else if (Test->op() == OpKind::OnnxNot) {
    Sliced = Test->operand(0);
    if (Node *Cast = def(Sliced, OpKind::OnnxCast))
      Sliced = Cast->operand(0);
  }
  return Sliced && isTrilBufferSlice(Sliced);
}

/// Where's condition keeping the lower triangle: the slice itself, or its
/// Cast to bool (HF's torch.where(bias[..], scores, min)).
bool isTrilBufferKeep(Value *Cond) {
  Value *Sliced = Cond;
  if (Node *Cast = def(Sliced, OpKind::OnnxCast))
    Sliced = Cast->operand(0);
  return isTrilBufferSlice(Sliced);
}

/// A lower triangle of ones built at run time, too large to fold:
/// Trilu(ConstantOfShape(nonzero), k = 0, upper = 0).
bool isTriluOfOnes(Value *V) {
  Node *Tri = def(V, OpKind::OnnxTrilu);
  if (!Tri || Tri->attrs().getInt("upper", 1) != 0)
    return false;
  if (Tri->numOperands() > 1 && !isScalar(Tri->operand(1), 0.0) &&
      scalar(Tri->operand(1)).value_or(1) != 0)
    return false;
  Node *Ones = def(Tri->operand(0), OpKind::OnnxConstantOfShape);
  const TensorType &T = Tri->result()->type();
  return Ones && Ones->attrs().getFloat("value", 0) != 0 && T.rank() >= 2 &&
         T.dim(-1) == T.dim(-2);
}

/// Where's condition, masking the strict upper triangle, written as
/// Not(lower triangle of ones) without constant data.
bool isNotTriluOfOnes(Value *Cond) {
  Node *Not = def(Cond, OpKind::OnnxNot);
  if (!Not)
    return false;
  Value *In = Not->operand(0);
  if (Node *Cast = def(In, OpKind::OnnxCast))
    In = Cast->operand(0);
  return isTriluOfOnes(In);
}

/// The masks below are read by value, a constant or a value computed from
/// constants alike (LazyElements: one element at a time, nothing
/// materialised, so a mask built at run time past the folder's limit, HF
/// Llama's _make_causal_mask at s > 1024, is read as a folded constant is). maskCore is the value under
/// the Expands, Unsqueezes and Reshapes that keep the last two dimensions
/// (each [s, s] matrix of the mask is one of that value's), so only its
/// elements are read.
Value *maskCore(Value *M) {
  while (Node *P = M->producer()) {
    if (P->op() != OpKind::OnnxExpand && P->op() != OpKind::OnnxUnsqueeze &&
        P->op() != OpKind::OnnxReshape && P->op() != OpKind::OnnxIdentity)
      break;
    const TensorType &In = P->operand(0)->type(), &Out = M->type();
    if (In.rank() < 2 || In.dim(-1) != Out.dim(-1) ||
        In.dim(-2) != Out.dim(-2))
      break;
    M = P->operand(0);
  }
  return M;
}

/// For an additive causal mask (0 on and below the diagonal, one fill value
/// above it), the fill; nullopt otherwise.
std::optional<double> additiveFill(LazyElements &L, Value *M) {
  M = maskCore(M);
  const TensorType &T = M->type();
  if (T.rank() < 2 || T.dim(-1) != T.dim(-2) || !L.computable(M))
    return std::nullopt;
  int64_t N = T.dim(-1);
  double F = 0;
  for (int64_t E = 0; E < T.numElements(); ++E) {
    int64_t Col = E % N, Row = (E / N) % N;
    double V = L.at(M, E);
    if (Col <= Row ? V != 0 : (F != 0 && V != F))
      return std::nullopt;
    if (Col > Row)
      F = V;
  }
  return F;
}

/// Whether each trailing [s, s] matrix of a boolean (or 0/1) condition is
/// the strictly-upper triangle (Upper) or the lower triangle with diagonal.
bool isTriangle(LazyElements &L, Value *C, bool Upper) {
  C = maskCore(C);
  const TensorType &T = C->type();
  if (T.rank() < 2 || T.dim(-1) != T.dim(-2) || !L.computable(C))
    return false;
  int64_t N = T.dim(-1);
  for (int64_t E = 0; E < T.numElements(); ++E) {
    int64_t Col = E % N, Row = (E / N) % N;
    if ((L.at(C, E) != 0) != (Upper ? Col > Row : Col <= Row))
      return false;
  }
  return true;
}

bool causalMask(Rewriter &R, Node &N) {
  Value *X = nullptr;
  double Fill = 0;
  if (N.op() == OpKind::OnnxWhere) {
    Value *C = N.operand(0);
    for (unsigned I : {1u, 2u}) {
      auto F = scalar(N.operand(I));
      Value *Other = N.operand(3 - I);
      if (!F || *F > -1e4 || Other->isConst())
        continue;
      // Where(masked, fill, x): masked is the strict upper triangle.
      bool Upper = I == 1;
      // The sliced buffers first: their direct read is the fast one.
      if ((Upper && (isTrilBufferTest(C) || isNotTriluOfOnes(C))) ||
          (!Upper && isTrilBufferKeep(C)) ||
          R.memo(C, Upper ? MaskUpper : MaskLower,
                 [&] { return isTriangle(R.Lazy, C, Upper); })) {
        X = Other;
        Fill = *F;
      }
    }
  } else if (N.op() == OpKind::OnnxAdd) {
    for (unsigned I : {0u, 1u}) {
      Value *M = N.operand(I);
      if (M->type().rank() < 2 || N.operand(1 - I)->isConst())
        continue;
      if (auto F = R.memo(M, AdditiveCausal,
                          [&] { return additiveFill(R.Lazy, M); });
          F && *F <= -1e4) {
        X = N.operand(1 - I);
        Fill = *F;
      }
    }
  }
  if (!X || X->type() != N.result()->type())
    return false;
  AttrList A;
  A.set("fill", Fill);
  Node *M = R.build(&N, OpKind::CausalMask, {X}, A);
  R.replace(N.result(), M->result());
  return true;
}

/// A padding bias built from an attention-mask input m [b, k] for scores
/// of type X [b, .., k]: the bias broadcasts over heads and queries.
struct PaddingBias {
  Value *Mask = nullptr;
  double Fill = 0;
  bool Where = false; // (1 - m) != 0 ? fill : 0, else (1 - m) * fill
};

/// Sub(1, m') where m' is m through Casts to X's type, Unsqueezes,
/// Reshapes and Expands that keep m's [b, 1, .., 1, k] layout (an Expand
/// may broadcast over the query axis): the m.
Value *oneMinusMask(Value *V, const TensorType &X) {
  Node *Sub = def(V, OpKind::OnnxSub);
  if (!Sub || !isScalar(Sub->operand(0), 1.0, 0.0) ||
      Sub->operand(1)->type().Dtype != X.Dtype)
    return nullptr;
  Value *M = Sub->operand(1);
  while (Node *P = M->producer()) {
    const TensorType &T = M->type();
    bool Layout = P->op() == OpKind::OnnxUnsqueeze ||
                  P->op() == OpKind::OnnxReshape ||
                  P->op() == OpKind::OnnxExpand;
    bool Cast = P->op() == OpKind::OnnxCast && T.Dtype == X.Dtype;
    if ((!Layout && !Cast) || T.rank() < 2 || T.Shape[0] != X.Shape[0] ||
        T.dim(-1) != X.dim(-1))
      return nullptr;
    M = P->operand(0);
  }
  const TensorType &MT = M->type();
  if (!M->isInput() || MT.rank() != 2 || MT.Shape[0] != X.Shape[0] ||
      MT.Shape[1] != X.dim(-1))
    return nullptr;
  return M;
}

/// The two forms exporters write:
///  - HF BERT, GPT-2: Mul(Sub(1, m'), fill) (or its scale);
///  - HF Llama's _expand_mask: Where(Cast(Sub(1, m'), bool), fill,
///    Sub(1, m')).
std::optional<PaddingBias> paddingBias(Value *Bias, const TensorType &X) {
  const TensorType &BT = Bias->type();
  if (BT.rank() != X.rank() || BT.Shape[0] != X.Shape[0] ||
      BT.dim(-1) != X.dim(-1))
    return std::nullopt;
  for (unsigned D = 1; D + 1 < BT.rank(); ++D)
    if (BT.Shape[D] != 1 && BT.Shape[D] != X.Shape[D])
      return std::nullopt;
  PaddingBias P;
  Value *Y = nullptr;
  if (Node *Sc = def(Bias, OpKind::Scale)) {
    P.Fill = Sc->attrs().getFloat("alpha", 1.0);
    Y = Sc->operand(0);
  } else if (Node *M = def(Bias, OpKind::OnnxMul)) {
    for (unsigned J : {0u, 1u})
      if (auto F = scalar(M->operand(J)); F && !M->operand(1 - J)->isConst()) {
        P.Fill = *F;
        Y = M->operand(1 - J);
      }
  } else if (Node *W = def(Bias, OpKind::OnnxWhere)) {
    Node *C = def(W->operand(0), OpKind::OnnxCast);
    auto F = scalar(W->operand(1));
    if (C && F && C->result()->type().Dtype == DType::Bool &&
        C->operand(0) == W->operand(2)) {
      P.Fill = *F;
      P.Where = true;
      Y = W->operand(2);
    }
  }
  if (!Y || !(P.Mask = oneMinusMask(Y, X)))
    return std::nullopt;
  return P;
}

/// The padding mask of BERT, HF GPT-2 and HF Llama, computed once from an
/// attention-mask input m [b, k] and added to every layer's scores [b, .., k]:
/// Add(x, bias) -> padding_mask(x, m) {fill[, where]}. HF Llama adds the
/// padding bias and the causal mask first (canonicalized to
/// causal_mask(bias)); Add(x, causal_mask(bias)) becomes
/// causal_mask(padding_mask(x, m)), equal wherever a row keeps an entry
/// (a masked entry is -inf or the fill either way, which softmax zeroes).
bool paddingMask(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxAdd)
    return false;
  for (unsigned I : {0u, 1u}) {
    Value *X = N.operand(1 - I), *Bias = N.operand(I);
    const TensorType &XT = X->type();
    if (XT != N.result()->type() || XT.rank() < 2)
      continue;
    Node *Causal = def(Bias, OpKind::CausalMask);
    auto P = paddingBias(Causal ? Causal->operand(0) : Bias, XT);
    if (!P)
      continue;
    AttrList A;
    A.set("fill", P->Fill);
    if (P->Where)
      A.set("where", int64_t(1));
    Value *Out = R.build(&N, OpKind::PaddingMask, {X, P->Mask}, A)->result();
    if (Causal)
      Out = R.build(&N, OpKind::CausalMask, {Out}, Causal->attrs())->result();
    R.replace(N.result(), Out);
    return true;
  }
  return false;
}

bool softmax(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxSoftmax)
    return false;
  unsigned Rank = N.operand(0)->type().rank();
  if (normAxis(N.attrs().getInt("axis", -1), Rank) != int64_t(Rank) - 1)
    return false;
  Node *S = R.build(&N, OpKind::Softmax, {N.operand(0)});
  R.replace(N.result(), S->result());
  return true;
}

bool dropout(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxDropout ||
      (N.numResults() > 1 && N.result(1)->hasUsers()))
    return false;
  double Ratio = 0.5;
  if (N.numOperands() > 1) {
    auto C = scalar(N.operand(1));
    if (!C)
      return false;
    Ratio = *C;
  }
  bool Training = false;
  if (N.numOperands() > 2) {
    auto T = scalar(N.operand(2));
    if (!T)
      return false;
    Training = *T != 0;
  }
  if (!Training) { // inference-mode dropout is the identity
    R.replace(N.result(), N.operand(0));
    return true;
  }
  AttrList A;
  A.set("ratio", Ratio);
  Node *D = R.build(&N, OpKind::Dropout, {N.operand(0)}, A);
  R.replace(N.result(), D->result());
  return true;
}

/// Whether V is a float constant of zeros whose data is at hand (the
/// `torch.zeros` GPT-NeoX's baddbmm adds its scores to, traced to an
/// initializer), read once per constant.
bool isZeros(Rewriter &R, Value *V) {
  if (!V->isConst() || !V->data() || V->type().Dtype != DType::F32)
    return false;
  return R.memo(V, AllZeros, [&]() {
    auto D = V->data()->load();
    if (!D) {
      consumeError(D.takeError());
      return false;
    }
    const char *P = D->data();
    for (int64_t I = 0; I < V->type().numElements(); ++I) {
      float F;
      std::memcpy(&F, P + I * 4, 4);
      if (F != 0.0f)
        return false;
    }
    return true;
  });
}

/// x + 0 -> x, when the zeros do not broadcast x to a larger shape
/// (`torch.baddbmm(zeros, q, k^T, beta=1, alpha)`, GPT-NeoX's scores).
bool addZeros(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxAdd)
    return false;
  for (unsigned I : {0u, 1u}) {
    Value *X = N.operand(1 - I);
    if (X->type() == N.result()->type() && isZeros(R, N.operand(I))) {
      R.replace(N.result(), X);
      return true;
    }
  }
  return false;
}

/// The [b a, s, t] scores of GPT-NeoX's _attn, q and k viewed to [b a, s, d]
/// and the product viewed back: Reshape(scale?(batch_matmul(Reshape(q),
/// Reshape(k))), [b, a, s, t]) with q, k [b, a, s|t, d] ->
/// scale?(batch_matmul(q, k)).
bool unmergedScores(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxReshape || N.result()->type().rank() != 4)
    return false;
  Value *In = N.operand(0);
  Node *Sc = def(In, OpKind::Scale);
  if (Sc && Sc->result()->users().size() != 1)
    return false;
  Node *M = def(Sc ? Sc->operand(0) : In, OpKind::BatchMatMul);
  if (!M || M->result()->users().size() != 1)
    return false;
  Node *RA = def(M->operand(0), OpKind::OnnxReshape),
       *RB = def(M->operand(1), OpKind::OnnxReshape);
  if (!RA || !RB)
    return false;
  Value *A = RA->operand(0), *B = RB->operand(0);
  const TensorType &Y = N.result()->type(), &TA = A->type(), &TB = B->type();
  auto Merged = [](const TensorType &Four, const TensorType &Three) {
    return Four.rank() == 4 && Three.rank() == 3 &&
           Three.Shape[0] == Four.Shape[0] * Four.Shape[1] &&
           Three.Shape[1] == Four.Shape[2] && Three.Shape[2] == Four.Shape[3];
  };
  if (!Merged(TA, M->operand(0)->type()) ||
      !Merged(TB, M->operand(1)->type()) || TA.Shape[0] != TB.Shape[0] ||
      TA.Shape[1] != TB.Shape[1] || !Merged(Y, M->result()->type()) ||
      Y.Shape[0] != TA.Shape[0] || Y.Shape[1] != TA.Shape[1])
    return false;
  Value *V = R.build(&N, OpKind::BatchMatMul, {A, B}, M->attrs())->result();
  if (Sc)
    V = R.build(&N, OpKind::Scale, {V}, Sc->attrs())->result();
  if (V->type() != Y)
    return false; // the new nodes die unused
  R.replace(N.result(), V);
  return true;
}

/// Elementwise product of two activations (SwiGLU's silu(gate) * up);
/// runs after scaleOp has taken the products by a scalar constant.
bool mulOp(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxMul ||
      N.operand(0)->type().Dtype != N.operand(1)->type().Dtype ||
      !isFloat(N.result()->type().Dtype) || N.operand(0)->isConst() ||
      N.operand(1)->isConst())
    return false;
  Node *M = R.build(&N, OpKind::Mul, {N.operand(0), N.operand(1)});
  R.replace(N.result(), M->result());
  return true;
}

bool addOp(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxAdd ||
      N.operand(0)->type().Dtype != N.operand(1)->type().Dtype ||
      !isFloat(N.result()->type().Dtype))
    return false;
  Node *A = R.build(&N, OpKind::Add, {N.operand(0), N.operand(1)});
  R.replace(N.result(), A->result());
  return true;
}


} // namespace

std::vector<Pattern> pointwisePatterns() {
  return {addZeros, scaleOp, unmergedScores, causalMask, paddingMask,
          softmax,  dropout, addOp,          mulOp};
}

} // namespace sp::canonicalize
