//===- Partition.h - Contiguous pipeline stages by cost -------*- C++ -*-===//
//
// Splits a Transformer's L layers into contiguous, non-empty pipeline
// stages (P M of them with interleaving), either balanced by a per-layer
// cost or uniformly. The embedding's cost counts toward the first stage and
// the head's (final norm, output layer, loss) toward the last, so a balanced
// split gives the end stages fewer layers.
//
//===----------------------------------------------------------------------===//
#ifndef SP_ANALYSIS_PARTITION_H
#define SP_ANALYSIS_PARTITION_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/Error.h"

namespace sp {

/// The first layer of each of Stages contiguous stages (element 0 is 0;
/// stage s holds layers [Starts[s], Starts[s + 1]), the last one up to L).
///
///  - Balanced (Uniform false): the split minimising the costliest stage,
///    where a stage costs the sum of its layers' LayerCost, plus FirstExtra
///    for stage 0 and LastExtra for stage Stages - 1. A dynamic program over
///    contiguous splits, O(Stages L^2): Best[s][j], the least possible
///    largest cost of stages 0..s over layers [0, j), is the minimum over
///    the start i of stage s of max(Best[s - 1][i], cost of [i, j)). Among
///    equally good splits it takes the one whose last stage starts latest.
///  - Uniform: every stage gets L / Stages layers; Stages must divide L.
///
/// Errors: fewer than 1 stage, more stages than layers, a negative or
/// non-finite cost, and a uniform split of L layers that Stages does not
/// divide (the message lists the stage counts that would).
llvm::Expected<llvm::SmallVector<int>>
partitionLayers(llvm::ArrayRef<double> LayerCost, double FirstExtra,
                double LastExtra, int Stages, bool Uniform);

/// The cost of each stage of a split partitionLayers returned, extras
/// included.
llvm::SmallVector<double> stageCosts(llvm::ArrayRef<double> LayerCost,
                                     double FirstExtra, double LastExtra,
                                     llvm::ArrayRef<int> Starts);

} // namespace sp

#endif // SP_ANALYSIS_PARTITION_H
