//===- ProcessGrid.cpp - World ranks as a d x p x c x t grid --------------===//
#include "runtime/comm/ProcessGrid.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

Expected<RankGroups> splitGroups(Communicator &World, const ProcessGrid &Grid) {
  if (World.size() != Grid.size())
    return createStringError(
        inconvertibleErrorCode(),
        formatv("the run has {0} ranks but the plan's grid needs d x p x c x "
                "t = {1} x {2} x {3} x {4} = {5}",
                World.size(), Grid.Data, Grid.Pipeline, Grid.Context,
                Grid.Tensor, Grid.size()));
  RankGroups R;
  R.At = Grid.coord(World.rank());
  const GridCoord &C = R.At;
  // Every rank makes the same four splits, in the same order (a split is
  // collective), and keeps the group only when it has more than one rank.
  const int P = Grid.Pipeline, T = Grid.Tensor, Cp = Grid.Context;
  struct Split {
    int Size, Color, Key;
    std::unique_ptr<Communicator> *Into;
  } Splits[] = {
      {T, (C.Data * P + C.Pipeline) * Cp + C.Context, C.Tensor, &R.Tensor},
      {P, (C.Data * Cp + C.Context) * T + C.Tensor, C.Pipeline, &R.Pipeline},
      {Grid.Data * Cp, C.Pipeline * T + C.Tensor, C.Data * Cp + C.Context,
       &R.Data},
      {Cp, (C.Data * P + C.Pipeline) * T + C.Tensor, C.Context, &R.Context},
  };
  for (Split &S : Splits) {
    if (S.Size == 1)
      continue;
    auto G = World.split(S.Color, S.Key);
    if (!G)
      return G.takeError();
    *S.Into = std::move(*G);
  }
  return R;
}

Expected<ContextGroupSplit> splitContext(Communicator &Cp, int K) {
  const int C = Cp.size(), R = Cp.rank();
  if (K < 1 || C % K)
    return createStringError(
        inconvertibleErrorCode(),
        formatv("an all-to-all group of {0} ranks does not divide the cp "
                "group of {1}; recompile with a --cp-a2a that divides --cp",
                K, C));
  ContextGroupSplit S;
  // Both splits on every rank, in this order (a split is collective).
  struct Split {
    int Size, Color;
    std::unique_ptr<Communicator> *Into;
  } Splits[] = {{K, R / K, &S.Inner}, {C / K, R % K, &S.Outer}};
  for (Split &X : Splits) {
    auto G = Cp.split(X.Color, R);
    if (!G)
      return G.takeError();
    if (X.Size > 1)
      *X.Into = std::move(*G);
  }
  return S;
}

} // namespace sp
