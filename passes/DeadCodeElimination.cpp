//===- DeadCodeElimination.cpp - Remove what no output needs --------------===//
//
// Erases nodes none of whose results is used or is a graph output (except
// ops with side effects, the optimizer update), then drops
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
    unsigned Erased = G.eraseDeadNodes();
    unsigned Leaves = G.removeUnusedConstants();
    Ctx.remarks() << "dce: erased " << Erased << " nodes and " << Leaves
                 << " constants\n";
    return Error::success();
  }
};

} // namespace

std::unique_ptr<Pass> createDeadCodeEliminationPass() {
  return std::make_unique<DeadCodeEliminationPass>();
}

} // namespace sp
