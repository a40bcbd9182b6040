//===- ConstantFold.cpp - Evaluate nodes with constant operands -----------===//
//
// Replaces every node whose operands are all constants (and whose result is
// small, see ir/Fold.h) by inline constants. One forward sweep suffices
// because the node list is topologically ordered: a node's operands are
// folded before the node is visited. The dead producers are left for dce.
//
//===----------------------------------------------------------------------===//
#include "ir/Fold.h"
#include "passes/Passes.h"

using namespace llvm;

namespace sp {
namespace {

class ConstantFoldPass : public Pass {
public:
  StringRef name() const override { return "constant-fold"; }

  Error run(Graph &G, PassContext &Ctx) override {
    unsigned Folded = 0;
    for (Node &N : G.nodes()) {
      if (!isFoldable(N.op()))
        continue;
      SmallVector<TensorType, 2> Types;
      for (Value *R : N.results())
        Types.push_back(R->type());
      auto Result = foldOp(N.op(), N.operands(), N.attrs(), Types);
      if (!Result)
        return createStringError(inconvertibleErrorCode(), "%s: %s",
                                 N.describe().c_str(),
                                 toString(Result.takeError()).c_str());
      if (!*Result)
        continue;
      for (unsigned I = 0; I < N.numResults(); ++I) {
        std::string Hint = N.name().empty() ? "fold" : N.name();
        if (N.numResults() > 1)
          Hint += "_" + std::to_string(I);
        Value *C = G.addConst(G.uniqueLeafName(Hint), Types[I],
                              std::move((**Result)[I]));
        G.replaceAllUsesWith(N.result(I), C);
      }
      ++Folded;
    }
    Ctx.remarks() << "constant-fold: folded " << Folded << " nodes\n";
    return Error::success();
  }
};

} // namespace

std::unique_ptr<Pass> createConstantFoldPass() {
  return std::make_unique<ConstantFoldPass>();
}

} // namespace sp
