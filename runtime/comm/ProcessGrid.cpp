//===- ProcessGrid.cpp - World ranks as a data x pipeline x tensor grid ---===//
#include "runtime/comm/ProcessGrid.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

Expected<RankGroups> splitGroups(Communicator &World, const ProcessGrid &Grid) {
  if (World.size() != Grid.size())
    return createStringError(
        inconvertibleErrorCode(),
        formatv("the run has {0} ranks but the plan's grid needs d x p x t = "
                "{1} x {2} x {3} = {4}",
                World.size(), Grid.Data, Grid.Pipeline, Grid.Tensor,
                Grid.size()));
  RankGroups R;
  R.At = Grid.coord(World.rank());
  const GridCoord &C = R.At;
  // Every rank makes the same three splits, in the same order (a split is
  // collective), and keeps the group only when it has more than one rank.
  struct Split {
    int Size, Color, Key;
    std::unique_ptr<Communicator> *Into;
  } Splits[] = {
      {Grid.Tensor, C.Data * Grid.Pipeline + C.Pipeline, C.Tensor, &R.Tensor},
      {Grid.Pipeline, C.Data * Grid.Tensor + C.Tensor, C.Pipeline,
       &R.Pipeline},
      {Grid.Data, C.Pipeline * Grid.Tensor + C.Tensor, C.Data, &R.Data},
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

} // namespace sp
