//===- ContextParallel.cpp - Split every activation along the sequence ----===//
//
// Context parallelism (sp-compile --cp C; Megatron-Core's
// --context-parallel-size, torchtitan's context_parallel). Sequence
// parallelism splits only the norm and dropout regions; here the whole
// layer runs on 1/C of the sequence, attention included, so activation
// memory per rank falls by C and the longest sequence is no longer one
// device's:
//
//   tokens, targets     the rank's positions (ir/ContextLayout.h), fed so
//                       by the runtime: the token input becomes [b, s/C]
//   position, token-type
//   embeddings, rotary  cp_slice of their ids (an embedding lookup) or of
//   tables              their value (roles with .CpSlice): the rank's rows
//   attention           {cp = C, cp_zigzag, cp_comm}: q, k, v are the rank's
//                       positions; the keys and values of the others come
//                       over the cp group (a ring of blocks); the padding
//                       mask stays whole (every key's)
//   dropout             {cp, cp_zigzag, cp_dim = 1}: the rank's block of the
//                       global [b, s, h] tensor, so the masks are those of
//                       one device
//
// Everything else is position-wise and runs unchanged on s/C rows. The
// parameters' gradients are partial on each rank; the data-parallel pass
// sums them over the data-parallel x context-parallel ranks, and the
// runtime weighs each rank's loss by its share of the counted targets, so
// the update is one device's.
//
// The layout is zigzag (rank r holds chunks r and 2C - 1 - r of 2C), so
// that under a causal mask every ring rank does the same work; the
// all-to-all (--cp-comm a2a: heads traded for positions) puts each sender's
// positions back in global order, so it shares the layout.
//
// Runs after fuse-attention: the core must be one attention op. The
// unfused core's [s, s] scores are refused, naming the node. Composes with
// tensor and sequence parallelism (which split each rank's s/C further),
// pipelines and data parallelism.
//
//===----------------------------------------------------------------------===//
#include "analysis/ModelInfo.h"
#include "analysis/Sharding.h"
#include "ir/ContextLayout.h"
#include "ir/Role.h"
#include "ir/ShapeInference.h"
#include "passes/Passes.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/FormatVariadic.h"
#include <numeric>

using namespace llvm;

namespace sp {
namespace {

class ContextParallelizer {
public:
  ContextParallelizer(Graph &G, const PassContext &Ctx)
      : G(G), Ctx(Ctx), C(Ctx.ContextParallel) {}

  Error run() {
    if (Ctx.ContextComm != "ring" && Ctx.ContextComm != "a2a")
      return makeError(formatv("--cp-comm {0}: 'ring' and 'a2a' are "
                               "implemented (hierarchical is not yet)",
                               Ctx.ContextComm));
    for (const Node &N : G.nodes())
      if (N.op() == OpKind::CpSlice ||
          (N.op() == OpKind::Attention && attrInt(N.op(), N.attrs(), "cp") > 1))
        return makeError("the graph is already context-parallel");
    auto Info = summarizeModel(G);
    if (!Info)
      return Info.takeError();
    Layout.Parts = C;
    Layout.Zigzag = true;
    Layout.Seq = Info->Seq;
    if (!Layout.divides())
      return makeError(formatv(
          "--cp {0}: the sequence length {1} must split into 2 x cp = {2} "
          "equal chunks (the ring's causal balance); cp can be one whose "
          "double divides {1} (or pass --seq)",
          C, Info->Seq, Layout.chunks()));
    int T = Ctx.TensorParallel;
    if (Ctx.SequenceParallel && Layout.local() % T)
      return makeError(formatv("--cp {0} with --tp {1} --sp: each rank's {2} "
                               "positions must split over t; t can be {3}",
                               C, T, Layout.local(),
                               divisorsOf(Layout.local())));
    // All-to-all: each rank takes a 1/C share of a tensor rank's heads.
    if (Ctx.ContextComm == "a2a") {
      int64_t Heads = Info->Heads / T,
              Kv = (Info->KvHeads ? Info->KvHeads : Info->Heads) / T;
      if (Heads % C || Kv % C)
        return makeError(formatv(
            "--cp {0} --cp-comm a2a: each tensor-parallel rank's {1} heads "
            "and {2} key/value heads must split over cp (each rank attends "
            "a 1/cp share of them); cp can be {3}, or use --cp-comm ring",
            C, Heads, Kv, divisorsOf(std::gcd(Heads, Kv))));
    }
    Value *Tokens = G.inputWithRole(InputRole::Tokens);
    if (!Tokens || Tokens->type().rank() != 2 ||
        Tokens->type().Shape[1] != Info->Seq)
      return makeError("--cp needs the token ids as a [batch, seq] input");

    SmallVector<Node *, 64> Work;
    for (Node &N : G.nodes())
      Work.push_back(&N);
    for (Node *N : Work)
      if (auto E = visit(*N))
        return E;
    TensorType Local = Tokens->type();
    Local.Shape[1] = Layout.local();
    Tokens->setType(Local);
    if (auto E = retypeGraph(G))
      return E;
    propagateSharding(G);
    return Error::success();
  }

private:
  Error visit(Node &N) {
    Role R = N.tags().Role;
    if (N.op() == OpKind::BatchMatMul || N.op() == OpKind::Softmax ||
        N.op() == OpKind::CausalMask || N.op() == OpKind::PaddingMask)
      return makeError(formatv(
          "--cp: {0} is part of an unfused attention core, whose [s, s] "
          "scores context parallelism does not split; compile with "
          "--attention fused (the default)",
          N.describe()));
    if (N.op() == OpKind::Attention) {
      if (attrInt(N.op(), N.attrs(), "packed"))
        return makeError(N.describe() + ": --cp needs q, k and v apart "
                                        "(run fuse-attention with --cp)");
      N.attrs().set("cp", int64_t(C));
      N.attrs().set("cp_zigzag", int64_t(Layout.Zigzag));
      N.attrs().set("cp_comm", Ctx.ContextComm);
      if (N.numOperands() > 3) {
        Value *Keep = N.operand(3);
        if (!Keep->isInput() || Keep->inputRole() != InputRole::Mask)
          return makeError(N.describe() +
                           ": --cp needs the padding mask to be the "
                           "attention-mask input (it stays whole: every "
                           "rank's keys)");
      }
      return Error::success();
    }
    if (N.op() == OpKind::Dropout) {
      const TensorType &X = N.operand(0)->type();
      // (Under sequence parallelism, already this tensor rank's part.)
      int64_t Rows =
          Ctx.SequenceParallel ? Layout.Seq / Ctx.TensorParallel : Layout.Seq;
      if (X.rank() != 3 || X.Shape[1] != Rows)
        return makeError(formatv("--cp: {0} drops out a {1}, not a [batch, "
                                 "seq, hidden] activation of {2} positions",
                                 N.describe(), X.str(), Rows));
      N.attrs().set("cp", int64_t(C));
      N.attrs().set("cp_zigzag", int64_t(Layout.Zigzag));
      N.attrs().set("cp_dim", int64_t(1));
      return Error::success();
    }
    Role Slice = roleProps(R).CpSlice;
    if (Slice == Role::None)
      return Error::success();
    // A lookup by position or token-type ids: cut the ids (the table's
    // gradient then comes from this rank's rows only). Anything else: cut
    // the value along its sequence axis, the last but one.
    if (N.op() == OpKind::Embedding) {
      Value *Ids = N.operand(1);
      if (Ids->type().rank() < 1 || Ids->type().dim(-1) != Layout.Seq)
        return makeError(formatv("--cp: the ids of {0} are {1}, not a "
                                 "sequence of {2}",
                                 N.describe(), Ids->type().str(), Layout.Seq));
      Node *&Cut = IdsSlice[Ids];
      if (!Cut) {
        auto Made = slice(N.getIterator(), Ids, Ids->type().rank() - 1, N);
        if (!Made)
          return Made.takeError();
        Cut = *Made;
        Cut->tags().Role = Slice;
      }
      N.setOperand(1, Cut->result());
      return Error::success();
    }
    const TensorType &Y = N.result()->type();
    if (Y.rank() < 2 || Y.dim(-2) != Layout.Seq)
      return makeError(formatv("--cp: {0} is {1}, not a sequence of {2} "
                               "along its last but one axis",
                               N.describe(), Y.str(), Layout.Seq));
    auto Made = slice(std::next(N.getIterator()), N.result(), Y.rank() - 2, N);
    if (!Made)
      return Made.takeError();
    (*Made)->tags().Role = Slice;
    G.replaceAllUsesWith(N.result(), (*Made)->result(), *Made);
    return Error::success();
  }

  Expected<Node *> slice(Graph::iterator At, Value *X, int64_t Dim,
                         const Node &For) {
    AttrList A;
    A.set("dim", Dim);
    A.set("parts", int64_t(C));
    A.set("zigzag", int64_t(Layout.Zigzag));
    auto Made = buildNode(G, At, OpKind::CpSlice, {X}, A, For.name());
    if (Made)
      (*Made)->tags().Layer = For.tags().Layer;
    return Made;
  }

  Graph &G;
  const PassContext &Ctx;
  int C;
  ContextLayout Layout;
  DenseMap<Value *, Node *> IdsSlice;
};

class ContextParallelPass : public Pass {
public:
  StringRef name() const override { return "context-parallel"; }

  Error run(Graph &G, PassContext &Ctx) override {
    if (Ctx.ContextParallel <= 1)
      return Error::success();
    return ContextParallelizer(G, Ctx).run();
  }
};

} // namespace

std::unique_ptr<Pass> createContextParallelPass() {
  return std::make_unique<ContextParallelPass>();
}

} // namespace sp
