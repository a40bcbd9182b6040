//===- CollectiveMatmul.cpp - The forward all-gather cut into a ring ------===//
//
// With --tp-comm-overlap, each all-gather of sequence parallelism's g read
// only by linears (the column-parallel QKV and fc1 of every layer, or q, k
// and v and gate and up as HF writes them, and the vocabulary-parallel head)
// becomes a ring of parts - 1 shifts and parts linears on one chunk each,
// so that a backend with a communication stream sends the next chunk while
// it multiplies this one: Megatron-Core's forward tensor-parallel overlap
// (Transformer Engine's all-gather + GEMM split into chunks; Wang et al.,
// "Overlap Communication with Dependent Computation via Decomposition",
// ASPLOS 2023). On rank r, with t = parts:
//
//   X = all_gather(x) {dim d}           x_0 = x
//   Y = linear(X, W, b)          =>     x_k = ring_shift(x_{k-1})   0 < k < t
//                                       y_k = linear(x_k, W, b)     k < t
//                                       Y   = ring_concat(y_0 .. y_{t-1})
//
// (with several linears, each its own chunk products and ring_concat).
//
// x_k is rank (r - k) mod t's chunk, and ring_concat writes y_k at that
// chunk of Y along d, so Y is the same tensor. Each element of Y is the
// same dot product of one row of X with one column of W; only how the
// rows are cut into GEMM calls differs (the BLAS may block the k sum
// differently for a shorter matrix), so a run matches the uncut plan within
// float32 rounding, not always to the bit.
//
// The backward is untouched: under sequence parallelism it gathers the
// saved shard again for the weight gradient. The pass runs last, after
// recomputation and the pipeline split, so full recomputation's cloned
// forward is cut too, and each new node keeps the tags (layer, role,
// phase, stage) of the one it replaces. lower/Overlap.h then places each
// shift beside the linear of the chunk before it.
//
//===----------------------------------------------------------------------===//
#include "ir/ShapeInference.h"
#include "passes/Passes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {
namespace {

class CollectiveMatmulPass : public Pass {
public:
  StringRef name() const override { return "collective-matmul"; }

  Error run(Graph &G, PassContext &Ctx) override {
    if (!Ctx.TpCommOverlap)
      return Error::success();
    if (Ctx.TensorParallel < 2 || !Ctx.SequenceParallel)
      return createStringError(
          inconvertibleErrorCode(),
          "--tp-comm-overlap cuts sequence parallelism's forward all-gathers "
          "into a ring; it needs --tp T > 1 and --sp");
    int Cut = 0, Left = 0;
    DenseMap<const Node *, int> Position;
    for (const Node &N : G.nodes())
      Position[&N] = int(Position.size());
    for (auto It = G.nodes().begin(); It != G.nodes().end();) {
      Node &AG = *It++;
      if (AG.op() != OpKind::AllGather ||
          collectiveGroup(AG.op(), AG.attrs()) != "tp")
        continue;
      SmallVector<Node *, 3> Linears = linearReaders(G, AG, Position);
      if (Linears.empty()) {
        ++Left;
        continue;
      }
      // The linears are erased below: step past them.
      while (It != G.nodes().end() && is_contained(Linears, &*It))
        ++It;
      if (auto E = cut(G, AG, Linears))
        return E;
      ++Cut;
    }
    Ctx.remarks() << formatv("collective-matmul: {0} all-gathers cut into "
                             "rings of {1} chunks, {2} left whole (their "
                             "result is read by something other than "
                             "linears of its phase)\n",
                             Cut, Ctx.TensorParallel, Left);
    return Error::success();
  }

private:
  /// The linears reading AG's result as their input (one for GPT's fused
  /// QKV and fc1, three for q, k and v as HF writes them, two for gate and
  /// up), in program order, if nothing else reads it; else none.
  static SmallVector<Node *, 3>
  linearReaders(const Graph &G, const Node &AG,
                const DenseMap<const Node *, int> &Position) {
    const Value *X = AG.result();
    SmallVector<Node *, 3> Out;
    if (G.isOutput(X))
      return Out;
    for (const Use &U : X->users()) {
      Node *L = U.User;
      if (L->op() != OpKind::Linear || U.OperandNo != 0 ||
          L->tags().Ph != AG.tags().Ph || is_contained(Out, L))
        return {};
      Out.push_back(L);
    }
    // users() is in the order the uses were made; the chunk linears go
    // before the first linear in program order (new nodes are never read).
    llvm::sort(Out, [&](Node *A, Node *B) {
      return Position.lookup(A) < Position.lookup(B);
    });
    return Out;
  }

  static Error cut(Graph &G, Node &AG, ArrayRef<Node *> Linears) {
    int64_t Parts = attrInt(AG.op(), AG.attrs(), "parts");
    int64_t Dim = attrInt(AG.op(), AG.attrs(), "dim");
    auto At = Linears.front()->getIterator();
    AttrList ShiftAttrs;
    ShiftAttrs.set("parts", Parts);
    // Chunks[l][k]: linear l's product of chunk k.
    std::vector<SmallVector<Value *, 8>> Chunks(Linears.size());
    Value *X = AG.operand(0);
    for (int64_t K = 0; K < Parts; ++K) {
      if (K) {
        auto S = buildNode(G, At, OpKind::RingShift, {X}, ShiftAttrs,
                           formatv("{0}.shift{1}", AG.name(), K).str());
        if (!S)
          return S.takeError();
        (*S)->tags() = AG.tags();
        (*S)->result()->setSharding(X->sharding());
        X = (*S)->result();
      }
      for (size_t L = 0; L < Linears.size(); ++L) {
        const Node &Lin = *Linears[L];
        SmallVector<Value *, 3> Operands(Lin.operands().begin(),
                                         Lin.operands().end());
        Operands[0] = X;
        auto Y = buildNode(G, At, OpKind::Linear, Operands, Lin.attrs(),
                           formatv("{0}.chunk{1}", Lin.name(), K).str());
        if (!Y)
          return Y.takeError();
        (*Y)->tags() = Lin.tags();
        Chunks[L].push_back((*Y)->result());
      }
    }
    AttrList ConcatAttrs;
    ConcatAttrs.set("dim", Dim);
    ConcatAttrs.set("parts", Parts);
    for (size_t L = 0; L < Linears.size(); ++L) {
      Node &Lin = *Linears[L];
      auto Whole = buildNode(G, At, OpKind::RingConcat, Chunks[L],
                             ConcatAttrs, Lin.name() + ".concat");
      if (!Whole)
        return Whole.takeError();
      (*Whole)->tags() = Lin.tags();
      (*Whole)->result()->setSharding(Lin.result()->sharding());
      if ((*Whole)->result()->type() != Lin.result()->type())
        return createStringError(inconvertibleErrorCode(),
                                 "collective-matmul: the ring of %s does not "
                                 "give its linear's type back",
                                 Lin.describe().c_str());
      G.replaceAllUsesWith(Lin.result(), (*Whole)->result());
    }
    for (Node *Lin : Linears)
      G.erase(Lin);
    G.erase(&AG);
    return Error::success();
  }
};

} // namespace

std::unique_ptr<Pass> createCollectiveMatmulPass() {
  return std::make_unique<CollectiveMatmulPass>();
}

} // namespace sp
