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
//   attention           {cp = C, cp_zigzag, cp_comm, cp_a2a}: q, k, v are
//                       the rank's positions; the keys and values of the
//                       others come over the cp group (a ring of blocks,
//                       an all-to-all, or both); the padding mask stays
//                       whole (every key's)
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
// positions back in global order, so it shares the layout. The hierarchical
// --cp-comm a2a+ring --cp-a2a K (cp_a2a = K) trades heads for positions
// inside groups of K consecutive ranks and runs the ring across the C / K
// groups: a group's positions are a zigzag layout's over C / K ranks, so
// its ring is balanced too. The all-to-all's group (C, or K) must divide a
// tensor rank's heads and key/value heads, and K must divide C with
// 1 < K < C; each refusal names the sizes.
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
    if (auto E = checkComm())
      return E;
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
    Heads = Info->Heads / T;
    KvHeads = (Info->KvHeads ? Info->KvHeads : Info->Heads) / T;
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
  /// ring, a2a, or a2a+ring with all-to-all groups of K consecutive ranks,
  /// 1 < K < C (K = C is a2a, K = 1 the ring: one name for each plan).
  Error checkComm() const {
    const std::string &Comm = Ctx.ContextComm;
    if (Comm == "ring" || Comm == "a2a")
      return Error::success();
    if (Comm != "a2a+ring")
      return makeError(formatv("--cp-comm {0}: expected ring, a2a or "
                               "a2a+ring",
                               Comm));
    const int K = Ctx.ContextAllToAll;
    if (K == C || K == 1)
      return makeError(formatv(
          "--cp {0} --cp-comm a2a+ring --cp-a2a {1}: all-to-all groups of {1} "
          "{2}; use --cp-comm {3}, or a --cp-a2a strictly between 1 and {0}",
          C, K, K == 1 ? "leave only the ring" : "are the whole cp group",
          K == 1 ? "ring" : "a2a"));
    if (K < 1 || C % K) {
      const std::string Can = groupSizes(0);
      return makeError(formatv(
          "--cp {0} --cp-comm a2a+ring --cp-a2a {1}: the all-to-all groups "
          "must divide the cp group into equal groups of consecutive ranks; "
          "{2}",
          C, K,
          Can.empty() ? formatv("cp {0} has no such groups: use --cp-comm "
                                "ring or a2a",
                                C)
                            .str()
                      : "--cp-a2a can be " + Can));
    }
    return Error::success();
  }

  /// All-to-all: each rank of its group (C ranks, or K) takes a 1/K share
  /// of a tensor rank's heads and key/value heads.
  Error checkHeads(const Node &N) const {
    if (Ctx.ContextComm == "ring")
      return Error::success();
    const bool Plain = Ctx.ContextComm == "a2a";
    const int K = Plain ? C : Ctx.ContextAllToAll;
    if (Heads % K == 0 && KvHeads % K == 0)
      return Error::success();
    const int64_t Both = std::gcd(Heads, KvHeads);
    const std::string Can = Plain ? divisorsOf(Both) : groupSizes(Both);
    return makeError(
        N.describe() + ": " +
        (Plain ? formatv("--cp {0} --cp-comm a2a: each tensor-parallel "
                         "rank's {1} heads and {2} key/value heads must "
                         "split over cp (each rank attends a 1/cp share of "
                         "them); cp can be {3}, or use --cp-comm ring",
                         C, Heads, KvHeads, Can)
                     .str()
               : formatv("--cp-comm a2a+ring --cp-a2a {0}: each "
                         "tensor-parallel rank's {1} heads and {2} key/value "
                         "heads must split over the all-to-all group (each "
                         "rank attends a 1/{0} share of them); {3}",
                         K, Heads, KvHeads,
                         Can.empty() ? "no --cp-a2a can: use --cp-comm ring"
                                     : "--cp-a2a can be " + Can)
                     .str()));
  }

  /// The all-to-all group sizes a2a+ring can take that divide Of (0: any): K
  /// with 1 < K < C dividing C ("2, 4"; empty: none).
  std::string groupSizes(int64_t Of) const {
    std::string Can;
    for (int K = 2; K < C; ++K)
      if (C % K == 0 && Of % K == 0)
        Can += (Can.empty() ? "" : ", ") + std::to_string(K);
    return Can;
  }

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
      if (auto E = checkHeads(N))
        return E;
      N.attrs().set("cp", int64_t(C));
      N.attrs().set("cp_zigzag", int64_t(Layout.Zigzag));
      N.attrs().set("cp_comm", Ctx.ContextComm);
      if (Ctx.ContextComm == "a2a+ring")
        N.attrs().set("cp_a2a", int64_t(Ctx.ContextAllToAll));
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
  /// A tensor-parallel rank's heads and key/value heads.
  int64_t Heads = 0, KvHeads = 0;
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
