//===- Sharding.h - Helpers of the parallel passes -------------*- C++ -*-===//
#ifndef SP_ANALYSIS_SHARDING_H
#define SP_ANALYSIS_SHARDING_H

#include "ir/IR.h"
#include "llvm/Support/Error.h"

namespace sp {

/// Recomputes every node's result types in program order, after a pass has
/// changed parameter shapes or attributes (a parameter became its shard, a
/// head count was divided). Fails naming the first node that no longer
/// type-checks.
llvm::Error retypeGraph(Graph &G);

/// Annotates every node result with how it is laid out over the group,
/// from the parameters' and collectives' shardings and each op's layout
/// rule (ir/ops/: a column-parallel linear splits the last axis, a
/// row-parallel one gives partial sums, split_heads splits the heads axis,
/// elementwise ops keep their input's).
/// The runtime reads it to index dropout masks globally.
void propagateSharding(Graph &G);

/// "1, 2, 4 and 8": the divisors of N, for diagnostics that suggest values.
std::string divisorsOf(int64_t N);

} // namespace sp

#endif // SP_ANALYSIS_SHARDING_H
