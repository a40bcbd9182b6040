//===- Canonicalize.cpp - Exporter patterns to core ops -------------------===//
//
// Rewrites what ONNX exporters write into the core ops that later passes
// reason about. Patterns run in phases, each to a fixed point, because some
// match inside others (the Div by sqrt(2) in an erf GELU is not a scaling):
//
//  1. composites   LayerNormalization or its decomposition
//                  (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add)
//                  -> layer_norm; RMSNorm (Pow or Mul/ReduceMean/Add/Sqrt,
//                  then Div(1, .), Reciprocal or Div(x, .), Mul weight)
//                  -> rms_norm; x * Sigmoid(x) -> silu; erf GELU (Div/Erf/Add/Mul/Mul) and tanh
//                  GELU (Pow/Mul/Add/Mul/Tanh/Add/Mul/Mul) -> gelu;
//                  Identity and no-op Casts disappear.
//  2. layers       MatMul by a parameter (or its Transpose) plus a bias Add,
//                  and Gemm -> linear (2-D Gemm inputs reshaped from 3-D
//                  activations are folded back); Split + Reshape + Transpose
//                  -> split_heads; Transpose + Reshape -> merge_heads;
//                  MatMul of activations -> batch_matmul (trans_b absorbs a
//                  Transpose of the last two axes); Gather from a parameter
//                  table -> embedding.
//  3. pointwise    Div/Mul by a scalar constant -> scale; Where or Add with a
//                  constant causal mask -> causal_mask; Add of
//                  (1 - attention_mask) * fill -> padding_mask; Softmax -> softmax;
//                  Dropout -> dropout (or nothing, in inference mode);
//                  Add -> add.
//
// Each phase sweeps the node list until nothing changes. Patterns only create
// nodes and redirect uses; nodes left without users are erased between
// sweeps, so a pattern never sees a dead node.
//
// Causal masks are recognised from their values when the mask is a constant
// the compiler can evaluate (folded Trilu/Where subgraphs, or a tril buffer
// with data). Two forms are recognised on structure alone: a weight-free
// graph cannot read its mask buffer, so the torch/GPT-2 form
// `Where(Equal(Slice(buffer), 0), fill, scores)` (or with Not/Cast instead of
// Equal) on a [.., S, S] buffer is accepted, assuming the buffer is the
// lower-triangular tril that GPT-2 and nanoGPT register; and a mask built at
// run time too large to fold, `Not(Trilu(ConstantOfShape(true), 0, upper=0))`,
// is causal by construction.
//
//===----------------------------------------------------------------------===//
#include "ir/ShapeInference.h"
#include "analysis/LazyElements.h"
#include "passes/Passes.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/ADT/DenseMap.h"
#include <any>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>

using namespace llvm;

namespace sp {
namespace {

//===----------------------------------------------------------------------===//
// Matching helpers
//===----------------------------------------------------------------------===//

Node *def(Value *V, OpKind K) {
  Node *N = V ? V->producer() : nullptr;
  return N && N->op() == K ? N : nullptr;
}

/// The value of a constant with one element whose data is at hand.
std::optional<double> scalar(const Value *V) {
  if (!V->isConst() || V->type().numElements() != 1 || !V->data())
    return std::nullopt;
  if (!V->data()->isLoaded() && !V->data()->isInline()) {
    if (auto D = V->data()->load(); !D) {
      consumeError(D.takeError());
      return std::nullopt;
    }
  }
  double D = V->data()->getDouble(0);
  if (V->type().Dtype == DType::F32 && std::isfinite(D)) {
    // Keep the decimal the exporter meant (1e-05, not 9.99999974e-06): the
    // shortest spelling of the float, read back as a double.
    char Buf[32];
    auto R = std::to_chars(Buf, Buf + sizeof(Buf), float(D));
    std::from_chars(Buf, R.ptr, D);
  }
  return D;
}

bool isScalar(const Value *V, double Want, double RelTol = 1e-4) {
  auto S = scalar(V);
  return S && std::abs(*S - Want) <= RelTol * std::abs(Want);
}

/// The single user of V, if it has exactly one and V is not a graph output.
Node *singleUser(Value *V, OpKind K) {
  if (V->users().size() != 1)
    return nullptr;
  Node *U = V->users()[0].User;
  if (U->parent()->isOutput(V)) // V may be a graph input: ask its user
    return nullptr;
  return U->op() == K ? U : nullptr;
}

/// For a commutative binary node using V, the other operand.
Value *other(Node *N, Value *V) {
  if (N->numOperands() != 2)
    return nullptr;
  if (N->operand(0) == V)
    return N->operand(1);
  if (N->operand(1) == V)
    return N->operand(0);
  return nullptr;
}

/// A weight: a parameter of rank R, or (for R = 1, the weight-free case) a
/// constant parameter-like leaf.
bool isWeight(const Value *V, unsigned Rank) {
  return V->isParam() && V->type().rank() == Rank;
}

bool isLastAxis(const Node *N, unsigned Rank) {
  auto Axes = N->attrs().getInts("axes");
  return Axes.size() == 1 &&
         (Axes[0] == -1 || Axes[0] == int64_t(Rank) - 1);
}

int64_t normAxis(int64_t A, unsigned Rank) { return A < 0 ? A + Rank : A; }

class Rewriter {
public:
  explicit Rewriter(Graph &G) : G(G) {}

  /// Builds a core op before Anchor; the result types are inferred. Ops
  /// with optional results (layer_norm statistics, the dropout mask) get
  /// only their first: autodiff adds the others when it needs them.
  Node *build(Node *Anchor, OpKind Op, ArrayRef<Value *> Operands,
              AttrList Attrs = {}) {
    unsigned MaxResults =
        Op == OpKind::LayerNorm || Op == OpKind::RmsNorm ||
                Op == OpKind::Dropout
            ? 1
            : ~0u;
    auto N = buildNode(G, Anchor->getIterator(), Op, Operands,
                       std::move(Attrs), Anchor->name(), MaxResults);
    if (!N) {
      // Patterns check shapes before building; a failure here is a bug.
      report_fatal_error(Twine("canonicalize: ") + toString(N.takeError()));
    }
    return *N;
  }

  void replace(Value *Old, Value *New) {
    assert(Old->type() == New->type() && "replacement changes the type");
    G.replaceAllUsesWith(Old, New);
  }

  /// What a pattern learned about a constant, computed once per constant
  /// and question: a [s, s] mask shared by every layer is read once, not
  /// once per layer (Kind tells the questions apart).
  template <typename F>
  auto memo(const Value *C, int Kind, F &&Compute) -> decltype(Compute()) {
    using R = decltype(Compute());
    auto Key = std::make_pair(C, Kind);
    auto It = Memo.find(Key);
    if (It != Memo.end())
      return std::any_cast<R>(It->second);
    R Result = Compute();
    Memo.try_emplace(Key, Result);
    return Result;
  }

  Value *constant(StringRef Hint, DType T, ArrayRef<int64_t> Shape,
                  double Value) {
    assert(T == DType::F32 && "only f32 fill constants are built");
    TensorType Ty(T, Shape);
    std::vector<char> Bytes(Ty.numBytes());
    float F = float(Value);
    for (int64_t I = 0; I < Ty.numElements(); ++I)
      std::memcpy(Bytes.data() + I * 4, &F, 4);
    return G.addInlineConst(Hint, Ty, std::move(Bytes));
  }

  /// Forgets what was learned about values that nodes compute (the masks
  /// LazyElements reads): each sweep erases dead nodes, and a new node may
  /// take an erased one's address. Constants stay until the phase ends.
  /// Call before the nodes are erased.
  void forgetComputed() {
    Lazy = LazyElements();
    for (auto It = Memo.begin(); It != Memo.end();) {
      auto Cur = It++;
      if (!Cur->first.first->isConst())
        Memo.erase(Cur);
    }
  }

  Graph &G;
  /// Elements of constants and of values computed from them, one at a time
  /// (masks too large to fold).
  LazyElements Lazy;

private:
  // Constants stay alive for the whole phase (unused ones are removed only
  // after it), so their addresses are stable keys; entries about computed
  // values are dropped before each sweep erases nodes (forgetComputed).
  DenseMap<std::pair<const Value *, int>, std::any> Memo;
};

using Pattern = std::function<bool(Rewriter &, Node &)>;

/// Questions patterns ask about a constant (Rewriter::memo keys).
enum ConstQuestion { MaskUpper, MaskLower, AdditiveCausal, RopeTable, PairsTable };

//===----------------------------------------------------------------------===//
// Phase 1: composites
//===----------------------------------------------------------------------===//

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

/// Whether V is a constant holding the integers Want.
bool isInts(const Value *V, ArrayRef<int64_t> Want) {
  if (!V->isConst())
    return false;
  auto I = constInts(V);
  if (!I) {
    consumeError(I.takeError());
    return false;
  }
  return ArrayRef<int64_t>(*I) == Want;
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
        !E->operand(0)->isConst() || !E->operand(0)->data())
      return nullptr;
    Value *Pairs = R.memo(E->operand(0), PairsTable, [&]() -> Value * {
      Value *T = E->operand(0);
      auto D = T->data()->load();
      if (!D || T->type().Dtype != DType::F32 || T->type().rank() != 2) {
        if (!D)
          consumeError(D.takeError());
        return nullptr;
      }
      int64_t Rows = T->type().Shape[0], K = T->type().Shape[1];
      std::vector<char> Bytes(Rows * K * 2 * 4);
      const char *Src = D->data();
      for (int64_t I = 0; I < Rows * K; ++I)
        for (int64_t C : {0, 1})
          std::memcpy(Bytes.data() + (2 * I + C) * 4, Src + I * 4, 4);
      return R.G.addInlineConst("rope_pairs_table",
                                TensorType(DType::F32, {Rows, 2 * K}),
                                std::move(Bytes));
    });
    if (!Pairs)
      return nullptr;
    // One lookup per table and ids, shared by q's and k's rope.
    for (const Use &U : Pairs->users())
      if (U.User->op() == OpKind::Embedding && !U.User->isDead() &&
          U.User->operand(1) == E->operand(1))
        Table = U.User->result();
    if (!Table)
      Table = R.build(E, OpKind::Embedding, {Pairs, E->operand(1)})->result();
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
    auto Starts = constInts(Slice->operand(1));
    if (!Starts) {
      consumeError(Starts.takeError());
      return false;
    }
    if (!all_of(*Starts, [](int64_t S) { return S == 0; }))
      return false;
    if (Slice->numOperands() > 4) {
      auto Steps = constInts(Slice->operand(4));
      if (!Steps) {
        consumeError(Steps.takeError());
        return false;
      }
      if (!all_of(*Steps, [](int64_t S) { return S == 1; }))
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

//===----------------------------------------------------------------------===//
// Driver
//===----------------------------------------------------------------------===//

/// Applies the patterns until none matches; returns the number of rewrites.
unsigned runPhase(Graph &G, ArrayRef<Pattern> Patterns) {
  Rewriter R(G);
  unsigned Total = 0;
  for (bool Changed = true; Changed;) {
    Changed = false;
    R.forgetComputed();
    G.eraseDeadNodes();
    for (auto It = G.nodes().begin(); It != G.nodes().end();) {
      Node &N = *It++;
      if (N.isDead())
        continue;
      for (const Pattern &P : Patterns)
        if (P(R, N)) {
          Changed = true;
          ++Total;
          break;
        }
    }
  }
  G.eraseDeadNodes();
  G.removeUnusedConstants();
  return Total;
}

class CanonicalizePass : public Pass {
public:
  StringRef name() const override { return "canonicalize"; }

  Error run(Graph &G, PassContext &Ctx) override {
    // No-op Casts and Reshapes go first: composites look through them
    // (HF's RMSNorm casts to f32 and back around its weight).
    unsigned N0 = runPhase(G, {foldIdentity});
    unsigned N1 =
        runPhase(G, {foldIdentity, fusedLayerNorm, decomposedLayerNorm,
                     rmsNorm, erfGelu, tanhGelu, silu});
    unsigned N2 =
        runPhase(G, {matmulLinear, gemmLinear, unflattenLinear, splitHeads,
                     toHeads, repeatHeads, mergeHeads, batchMatMul, embedding,
                     rope});
    unsigned N3 =
        runPhase(G, {scaleOp, causalMask, paddingMask, softmax, dropout,
                     addOp, mulOp});
    Ctx.remarks() << formatv("canonicalize: {0} composite, {1} layer and {2} "
                            "pointwise rewrites\n",
                            N0 + N1, N2, N3);
    return Error::success();
  }
};

} // namespace

std::unique_ptr<Pass> createCanonicalizePass() {
  return std::make_unique<CanonicalizePass>();
}

} // namespace sp
