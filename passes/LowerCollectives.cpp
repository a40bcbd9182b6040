//===- LowerCollectives.cpp - Abstract f/g pairs to concrete calls --------===//
//
// After autodiff, the abstract collectives of the forward have done their
// job (autodiff emitted their conjugates): f (tp_copy) is the identity and
// disappears; f-bar becomes all_reduce; g becomes all_gather; g-bar becomes
// reduce_scatter. sp_split stays: it is already concrete (each rank keeps its
// chunk). The runtime then only knows all_reduce, all_gather, reduce_scatter
// and sp_split.
//
//===----------------------------------------------------------------------===//
#include "ir/ShapeInference.h"
#include "passes/Passes.h"

using namespace llvm;

namespace sp {
namespace {

class LowerCollectivesPass : public Pass {
public:
  StringRef name() const override { return "lower-collectives"; }

  Error run(Graph &G, PassContext &Ctx) override {
    for (auto It = G.nodes().begin(); It != G.nodes().end();) {
      Node &N = *It++;
      std::optional<OpKind> To;
      switch (N.op()) {
      case OpKind::TpCopy:
        replace(G, N, N.operand(0));
        continue;
      case OpKind::TpReduce:
        To = OpKind::AllReduce;
        break;
      case OpKind::SpGather:
        To = OpKind::AllGather;
        break;
      case OpKind::SpScatter:
        To = OpKind::ReduceScatter;
        break;
      default:
        continue;
      }
      AttrList A = N.attrs();
      A.erase("regather");
      Node *C = cantFail(
          buildNode(G, N.getIterator(), *To, {N.operand(0)}, A, N.name()));
      C->tags() = N.tags();
      C->result()->setSharding(N.result()->sharding());
      replace(G, N, C->result());
    }
    return Error::success();
  }

private:
  static void replace(Graph &G, Node &N, Value *New) {
    G.replaceAllUsesWith(N.result(), New);
    G.erase(&N);
  }
};

} // namespace

std::unique_ptr<Pass> createLowerCollectivesPass() {
  return std::make_unique<LowerCollectivesPass>();
}

} // namespace sp
