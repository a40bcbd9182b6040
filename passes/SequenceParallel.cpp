//===- SequenceParallel.cpp - Shard LayerNorm/dropout regions by sequence -===//
//
// Korthikanti et al. 2022, Section 4.2.2. After tensor-parallel, the regions
// between the tensor-parallel blocks (LayerNorm, dropout, residual adds) are
// replicated on every rank. This pass shards them along the sequence axis:
//
//   f      (before qkv, fc1, lm head) becomes g:  all-gather forward,
//                                                  reduce-scatter backward
//   f-bar  (after proj, fc2, embedding) becomes g-bar: reduce-scatter
//                                                  forward, all-gather backward
//
// so every rank holds 1/T of every activation. The position and token-type
// embeddings are split to this rank's positions (sp_split: its chunk
// forward, all-gather backward). Parameters used on sequence-sharded data
// (norm scales and biases, row-parallel biases, BERT's head transform) get
// partial gradients on each rank: they are marked #replicated(sum_grad) and
// autodiff sums their gradients over the group. Which nodes these are comes
// from their roles' properties (ir/Role.h).
//
// Each g before a column-parallel linear is marked regather: the linear's
// backward needs the full input, but autodiff saves the sequence shard and
// all-gathers it again in the backward (communication recomputation), which
// is what makes Eq. 4 hold.
//
//===----------------------------------------------------------------------===//
#include "ir/ShapeInference.h"
#include "analysis/ModelInfo.h"
#include "passes/Passes.h"
#include "ir/Role.h"
#include "analysis/Sharding.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {
namespace {

constexpr int SeqDim = 1; // activations are [batch, seq, hidden]

class SequenceParallelPass : public Pass {
public:
  StringRef name() const override { return "sequence-parallel"; }

  Error run(Graph &G, PassContext &Ctx) override {
    int T = Ctx.TensorParallel;
    if (!Ctx.SequenceParallel)
      return Error::success();
    if (T == 1)
      return createStringError(inconvertibleErrorCode(),
                               "sequence parallelism needs --tp T with T > 1");
    auto Info = summarizeModel(G);
    if (!Info)
      return Info.takeError();
    if (Info->Seq % T)
      return createStringError(
          inconvertibleErrorCode(),
          "--sp with --tp %d: the sequence length %lld is not divisible by t; "
          "t can be %s (or pass --seq)",
          T, (long long)Info->Seq, divisorsOf(Info->Seq).c_str());
    bool Found = false;
    SmallVector<Node *, 64> Work;
    for (Node &N : G.nodes())
      Work.push_back(&N);
    for (Node *N : Work) {
      const RoleProps &P = roleProps(N->tags().Role);
      if (N->op() == OpKind::TpCopy) {
        replace(G, *N, OpKind::SpGather, T, /*Regather=*/true);
        Found = true;
      } else if (N->op() == OpKind::TpReduce) {
        replace(G, *N, OpKind::SpScatter, T, false);
      } else if (P.Split != Role::None) {
        splitAfter(G, *N, T);
      } else if (P.SeqShardedParams) {
        for (Value *Op : N->operands()) // norm scales and biases, linears
          sumGrad(Op);
      }
    }
    if (!Found)
      return createStringError(inconvertibleErrorCode(),
                               "run tensor-parallel first: there is no f to "
                               "turn into g");
    if (auto E = retypeGraph(G))
      return E;
    propagateSharding(G);
    return Error::success();
  }

private:
  static void sumGrad(Value *P) {
    if (P->isParam())
      P->setSharding(Sharding::replicated(/*SumGrad=*/true));
  }

  static AttrList seqAttrs(int T, int64_t Dim = SeqDim) {
    AttrList A;
    A.set("dim", Dim);
    A.set("parts", int64_t(T));
    return A;
  }

  static void replace(Graph &G, Node &N, OpKind Op, int T, bool Regather) {
    AttrList A = seqAttrs(T);
    if (Regather)
      A.set("regather", int64_t(1));
    // Types are placeholders until retypeGraph.
    Node *C = G.create(N.getIterator(), Op, {N.operand(0)},
                       {N.result()->type()}, N.name());
    C->attrs() = A;
    C->tags() = N.tags();
    G.replaceAllUsesWith(N.result(), C->result());
    G.erase(&N);
  }

  /// Splits a position or token-type embedding ([b or 1, s, h] or [s, h]:
  /// the sequence is the second-to-last axis) to this rank's positions.
  static void splitAfter(Graph &G, Node &N, int T) {
    Node *C = G.create(std::next(N.getIterator()), OpKind::SpSplit,
                       {N.result()}, {N.result()->type()}, N.name());
    C->attrs() = seqAttrs(T, N.result()->type().rank() - 2);
    C->tags().Role = roleProps(N.tags().Role).Split;
    G.replaceAllUsesWith(N.result(), C->result(), C);
  }
};

} // namespace

std::unique_ptr<Pass> createSequenceParallelPass() {
  return std::make_unique<SequenceParallelPass>();
}

} // namespace sp
