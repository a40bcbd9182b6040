//===- AttentionFusion.cpp - The attention core as one fused op -----------===//
//
// With --attention fused, each attention core of the graph,
//
//   s = batch_matmul(q, k) {trans_b = 1}
//   s = scale(s) {alpha}                       (optional)
//   s = causal_mask(s) {fill}                  (optional)
//   s = padding_mask(s, keep) {fill, where}    (optional; either order)
//   p = softmax(s)
//   p = dropout(p) {ratio}                     (optional)
//   o = batch_matmul(p, v)
//   o = merge_heads(o)                         (optional)
//
// (k and v possibly the repeat_heads of grouped-query attention), becomes
//
//   o, lse = attention(q, k, v [, keep]) {scale, causal, fill, pad_fill,
//                                        pad_where, pad_first, dropout,
//                                        ratio, merged}
//
// When q, k and v are the three results of one split_heads read only here
// (GPT's fused QKV projection) and the output is merged, the op reads the
// projection's output itself, and its gradient writes the projection's
// input gradient, with no split_heads copies either way:
//
//   o, lse = attention(qkv [, keep]) {packed = 1, heads, merged = 1, ...}
//
// which computes the same values blockwise and stores only q, k, v, o and a
// per-row log-sum-exp: the paper's 5as/h term of stored activations goes
// (runtime/cpu/Attention.h). It runs after the parallel passes, so the heads
// are already this rank's, and before autodiff, which keys the fused op's
// dropout as the site of the dropout it replaced: fused and unfused runs
// draw the same masks. A chain that does not have this shape exactly (an
// intermediate read twice, a broadcast batch, a transposed product) is left
// as it is, with a remark.
//
//===----------------------------------------------------------------------===//
#include "ir/OpDef.h"
#include "ir/ShapeInference.h"
#include "passes/Passes.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {
namespace {

/// The one user of V, if it is of kind K and V is not a graph output.
Node *onlyUser(const Graph &G, Value *V, OpKind K) {
  if (V->users().size() != 1 || G.isOutput(V))
    return nullptr;
  Node *U = V->users()[0].User;
  return U->op() == K && U->operand(0) == V ? U : nullptr;
}

/// The split_heads whose results are Q, K and V, in order, each read only
/// by the core (once), or null.
Node *packedSplit(const Graph &G, Value *Q, Value *K, Value *V) {
  Node *S = Q->producer();
  // The packed core reads q | k | v blocks, not GPT-NeoX's per-head layout.
  if (!S || S->op() != OpKind::SplitHeads || S->numResults() != 3 ||
      S->result(0) != Q || S->result(1) != K || S->result(2) != V ||
      attrInt(S->op(), S->attrs(), "per_head"))
    return nullptr;
  for (Value *X : {Q, K, V})
    if (X->users().size() != 1 || G.isOutput(X))
      return nullptr;
  return S;
}

/// X's producer when it is a repeat_heads read only here.
Node *repeatOf(const Graph &G, Value *X) {
  Node *P = X->producer();
  if (!P || P->op() != OpKind::RepeatHeads || X->users().size() != 1 ||
      G.isOutput(X))
    return nullptr;
  return P;
}

class AttentionFusionPass : public Pass {
public:
  StringRef name() const override { return "fuse-attention"; }

  Error run(Graph &G, PassContext &Ctx) override {
    if (!Ctx.FusedAttention)
      return Error::success();
    int Fused = 0;
    for (auto It = G.nodes().begin(); It != G.nodes().end();) {
      Node &N = *It++;
      if (N.op() != OpKind::BatchMatMul)
        continue;
      auto Made = fuse(G, N, Ctx.remarks(), Ctx.ContextParallel > 1);
      if (!Made)
        return Made.takeError();
      if (*Made) {
        ++Fused;
        // The chain's nodes are gone; go on after the op that replaced it.
        It = std::next((*Made)->getIterator());
      }
    }
    Ctx.remarks() << formatv("fuse-attention: {0} attention core{1} fused\n",
                            Fused, Fused == 1 ? "" : "s");
    return Error::success();
  }

private:
  /// Fuses the core starting at the q k^T product QK into an attention op
  /// and returns it; null if QK does not start one.
  static Expected<Node *> fuse(Graph &G, Node &QK, raw_ostream &Remarks,
                               bool ContextParallel) {
    auto A = [](const Node &N, StringRef Name) {
      return attrInt(N.op(), N.attrs(), Name);
    };
    if (A(QK, "trans_a") || !A(QK, "trans_b"))
      return nullptr;
    SmallVector<Node *, 8> Chain = {&QK};
    AttrList Attrs;
    Value *V = QK.result();
    if (Node *S = onlyUser(G, V, OpKind::Scale)) {
      Attrs.set("scale", attrFloat(S->op(), S->attrs(), "alpha"));
      Chain.push_back(S);
      V = S->result();
    }
    // The masks, in either order (HF Llama adds the padding first).
    Value *Keep = nullptr;
    bool Causal = false;
    for (int Step = 0; Step < 2; ++Step) {
      if (Node *C = !Causal ? onlyUser(G, V, OpKind::CausalMask) : nullptr) {
        Attrs.set("causal", int64_t(1));
        Attrs.set("fill", attrFloat(C->op(), C->attrs(), "fill"));
        Chain.push_back(C);
        V = C->result();
        Causal = true;
      } else if (Node *P =
                     !Keep ? onlyUser(G, V, OpKind::PaddingMask) : nullptr) {
        Keep = P->operand(1);
        Attrs.set("pad_fill", attrFloat(P->op(), P->attrs(), "fill"));
        Attrs.set("pad_where", A(*P, "where"));
        if (!Causal)
          Attrs.set("pad_first", int64_t(1));
        Chain.push_back(P);
        V = P->result();
      }
    }
    Node *Soft = onlyUser(G, V, OpKind::Softmax);
    if (!Soft)
      return nullptr;
    if (Soft->attrs().has("alpha") || Soft->attrs().has("causal")) {
      Remarks << formatv("fuse-attention: {0}: a softmax with fused "
                         "attributes is left alone\n",
                         Soft->name());
      return nullptr;
    }
    Chain.push_back(Soft);
    V = Soft->result();
    if (Node *D = onlyUser(G, V, OpKind::Dropout)) {
      Attrs.set("dropout", int64_t(1));
      Attrs.set("ratio", attrFloat(D->op(), D->attrs(), "ratio"));
      Chain.push_back(D);
      V = D->result();
    }
    Node *AV = onlyUser(G, V, OpKind::BatchMatMul);
    if (!AV || A(*AV, "trans_a") || A(*AV, "trans_b"))
      return nullptr;
    Chain.push_back(AV);
    // The output merged back to [b, s, h] (the projection's input): the op
    // writes it so, and the backward reads that stored tensor.
    Node *Last = AV;
    if (Node *M = onlyUser(G, AV->result(), OpKind::MergeHeads)) {
      Attrs.set("merged", int64_t(1));
      Chain.push_back(M);
      Last = M;
    }
    Value *Q = QK.operand(0), *K = QK.operand(1), *Vv = AV->operand(1);
    const TensorType &QT = Q->type(), &KT = K->type(), &VT = Vv->type();
    if (QT.rank() != 4 || KT.Shape != QT.Shape || VT.Shape != QT.Shape) {
      Remarks << formatv("fuse-attention: {0}: q, k, v of {1}, {2}, {3} are "
                         "not [b, a, s, d] alike; left unfused\n",
                         QK.name(), QT.str(), KT.str(), VT.str());
      return nullptr;
    }
    // Grouped-query attention: read the kv heads, not their repeats.
    Node *RK = repeatOf(G, K), *RV = repeatOf(G, Vv);
    if (RK && RV &&
        A(*RK, "repeats") == A(*RV, "repeats")) {
      K = RK->operand(0);
      Vv = RV->operand(0);
    } else {
      RK = RV = nullptr;
    }
    SmallVector<Value *, 4> Operands = {Q, K, Vv};
    // GPT's fused QKV: read the projection's output in place (not under
    // context parallelism, whose ring passes k and v on without q).
    Node *Split = RK || ContextParallel ? nullptr : packedSplit(G, Q, K, Vv);
    if (Split && Attrs.has("merged")) {
      Attrs.set("packed", int64_t(1));
      Attrs.set("heads", A(*Split, "heads"));
      Operands = {Split->operand(0)};
    } else {
      Split = nullptr;
    }
    if (Keep)
      Operands.push_back(Keep);
    auto Made = buildNode(G, Last->getIterator(), OpKind::Attention, Operands,
                          Attrs, AV->name());
    if (!Made)
      return Made.takeError();
    Node *F = *Made;
    F->tags() = AV->tags();
    F->tags().Role = Role::Attention;
    for (Value *R : F->results())
      R->setSharding(resultLayout(*F));
    G.replaceAllUsesWith(Last->result(), F->result(0));
    for (auto I = Chain.rbegin(); I != Chain.rend(); ++I)
      G.erase(*I);
    for (Node *R : {RV, RK, Split})
      if (R)
        G.erase(R);
    return F;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseAttentionPass() {
  return std::make_unique<AttentionFusionPass>();
}

} // namespace sp
