//===- ProcessGrid.h - World ranks as a data x pipeline x tensor grid -*- C++ -*-===//
//
// The one place that maps a world rank to its coordinates and groups, for
// sp-run, the tests and MPI alike. Tensor-parallel ranks are adjacent (they
// talk most), then pipeline stages, then data-parallel replicas, as Megatron
// lays them out:
//
//   world rank = (d * P + p) * T + t
//
// A rank's tensor-parallel group is the ranks with its (d, p), ordered by t;
// its pipeline group those with its (d, t), ordered by p; its data-parallel
// group those with its (p, t), ordered by d.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_COMM_PROCESSGRID_H
#define SP_RUNTIME_COMM_PROCESSGRID_H

#include "runtime/comm/Communicator.h"
#include <memory>

namespace sp {

struct GridCoord {
  int Data = 0, Pipeline = 0, Tensor = 0;
  bool operator==(const GridCoord &O) const {
    return Data == O.Data && Pipeline == O.Pipeline && Tensor == O.Tensor;
  }
};

struct ProcessGrid {
  int Data = 1, Pipeline = 1, Tensor = 1;

  int size() const { return Data * Pipeline * Tensor; }
  GridCoord coord(int WorldRank) const {
    return {WorldRank / (Pipeline * Tensor), WorldRank / Tensor % Pipeline,
            WorldRank % Tensor};
  }
  int worldRank(GridCoord C) const {
    return (C.Data * Pipeline + C.Pipeline) * Tensor + C.Tensor;
  }
};

/// One rank's communicators. A group of one rank is a null pointer (nothing
/// to talk to), as the executor expects.
struct RankGroups {
  GridCoord At;
  std::unique_ptr<Communicator> Tensor, Pipeline, Data;
};

/// Splits World (of Grid.size() ranks) into this rank's groups. A collective
/// call: every rank of World must make it. Errors if the sizes differ.
llvm::Expected<RankGroups> splitGroups(Communicator &World,
                                       const ProcessGrid &Grid);

} // namespace sp

#endif // SP_RUNTIME_COMM_PROCESSGRID_H
