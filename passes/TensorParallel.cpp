//===- TensorParallel.cpp - Megatron tensor parallelism -------------------===//
//
// Shards a detected Transformer over a tensor-parallel group of T ranks, as
// Megatron-LM does (Shoeybi et al. 2019). The graph becomes the program of
// one rank (SPMD): parameters become their shards, collectives appear.
//
//   attention  f -> qkv (column-parallel, heads split) -> core on a/T heads
//              -> proj (row-parallel) -> f-bar -> + bias
//   mlp        f -> fc1 (column-parallel) -> gelu -> fc2 (row-parallel)
//              -> f-bar -> + bias
//   parallel   x + attn + mlp (GPT-NeoX, GPT-J): one f per norm (one for
//   blocks     both blocks with one norm), and proj's and fc2's partial sums
//              added before one f-bar, then both biases, then x
//   embedding  vocabulary-parallel (rows [r V/T, (r+1) V/T)) -> f-bar
//   lm head    f -> vocabulary-parallel logits (and bias); the cross
//              entropy that autodiff adds reduces max, sum-exp and the
//              target logit over
//              the group, so no rank holds the full logits
//
// f is identity forward and all-reduce backward, f-bar the converse. The
// fused QKV weight is split per block (q, k, v), so rank r holds heads
// [r a/T, (r+1) a/T) of each. Row-parallel biases are added once, after the
// all-reduce. A vocabulary not divisible by T is padded to the next multiple
// with zero rows, and the padding logits are masked out of the loss
// (valid_vocab), as Megatron does.
//
// Which node is which comes from its role's properties (ir/Role.h):
// column, row, heads, vocabulary embedding or head; everything else is
// replicated.
//
// Parameters keep referencing the whole source tensor; their sharding
// (#split(dim, parts, blocks, padded)) tells the runtime which slice a rank
// reads, lazily.
//
//===----------------------------------------------------------------------===//
#include "analysis/ModelInfo.h"
#include "analysis/Sharding.h"
#include "ir/ShapeInference.h"
#include "passes/Passes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/FormatVariadic.h"
#include <optional>

using namespace llvm;

namespace sp {
namespace {

class TensorParallelizer {
public:
  TensorParallelizer(Graph &G, int T) : G(G), T(T) {}

  Error run() {
    for (const Node &N : G.nodes())
      if (N.op() == OpKind::TpCopy || N.op() == OpKind::SpGather)
        return err("the graph is already tensor-parallel");
    auto Info = summarizeModel(G);
    if (!Info)
      return Info.takeError();
    if (auto E = checkSizes(*Info))
      return E;
    SmallVector<Node *, 64> Work;
    for (Node &N : G.nodes())
      Work.push_back(&N);
    SmallVector<Node *, 8> ParallelResiduals;
    for (Node *N : Work) {
      if (N->tags().Role == Role::ParallelResidual)
        ParallelResiduals.push_back(N);
      const RoleProps &P = roleProps(N->tags().Role);
      switch (P.Parallel) {
      case RoleTp::Column:
        column(*N, columnBlocks(*N, P.Blocks), P.F);
        break;
      case RoleTp::Row:
        row(*N, P.F, P.Bias);
        break;
      case RoleTp::Heads:
        N->attrs().set("heads", attrInt(N->op(), N->attrs(), "heads") / T);
        break;
      case RoleTp::VocabEmbedding:
        embedding(*N, Info->Vocab);
        break;
      case RoleTp::VocabHead:
        head(*N, Info->Vocab);
        break;
      case RoleTp::Replicated:
        break;
      }
    }
    for (Node *N : ParallelResiduals)
      joinParallelReductions(*N);
    if (auto E = retypeGraph(G))
      return E;
    propagateSharding(G);
    return Error::success();
  }

private:
  Error err(const Twine &Msg) {
    return createStringError(inconvertibleErrorCode(), Msg);
  }

  Error checkSizes(const ModelInfo &M) {
    if (T > M.Heads || M.Heads % T)
      return err(formatv("--tp {0}: the {1} attention heads must be divisible "
                         "by t (and t at most the head count); t can be {2}",
                         T, M.Heads, divisorsOf(M.Heads)));
    if (M.KvHeads && (T > M.KvHeads || M.KvHeads % T))
      return err(formatv("--tp {0}: the {1} key/value heads must be divisible "
                         "by t (each rank keeps whole kv heads); t can be {2}",
                         T, M.KvHeads, divisorsOf(M.KvHeads)));
    // Every column-parallel linear's output (each block of a fused qkv).
    for (const Node &N : G.nodes()) {
      const RoleProps &P = roleProps(N.tags().Role);
      if (P.Parallel != RoleTp::Column)
        continue;
      int64_t Width = N.result()->type().dim(-1) / columnBlocks(N, P.Blocks);
      if (Width % T)
        return err(formatv("--tp {0}: the output width {1} of {2} (layer "
                           "{3}) is not divisible by t; t can be {4}",
                           T, Width, roleName(N.tags().Role), N.tags().Layer,
                           divisorsOf(Width)));
    }
    return Error::success();
  }

  /// The blocks a column-parallel linear's output is split in: its role's
  /// (3 for a fused qkv: q | k | v), or 1 for a qkv read by a per-head
  /// split_heads (GPT-NeoX's [a, 3, d] columns), whose rank r holds heads
  /// [r a / T, (r + 1) a / T) as one contiguous block of rows.
  static int columnBlocks(const Node &N, int Blocks) {
    if (N.tags().Role != Role::Qkv)
      return Blocks;
    for (const Use &U : N.result()->users())
      if (U.User->op() == OpKind::SplitHeads &&
          attrInt(U.User->op(), U.User->attrs(), "per_head"))
        return 1;
    return Blocks;
  }

  /// Splits parameter P along Dim into T parts (of each of Blocks blocks),
  /// padding the axis to a multiple of T when Pad is set.
  void splitParam(Value *P, int Dim, int Blocks, bool Pad = false) {
    if (P->sharding().K == Sharding::Split)
      return; // a tied weight already split by its other use
    TensorType Local = P->type();
    int64_t Size = Local.Shape[Dim];
    int64_t Padded = Pad && Size % T ? alignTo(Size, T) : 0;
    Local.Shape[Dim] = (Padded ? Padded : Size) / T;
    P->setType(Local);
    P->setSharding(Sharding::split(Dim, T, Blocks, Padded));
  }

  Node *insertBefore(Node &N, unsigned Operand, OpKind Op, Role R) {
    Node *C = cantFail(buildNode(G, N.getIterator(), Op, {N.operand(Operand)},
                                 {}, N.name()));
    C->tags().Layer = N.tags().Layer;
    C->tags().Role = R;
    N.setOperand(Operand, C->result());
    return C;
  }

  Node *insertAfter(Node &N, OpKind Op, Role R) {
    Node *C = cantFail(buildNode(G, std::next(N.getIterator()), Op,
                                 {N.result()}, {}, N.name()));
    C->tags().Layer = N.tags().Layer;
    C->tags().Role = R;
    G.replaceAllUsesWith(N.result(), C->result(), C);
    return C;
  }

  void column(Node &N, int Blocks, Role FRole) {
    bool TransW = attrInt(N.op(), N.attrs(), "trans_w");
    splitParam(N.operand(1), TransW ? 0 : 1, Blocks);
    if (N.numOperands() > 2)
      splitParam(N.operand(2), 0, Blocks);
    // Linears reading the same input (Llama's q, k and v; gate and up)
    // share one f, so the backward all-reduces their summed gradient once.
    if (Node *F = SharedF.lookup(N.operand(0))) {
      N.setOperand(0, F->result());
      return;
    }
    Value *In = N.operand(0);
    SharedF[In] = insertBefore(N, 0, OpKind::TpCopy, FRole);
  }

  void row(Node &N, Role FBarRole, Role BiasRole) {
    bool TransW = attrInt(N.op(), N.attrs(), "trans_w");
    splitParam(N.operand(1), TransW ? 1 : 0, 1);
    // Types are placeholders until retypeGraph: the input is not yet sharded.
    Node *L = G.create(N.getIterator(), OpKind::Linear,
                       {N.operand(0), N.operand(1)}, {N.result()->type()},
                       N.name());
    L->attrs() = N.attrs();
    L->tags() = N.tags();
    Node *R = insertAfter(*L, OpKind::TpReduce, FBarRole);
    Value *Out = R->result();
    if (N.numOperands() > 2) {
      Node *A = cantFail(buildNode(G, std::next(R->getIterator()), OpKind::Add,
                                   {Out, N.operand(2)}, {}, N.name()));
      A->tags().Layer = N.tags().Layer;
      A->tags().Role = BiasRole;
      Out = A->result();
    }
    G.replaceAllUsesWith(N.result(), Out);
    G.erase(&N);
  }

  /// A parallel block's branch after row(): partial -> f-bar -> [+ bias].
  struct ReducedBranch {
    Value *Partial = nullptr, *Bias = nullptr;
    Node *Reduce = nullptr, *BiasAdd = nullptr;
  };
  static std::optional<ReducedBranch> reducedBranch(Value *V, Role FBar,
                                                    Role BiasRole) {
    ReducedBranch B;
    Node *P = V->producer();
    if (P && P->op() == OpKind::Add && P->tags().Role == BiasRole) {
      B.BiasAdd = P;
      B.Bias = P->operand(1);
      P = P->operand(0)->producer();
    }
    if (!P || P->op() != OpKind::TpReduce || P->tags().Role != FBar)
      return std::nullopt;
    B.Reduce = P;
    B.Partial = P->operand(0);
    return B;
  }

  /// x + attn + mlp of a parallel block (R2, parallel_residual, and its
  /// residual1 operand) with each branch reduced on its own becomes
  /// x + (f-bar(proj partial + fc2 partial) + proj bias + fc2 bias): one
  /// all-reduce (one reduce-scatter under sequence parallelism) instead of
  /// two, as Megatron does for parallel blocks. A dropout on a branch
  /// applies to its bias too, so such a block keeps its two reductions
  /// (one of ratio 0 is dropped: it is the identity).
  void joinParallelReductions(Node &R2) {
    Node *R1 = nullptr;
    for (Value *Op : R2.operands())
      if (Op->producer() && Op->producer()->tags().Role == Role::Residual1)
        R1 = Op->producer();
    if (!R1 || R1->result()->users().size() != 1)
      return;
    // A dropout of ratio 0 (an export with p = 0) is the identity.
    for (Node *Add : {R1, &R2})
      for (Value *Op : Add->operands()) {
        Node *D = Op->producer();
        if (D && D->op() == OpKind::Dropout && Op->users().size() == 1 &&
            (D->numResults() == 1 || D->result(1)->users().empty()) &&
            attrFloat(D->op(), D->attrs(), "ratio") == 0.0) {
          G.replaceAllUsesWith(Op, D->operand(0));
          G.erase(D);
        }
      }
    SmallVector<Value *, 3> Leaves{R1->operand(0), R1->operand(1)};
    for (Value *Op : R2.operands())
      if (Op != R1->result())
        Leaves.push_back(Op);
    std::optional<ReducedBranch> Attn, Mlp;
    Value *X = nullptr;
    for (Value *V : Leaves) {
      if (V->users().size() != 1)
        X = V;
      else if (auto B = reducedBranch(V, Role::AttnFBar, Role::ProjBias))
        Attn = B;
      else if (auto B = reducedBranch(V, Role::MlpFBar, Role::Fc2Bias))
        Mlp = B;
      else
        X = V;
    }
    if (!Attn || !Mlp || !X)
      return;
    int L = R2.tags().Layer;
    auto Build = [&](OpKind Op, ArrayRef<Value *> In, Role R) {
      Node *N = cantFail(buildNode(G, R2.getIterator(), Op, In, {}, R2.name()));
      N->tags().Layer = L;
      N->tags().Role = R;
      return N->result();
    };
    Value *Out = Build(
        OpKind::TpReduce,
        {Build(OpKind::Add, {Attn->Partial, Mlp->Partial}, Role::Residual1)},
        Role::MlpFBar);
    for (auto [Bias, R] : {std::pair{Attn->Bias, Role::ProjBias},
                           std::pair{Mlp->Bias, Role::Fc2Bias}})
      if (Bias)
        Out = Build(OpKind::Add, {Out, Bias}, R);
    G.replaceAllUsesWith(R2.result(),
                         Build(OpKind::Add, {X, Out}, Role::ParallelResidual));
    for (Node *N :
         {&R2, R1, Attn->BiasAdd, Mlp->BiasAdd, Attn->Reduce, Mlp->Reduce})
      if (N)
        G.erase(N);
  }

  void embedding(Node &N, int64_t Vocab) {
    splitParam(N.operand(0), 0, 1, /*Pad=*/true);
    N.attrs().set("vocab_parallel", int64_t(1));
    insertAfter(N, OpKind::TpReduce, Role::EmbedFBar);
  }

  void head(Node &N, int64_t Vocab) {
    bool TransW = attrInt(N.op(), N.attrs(), "trans_w");
    splitParam(N.operand(1), TransW ? 0 : 1, 1, /*Pad=*/true);
    if (N.numOperands() > 2) // BERT's decoder bias: one per vocabulary row
      splitParam(N.operand(2), 0, 1, /*Pad=*/true);
    N.attrs().set("valid_vocab", Vocab);
    insertBefore(N, 0, OpKind::TpCopy, Role::HeadF);
  }

  Graph &G;
  int T;
  llvm::DenseMap<Value *, Node *> SharedF;
};

class TensorParallelPass : public Pass {
public:
  StringRef name() const override { return "tensor-parallel"; }

  Error run(Graph &G, PassContext &Ctx) override {
    if (Ctx.TensorParallel == 1)
      return Error::success();
    return TensorParallelizer(G, Ctx.TensorParallel).run();
  }
};

} // namespace

std::unique_ptr<Pass> createTensorParallelPass() {
  return std::make_unique<TensorParallelPass>();
}

} // namespace sp
