//===- DetectTransformer.cpp - Find the embedding, layers and head --------===//
//
// Walks the residual stream of a canonicalized Transformer and tags every
// node with its layer and role. These layer templates share the walk:
//
//   embed [pos_embed embed_add] [type_embed embed_add] [embed_norm]
//         [embed_dropout]
//   GPT (pre-norm):   ln1 qkv split_heads qk [scale] [mask] [pad_mask]
//          softmax [attn_core_dropout] av merge_heads proj [attn_dropout]
//          residual1 ln2 fc1 act fc2 [mlp_dropout] residual2
//   Llama (pre-norm): ln1 (rms_norm) q k v q_heads k_heads v_heads
//          [rope_cos rope_sin q_rope k_rope] [k_repeat v_repeat] qk ...
//          merge_heads proj residual1
//          ln2 (rms_norm) gate up act (silu) glu (mul) fc2 residual2
//   BERT (post-norm): q k v q_heads k_heads v_heads qk [scale] [pad_mask]
//          softmax ... proj [attn_dropout] residual1 ln1
//          fc1 act fc2 [mlp_dropout] residual2 ln2
//   parallel (pre-norm, GPT-NeoX, GPT-J): ln1 [ln2] (both of the layer's
//          input x, or one norm feeding both blocks) then the attention
//          (fused or separate projections, as above) and the MLP side by
//          side, and x + attn + mlp as two adds in any order: residual1 (any
//          two of the three), parallel_residual (the third)
//   [final_norm] [head_dense head_act head_norm] lm_head
//
// Dropouts, the scaling and the masks are optional (an inference export has
// no dropout, an encoder no causal mask), but every layer must mask as layer
// 0 does; scale and masks may come in any order. Position and token-type
// embeddings are told apart by their ids (bind-inputs documents the rule).
// When the structure does not match, the error says which part of which
// layer failed and what was found instead. Every node must end up with a
// role, so nothing the later passes do not understand slips through, and
// every layer's roles must fit a family template (ir/Family.h): the walk
// accepts any combination of the blocks above, and a family is one the
// parallel rules and memory formulas are written for.
//
//===----------------------------------------------------------------------===//
#include "ir/OpDef.h"
#include "passes/Passes.h"
#include "ir/Family.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {
namespace {

class Detector {
public:
  explicit Detector(Graph &G) : G(G) {}

  Error run() {
    for (Node &N : G.nodes())
      N.tags() = Tags{-1, Role::None, N.tags().Ph, N.tags().Stage};
    Value *X;
    if (auto E = embedding(X))
      return E;
    for (int L = 0;; ++L) {
      if (startsLayer(X)) {
        if (auto E = layer(L, X))
          return E;
        continue;
      }
      if (L == 0)
        return fail(-1, "layer 0", X,
                    "expected the residual stream to feed a residual add and "
                    "either a layer_norm or rms_norm (pre-norm: ln1) or the "
                    "attention's linears (post-norm); " + found(X));
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

  /// A pre-norm: layer_norm (GPT) or rms_norm (Llama).
  static Node *findNorm(Value *V) {
    if (Node *N = findUser(V, OpKind::LayerNorm))
      return N;
    return findUser(V, OpKind::RmsNorm);
  }

  /// A layer starts where the residual stream feeds a residual add and
  /// either a norm (pre-norm: GPT, Llama) or only linears (post-norm: the
  /// attention's q, k, v or fused qkv projections read the stream itself).
  static bool startsLayer(Value *X) {
    if (!findUser(X, OpKind::Add) || X->users().size() < 2)
      return false;
    if (findNorm(X)) // one norm, or two (a parallel block's ln1 and ln2)
      return X->users().size() == 2 ||
             (X->users().size() == 3 && normUsers(X).size() == 2);
    return all_of(X->users(), [](const Use &U) {
      return U.User->op() == OpKind::Linear || U.User->op() == OpKind::Add;
    });
  }

  /// The norms (layer_norm, rms_norm) reading V.
  static SmallVector<Node *, 2> normUsers(Value *V) {
    SmallVector<Node *, 2> R;
    for (const Use &U : V->users())
      if (U.User->op() == OpKind::LayerNorm || U.User->op() == OpKind::RmsNorm)
        R.push_back(U.User);
    return R;
  }

  /// Whether N is one of the attention's projections: a linear whose only
  /// user makes heads (split_heads of a fused qkv, to_heads of q, k or v).
  static bool isProjection(Node *N) {
    if (N->op() != OpKind::Linear || N->result()->users().size() != 1)
      return false;
    OpKind U = N->result()->users()[0].User->op();
    return U == OpKind::SplitHeads || U == OpKind::ToHeads;
  }

  /// The users of a block's input V other than the residual add Res.
  static SmallVector<Node *, 4> blockUsers(Value *V, Node *Res) {
    SmallVector<Node *, 4> R;
    for (const Use &U : V->users())
      if (U.User != Res)
        R.push_back(U.User);
    return R;
  }

  static Node *onlyUser(Value *V, OpKind K) {
    if (V->users().size() != 1)
      return nullptr;
    Node *U = V->users()[0].User;
    return U->op() == K ? U : nullptr;
  }

  /// "gelu, silu or relu": the ops isActivation accepts.
  static std::string activationNames() {
    SmallVector<StringRef, 4> Names;
    for (OpKind Op : activationOps())
      Names.push_back(opName(Op));
    std::string S;
    for (size_t I = 0; I < Names.size(); ++I)
      S += (I ? I + 1 == Names.size() ? " or " : ", " : "") + Names[I].str();
    return S;
  }

  /// V's only user if it is an activation (gelu, silu, relu: isActivation).
  static Node *activationUser(Value *V) {
    if (V->users().size() != 1)
      return nullptr;
    Node *U = V->users()[0].User;
    return isActivation(U->op()) ? U : nullptr;
  }

  void tag(Node *N, int Layer, Role R) {
    N->tags().Layer = Layer;
    N->tags().Role = R;
  }

  /// The input of a block of layer L: X itself (post-norm, Norm null) or
  /// the result of X's Norm (pre-norm), which it tags R.
  Value *blockInput(int L, Value *X, Node *Norm, Role R) {
    if (!Norm)
      return X;
    tag(Norm, L, R);
    return Norm->result();
  }

  /// Requires that V's only user is a K node; tags and returns it.
  Expected<Node *> expect(int Layer, StringRef Part, Value *V, OpKind K,
                          Role R) {
    Node *N = onlyUser(V, K);
    if (!N)
      return fail(Layer, Part, V,
                  formatv("expected {0} ({1}); {2}", opName(K), roleName(R),
                          found(V)));
    tag(N, Layer, R);
    return N;
  }

  /// Tags an optional dropout on V and returns the value after it.
  Value *optionalDropout(Value *V, int Layer, Role R) {
    if (Node *D = onlyUser(V, OpKind::Dropout)) {
      tag(D, Layer, R);
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
    tag(Tok, -1, Role::Embed);
    X = Tok->result();
    // Embeddings added to the tokens': positions and token types (BERT),
    // in either order. Each add's other operand is an embedding indexed by
    // a constant or an input.
    Node *Pos = nullptr, *Types = nullptr;
    while (Node *Add = onlyUser(X, OpKind::Add)) {
      Value *P = Add->operand(0) == X ? Add->operand(1) : Add->operand(0);
      Node *E = P->producer();
      if (!E || E->op() != OpKind::Embedding || E->tags().Role != Role::None ||
          !(E->operand(1)->isConst() || E->operand(1)->isInput()))
        break;
      bool IsPos = isPositionLookup(E, Pos != nullptr);
      if (IsPos ? Pos : Types)
        return fail(-1, "embedding", X,
                    "two " + Twine(IsPos ? "position" : "token-type") +
                        " embeddings added to the tokens (" +
                        (IsPos ? Pos : Types)->describe() + ", " +
                        E->describe() + ")");
      (IsPos ? Pos : Types) = E;
      tag(E, -1, IsPos ? Role::PosEmbed : Role::TypeEmbed);
      tag(Add, -1, Role::EmbedAdd);
      X = Add->result();
    }
    if (Node *LN = onlyUser(X, OpKind::LayerNorm)) { // BERT's embedding norm
      tag(LN, -1, Role::EmbedNorm);
      X = LN->result();
    }
    X = optionalDropout(X, -1, Role::EmbedDropout);
    return Error::success();
  }

  /// Whether an embedding added to the tokens' looks up positions (else
  /// token types). Constant ids say so by their values: 0, 1, .., s-1 along
  /// the sequence are positions, one repeated id is a token type. Input ids
  /// are positions when the table has a row for every position and no
  /// position table was found yet; a table with fewer rows than the
  /// sequence cannot be indexed by positions. (bind-inputs lets
  /// --input NAME=token_types overrule the guess for an input.)
  static bool isPositionLookup(Node *E, bool HavePositions) {
    Value *Ids = E->operand(1);
    const TensorType &T = Ids->type();
    int64_t Seq = T.rank() ? T.dim(-1) : 1;
    if (Ids->isConst() && Ids->data()) {
      if (auto D = Ids->data()->load(); !D) {
        consumeError(D.takeError());
      } else {
        bool Arange = true, Same = true;
        double First = Ids->data()->getDouble(0);
        for (int64_t I = 0; I < T.numElements(); ++I) {
          double V = Ids->data()->getDouble(I);
          Arange &= V == double(I % Seq);
          Same &= V == First;
        }
        if (Arange != Same) // a 1-long sequence is both
          return Arange;
      }
    }
    return !HavePositions && E->operand(0)->type().Shape[0] >= Seq;
  }

  /// The rotary tables of q's and k's ropes (either may be null): lookups
  /// of fixed tables by position ids.
  void tagRopeTables(int L, Node *QRope, Node *KRope) {
    for (Node *R : {QRope, KRope})
      for (unsigned I : {1u, 2u})
        if (R)
          if (Node *T = R->operand(I)->producer();
              T && T->op() == OpKind::Embedding && T->tags().Role == Role::None)
            tag(T, L, I == 1 ? Role::RopeCos : Role::RopeSin);
  }

  /// Separate q, k and v projections (Llama): each linear's heads, through
  /// an optional rope and an optional repeat (GQA), reach the scores (q as
  /// operand 0, k as operand 1) or the values (operand 1 of av). Tags them
  /// and returns the qk product and the value operand.
  Error separateQKV(int L, Value *Normed, ArrayRef<Node *> Users, Node *&QK,
                    Value *&V) {
    struct Path {
      Node *Lin, *Heads, *Rope = nullptr, *Repeat = nullptr, *Reader = nullptr;
      unsigned OperandNo = 0;
    };
    SmallVector<Path, 3> Paths;
    for (Node *Lin : Users) {
      Node *H = Lin->op() == OpKind::Linear
                    ? onlyUser(Lin->result(), OpKind::ToHeads)
                    : nullptr;
      if (!H)
        return fail(L, "attention", Normed,
                    "expected q, k and v linears, each followed by to_heads; "
                    "found " + Lin->describe());
      Path P{Lin, H};
      Value *Cur = H->result();
      if (Node *R = onlyUser(Cur, OpKind::Rope)) {
        P.Rope = R;
        Cur = R->result();
      }
      if (Node *R = onlyUser(Cur, OpKind::RepeatHeads)) {
        P.Repeat = R;
        Cur = R->result();
      }
      if (Cur->users().size() != 1 ||
          Cur->users()[0].User->op() != OpKind::BatchMatMul)
        return fail(L, "attention", Cur,
                    "expected the heads to reach a batch_matmul; " + found(Cur));
      P.Reader = Cur->users()[0].User;
      P.OperandNo = Cur->users()[0].OperandNo;
      Paths.push_back(P);
    }
    Path *Q = nullptr, *K = nullptr, *Vp = nullptr;
    // q and k meet in the scores (q k^T), v is operand 1 of av.
    for (Path &P : Paths) {
      bool Scores = attrInt(P.Reader->op(), P.Reader->attrs(), "trans_b");
      Path *&Slot = !Scores ? Vp : P.OperandNo == 0 ? Q : K;
      if (Slot || (!Scores && P.OperandNo != 1))
        return fail(L, "attention", P.Lin->result(),
                    "cannot tell the q, k and v projections apart");
      Slot = &P;
    }
    if (!Q || !K || !Vp || Q->Reader != K->Reader)
      return fail(L, "attention", Normed,
                  "expected three projections: q and k multiplied as q k^T, "
                  "and v multiplied by the attention probabilities");
    if (Q->Repeat || Vp->Rope || bool(K->Repeat) != bool(Vp->Repeat) ||
        bool(Q->Rope) != bool(K->Rope))
      return fail(L, "attention", Normed,
                  "unsupported rotary/repeat layout: rope on q and k, the "
                  "kv-head repeat on k and v");
    // (Only q and k are rotated and only k and v repeated: refused above.)
    struct ProjectionRoles {
      Path *P;
      Role Lin, Heads, Rope, Repeat;
    };
    for (auto [P, Lin, Heads, Rope, Repeat] :
         {ProjectionRoles{Q, Role::Q, Role::QHeads, Role::QRope, Role::None},
          ProjectionRoles{K, Role::K, Role::KHeads, Role::KRope, Role::KRepeat},
          ProjectionRoles{Vp, Role::V, Role::VHeads, Role::None,
                          Role::VRepeat}}) {
      tag(P->Lin, L, Lin);
      tag(P->Heads, L, Heads);
      if (P->Rope)
        tag(P->Rope, L, Rope);
      if (P->Repeat)
        tag(P->Repeat, L, Repeat);
    }
    tagRopeTables(L, Q->Rope, K->Rope);
    tag(Q->Reader, L, Role::Qk);
    QK = Q->Reader;
    V = Vp->Repeat ? Vp->Repeat->result() : Vp->Heads->result();
    return Error::success();
  }

  Error layer(int L, Value *&X) {
    // Pre-norm (GPT, Llama): x + attn(ln1(x)), then h + mlp(ln2(h)).
    // Post-norm (BERT): h = ln1(x + attn(x)), then ln2(h + mlp(h)).
    // Parallel (GPT-NeoX, GPT-J): x + attn(ln1(x)) + mlp(ln2(x) or ln1(x)).
    Node *Res1 = findUser(X, OpKind::Add);
    Node *LN1 = findNorm(X);
    bool PostNorm = !LN1;
    if (L == 0)
      PostNormModel = PostNorm;
    else if (PostNorm != PostNormModel)
      return fail(L, "layer", X,
                  Twine("the layer is ") + (PostNorm ? "post" : "pre") +
                      "-norm but layer 0 is " + (PostNorm ? "pre" : "post") +
                      "-norm");
    if (!PostNorm && (normUsers(X).size() == 2 ||
                      any_of(LN1->result()->users(), [](const Use &U) {
                        return !isProjection(U.User);
                      })))
      return parallelLayer(L, X);
    Value *AttnIn = blockInput(L, X, LN1, Role::Ln1);
    auto Proj = attentionBlock(L, AttnIn,
                               blockUsers(AttnIn, PostNorm ? Res1 : nullptr));
    if (!Proj)
      return Proj.takeError();
    auto X1 =
        closeBlock(L, "attention", (*Proj)->result(), Res1, PostNorm,
                   {Role::AttnDropout, Role::Residual1, Role::Ln1, "layer"});
    if (!X1)
      return X1.takeError();
    X = *X1;
    // MLP block.
    Node *Res2 = findUser(X, OpKind::Add);
    Node *LN2 = PostNorm ? nullptr : findNorm(X);
    if (X->users().size() < 2 || !Res2 || (!PostNorm && !LN2))
      return fail(L, "mlp", X,
                  PostNorm ? "expected the normed stream to feed the mlp and "
                             "a residual add; " +
                                 found(X)
                           : "expected the residual stream to feed a "
                             "layer_norm or rms_norm (ln2) and a residual "
                             "add; " +
                                 found(X));
    Value *MlpIn = blockInput(L, X, LN2, Role::Ln2);
    auto Down =
        mlpBlock(L, MlpIn, blockUsers(MlpIn, PostNorm ? Res2 : nullptr));
    if (!Down)
      return Down.takeError();
    auto X2 =
        closeBlock(L, "mlp", (*Down)->result(), Res2, PostNorm,
                   {Role::MlpDropout, Role::Residual2, Role::Ln2, "block"});
    if (!X2)
      return X2.takeError();
    X = *X2;
    return Error::success();
  }

  /// A parallel block: two layer_norms of the layer's input X, one feeding
  /// the attention's projections (ln1), the other the MLP (ln2); or one
  /// layer_norm feeding both. Then x + attn + mlp (parallelResidual).
  Error parallelLayer(int L, Value *&X) {
    auto Norms = normUsers(X);
    for (Node *N : Norms)
      if (N->op() != OpKind::LayerNorm)
        return fail(L, "layer", X,
                    "a parallel residual block normed by " + N->describe() +
                        ": the parallel families (gpt-neox, gpt-j) are "
                        "written for layer_norm; rms_norm is supported in "
                        "sequential (Llama) blocks only");
    SmallVector<Node *, 4> AttnUsers, MlpUsers;
    Value *AttnIn, *MlpIn;
    if (Norms.size() == 2) {
      auto FeedsAttention = [](Node *N) {
        return any_of(N->result()->users(),
                      [](const Use &U) { return isProjection(U.User); });
      };
      bool A0 = FeedsAttention(Norms[0]), A1 = FeedsAttention(Norms[1]);
      if (A0 == A1)
        return fail(L, "layer", X,
                    Twine("two norms of the layer's input (") +
                        Norms[0]->describe() + ", " + Norms[1]->describe() +
                        "), but " + (A0 ? "both" : "neither") +
                        " feed the attention's projections: expected one "
                        "for the attention (ln1), one for the mlp (ln2)");
      Node *LN1 = A0 ? Norms[0] : Norms[1], *LN2 = A0 ? Norms[1] : Norms[0];
      AttnIn = blockInput(L, X, LN1, Role::Ln1);
      MlpIn = blockInput(L, X, LN2, Role::Ln2);
      for (const Use &U : AttnIn->users())
        AttnUsers.push_back(U.User);
      for (const Use &U : MlpIn->users())
        MlpUsers.push_back(U.User);
    } else {
      AttnIn = MlpIn = blockInput(L, X, Norms[0], Role::Ln1);
      for (const Use &U : AttnIn->users())
        (isProjection(U.User) ? AttnUsers : MlpUsers).push_back(U.User);
      // Separate projections of which only some reached to_heads (GPT-J's
      // q and k, rotated before the permute in a form canonicalize did not
      // prove): name the first that did not, and what follows it.
      if (AttnUsers.size() == 1 &&
          AttnUsers[0]->result()->users()[0].User->op() == OpKind::ToHeads)
        for (Node *N : MlpUsers)
          if (N->op() == OpKind::Linear && N->result()->users().size() == 1 &&
              N->result()->users()[0].User->op() == OpKind::OnnxReshape)
            return fail(L, "attention", N->result(),
                        "expected q, k and v linears, each followed by "
                        "to_heads (a rotary on [b, s, heads, d] heads must be "
                        "x·cos + rotate(x)·sin of their first dims before the "
                        "permute); " +
                            found(N->result()));
    }
    auto Proj = attentionBlock(L, AttnIn, AttnUsers);
    if (!Proj)
      return Proj.takeError();
    auto Down = mlpBlock(L, MlpIn, MlpUsers);
    if (!Down)
      return Down.takeError();
    return parallelResidual(L, X, (*Proj)->result(), (*Down)->result());
  }

  /// The end of a parallel block: the attention's and the MLP's outputs,
  /// each after an optional dropout, added to the layer's input X in two
  /// adds, residual1 (any two of the three) then parallel_residual (the
  /// third). Moves X to the sum.
  Error parallelResidual(int L, Value *&X, Value *AttnOut, Value *MlpOut) {
    Value *A = optionalDropout(AttnOut, L, Role::AttnDropout);
    Value *M = optionalDropout(MlpOut, L, Role::MlpDropout);
    Node *AddA = onlyUser(A, OpKind::Add), *AddM = onlyUser(M, OpKind::Add);
    if (!AddA || !AddM)
      return fail(L, "parallel residual", AddA ? M : A,
                  "expected the attention's and the mlp's outputs each to "
                  "feed one add (x + attn + mlp); " +
                      found(AddA ? M : A));
    // residual1 is the add whose operands are both among x, attn and mlp.
    auto Leaf = [&](Value *V) { return V == X || V == A || V == M; };
    Node *R1 = nullptr, *R2 = nullptr;
    for (Node *C : {AddA, AddM})
      if (Leaf(C->operand(0)) && Leaf(C->operand(1)) &&
          C->operand(0) != C->operand(1))
        R1 = C;
    if (R1)
      R2 = onlyUser(R1->result(), OpKind::Add);
    SmallVector<Value *, 4> Seen;
    if (R2)
      for (Node *N : {R1, R2})
        for (Value *Op : N->operands())
          if (Op != R1->result())
            Seen.push_back(Op);
    if (!R2 || Seen.size() != 3 || !is_contained(Seen, X) ||
        !is_contained(Seen, A) || !is_contained(Seen, M))
      return fail(L, "parallel residual", A,
                  "expected x + attn + mlp as two adds of the layer's input, "
                  "the attention's output and the mlp's output; found " +
                      AddA->describe() +
                      (AddA != AddM ? " and " + AddM->describe() : ""));
    tag(R1, L, Role::Residual1);
    tag(R2, L, Role::ParallelResidual);
    X = R2->result();
    return Error::success();
  }

  /// The attention block of layer L from its input AttnIn, read by Users (a
  /// fused qkv linear, or q, k and v linears): tags it, returns proj.
  Expected<Node *> attentionBlock(int L, Value *AttnIn,
                                  ArrayRef<Node *> AttnUsers) {
    // A fused QKV linear and split_heads (GPT), or separate q, k, v
    // projections (Llama, BERT).
    Node *QKNode = nullptr;
    Value *V = nullptr;
    if (AttnUsers.size() == 3) {
      if (auto E = separateQKV(L, AttnIn, AttnUsers, QKNode, V))
        return std::move(E);
    } else {
      Node *QKV = AttnUsers.size() == 1 && AttnUsers[0]->op() == OpKind::Linear
                      ? AttnUsers[0]
                      : nullptr;
      if (!QKV)
        return fail(L, "attention", AttnIn,
                    "expected a fused qkv linear or q, k and v linears; " +
                        found(AttnIn));
      tag(QKV, L, Role::Qkv);
      auto SH = expect(L, "attention", QKV->result(), OpKind::SplitHeads,
                       Role::SplitHeads);
      if (!SH)
        return SH.takeError();
      Value *Q = (*SH)->result(0), *K = (*SH)->result(1);
      V = (*SH)->result(2);
      // GPT-NeoX rotates the fused projection's q and k.
      Node *QRope = onlyUser(Q, OpKind::Rope),
           *KRope = onlyUser(K, OpKind::Rope);
      if (bool(QRope) != bool(KRope) || onlyUser(V, OpKind::Rope))
        return fail(L, "attention", (*SH)->result(0),
                    "unsupported rotary layout after split_heads: rope on "
                    "both q and k, not on v");
      if (QRope) {
        tag(QRope, L, Role::QRope);
        tag(KRope, L, Role::KRope);
        tagRopeTables(L, QRope, KRope);
        Q = QRope->result();
        K = KRope->result();
      }
      auto QK = expect(L, "attention core", Q, OpKind::BatchMatMul, Role::Qk);
      if (!QK)
        return QK.takeError();
      if ((*QK)->operand(1) != K || !attrInt((*QK)->op(), (*QK)->attrs(), "trans_b"))
        return fail(L, "attention core", Q,
                    "qk must multiply the queries by the transposed keys");
      QKNode = *QK;
    }
    return attentionCore(L, QKNode, V);
  }

  /// The MLP block of layer L from its input MlpIn, read by Users (fc1, or
  /// gate and up): tags it, returns fc2.
  Expected<Node *> mlpBlock(int L, Value *MlpIn, ArrayRef<Node *> MlpUsers) {
    if (MlpUsers.size() == 2) {
      // SwiGLU: down(silu(gate(x)) * up(x)), or another activation (GeGLU).
      Node *Gate = nullptr, *Up = nullptr;
      for (Node *Lin : MlpUsers) {
        if (Lin->op() != OpKind::Linear)
          return fail(L, "mlp", MlpIn,
                      "expected gate and up linears; found " + Lin->describe());
        (activationUser(Lin->result()) ? Gate : Up) = Lin;
      }
      if (!Gate || !Up)
        return fail(L, "mlp", MlpIn, "expected silu(gate(x)) * up(x)");
      Node *Act = activationUser(Gate->result());
      Node *Glu = onlyUser(Act->result(), OpKind::Mul);
      if (!Glu || onlyUser(Up->result(), OpKind::Mul) != Glu)
        return fail(L, "mlp", Act->result(),
                    "expected silu(gate(x)) * up(x); " + found(Act->result()));
      tag(Gate, L, Role::Gate);
      tag(Up, L, Role::Up);
      tag(Act, L, Role::Act);
      tag(Glu, L, Role::Glu);
      return expect(L, "mlp", Glu->result(), OpKind::Linear, Role::Fc2);
    }
    if (MlpUsers.size() != 1 || MlpUsers[0]->op() != OpKind::Linear)
      return fail(L, "mlp", MlpIn,
                  "expected an fc1 linear or gate and up linears; " +
                      found(MlpIn));
    Node *FC1 = MlpUsers[0];
    tag(FC1, L, Role::Fc1);
    Node *Act = activationUser(FC1->result());
    if (!Act)
      return fail(L, "mlp", FC1->result(),
                  "expected an activation: " + activationNames() + " (act); " +
                      found(FC1->result()));
    tag(Act, L, Role::Act);
    return expect(L, "mlp", Act->result(), OpKind::Linear, Role::Fc2);
  }

  /// The roles at a block's end, and what its residual adds (for errors).
  struct BlockEnd {
    Role Dropout, Residual, PostNorm;
    const char *Input;
  };

  /// The end of a block: an optional dropout, the residual add Res found at
  /// the block's input and, post-norm, a LayerNorm. Returns the residual
  /// stream after it.
  Expected<Value *> closeBlock(int L, StringRef Part, Value *Out, Node *Res,
                               bool PostNorm, BlockEnd Roles) {
    Value *Cur = optionalDropout(Out, L, Roles.Dropout);
    auto R = expect(L, Part, Cur, OpKind::Add, Roles.Residual);
    if (!R)
      return R.takeError();
    if (*R != Res)
      return fail(L, Part, Cur,
                  Twine("the residual add must add the ") + Roles.Input +
                      " input");
    Value *X = Res->result();
    if (!PostNorm)
      return X;
    auto N = expect(L, Part, X, OpKind::LayerNorm, Roles.PostNorm);
    if (!N)
      return N.takeError();
    return (*N)->result();
  }

  /// From the scores q k^T to the attention output projection: an optional
  /// scaling, causal mask and padding mask in any order, the softmax, an
  /// optional dropout, the product with the values, merge_heads and proj.
  /// Every layer must mask as layer 0 does. Returns proj.
  Expected<Node *> attentionCore(int L, Node *QK, Value *V) {
    Value *Cur = QK->result();
    struct Optional {
      OpKind Op;
      Role R;
      bool Found = false;
    } Steps[] = {{OpKind::Scale, Role::Scale},
                 {OpKind::CausalMask, Role::Mask},
                 {OpKind::PaddingMask, Role::PadMask}};
    for (bool More = true; More;) {
      More = false;
      for (Optional &S : Steps)
        if (Node *N = onlyUser(Cur, S.Op); N && !S.Found) {
          tag(N, L, S.R);
          S.Found = More = true;
          Cur = N->result();
        }
    }
    bool Causal = Steps[1].Found, Padding = Steps[2].Found;
    if (L == 0) {
      CausalModel = Causal;
      PaddingModel = Padding;
    } else if (Causal != CausalModel || Padding != PaddingModel) {
      return fail(L, "attention core", Cur,
                  "the layer masks its scores differently from layer 0 (causal "
                  "mask, padding mask)");
    }
    Node *SM = onlyUser(Cur, OpKind::Softmax);
    if (!SM)
      return fail(L, "attention core", Cur,
                  "expected softmax after the scores, their scaling and the "
                  "masks; " + found(Cur) + unsupportedMaskHint(Cur));
    tag(SM, L, Role::Softmax);
    Cur = optionalDropout(SM->result(), L, Role::AttnCoreDropout);
    auto AV = expect(L, "attention core", Cur, OpKind::BatchMatMul, Role::Av);
    if (!AV)
      return AV.takeError();
    if ((*AV)->operand(1) != V || attrInt((*AV)->op(), (*AV)->attrs(), "trans_b"))
      return fail(L, "attention core", Cur,
                  "av must multiply the attention probabilities by the values");
    auto MH = expect(L, "attention", (*AV)->result(), OpKind::MergeHeads,
                     Role::MergeHeads);
    if (!MH)
      return MH.takeError();
    auto Proj =
        expect(L, "attention", (*MH)->result(), OpKind::Linear, Role::Proj);
    if (!Proj)
      return Proj.takeError();
    return *Proj;
  }

  /// When the scores meet an add of something computed from a graph input,
  /// says which attention masks sp understands.
  static std::string unsupportedMaskHint(Value *Scores) {
    if (Scores->users().size() != 1)
      return "";
    Node *U = Scores->users()[0].User;
    for (Value *Op : U->operands()) {
      if (Op == Scores)
        continue;
      SmallVector<Value *, 8> Work{Op};
      for (unsigned Steps = 0; !Work.empty() && Steps < 16; ++Steps) {
        Value *W = Work.pop_back_val();
        if (W->isInput())
          return formatv(". The scores are combined with a value computed "
                         "from input '{0}' ({1}): sp supports an attention "
                         "mask input m of shape [batch, seq] added as "
                         "(1 - m) * fill, and constant causal masks",
                         W->name(), W->type().str())
              .str();
        if (W->producer())
          for (Value *In : W->producer()->operands())
            Work.push_back(In);
      }
    }
    return "";
  }

  Error head(Value *X) {
    Value *Cur = X;
    Node *LN = onlyUser(Cur, OpKind::LayerNorm);
    if (!LN)
      LN = onlyUser(Cur, OpKind::RmsNorm);
    if (LN) {
      tag(LN, -1, Role::FinalNorm);
      Cur = LN->result();
    }
    // BERT's prediction head transform: linear, gelu, layer_norm.
    if (Node *D = onlyUser(Cur, OpKind::Linear)) {
      Node *Act = activationUser(D->result());
      Node *N = Act ? onlyUser(Act->result(), OpKind::LayerNorm) : nullptr;
      if (N) {
        tag(D, -1, Role::HeadDense);
        tag(Act, -1, Role::HeadAct);
        tag(N, -1, Role::HeadNorm);
        Cur = N->result();
      }
    }
    auto Head = expect(-1, "lm head", Cur, OpKind::Linear, Role::LmHead);
    if (!Head)
      return Head.takeError();
    Node *H = *Head;
    if (!G.isOutput(H->result()))
      return fail(-1, "lm head", H->result(),
                  "the lm head's logits must be a graph output");
    const TensorType &W = H->operand(1)->type();
    int64_t Vocab = attrInt(H->op(), H->attrs(), "trans_w") ? W.Shape[0] : W.Shape[1];
    if (H->result()->type().dim(-1) != Vocab)
      return fail(-1, "lm head", Cur, "unexpected logits shape");
    // Everything must be accounted for.
    for (Node &N : G.nodes())
      if (N.tags().Role == Role::None) {
        std::string Near;
        for (Value *Op : N.operands())
          if (Op->producer() && Op->producer()->tags().Role != Role::None) {
            const Tags &T = Op->producer()->tags();
            Near = " (it uses the result of " +
                   (T.Layer >= 0 ? formatv("layer {0} ", T.Layer).str()
                                 : std::string()) +
                   roleName(T.Role).str() + ")";
            break;
          }
        return fail(-1, "structure", nullptr,
                    N.describe() + " is not part of the recognised "
                                   "Transformer" +
                        Near);
      }
    return checkFamily();
  }

  /// Every layer's roles must fit the same family template
  /// (ir/Family.h): the walk accepts any combination of the blocks it
  /// knows, a family is one that the parallel rules and the memory formulas
  /// cover.
  Error checkFamily() {
    std::vector<std::vector<Role>> Roles;
    for (const Node &N : G.nodes())
      if (N.tags().Layer >= 0) {
        if (Roles.size() <= size_t(N.tags().Layer))
          Roles.resize(N.tags().Layer + 1);
        Roles[N.tags().Layer].push_back(N.tags().Role);
      }
    FamilyFit Fit = fitFamily(Roles);
    if (!Fit.Family)
      return fail(Fit.Layer, "layer", nullptr, Fit.Why);
    return Error::success();
  }

  Graph &G;
  bool PostNormModel = false, CausalModel = false, PaddingModel = false;
};

class DetectTransformerPass : public Pass {
public:
  StringRef name() const override { return "detect-transformer"; }

  Error run(Graph &G, PassContext &Ctx) override {
    if (auto E = Detector(G).run())
      return createStringError(inconvertibleErrorCode(),
                               "not a supported Transformer (GPT, Llama, BERT, "
                               "GPT-NeoX or GPT-J family): %s",
                               toString(std::move(E)).c_str());
    return Error::success();
  }
};

} // namespace

std::unique_ptr<Pass> createDetectTransformerPass() {
  return std::make_unique<DetectTransformerPass>();
}

} // namespace sp
