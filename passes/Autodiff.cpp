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
//  3. A reverse sweep over the forward nodes applies each op's gradient rule
//     (its definition in ir/ops/, through the GradBuilder of ir/OpDef.h).
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
#include "ir/OpDef.h"
#include "ir/ShapeInference.h"
#include "passes/Passes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/FormatVariadic.h"
#include <cstring>

using namespace llvm;

namespace sp {

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
        Sum->tags().Role = Role::GradSum;
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
    (*CE)->tags().Role = Role::Loss;
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
    (*Weighted)->tags().Role = Role::Loss;
    return (*Weighted)->result();
  }

  /// Rebuilds layer_norm, rms_norm and dropout with all their results, and
  /// keys the dropouts.
  void upgradeForwardNodes() {
    DenseMap<int, int64_t> Sites;
    for (auto It = G.nodes().begin(); It != G.nodes().end();) {
      Node &N = *It++;
      // A fused attention that absorbed a dropout is that dropout's site.
      bool IsDropout =
          N.op() == OpKind::Dropout ||
          (N.op() == OpKind::Attention && attrInt(N.op(), N.attrs(), "dropout"));
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

  /// The gradient rule of N's op (ir/ops/), building through this pass.
  Error applyRule(Node &N, ArrayRef<Value *> DR) {
    GradRule Rule = opDef(N.op()).Grad;
    if (!Rule)
      return diffError(N, "no gradient rule for this op (run canonicalize "
                          "first, or the model uses an op the training graph "
                          "does not support)");
    Builder B(*this, N, DR);
    return Rule(B);
  }

  /// What a rule sees of the pass: the gradients of N's results and the
  /// pass's emit and accumulate.
  class Builder : public GradBuilder {
  public:
    Builder(Differentiator &D, const Node &N, ArrayRef<Value *> DR)
        : GradBuilder(N), D(D), DR(DR) {}
    Value *grad(unsigned I) const override {
      return I < DR.size() ? DR[I] : nullptr;
    }
    bool requiresGrad(const Value *V) const override {
      return D.RequiresGrad.count(const_cast<Value *>(V));
    }
    Node *emit(OpKind Op, ArrayRef<Value *> Operands,
               AttrList Attrs) override {
      return D.emit(N, Op, Operands, std::move(Attrs));
    }
    void accumulate(Value *V, Value *Grad) override {
      D.accumulate(N, V, Grad);
    }
    Value *regathered(const Node &G) override {
      Value *&Again = D.Regathered[&G];
      if (!Again) {
        AttrList A;
        A.set("dim", attrInt(G.op(), G.attrs(), "dim"));
        A.set("parts", attrInt(G.op(), G.attrs(), "parts"));
        Node *AG = D.emit(G, OpKind::AllGather, {G.operand(0)}, A);
        AG->tags().Role = roleProps(G.tags().Role).Regather;
        Again = AG->result();
      }
      return Again;
    }

  private:
    Differentiator &D;
    ArrayRef<Value *> DR;
  };

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
