//===- Sharding.cpp - Helpers of the parallel passes ----------------------===//
#include "passes/Sharding.h"
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

static Sharding resultSharding(const Node &N, unsigned Result) {
  auto In = [&](unsigned I) { return N.operand(I)->sharding(); };
  auto IsSplit = [](const Sharding &S, int Dim) {
    return S.K == Sharding::Split && S.Dim == Dim;
  };
  int64_t Parts = N.attrs().getInt("parts", 1); // any op: 1 when none
  switch (N.op()) {
  case OpKind::TpCopy:
  case OpKind::TpReduce:
  case OpKind::AllReduce:
  case OpKind::SpGather:
  case OpKind::AllGather:
    return Sharding::replicated();
  case OpKind::SpScatter:
  case OpKind::SpSplit:
  case OpKind::ReduceScatter:
    return Sharding::split(attrInt(N.op(), N.attrs(), "dim"), Parts);
  case OpKind::Embedding:
    return attrInt(N.op(), N.attrs(), "vocab_parallel") ? Sharding::partial()
                                                 : Sharding::replicated();
  case OpKind::Linear: {
    const Sharding &W = In(1);
    if (W.K != Sharding::Split)
      return In(0);
    bool TransW = attrInt(N.op(), N.attrs(), "trans_w");
    int OutDim = TransW ? 0 : 1;
    if (W.Dim == OutDim)
      return Sharding::split(N.result()->type().rank() - 1, W.Parts);
    return Sharding::partial();
  }
  case OpKind::SplitHeads:
  case OpKind::ToHeads:
    if (In(0).K == Sharding::Split)
      return Sharding::split(1, In(0).Parts);
    return In(0);
  case OpKind::MergeHeads:
    if (IsSplit(In(0), 1))
      return Sharding::split(2, In(0).Parts);
    return In(0);
  case OpKind::BatchMatMul:
    if (IsSplit(In(0), 1) || IsSplit(In(1), 1))
      return Sharding::split(1, IsSplit(In(0), 1) ? In(0).Parts : In(1).Parts);
    return In(0);
  case OpKind::CrossEntropy:
    return Sharding::replicated();
  default: {
    // Elementwise and row-wise ops keep their input's layout; an add of a
    // split and a replicated value (the position embedding) is split.
    Sharding S = In(0);
    if (S.K != Sharding::Split && N.numOperands() > 1 &&
        In(1).K == Sharding::Split &&
        (N.op() == OpKind::Add || N.op() == OpKind::Mul))
      S = In(1);
    S.SumGrad = false;
    S.Blocks = 1;
    S.Padded = 0;
    (void)Result;
    return S;
  }
  }
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
      N.result(I)->setSharding(resultSharding(N, I));
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
