//===- ProcessGrid.h - World ranks as a d x p x c x t grid ------*- C++ -*-===//
//
// The one place that maps a world rank to its coordinates and groups, for
// sp-run, the tests and MPI alike. Tensor-parallel ranks are adjacent (they
// talk most), then context-parallel ranks, then pipeline stages, then
// data-parallel replicas, as Megatron lays them out:
//
//   world rank = ((d * P + p) * C + c) * T + t
//
// A rank's tensor-parallel group is the ranks with its (d, p, c), ordered by
// t; its context-parallel group those with its (d, p, t), ordered by c; its
// pipeline group those with its (d, c, t), ordered by p. Its data-parallel
// group, over which gradients are summed, is those with its (p, t), ordered
// by (d, c): the replicas, and the context-parallel ranks of each, whose
// gradients are each their positions' part (Megatron's data-parallel group
// with context parallelism). Without --cp it is the replicas.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_COMM_PROCESSGRID_H
#define SP_RUNTIME_COMM_PROCESSGRID_H

#include "runtime/comm/Communicator.h"
#include <memory>

namespace sp {

struct GridCoord {
  int Data = 0, Pipeline = 0, Tensor = 0, Context = 0;
  bool operator==(const GridCoord &O) const {
    return Data == O.Data && Pipeline == O.Pipeline && Tensor == O.Tensor &&
           Context == O.Context;
  }
};

struct ProcessGrid {
  int Data = 1, Pipeline = 1, Tensor = 1, Context = 1;

  int size() const { return Data * Pipeline * Context * Tensor; }
  GridCoord coord(int WorldRank) const {
    return {WorldRank / (Pipeline * Context * Tensor),
            WorldRank / (Context * Tensor) % Pipeline, WorldRank % Tensor,
            WorldRank / Tensor % Context};
  }
  int worldRank(GridCoord C) const {
    return ((C.Data * Pipeline + C.Pipeline) * Context + C.Context) * Tensor +
           C.Tensor;
  }
};

/// A checkpoint's view of a grid: context-parallel ranks hold their
/// replica's parameters as replicas do (and ZeRO-1 chunks them over the
/// d x c ranks, ordered by replica, then context rank), so a checkpoint
/// records them folded into d, and reshards across c as across d.
inline ProcessGrid foldContext(ProcessGrid G) {
  G.Data *= G.Context;
  G.Context = 1;
  return G;
}
inline GridCoord foldContext(GridCoord C, const ProcessGrid &G) {
  C.Data = C.Data * G.Context + C.Context;
  C.Context = 0;
  return C;
}

/// One rank's communicators. A group of one rank is a null pointer (nothing
/// to talk to), as the executor expects.
struct RankGroups {
  GridCoord At;
  /// Data: the data-parallel x context-parallel ranks (see above).
  std::unique_ptr<Communicator> Tensor, Pipeline, Data, Context;
};

/// Hierarchical context parallelism (--cp-comm a2a+ring, --cp-a2a K): the
/// cp group of C ranks as C / K all-to-all groups of K consecutive ranks
/// (Inner, ordered by cp rank: cp rank c is inner rank c mod K of group
/// c / K) and the rings across them between the ranks with the same inner
/// index (Outer, ordered by group). A group of one rank is null.
struct ContextGroupSplit {
  std::unique_ptr<Communicator> Inner, Outer;
};
/// Splits Cp so; collective over its ranks. Errors if K does not divide
/// its size.
llvm::Expected<ContextGroupSplit> splitContext(Communicator &Cp, int K);

/// Splits World (of Grid.size() ranks) into this rank's groups. A collective
/// call: every rank of World must make it. Errors if the sizes differ.
llvm::Expected<RankGroups> splitGroups(Communicator &World,
                                       const ProcessGrid &Grid);

} // namespace sp

#endif // SP_RUNTIME_COMM_PROCESSGRID_H
