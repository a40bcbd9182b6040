//===- Autodiff.cpp - Loss and reverse-mode gradients ---------------------===//
//
// Turns the forward graph of a detected Transformer into a training graph:
//
//  1. The language-model loss: a `targets` input (the token each position
//     predicts, or -100 for one that counts for nothing) and
//     cross_entropy(logits, targets) {ignore_index = -100}, the mean over the
//     counted targets, times a `loss_weight` input (the microbatch's share of
//     the step's counted targets, so that the sum over microbatches is the
//     step's mean).
//  2. Forward nodes whose gradient needs more than their first result are
//     rebuilt with all of them: layer_norm keeps its per-row mean and 1/std,
//     dropout its 1-byte keep mask. Each dropout gets its Philox key
//     [layer + 1, site] (site: ordinal within the layer, embedding = layer 0),
//     so the mask of an element never depends on how tensors are split.
//  3. A reverse sweep over the forward nodes applies one gradient rule per op.
//     Gradients reaching a value twice (a residual stream, a tied embedding)
//     are summed with add. Only values that depend on a parameter get
//     gradients.
//  4. The outputs become "loss" and one "grad:<parameter>" per parameter.
//
// Each rule declares the forward values it saves (savedForBackward); the pass
// checks that the backward nodes a rule builds read no other forward value,
// so the declaration is exact. The backward nodes keep the layer and role of
// their forward node and are tagged phase = bwd.
//
//===----------------------------------------------------------------------===//
#include "passes/Autodiff.h"
#include "ir/ShapeInference.h"
#include "passes/Passes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/FormatVariadic.h"
#include <cstring>

using namespace llvm;

namespace sp {

const Node *regatheredInput(const Node &N) {
  const Node *G = N.numOperands() ? N.operand(0)->producer() : nullptr;
  if (N.op() == OpKind::Linear && G && G->op() == OpKind::SpGather &&
      attrInt(G->op(), G->attrs(), "regather"))
    return G;
  return nullptr;
}

SmallVector<Value *, 4> savedForBackward(const Node &N) {
  auto Op = [&](unsigned I) { return N.operand(I); };
  auto Res = [&](unsigned I) { return N.result(I); };
  switch (N.op()) {
  case OpKind::Embedding:
    return {Op(1)}; // the ids
  case OpKind::LayerNorm:
    return {Op(0), Op(1), Res(1), Res(2)}; // input, gamma, mean, 1/std
  case OpKind::Linear:
    // Under sequence parallelism the input of a column-parallel linear is
    // all-gathered (g); the backward gathers it again from the saved shard.
    if (const Node *G = regatheredInput(N))
      return {G->operand(0), Op(1)};
    return {Op(0), Op(1)}; // input, weight
  case OpKind::RmsNorm:
    return {Op(0), Op(1), Res(1)}; // input, gamma, 1/rms
  case OpKind::Gelu:
  case OpKind::Silu:
    return {Op(0)};
  case OpKind::Mul:
    return {Op(0), Op(1)}; // each operand's gradient reads the other
  case OpKind::Rope:
    return {Op(1), Op(2)}; // the cos and sin tables
  case OpKind::BatchMatMul:
    return {Op(0), Op(1)};
  case OpKind::Softmax:
    return {Res(0)};
  case OpKind::Dropout:
    return {Res(1)}; // the mask
  case OpKind::CrossEntropy:
    return {Op(0), Op(1)}; // logits, targets
  default:
    return {}; // add, scale, causal/padding mask, split/merge/to/repeat heads
  }
}

namespace {

Error diffError(const Node &N, const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), "%s: %s",
                           N.describe().c_str(), Msg.str().c_str());
}

class Differentiator {
public:
  explicit Differentiator(Graph &G) : G(G) {}

  Error run() {
    auto Loss = addLoss();
    if (!Loss)
      return Loss.takeError();
    upgradeForwardNodes();
    computeRequiresGrad();

    SmallVector<Node *, 64> Forward;
    for (Node &N : G.nodes())
      Forward.push_back(&N);
    Seed = constant("loss_grad_seed", 1.0f);
    Grads[*Loss] = Seed;
    for (Node *N : reverse(Forward))
      if (auto E = differentiate(*N))
        return E;

    // Outputs: the loss and every parameter's gradient.
    std::vector<std::pair<std::string, Value *>> Outs{{"loss", *Loss}};
    for (const auto &P : G.params()) {
      Value *D = Grads.lookup(P.get());
      if (!D)
        return createStringError(inconvertibleErrorCode(),
                                 "parameter '%s' does not affect the loss",
                                 P->name().c_str());
      if (P->sharding().SumGrad) {
        // Used on sequence-sharded data: each rank's gradient is partial.
        Node *Sum = cantFail(buildNode(G, G.nodes().end(), OpKind::AllReduce,
                                       {D}, {}, P->name()));
        Sum->tags().Role = "grad_sum";
        Sum->tags().Ph = Phase::Backward;
        D = Sum->result();
      }
      Outs.push_back({"grad:" + P->name(), D});
    }
    G.clearOutputs();
    for (auto &[Name, V] : Outs)
      G.addOutput(Name, V);
    G.eraseDeadNodes();
    return Error::success();
  }

private:
  Expected<Value *> addLoss() {
    if (G.outputs().size() != 1)
      return createStringError(inconvertibleErrorCode(),
                               "expected one output (the logits), found %zu",
                               G.outputs().size());
    Value *Logits = G.outputs()[0].V;
    const TensorType &LT = Logits->type();
    if (!isFloat(LT.Dtype) || LT.rank() < 2)
      return createStringError(inconvertibleErrorCode(),
                               "the output must be float logits [.., vocab], "
                               "got %s",
                               LT.str().c_str());
    Value *Targets = G.addInput(
        G.uniqueLeafName("targets"),
        TensorType(DType::I64, ArrayRef<int64_t>(LT.Shape).drop_back()),
        InputRole::Targets);
    // Vocabulary-parallel logits: the loss reduces over the group, and
    // masks the padding columns.
    AttrList A;
    if (Node *Head = Logits->producer()) {
      if (Logits->sharding().K == Sharding::Split &&
          Logits->sharding().Dim == int(LT.rank()) - 1)
        A.set("vocab_parallel", int64_t(1));
      if (Head->attrs().has("valid_vocab"))
        A.set("valid_vocab", attrInt(Head->op(), Head->attrs(), "valid_vocab"));
    }
    A.set("ignore_index", IgnoreTarget);
    auto CE = buildNode(G, G.nodes().end(), OpKind::CrossEntropy,
                        {Logits, Targets}, A, "loss");
    if (!CE)
      return CE.takeError();
    (*CE)->tags().Role = "loss";
    // The step's loss is the mean over every counted target of the step:
    // the sum over microbatches of weight * (the microbatch's mean), where
    // the runtime feeds weight = (the microbatch's counted targets) / (the
    // step's).
    Value *Weight =
        G.addInput(G.uniqueLeafName("loss_weight"),
                   TensorType(DType::F32, {}), InputRole::LossWeight);
    auto Weighted = buildNode(G, G.nodes().end(), OpKind::Mul,
                              {(*CE)->result(), Weight}, {}, "loss");
    if (!Weighted)
      return Weighted.takeError();
    (*Weighted)->tags().Role = "loss";
    return (*Weighted)->result();
  }

  /// Rebuilds layer_norm, rms_norm and dropout with all their results, and
  /// keys the dropouts.
  void upgradeForwardNodes() {
    DenseMap<int, int64_t> Sites;
    for (auto It = G.nodes().begin(); It != G.nodes().end();) {
      Node &N = *It++;
      bool IsDropout = N.op() == OpKind::Dropout;
      if (!IsDropout && N.op() != OpKind::LayerNorm &&
          N.op() != OpKind::RmsNorm)
        continue;
      AttrList A = N.attrs();
      if (IsDropout) {
        int KeyLayer = N.tags().Layer + 1;
        A.set("key", std::vector<int64_t>{KeyLayer, Sites[KeyLayer]++});
      }
      if (N.numResults() > 1 && !IsDropout)
        continue;
      Node *New = cantFail(buildNode(G, N.getIterator(), N.op(),
                                     N.operands(), A, N.name()));
      New->tags() = N.tags();
      // Statistics and masks are laid out like the output.
      for (Value *R : New->results())
        R->setSharding(N.result()->sharding());
      G.replaceAllUsesWith(N.result(), New->result());
      for (unsigned I = 1; I < N.numResults(); ++I)
        G.replaceAllUsesWith(N.result(I), New->result(I));
      G.erase(&N);
    }
  }

  void computeRequiresGrad() {
    for (const auto &P : G.params())
      RequiresGrad.insert(P.get());
    for (Node &N : G.nodes())
      if (any_of(N.operands(),
                 [&](Value *V) { return RequiresGrad.count(V); }))
        for (Value *R : N.results())
          if (isFloat(R->type().Dtype))
            RequiresGrad.insert(R);
  }

  Value *constant(StringRef Name, float V) {
    std::vector<char> B(4);
    std::memcpy(B.data(), &V, 4);
    return G.addInlineConst(Name, TensorType(DType::F32, {}), std::move(B));
  }

  /// Appends a backward node for the forward node Fwd.
  Node *emit(const Node &Fwd, OpKind Op, ArrayRef<Value *> Operands,
             AttrList Attrs = {}) {
    auto N = buildNode(G, G.nodes().end(), Op, Operands, std::move(Attrs),
                       Fwd.name());
    if (!N) // every rule builds well-typed nodes from a verified graph
      report_fatal_error(Twine("autodiff: ") + toString(N.takeError()));
    (*N)->tags() = Fwd.tags();
    (*N)->tags().Ph = Phase::Backward;
    Emitted.push_back(*N);
    return *N;
  }

  void accumulate(const Node &Fwd, Value *V, Value *D) {
    if (!RequiresGrad.count(V))
      return;
    if (D->type() != V->type()) {
      AttrList A;
      A.set("shape", std::vector<int64_t>(V->type().Shape.begin(),
                                          V->type().Shape.end()));
      D = emit(Fwd, OpKind::ReduceTo, {D}, A)->result();
    }
    Value *&Slot = Grads[V];
    Slot = Slot ? emit(Fwd, OpKind::Add, {Slot, D})->result() : D;
  }

  Error differentiate(Node &N) {
    SmallVector<Value *, 3> DR;
    bool Any = false;
    for (Value *R : N.results()) {
      DR.push_back(Grads.lookup(R));
      Any |= DR.back() != nullptr;
    }
    if (!Any || none_of(N.operands(),
                        [&](Value *V) { return RequiresGrad.count(V); }))
      return Error::success();
    Emitted.clear();
    if (auto E = applyRule(N, DR))
      return E;
    return checkSaved(N);
  }

  /// The rule may read gradients (values of backward nodes, the loss seed)
  /// and what savedForBackward declares, nothing else of the forward.
  Error checkSaved(const Node &N) {
    auto Saved = savedForBackward(N);
    for (Node *B : Emitted)
      for (Value *V : B->operands()) {
        bool IsGrad = V == Seed || (V->producer() &&
                                    V->producer()->tags().Ph == Phase::Backward);
        if (!IsGrad && !is_contained(Saved, V))
          return diffError(N, "its gradient rule reads a forward value it does "
                              "not declare as saved");
      }
    return Error::success();
  }

  static AttrList collectiveAttrs(const Node &N) {
    AttrList A;
    A.set("dim", attrInt(N.op(), N.attrs(), "dim"));
    A.set("parts", attrInt(N.op(), N.attrs(), "parts"));
    return A;
  }

  Error applyRule(Node &N, ArrayRef<Value *> DR) {
    Value *DY = DR[0];
    auto NeedAll = [&]() -> Error {
      for (unsigned I = 0; I < DR.size(); ++I)
        if (!DR[I])
          return diffError(N, formatv("result {0} has no gradient", I));
      return Error::success();
    };
    switch (N.op()) {
    case OpKind::CrossEntropy:
      accumulate(N, N.operand(0),
                 emit(N, OpKind::CrossEntropyGrad,
                      {N.operand(0), N.operand(1), DY}, N.attrs())
                     ->result());
      return Error::success();
    case OpKind::Embedding: {
      AttrList A;
      A.set("vocab", N.operand(0)->type().Shape[0]);
      if (attrInt(N.op(), N.attrs(), "vocab_parallel"))
        A.set("vocab_parallel", int64_t(1));
      accumulate(N, N.operand(0),
                 emit(N, OpKind::EmbeddingGrad, {N.operand(1), DY}, A)->result());
      return Error::success();
    }
    case OpKind::Add:
      accumulate(N, N.operand(0), DY);
      accumulate(N, N.operand(1), DY);
      return Error::success();
    case OpKind::LayerNorm: {
      Node *B = emit(N, OpKind::LayerNormGrad,
                     {DY, N.operand(0), N.operand(1), N.result(1), N.result(2)});
      accumulate(N, N.operand(0), B->result(0));
      accumulate(N, N.operand(1), B->result(1));
      accumulate(N, N.operand(2), B->result(2));
      return Error::success();
    }
    case OpKind::Linear: {
      int64_t TransW = attrInt(N.op(), N.attrs(), "trans_w");
      AttrList AX, AW;
      AX.set("trans_w", int64_t(!TransW));
      AW.set("trans_w", TransW);
      if (RequiresGrad.count(N.operand(0)))
        accumulate(N, N.operand(0),
                   emit(N, OpKind::Linear, {DY, N.operand(1)}, AX)->result());
      // The full input for dW: saved, or gathered again from the shard,
      // once for every linear that reads the same g (Llama's q, k, v).
      Value *X = N.operand(0);
      if (const Node *G = regatheredInput(N)) {
        Value *&Again = Regathered[G];
        if (!Again) {
          Node *AG = emit(*G, OpKind::AllGather, {G->operand(0)},
                          collectiveAttrs(*G));
          AG->tags().Role = G->tags().Role + "_regather";
          Again = AG->result();
        }
        X = Again;
      }
      accumulate(N, N.operand(1),
                 emit(N, OpKind::LinearGradW, {X, DY}, AW)->result());
      if (N.numOperands() == 3)
        accumulate(N, N.operand(2), emit(N, OpKind::BiasGrad, {DY})->result());
      return Error::success();
    }
    case OpKind::Gelu:
      accumulate(N, N.operand(0),
                 emit(N, OpKind::GeluGrad, {N.operand(0), DY}, N.attrs())
                     ->result());
      return Error::success();
    case OpKind::RmsNorm: {
      Node *B = emit(N, OpKind::RmsNormGrad,
                     {DY, N.operand(0), N.operand(1), N.result(1)});
      accumulate(N, N.operand(0), B->result(0));
      accumulate(N, N.operand(1), B->result(1));
      return Error::success();
    }
    case OpKind::Silu:
      accumulate(N, N.operand(0),
                 emit(N, OpKind::SiluGrad, {N.operand(0), DY})->result());
      return Error::success();
    case OpKind::Mul: // d(a b) = b da + a db; accumulate reduces broadcasts
      for (unsigned I : {0u, 1u})
        if (RequiresGrad.count(N.operand(I)))
          accumulate(N, N.operand(I),
                     emit(N, OpKind::Mul, {DY, N.operand(1 - I)})->result());
      return Error::success();
    case OpKind::Rope:
      if (RequiresGrad.count(N.operand(1)) || RequiresGrad.count(N.operand(2)))
        return diffError(N, "its cos/sin tables depend on a parameter; only "
                            "fixed rotary tables are supported");
      accumulate(N, N.operand(0),
                 emit(N, OpKind::RopeGrad, {DY, N.operand(1), N.operand(2)},
                      N.attrs())
                     ->result());
      return Error::success();
    case OpKind::ToHeads:
      accumulate(N, N.operand(0), emit(N, OpKind::MergeHeads, {DY})->result());
      return Error::success();
    case OpKind::RepeatHeads:
      accumulate(N, N.operand(0),
                 emit(N, OpKind::RepeatHeadsGrad, {DY}, N.attrs())->result());
      return Error::success();
    case OpKind::SplitHeads: {
      if (auto E = NeedAll())
        return E;
      accumulate(N, N.operand(0),
                 emit(N, OpKind::SplitHeadsGrad, {DR[0], DR[1], DR[2]})
                     ->result());
      return Error::success();
    }
    case OpKind::MergeHeads: {
      AttrList A;
      A.set("heads", N.operand(0)->type().Shape[1]);
      accumulate(N, N.operand(0),
                 emit(N, OpKind::MergeHeadsGrad, {DY}, A)->result());
      return Error::success();
    }
    case OpKind::BatchMatMul: {
      if (attrInt(N.op(), N.attrs(), "trans_a"))
        return diffError(N, "batch_matmul with trans_a is not differentiable "
                            "yet");
      int64_t TransB = attrInt(N.op(), N.attrs(), "trans_b");
      Value *A = N.operand(0), *B = N.operand(1);
      AttrList DA, DB;
      DA.set("trans_b", int64_t(!TransB));
      DB.set("trans_a", int64_t(1));
      // C = A op(B): dA = dC op(B)^T; dB = A^T dC, or dC^T A when B is
      // stored transposed.
      if (RequiresGrad.count(A))
        accumulate(N, A, emit(N, OpKind::BatchMatMul, {DY, B}, DA)->result());
      if (RequiresGrad.count(B)) {
        Value *DBv = TransB ? emit(N, OpKind::BatchMatMul, {DY, A}, DB)->result()
                            : emit(N, OpKind::BatchMatMul, {A, DY}, DB)->result();
        accumulate(N, B, DBv);
      }
      return Error::success();
    }
    case OpKind::Scale:
      accumulate(N, N.operand(0),
                 emit(N, OpKind::Scale, {DY}, N.attrs())->result());
      return Error::success();
    case OpKind::PaddingMask: // x + bias: the gradient passes unchanged
      accumulate(N, N.operand(0), DY);
      return Error::success();
    case OpKind::CausalMask: {
      AttrList A;
      A.set("fill", 0.0);
      accumulate(N, N.operand(0),
                 emit(N, OpKind::CausalMask, {DY}, A)->result());
      return Error::success();
    }
    case OpKind::Softmax:
      accumulate(N, N.operand(0),
                 emit(N, OpKind::SoftmaxGrad, {N.result(), DY})->result());
      return Error::success();
    case OpKind::Dropout: {
      AttrList A;
      A.set("ratio", attrFloat(N.op(), N.attrs(), "ratio"));
      accumulate(N, N.operand(0),
                 emit(N, OpKind::DropoutGrad, {DY, N.result(1)}, A)->result());
      return Error::success();
    }
    // The conjugate collectives.
    case OpKind::TpCopy: // f: all-reduce backward
      accumulate(N, N.operand(0), emit(N, OpKind::AllReduce, {DY})->result());
      return Error::success();
    case OpKind::TpReduce: // f-bar: identity backward
      accumulate(N, N.operand(0), DY);
      return Error::success();
    case OpKind::SpGather: // g: reduce-scatter backward
      accumulate(N, N.operand(0),
                 emit(N, OpKind::ReduceScatter, {DY}, collectiveAttrs(N))
                     ->result());
      return Error::success();
    case OpKind::SpScatter: // g-bar: all-gather backward
    case OpKind::SpSplit:
      accumulate(N, N.operand(0),
                 emit(N, OpKind::AllGather, {DY}, collectiveAttrs(N))->result());
      return Error::success();
    default:
      return diffError(N, "no gradient rule for this op (run canonicalize "
                          "first, or the model uses an op the training graph "
                          "does not support)");
    }
  }

  Graph &G;
  DenseMap<Value *, Value *> Grads;
  /// The backward all-gather of each regathered g, shared by its linears.
  DenseMap<const Node *, Value *> Regathered;
  llvm::DenseSet<Value *> RequiresGrad;
  SmallVector<Node *, 8> Emitted;
  Value *Seed = nullptr;
};

class AutodiffPass : public Pass {
public:
  StringRef name() const override { return "autodiff"; }

  Error run(Graph &G, PassContext &Ctx) override {
    for (const Graph::Output &O : G.outputs())
      if (O.Name == "loss")
        return createStringError(inconvertibleErrorCode(),
                                 "the graph already has a loss");
    return Differentiator(G).run();
  }
};

} // namespace

std::unique_ptr<Pass> createAutodiffPass() {
  return std::make_unique<AutodiffPass>();
}

} // namespace sp
