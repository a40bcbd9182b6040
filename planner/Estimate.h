//===- Estimate.h - The cost model's estimate of a compiled plan -*- C++ -*-===//
//
// sp-compile --estimate: the plan's step on a cluster by the cost model
// (planner/CostModel.h), as the summary's lines and the report's
// "estimate" object.
//
//===----------------------------------------------------------------------===//
#ifndef SP_PLANNER_ESTIMATE_H
#define SP_PLANNER_ESTIMATE_H

#include "driver/Compile.h"
#include "planner/CostModel.h"
#include <string>

namespace sp {

/// Estimates C's plan on M under Ctx, adds "estimate" to C.Facts and
/// returns the lines to print.
llvm::Expected<std::string> estimateCompilation(const ClusterSpec &M,
                                                const PassContext &Ctx,
                                                Compilation &C);

} // namespace sp

#endif // SP_PLANNER_ESTIMATE_H
