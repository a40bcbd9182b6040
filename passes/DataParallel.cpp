//===- DataParallel.cpp - Gradient sums over the data-parallel group ------===//
//
// With --dp D, D replicas of the whole t x p grid each train on their own
// rows of the step's batch (the runtime's data loader gives replica r rows
// [r B, (r + 1) B) of the D B rows), and every replica must apply the same
// update: the gradient of the whole batch. Each replica's gradients are
// its rows' contributions to the global mean loss (the runtime weighs each
// microbatch's loss by its share of the targets counted over all replicas),
// so the global gradient is their sum:
//
//   g_i' = all_reduce {group = "dp"} (g_i)     for every gradient g_i
//
// read by grad_norm, adamw and the grad: outputs instead of g_i. The sums are
// optimizer-phase nodes on the stage of the gradient's update: they run once
// per step, on the gradient accumulated over the microbatches (and, for a
// weight shared by pipeline stages, after its sum over them), in the order
// the backward produced the gradients, so that a backend that runs
// collectives on a stream of their own overlaps the first of them with the
// end of the backward. Each sum carries the bucket size (--dp-bucket):
// after the schedule is unrolled, the lowering groups them into buckets and
// moves each bucket into the backward, right after its last gradient is made
// (lower/GradientBuckets.h), where the actual order of the program is known.
//
// With --zero 1 (ZeRO stage 1, Megatron's distributed optimizer), each rank
// keeps the AdamW moments of only its share of every parameter: the
// parameter's elements read flat, in D equal chunks (the last zero-padded),
// replica r owning chunk r. The sums become
//
//   c_i = reduce_scatter {group = "dp", flat = 1, parts = D} (g_i)
//   adamw {zero_parts = D} (p_i, c_i, m_i, v_i, ...)  m_i, v_i: chunk-sized
//   gather_param {parts = D} (p_i)                    every chunk, in place
//
// grad_norm {zero = 1} sums its chunks' squares over the replicas too, and
// the grad: outputs are the chunks (sharding dp_chunks = D; dumps gather
// them). The moments take 8 bytes per parameter / D instead of 8; the
// gradient a rank keeps for the optimizer is its chunk.
//
// With --cp C, each context-parallel rank's gradients are its positions'
// part of its replica's, so the sums (and ZeRO's chunks) run over the D x C
// ranks of the data-parallel x context-parallel group, which the runtime's
// "dp" group then is.
//
// Runs after pipeline-stages (it reads the stage of each update); a no-op
// without --dp or --cp.
//
//===----------------------------------------------------------------------===//
#include "ir/ShapeInference.h"
#include "passes/Passes.h"
#include "llvm/ADT/DenseMap.h"

using namespace llvm;

namespace sp {
namespace {

/// The ranks a gradient is summed over: the replicas, and the
/// context-parallel ranks of each (each holds its part of the sequence's
/// contribution), Megatron's data-parallel-with-context-parallel group. The
/// runtime's "dp" group is that group.
int64_t gradientRanks(const PassContext &Ctx) {
  return int64_t(Ctx.DataParallel) * Ctx.ContextParallel;
}

class DataParallelPass : public Pass {
public:
  StringRef name() const override { return "data-parallel"; }

  Error run(Graph &G, PassContext &Ctx) override {
    if (gradientRanks(Ctx) <= 1)
      return Error::success();
    Node *Norm = nullptr;
    DenseMap<const Node *, size_t> Position; // in the node list
    size_t Next = 0;
    for (Node &N : G.nodes()) {
      Position[&N] = Next++;
      if (N.op() == OpKind::GradNorm)
        Norm = &N;
      if (N.op() == OpKind::AllReduce &&
          N.attrs().getString("group", "") == "dp")
        return createStringError(inconvertibleErrorCode(),
                                 "the graph already sums its gradients over "
                                 "the data-parallel group");
    }
    if (!Norm)
      return createStringError(inconvertibleErrorCode(),
                               "needs a training graph with its optimizer "
                               "(run autodiff and optimizer first)");
    // Each update's gradient, once, in the order the backward makes them.
    SmallVector<std::pair<Value *, Node *>, 32> Grads; // gradient, its update
    for (Node &N : G.nodes())
      if (N.op() == OpKind::AdamW &&
          none_of(Grads, [&](auto &GU) { return GU.first == N.operand(1); }))
        Grads.push_back({N.operand(1), &N});
    auto Made = [&](Value *V) {
      Node *P = V->producer();
      return P ? Position.lookup(P) : 0;
    };
    std::stable_sort(Grads.begin(), Grads.end(), [&](auto &A, auto &B) {
      return Made(A.first) < Made(B.first);
    });
    if (Ctx.Zero)
      return shardOptimizer(G, Ctx, *Norm, Grads);
    for (auto [Grad, Update] : Grads) {
      AttrList A;
      A.set("group", std::string("dp"));
      A.set("bucket_bytes", Ctx.DataParallelBucketBytes);
      Node *Sum = cantFail(buildNode(G, Norm->getIterator(),
                                     OpKind::AllReduce, {Grad}, A,
                                     "dp_sum." + Update->operand(0)->name()));
      Sum->tags().Role = Role::DpGradSum;
      Sum->tags().Ph = Phase::Optimizer;
      Sum->tags().Stage = Update->tags().Stage;
      Sum->result()->setSharding(Grad->sharding());
      G.replaceAllUsesWith(Grad, Sum->result(), Sum);
    }
    return Error::success();
  }

private:
  /// --zero 1: reduce-scatter every gradient over the replicas, update each
  /// rank's chunk, gather the updated chunks.
  static Error shardOptimizer(Graph &G, const PassContext &Ctx, Node &Norm,
                              ArrayRef<std::pair<Value *, Node *>> Grads) {
    int64_t D = gradientRanks(Ctx);
    for (auto [Grad, Update] : Grads) {
      AttrList A;
      A.set("group", std::string("dp"));
      A.set("dim", int64_t(0));
      A.set("parts", D);
      A.set("flat", int64_t(1));
      A.set("bucket_bytes", Ctx.DataParallelBucketBytes);
      auto RS = buildNode(G, Norm.getIterator(), OpKind::ReduceScatter, {Grad},
                          A, "dp_scatter." + Update->operand(0)->name());
      if (!RS)
        return RS.takeError();
      Node *Sum = *RS;
      Sum->tags().Role = Role::DpGradScatter;
      Sum->tags().Ph = Phase::Optimizer;
      Sum->tags().Stage = Update->tags().Stage;
      Sharding S = Grad->sharding();
      S.DataChunks = int(D);
      Sum->result()->setSharding(S);
      G.replaceAllUsesWith(Grad, Sum->result(), Sum);
    }
    Norm.attrs().set("zero", int64_t(1));
    SmallVector<Node *, 32> Updates;
    for (Node &N : G.nodes())
      if (N.op() == OpKind::AdamW)
        Updates.push_back(&N);
    for (Node *U : Updates) {
      Value *P = U->operand(0);
      TensorType Chunk(P->type().Dtype,
                       {dataChunkElements(P->type().numElements(), D)});
      for (unsigned K : {2u, 3u}) { // the moments
        Value *M = U->operand(K);
        if (!M->isState() || M->users().size() != 1)
          return createStringError(inconvertibleErrorCode(),
                                   "%s: its moment '%s' is not a state of "
                                   "its own; cannot shard it",
                                   U->describe().c_str(), M->name().c_str());
        M->setType(Chunk);
        M->setSharding(U->operand(1)->sharding()); // the gradient's chunk
      }
      U->attrs().set("zero_parts", D);
      AttrList A;
      A.set("parts", D);
      A.set("bucket_bytes", Ctx.DataParallelBucketBytes);
      // After every update (one batch of AdamW on a device), in their
      // order.
      auto Gather = buildNode(G, G.nodes().end(), OpKind::GatherParam, {P}, A,
                              "dp_gather." + P->name());
      if (!Gather)
        return Gather.takeError();
      (*Gather)->tags().Role = Role::DpParamGather;
      (*Gather)->tags().Ph = Phase::Optimizer;
      (*Gather)->tags().Stage = U->tags().Stage;
    }
    return Error::success();
  }
};

} // namespace

std::unique_ptr<Pass> createDataParallelPass() {
  return std::make_unique<DataParallelPass>();
}

} // namespace sp
