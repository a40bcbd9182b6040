//===- DeadCodeElimination.cpp - Remove what no output needs --------------===//
//
// Walks the node list backwards, erasing nodes none of whose results is used
// or is a graph output (ops have no side effects in this IR), then drops
// parameters and constants left without users. Graph inputs are kept: they are
// the model's interface.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

using namespace llvm;

namespace sp {
namespace {

class DeadCodeEliminationPass : public Pass {
public:
  StringRef name() const override { return "dce"; }

  Error run(Graph &G, PassContext &Ctx) override {
    unsigned Erased = 0;
    auto &Nodes = G.nodes();
    for (auto It = Nodes.rbegin(); It != Nodes.rend();) {
      Node &N = *It++;
      bool Live = any_of(N.results(), [&](Value *R) {
        return R->hasUsers() || G.isOutput(R);
      });
      if (!Live) {
        G.erase(&N);
        ++Erased;
      }
    }
    unsigned Leaves = G.removeUnusedConstants();
    *Ctx.Remarks << "dce: erased " << Erased << " nodes and " << Leaves
                 << " constants\n";
    return Error::success();
  }
};

} // namespace

std::unique_ptr<Pass> createDeadCodeEliminationPass() {
  return std::make_unique<DeadCodeEliminationPass>();
}

} // namespace sp
