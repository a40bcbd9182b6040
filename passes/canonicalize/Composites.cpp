//===- Composites.cpp - canonicalize: norms and activations ---===//
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
// Phase 1: composites
//===----------------------------------------------------------------------===//

} // namespace

bool foldIdentity(Rewriter &R, Node &N) {
  // A Cast to the same type, or a Reshape to the same shape (Llama's
  // position_ids.view(-1, s)), changes nothing.
  bool NoOp = (N.op() == OpKind::OnnxCast || N.op() == OpKind::OnnxReshape) &&
              N.numOperands() >= 1 &&
              N.operand(0)->type() == N.result()->type();
  if (N.op() != OpKind::OnnxIdentity && !NoOp)
    return false;
  R.replace(N.result(), N.operand(0));
  return true;
}

namespace {

bool fusedLayerNorm(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxLayerNormalization || N.numOperands() < 2)
    return false;
  for (unsigned I = 1; I < N.numResults(); ++I)
    if (N.result(I)->hasUsers())
      return false;
  Value *X = N.operand(0);
  int64_t Axis = N.attrs().getInt("axis", -1);
  if (normAxis(Axis, X->type().rank()) != int64_t(X->type().rank()) - 1)
    return false;
  Value *Bias = N.numOperands() > 2
                    ? N.operand(2)
                    : R.constant("ln_zero_bias", X->type().Dtype,
                                 {X->type().dim(-1)}, 0.0);
  AttrList A;
  A.set("epsilon", N.attrs().getFloat("epsilon", 1e-5));
  Node *LN = R.build(&N, OpKind::LayerNorm, {X, N.operand(1), Bias}, A);
  R.replace(N.result(), LN->result());
  return true;
}

/// ReduceMean(x) -> Sub(x, mean) -> {Pow(d, 2) -> ReduceMean -> Add eps ->
/// Sqrt, Div(d, sqrt)} -> Mul gamma -> Add beta.
bool decomposedLayerNorm(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxReduceMean || N.numOperands() != 1)
    return false;
  Value *X = N.operand(0);
  unsigned Rank = X->type().rank();
  if (!isLastAxis(&N, Rank) || !N.attrs().getInt("keepdims", 1))
    return false;
  Node *Sub = singleUser(N.result(), OpKind::OnnxSub);
  if (!Sub || Sub->operand(0) != X || Sub->operand(1) != N.result())
    return false;
  Value *D = Sub->result();
  Node *Pow = nullptr, *Div = nullptr;
  for (const Use &U : D->users()) {
    if (U.User->op() == OpKind::OnnxPow && U.OperandNo == 0 &&
        isScalar(U.User->operand(1), 2.0))
      Pow = U.User;
    else if (U.User->op() == OpKind::OnnxDiv && U.OperandNo == 0)
      Div = U.User;
  }
  if (!Pow || !Div || D->users().size() != 2)
    return false;
  Node *Var = singleUser(Pow->result(), OpKind::OnnxReduceMean);
  if (!Var || !isLastAxis(Var, Rank))
    return false;
  Node *AddEps = singleUser(Var->result(), OpKind::OnnxAdd);
  Value *Eps = AddEps ? other(AddEps, Var->result()) : nullptr;
  if (!Eps || !scalar(Eps))
    return false;
  Node *Sqrt = singleUser(AddEps->result(), OpKind::OnnxSqrt);
  if (!Sqrt || Div->operand(1) != Sqrt->result())
    return false;
  // Optional affine part.
  int64_t H = X->type().dim(-1);
  Value *Out = Div->result(), *Gamma = nullptr, *Beta = nullptr;
  if (Node *Mul = singleUser(Out, OpKind::OnnxMul)) {
    Value *W = other(Mul, Out);
    if (W && W->type().hasShape({H})) {
      Gamma = W;
      Out = Mul->result();
    }
  }
  if (Node *Add = singleUser(Out, OpKind::OnnxAdd)) {
    Value *B = other(Add, Out);
    if (B && B->type().hasShape({H})) {
      Beta = B;
      Out = Add->result();
    }
  }
  DType T = X->type().Dtype;
  if (!Gamma)
    Gamma = R.constant("ln_one_scale", T, {H}, 1.0);
  if (!Beta)
    Beta = R.constant("ln_zero_bias", T, {H}, 0.0);
  AttrList A;
  A.set("epsilon", *scalar(Eps));
  Node *LN = R.build(Out->producer(), OpKind::LayerNorm, {X, Gamma, Beta}, A);
  R.replace(Out, LN->result());
  return true;
}

/// RMSNorm as Llama exporters write it: mean(x^2) over the last axis
/// (Pow(x, 2) or Mul(x, x)), + eps, Sqrt, then x times its reciprocal
/// (Div(1, s) or Reciprocal(s)) or x divided by it, then an optional Mul by
/// the weight [h].
bool rmsNorm(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxReduceMean || N.numOperands() != 1)
    return false;
  Value *Sq = N.operand(0);
  unsigned Rank = Sq->type().rank();
  if (!Rank || !isLastAxis(&N, Rank) || !N.attrs().getInt("keepdims", 1))
    return false;
  Value *X = nullptr;
  if (Node *Pow = def(Sq, OpKind::OnnxPow); Pow && isScalar(Pow->operand(1), 2))
    X = Pow->operand(0);
  else if (Node *M = def(Sq, OpKind::OnnxMul);
           M && M->operand(0) == M->operand(1))
    X = M->operand(0);
  if (!X || Sq->users().size() != 1 || X->type() != Sq->type() ||
      !isFloat(X->type().Dtype))
    return false;
  Node *AddEps = singleUser(N.result(), OpKind::OnnxAdd);
  Value *Eps = AddEps ? other(AddEps, N.result()) : nullptr;
  if (!Eps || !scalar(Eps))
    return false;
  Node *Sqrt = singleUser(AddEps->result(), OpKind::OnnxSqrt);
  if (!Sqrt || Sqrt->result()->users().size() != 1)
    return false;
  Node *Use = Sqrt->result()->users()[0].User;
  Value *Out = nullptr;
  if (Use->op() == OpKind::OnnxDiv && Use->operand(1) == Sqrt->result() &&
      Use->operand(0) == X) { // x / sqrt(..)
    Out = Use->result();
  } else {
    Value *Inv = nullptr; // 1 / sqrt(..)
    if (Use->op() == OpKind::OnnxDiv && Use->operand(1) == Sqrt->result() &&
        isScalar(Use->operand(0), 1.0))
      Inv = Use->result();
    else if (Use->op() == OpKind::OnnxReciprocal)
      Inv = Use->result();
    Node *Mul = Inv ? singleUser(Inv, OpKind::OnnxMul) : nullptr;
    if (!Mul || other(Mul, Inv) != X)
      return false;
    Out = Mul->result();
  }
  if (Out->type() != X->type())
    return false;
  int64_t H = X->type().dim(-1);
  Value *Gamma = nullptr;
  if (Node *Mul = singleUser(Out, OpKind::OnnxMul)) {
    Value *W = other(Mul, Out);
    if (W && W->type().hasShape({H}) && Mul->result()->type() == X->type()) {
      Gamma = W;
      Out = Mul->result();
    }
  }
  if (!Gamma)
    Gamma = R.constant("rms_one_scale", X->type().Dtype, {H}, 1.0);
  AttrList A;
  A.set("epsilon", *scalar(Eps));
  Node *RN = R.build(Out->producer(), OpKind::RmsNorm, {X, Gamma}, A);
  R.replace(Out, RN->result());
  return true;
}

/// SiLU: x * Sigmoid(x), in either operand order.
bool silu(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxSigmoid)
    return false;
  Value *X = N.operand(0);
  Node *Mul = singleUser(N.result(), OpKind::OnnxMul);
  if (!Mul || other(Mul, N.result()) != X ||
      Mul->result()->type() != X->type())
    return false;
  Node *S = R.build(Mul, OpKind::Silu, {X});
  R.replace(Mul->result(), S->result());
  return true;
}

/// Starting from the value A = 1 + erf(..) (or 1 + tanh(..)), follows the
/// chain of Muls that multiplies it by X and 0.5 in any association, and
/// returns the final product.
Value *geluProduct(Value *A, Value *X) {
  bool NeedX = true, NeedHalf = true;
  Value *Cur = A;
  while (NeedX || NeedHalf) {
    Node *Mul = singleUser(Cur, OpKind::OnnxMul);
    Value *O = Mul ? other(Mul, Cur) : nullptr;
    if (!O)
      return nullptr;
    if (NeedX && O == X) {
      NeedX = false;
    } else if (NeedHalf && isScalar(O, 0.5)) {
      NeedHalf = false;
    } else if (Node *XH = def(O, OpKind::OnnxMul);
               XH && NeedX && NeedHalf && other(XH, X) &&
               isScalar(other(XH, X), 0.5)) {
      NeedX = NeedHalf = false;
    } else {
      return nullptr;
    }
    Cur = Mul->result();
  }
  return Cur;
}

/// The Add(1, T) user of T.
Value *onePlus(Value *T) {
  Node *Add = singleUser(T, OpKind::OnnxAdd);
  if (!Add || !isScalar(other(Add, T), 1.0))
    return nullptr;
  return Add->result();
}

bool erfGelu(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxErf)
    return false;
  Value *U = N.operand(0), *X = nullptr;
  if (Node *Div = def(U, OpKind::OnnxDiv);
      Div && isScalar(Div->operand(1), M_SQRT2))
    X = Div->operand(0);
  else if (Node *Mul = def(U, OpKind::OnnxMul)) {
    for (unsigned I : {0u, 1u})
      if (isScalar(Mul->operand(I), M_SQRT1_2))
        X = Mul->operand(1 - I);
  }
  Value *A = X ? onePlus(N.result()) : nullptr;
  Value *Out = A ? geluProduct(A, X) : nullptr;
  if (!Out)
    return false;
  AttrList Attrs;
  Attrs.set("approximate", std::string("none"));
  Node *G = R.build(Out->producer(), OpKind::Gelu, {X}, Attrs);
  R.replace(Out, G->result());
  return true;
}

/// tanh(sqrt(2/pi) * (x + 0.044715 * x^3)); returns x.
Value *tanhGeluInput(Value *U) {
  Node *Mul = def(U, OpKind::OnnxMul);
  if (!Mul)
    return nullptr;
  Value *Inner = nullptr;
  for (unsigned I : {0u, 1u})
    if (isScalar(Mul->operand(I), std::sqrt(2.0 / M_PI)))
      Inner = Mul->operand(1 - I);
  Node *Add = Inner ? def(Inner, OpKind::OnnxAdd) : nullptr;
  if (!Add)
    return nullptr;
  for (unsigned I : {0u, 1u}) {
    Value *X = Add->operand(I);
    Node *Cube = def(Add->operand(1 - I), OpKind::OnnxMul);
    if (!Cube)
      continue;
    for (unsigned J : {0u, 1u}) {
      Node *Pow = def(Cube->operand(J), OpKind::OnnxPow);
      if (Pow && Pow->operand(0) == X && isScalar(Pow->operand(1), 3.0) &&
          isScalar(Cube->operand(1 - J), 0.044715))
        return X;
    }
  }
  return nullptr;
}

bool tanhGelu(Rewriter &R, Node &N) {
  if (N.op() != OpKind::OnnxTanh)
    return false;
  Value *X = tanhGeluInput(N.operand(0));
  Value *A = X ? onePlus(N.result()) : nullptr;
  Value *Out = A ? geluProduct(A, X) : nullptr;
  if (!Out)
    return false;
  AttrList Attrs;
  Attrs.set("approximate", std::string("tanh"));
  Node *G = R.build(Out->producer(), OpKind::Gelu, {X}, Attrs);
  R.replace(Out, G->result());
  return true;
}


} // namespace

std::vector<Pattern> compositePatterns() {
  return {foldIdentity, fusedLayerNorm, decomposedLayerNorm, rmsNorm,
          erfGelu, tanhGelu, silu};
}

} // namespace sp::canonicalize
