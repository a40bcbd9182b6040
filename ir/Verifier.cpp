//===- Verifier.cpp - IR invariants ---------------------------------------===//
#include "ir/Verifier.h"
#include "ir/ShapeInference.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

static Error verifyError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), "verifier: " + Msg);
}

/// A parameter's data is the whole source tensor; a split parameter's value
/// is one rank's shard of it (padded axes may be shorter in the source).
static bool dataMatches(const Value &V) {
  const TensorType &D = V.data()->type(), &T = V.type();
  const Sharding &S = V.sharding();
  if (S.K != Sharding::Split)
    return D == T;
  if (D.Dtype != T.Dtype || D.rank() != T.rank() || S.Dim >= int(T.rank()))
    return false;
  for (unsigned I = 0; I < T.rank(); ++I) {
    int64_t Global = T.Shape[I] * (int(I) == S.Dim ? S.Parts : 1);
    if (int(I) == S.Dim && S.Padded ? D.Shape[I] > Global
                                    : D.Shape[I] != Global)
      return false;
  }
  return true;
}

Error verifyGraph(const Graph &G) {
  DenseSet<const Value *> Defined;
  StringSet<> Names;
  auto CheckLeaf = [&](const Value &V, StringRef Kind) -> Error {
    if (V.name().empty())
      return verifyError(Kind + " without a name");
    if (!Names.insert(V.name()).second)
      return verifyError("duplicate name '" + V.name() + "'");
    if (Kind == "param" || Kind == "const") {
      if (!V.data())
        return verifyError(Kind + " '" + V.name() + "' has no data");
      if (!dataMatches(V))
        return verifyError(
            formatv("{0} '{1}' has type {2}{3} but its data is {4}", Kind,
                    V.name(), V.type().str(),
                    V.sharding().K == Sharding::Split
                        ? " " + V.sharding().str() + " (a shard of it)"
                        : std::string(),
                    V.data()->type().str()));
    }
    Defined.insert(&V);
    return Error::success();
  };
  for (auto [Leaves, Kind] :
       {std::pair{G.inputs(), "input"}, std::pair{G.params(), "param"},
        std::pair{G.consts(), "const"}, std::pair{G.states(), "state"}})
    for (const auto &V : Leaves)
      if (auto E = CheckLeaf(*V, Kind))
        return E;

  for (const Node &N : G.nodes()) {
    if (N.parent() != &G)
      return verifyError(N.describe() + " belongs to another graph");
    for (unsigned I = 0; I < N.numOperands(); ++I) {
      const Value *V = N.operand(I);
      if (!V)
        return verifyError(formatv("{0}: operand {1} is null", N.describe(), I));
      if (!Defined.count(V))
        return verifyError(formatv("{0}: operand {1} is used before it is "
                                   "defined",
                                   N.describe(), I));
      if (!is_contained(V->users(), Use{const_cast<Node *>(&N), I}))
        return verifyError(formatv("{0}: operand {1} is missing from its "
                                   "value's use list",
                                   N.describe(), I));
    }
    for (unsigned I = 0; I < N.numResults(); ++I) {
      const Value *R = N.result(I);
      if (R->producer() != &N || R->resultIndex() != I)
        return verifyError(formatv("{0}: result {1} has a wrong producer",
                                   N.describe(), I));
      for (const Use &U : R->users())
        if (U.OperandNo >= U.User->numOperands() ||
            U.User->operand(U.OperandNo) != R)
          return verifyError(formatv("{0}: result {1} has a stale use",
                                     N.describe(), I));
      Defined.insert(R);
    }
    if (std::string Why = checkAttrs(N.op(), N.attrs()); !Why.empty())
      return verifyError(N.describe() + ": " + Why);
    auto Types =
        inferTypes(N.op(), N.operands(), N.attrs());
    if (!Types)
      return verifyError(N.describe() + ": " + toString(Types.takeError()));
    // Optional trailing results (e.g. a Dropout mask) may be absent.
    if (Types->size() < N.numResults())
      return verifyError(formatv("{0}: has {1} results, expected {2}",
                                 N.describe(), N.numResults(), Types->size()));
    for (unsigned I = 0; I < N.numResults(); ++I)
      if ((*Types)[I] != N.result(I)->type())
        return verifyError(formatv("{0}: result {1} has type {2}, expected {3}",
                                   N.describe(), I,
                                   N.result(I)->type().str(),
                                   (*Types)[I].str()));
  }
  StringSet<> OutNames;
  for (const Graph::Output &O : G.outputs()) {
    if (!O.V || !Defined.count(O.V))
      return verifyError("output '" + O.Name + "' is not defined");
    if (!OutNames.insert(O.Name).second)
      return verifyError("duplicate output '" + O.Name + "'");
  }
  return Error::success();
}

} // namespace sp
