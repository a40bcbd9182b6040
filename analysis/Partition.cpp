//===- Partition.cpp - Contiguous pipeline stages by cost -----------------===//
//
// The dynamic program of Partition.h. Stage costs are differences of prefix
// sums; the table keeps, for every stage s and end j, the best largest cost
// and the start of stage s that achieves it, and the split is read back from
// the last stage. Quadratic in the layers per stage count, which for the
// paper's largest model (128 layers, 64 stages) is about a million steps.
//
//===----------------------------------------------------------------------===//
#include "analysis/Partition.h"
#include "support/Diagnostics.h"
#include "support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace llvm;

namespace sp {

namespace {

std::string divisorsOf(int L) {
  std::string S;
  for (int D = 1; D <= L; ++D)
    if (L % D == 0)
      S += (S.empty() ? "" : ", ") + std::to_string(D);
  return S;
}

} // namespace

Expected<SmallVector<int>> partitionLayers(ArrayRef<double> LayerCost,
                                           double FirstExtra, double LastExtra,
                                           int Stages, bool Uniform) {
  int L = LayerCost.size();
  if (Stages < 1)
    return makeError(
        formatv("a pipeline needs at least 1 stage, got {0}", Stages));
  if (Stages > L)
    return makeError(formatv(
        "more stages than layers: {0} stages (P x M) for {1} layers; use at "
        "most {1} stages",
        Stages, L));
  for (int I = 0; I < L; ++I)
    if (!std::isfinite(LayerCost[I]) || LayerCost[I] < 0)
      return makeError(formatv(
          "layer {0} has cost {1}; costs must be finite and non-negative", I,
          generalNumber(LayerCost[I])));
  if (!std::isfinite(FirstExtra) || FirstExtra < 0 ||
      !std::isfinite(LastExtra) || LastExtra < 0)
    return makeError(
        formatv("embedding cost {0} and head cost {1} must be finite and "
                "non-negative",
                generalNumber(FirstExtra), generalNumber(LastExtra)));

  SmallVector<int> Starts;
  if (Uniform) {
    if (L % Stages != 0)
      return makeError(formatv(
          "uniform partition: {0} layers do not split evenly into {1} stages "
          "(P x M); use a stage count that divides {0} ({2}) or the "
          "cost-balanced partition",
          L, Stages, divisorsOf(L)));
    for (int S = 0; S < Stages; ++S)
      Starts.push_back(S * (L / Stages));
    return Starts;
  }

  std::vector<double> Prefix(L + 1, 0.0);
  for (int I = 0; I < L; ++I)
    Prefix[I + 1] = Prefix[I] + LayerCost[I];
  auto Cost = [&](int S, int I, int J) {
    double C = Prefix[J] - Prefix[I];
    if (S == 0)
      C += FirstExtra;
    if (S == Stages - 1)
      C += LastExtra;
    return C;
  };
  const double Inf = std::numeric_limits<double>::infinity();
  // Best[S][J]: stages 0..S over layers [0, J); From[S][J]: where stage S
  // starts in that split.
  std::vector<std::vector<double>> Best(Stages,
                                        std::vector<double>(L + 1, Inf));
  std::vector<std::vector<int>> From(Stages, std::vector<int>(L + 1, -1));
  for (int J = 1; J <= L - (Stages - 1); ++J) {
    Best[0][J] = Cost(0, 0, J);
    From[0][J] = 0;
  }
  for (int S = 1; S < Stages; ++S)
    // Stage S ends at J: S + 1 <= J, and the later stages need a layer
    // each.
    for (int J = S + 1; J <= L - (Stages - 1 - S); ++J)
      for (int I = S; I < J; ++I) {
        double C = std::max(Best[S - 1][I], Cost(S, I, J));
        if (C <= Best[S][J]) {
          Best[S][J] = C;
          From[S][J] = I;
        }
      }
  Starts.assign(Stages, 0);
  int J = L;
  for (int S = Stages - 1; S >= 0; --S) {
    assert(From[S][J] >= 0 && "every stage count up to L has a split");
    Starts[S] = From[S][J];
    J = Starts[S];
  }
  return Starts;
}

SmallVector<double> stageCosts(ArrayRef<double> LayerCost, double FirstExtra,
                               double LastExtra, ArrayRef<int> Starts) {
  int Stages = Starts.size(), L = LayerCost.size();
  SmallVector<double> Costs(Stages, 0.0);
  for (int S = 0; S < Stages; ++S) {
    int End = S + 1 < Stages ? Starts[S + 1] : L;
    for (int I = Starts[S]; I < End; ++I)
      Costs[S] += LayerCost[I];
  }
  if (Stages > 0) {
    Costs.front() += FirstExtra;
    Costs.back() += LastExtra;
  }
  return Costs;
}

} // namespace sp
