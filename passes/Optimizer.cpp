//===- Optimizer.cpp - AdamW update after the backward --------------------===//
//
// Appends the optimizer step to a training graph (the output of autodiff):
//
//   norm = grad_norm(g_1, ..., g_n)              global L2 norm of all gradients
//                                                (split gradients are summed
//                                                over the group, replicated
//                                                ones counted once)
//   adamw(p_i, g_i, m_i, v_i, norm, lr, step)    for every parameter, in place
//
// m_i and v_i are `state` leaves (fp32, zero at the first step). The update
// follows torch.optim.AdamW after torch.nn.utils.clip_grad_norm_: gradients
// are scaled by min(1, max_norm / (norm + 1e-6)); weight decay is decoupled
// and applies only to parameters of rank >= 2 (matrices and embeddings), not
// to biases and norm scales. The learning rate and the 1-based step count are
// graph inputs, so the runtime owns the schedule (warmup, cosine decay).
//
//===----------------------------------------------------------------------===//
#include "ir/ShapeInference.h"
#include "passes/Passes.h"
#include "llvm/ADT/StringExtras.h"

using namespace llvm;

namespace sp {
namespace {

class OptimizerPass : public Pass {
public:
  StringRef name() const override { return "optimizer"; }

  Error run(Graph &G, PassContext &Ctx) override {
    const OptimizerOptions &O = Ctx.Optimizer;
    if (G.inputWithRole(InputRole::LearningRate) ||
        G.inputWithRole(InputRole::Step))
      return createStringError(inconvertibleErrorCode(),
                               "the graph already has an optimizer step");
    SmallVector<std::pair<Value *, Value *>, 32> ParamGrads;
    for (const Graph::Output &Out : G.outputs()) {
      StringRef Name = Out.Name;
      if (!Name.consume_front("grad:"))
        continue;
      Value *P = G.lookup(Name);
      if (!P || !P->isParam())
        return createStringError(inconvertibleErrorCode(),
                                 "output '%s' names no parameter",
                                 Out.Name.c_str());
      ParamGrads.push_back({P, Out.V});
      // A gradient is laid out like its parameter; summed ones are whole.
      Out.V->setSharding(P->sharding().K == Sharding::Split
                             ? P->sharding()
                             : Sharding::replicated());
    }
    if (ParamGrads.empty())
      return createStringError(inconvertibleErrorCode(),
                               "no gradients to apply: run autodiff first");

    TensorType Scalar(DType::F32, {});
    Value *LR =
        G.addInput(G.uniqueLeafName("lr"), Scalar, InputRole::LearningRate);
    Value *Step = G.addInput(G.uniqueLeafName("step"), Scalar, InputRole::Step);
    SmallVector<Value *, 32> Grads;
    for (auto &PG : ParamGrads)
      Grads.push_back(PG.second);
    Node *Norm = cantFail(
        buildNode(G, G.nodes().end(), OpKind::GradNorm, Grads, {}, "grad_norm"));
    tag(Norm, Role::GradNorm);
    for (auto [P, Grad] : ParamGrads) {
      Value *M = G.addState(G.uniqueLeafName("adam.m." + P->name()), P->type());
      Value *V = G.addState(G.uniqueLeafName("adam.v." + P->name()), P->type());
      AttrList A;
      A.set("beta1", O.Beta1);
      A.set("beta2", O.Beta2);
      A.set("eps", O.Eps);
      A.set("weight_decay", P->type().rank() >= 2 ? O.WeightDecay : 0.0);
      A.set("max_norm", O.MaxGradNorm);
      Node *U = cantFail(buildNode(G, G.nodes().end(), OpKind::AdamW,
                                   {P, Grad, M, V, Norm->result(), LR, Step}, A,
                                   "adamw." + P->name()));
      tag(U, Role::AdamW);
    }
    return Error::success();
  }

private:
  static void tag(Node *N, Role R) {
    N->tags().Role = R;
    N->tags().Ph = Phase::Optimizer;
  }
};

} // namespace

std::unique_ptr<Pass> createOptimizerPass() {
  return std::make_unique<OptimizerPass>();
}

} // namespace sp
