//===- DetectTransformer.cpp - Find the embedding, layers and head --------===//
//
// Walks the residual stream of a canonicalized GPT-style (pre-LayerNorm)
// decoder and tags every node with its layer and role:
//
//   embed [pos_embed embed_add] [embed_dropout]
//   per layer: ln1 qkv split_heads qk scale mask softmax attn_core_dropout av
//              merge_heads proj attn_dropout residual1
//              ln2 fc1 act fc2 mlp_dropout residual2
//   final_norm lm_head
//
// Dropouts and the scaling are optional (an inference export has no
// dropout); everything else is required. Scale and mask may come in either
// order. When the structure does not match, the error says which part of
// which layer failed and what was found instead. Every node must end up with
// a role, so nothing the later passes do not understand slips through.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {
namespace {

class Detector {
public:
  explicit Detector(Graph &G) : G(G) {}

  Error run() {
    for (Node &N : G.nodes())
      N.tags() = Tags{-1, "", N.tags().Ph, N.tags().Stage};
    Value *X;
    if (auto E = embedding(X))
      return E;
    for (int L = 0;; ++L) {
      auto Users = X->users();
      Node *LN = findUser(X, OpKind::LayerNorm);
      Node *Res = findUser(X, OpKind::Add);
      if (Users.size() == 2 && LN && Res) {
        if (auto E = layer(L, X))
          return E;
        continue;
      }
      if (L == 0)
        return fail(-1, "layer 0", X,
                    "expected the residual stream to feed a layer_norm (ln1) "
                    "and a residual add");
      return head(X);
    }
  }

private:
  Error fail(int Layer, StringRef Part, Value *After, const Twine &Msg) {
    std::string Where = Layer >= 0 ? formatv("layer {0}: ", Layer).str() : "";
    std::string From =
        After && After->producer()
            ? " (after " + After->producer()->describe() + ")"
            : "";
    return createStringError(inconvertibleErrorCode(), "%s%s: %s%s",
                             Where.c_str(), Part.str().c_str(),
                             Msg.str().c_str(), From.c_str());
  }

  static std::string found(Value *V) {
    auto Users = V->users();
    if (Users.empty())
      return "nothing uses the value";
    if (Users.size() > 1)
      return formatv("the value has {0} users", Users.size()).str();
    return "found " + Users[0].User->describe();
  }

  static Node *findUser(Value *V, OpKind K) {
    for (const Use &U : V->users())
      if (U.User->op() == K)
        return U.User;
    return nullptr;
  }

  static Node *onlyUser(Value *V, OpKind K) {
    if (V->users().size() != 1)
      return nullptr;
    Node *U = V->users()[0].User;
    return U->op() == K ? U : nullptr;
  }

  void tag(Node *N, int Layer, StringRef Role) {
    N->tags().Layer = Layer;
    N->tags().Role = Role.str();
  }

  /// Requires that V's only user is a K node; tags and returns it.
  Expected<Node *> expect(int Layer, StringRef Part, Value *V, OpKind K,
                          StringRef Role) {
    Node *N = onlyUser(V, K);
    if (!N)
      return fail(Layer, Part, V,
                  formatv("expected {0} ({1}); {2}", opName(K), Role, found(V)));
    tag(N, Layer, Role);
    return N;
  }

  /// Tags an optional dropout on V and returns the value after it.
  Value *optionalDropout(Value *V, int Layer, StringRef Role) {
    if (Node *D = onlyUser(V, OpKind::Dropout)) {
      tag(D, Layer, Role);
      return D->result();
    }
    return V;
  }

  Error embedding(Value *&X) {
    // The token embedding is an embedding of a graph input. Several (a
    // position table indexed by a position-ids input) are told apart by the
    // head: its weight is the token table (tied), or it has as many output
    // columns as the token table has rows (the vocabulary).
    SmallVector<Node *, 2> Candidates;
    for (Node &N : G.nodes())
      if (N.op() == OpKind::Embedding && N.operand(1)->isInput() &&
          N.operand(0)->isParam())
        Candidates.push_back(&N);
    if (Candidates.empty())
      return fail(-1, "embedding", nullptr,
                  "no token embedding: expected an embedding (Gather from a "
                  "parameter table) of a graph input");
    Node *Tok = Candidates.size() == 1 ? Candidates[0] : nullptr;
    if (!Tok && G.outputs().size() == 1) {
      Value *Logits = G.outputs()[0].V;
      Node *Head = Logits->producer();
      auto Pick = [&](auto Pred) -> Node * {
        Node *Found = nullptr;
        for (Node *C : Candidates)
          if (Pred(C)) {
            if (Found)
              return nullptr;
            Found = C;
          }
        return Found;
      };
      if (Head && Head->op() == OpKind::Linear)
        Tok = Pick([&](Node *C) { return Head->operand(1) == C->operand(0); });
      if (!Tok && Logits->type().rank())
        Tok = Pick([&](Node *C) {
          return C->operand(0)->type().Shape[0] == Logits->type().dim(-1);
        });
    }
    if (!Tok)
      return fail(-1, "embedding", nullptr,
                  "cannot tell the token embedding among " +
                      Twine(Candidates.size()) + " embeddings of inputs (" +
                      Candidates[0]->describe() + ", " +
                      Candidates[1]->describe() +
                      "): none is tied to the head or as wide as the "
                      "vocabulary");
    tag(Tok, -1, "embed");
    X = Tok->result();
    if (Node *Add = onlyUser(X, OpKind::Add)) {
      Value *P = Add->operand(0) == X ? Add->operand(1) : Add->operand(0);
      Node *Pos = P->producer();
      if (Pos && Pos->op() == OpKind::Embedding &&
          (Pos->operand(1)->isConst() || Pos->operand(1)->isInput())) {
        tag(Pos, -1, "pos_embed");
        tag(Add, -1, "embed_add");
        X = Add->result();
      }
    }
    X = optionalDropout(X, -1, "embed_dropout");
    return Error::success();
  }

  Error layer(int L, Value *&X) {
    Node *LN1 = findUser(X, OpKind::LayerNorm);
    tag(LN1, L, "ln1");
    // Attention block.
    auto QKV = expect(L, "attention", LN1->result(), OpKind::Linear, "qkv");
    if (!QKV)
      return QKV.takeError();
    auto SH = expect(L, "attention", (*QKV)->result(), OpKind::SplitHeads,
                     "split_heads");
    if (!SH)
      return SH.takeError();
    Value *Q = (*SH)->result(0), *K = (*SH)->result(1), *V = (*SH)->result(2);
    auto QK = expect(L, "attention core", Q, OpKind::BatchMatMul, "qk");
    if (!QK)
      return QK.takeError();
    if ((*QK)->operand(1) != K || !(*QK)->attrs().getInt("trans_b", 0))
      return fail(L, "attention core", Q,
                  "qk must multiply the queries by the transposed keys");
    Value *Cur = (*QK)->result();
    bool Scaled = false, Masked = false;
    while (true) {
      if (Node *S = onlyUser(Cur, OpKind::Scale); S && !Scaled) {
        tag(S, L, "scale");
        Scaled = true;
        Cur = S->result();
      } else if (Node *M = onlyUser(Cur, OpKind::CausalMask); M && !Masked) {
        tag(M, L, "mask");
        Masked = true;
        Cur = M->result();
      } else {
        break;
      }
    }
    if (!Masked)
      return fail(L, "attention core", Cur,
                  "expected a causal mask before the softmax; " + found(Cur));
    auto SM = expect(L, "attention core", Cur, OpKind::Softmax, "softmax");
    if (!SM)
      return SM.takeError();
    Cur = optionalDropout((*SM)->result(), L, "attn_core_dropout");
    auto AV = expect(L, "attention core", Cur, OpKind::BatchMatMul, "av");
    if (!AV)
      return AV.takeError();
    if ((*AV)->operand(1) != V || (*AV)->attrs().getInt("trans_b", 0))
      return fail(L, "attention core", Cur,
                  "av must multiply the attention probabilities by the values");
    auto MH = expect(L, "attention", (*AV)->result(), OpKind::MergeHeads,
                     "merge_heads");
    if (!MH)
      return MH.takeError();
    auto Proj =
        expect(L, "attention", (*MH)->result(), OpKind::Linear, "proj");
    if (!Proj)
      return Proj.takeError();
    Cur = optionalDropout((*Proj)->result(), L, "attn_dropout");
    auto Res1 = expect(L, "attention", Cur, OpKind::Add, "residual1");
    if (!Res1)
      return Res1.takeError();
    if (findUser(X, OpKind::Add) != *Res1)
      return fail(L, "attention", Cur,
                  "the residual add must add the layer input");
    X = (*Res1)->result();
    // MLP block.
    Node *LN2 = findUser(X, OpKind::LayerNorm);
    Node *Res2 = findUser(X, OpKind::Add);
    if (X->users().size() != 2 || !LN2 || !Res2)
      return fail(L, "mlp", X,
                  "expected the residual stream to feed a layer_norm (ln2) "
                  "and a residual add; " +
                      found(X));
    tag(LN2, L, "ln2");
    auto FC1 = expect(L, "mlp", LN2->result(), OpKind::Linear, "fc1");
    if (!FC1)
      return FC1.takeError();
    auto Act = expect(L, "mlp", (*FC1)->result(), OpKind::Gelu, "act");
    if (!Act)
      return Act.takeError();
    auto FC2 = expect(L, "mlp", (*Act)->result(), OpKind::Linear, "fc2");
    if (!FC2)
      return FC2.takeError();
    Cur = optionalDropout((*FC2)->result(), L, "mlp_dropout");
    auto R2 = expect(L, "mlp", Cur, OpKind::Add, "residual2");
    if (!R2)
      return R2.takeError();
    if (*R2 != Res2)
      return fail(L, "mlp", Cur, "the residual add must add the block input");
    X = (*R2)->result();
    return Error::success();
  }

  Error head(Value *X) {
    Value *Cur = X;
    if (Node *LN = onlyUser(Cur, OpKind::LayerNorm)) {
      tag(LN, -1, "final_norm");
      Cur = LN->result();
    }
    auto Head = expect(-1, "lm head", Cur, OpKind::Linear, "lm_head");
    if (!Head)
      return Head.takeError();
    Node *H = *Head;
    if (!G.isOutput(H->result()))
      return fail(-1, "lm head", H->result(),
                  "the lm head's logits must be a graph output");
    const TensorType &W = H->operand(1)->type();
    int64_t Vocab = H->attrs().getInt("trans_w", 0) ? W.Shape[0] : W.Shape[1];
    if (H->result()->type().dim(-1) != Vocab)
      return fail(-1, "lm head", Cur, "unexpected logits shape");
    // Everything must be accounted for.
    for (Node &N : G.nodes())
      if (N.tags().Role.empty()) {
        std::string Near;
        for (Value *Op : N.operands())
          if (Op->producer() && !Op->producer()->tags().Role.empty()) {
            const Tags &T = Op->producer()->tags();
            Near = " (it uses the result of " +
                   (T.Layer >= 0 ? formatv("layer {0} ", T.Layer).str()
                                 : std::string()) +
                   T.Role + ")";
            break;
          }
        return fail(-1, "structure", nullptr,
                    N.describe() + " is not part of the recognised "
                                   "Transformer" +
                        Near);
      }
    return Error::success();
  }

  Graph &G;
};

class DetectTransformerPass : public Pass {
public:
  StringRef name() const override { return "detect-transformer"; }

  Error run(Graph &G, PassContext &Ctx) override {
    if (auto E = Detector(G).run())
      return createStringError(inconvertibleErrorCode(),
                               "not a supported GPT-style Transformer: %s",
                               toString(std::move(E)).c_str());
    return Error::success();
  }
};

} // namespace

std::unique_ptr<Pass> createDetectTransformerPass() {
  return std::make_unique<DetectTransformerPass>();
}

} // namespace sp
