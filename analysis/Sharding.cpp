//===- Sharding.cpp - Helpers of the parallel passes ----------------------===//
#include "analysis/Sharding.h"
#include "ir/OpDef.h"
#include "ir/ShapeInference.h"

using namespace llvm;

namespace sp {

Error retypeGraph(Graph &G) {
  for (Node &N : G.nodes()) {
    auto Types = inferTypes(N.op(), N.operands(), N.attrs());
    if (!Types)
      return createStringError(inconvertibleErrorCode(), "%s: %s",
                               N.describe().c_str(),
                               toString(Types.takeError()).c_str());
    for (unsigned I = 0; I < N.numResults(); ++I)
      N.result(I)->setType((*Types)[I]);
  }
  return Error::success();
}

void propagateSharding(Graph &G) {
  for (const auto &V : G.inputs())
    if (V->sharding().K == Sharding::None)
      V->setSharding(Sharding::replicated());
  for (const auto &V : G.consts())
    if (V->sharding().K == Sharding::None)
      V->setSharding(Sharding::replicated());
  for (const auto &V : G.params())
    if (V->sharding().K == Sharding::None)
      V->setSharding(Sharding::replicated());
  for (Node &N : G.nodes())
    for (unsigned I = 0; I < N.numResults(); ++I)
      N.result(I)->setSharding(resultLayout(N));
}

std::string divisorsOf(int64_t N) {
  SmallVector<int64_t, 16> D;
  for (int64_t I = 1; I <= N; ++I)
    if (N % I == 0)
      D.push_back(I);
  std::string S;
  for (size_t I = 0; I < D.size(); ++I) {
    if (I)
      S += I + 1 == D.size() ? " and " : ", ";
    S += std::to_string(D[I]);
  }
  return S;
}

} // namespace sp
