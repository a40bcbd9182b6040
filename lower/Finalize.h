//===- Finalize.h - The last steps of lowering a program -------*- C++ -*-===//
//
// Every path that makes a program from a graph (the plan's programs, the
// recompute planner's estimates, the paper table) ends here, so that what
// it measures is what sp-run runs: the instruction fusions, the causal
// structure of the attention products (lower/CausalProducts.h), the
// placement of the collectives beside the GEMMs they overlap, then the
// memory plan.
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_FINALIZE_H
#define SP_LOWER_FINALIZE_H

#include "plan/Program.h"

namespace sp {

void finalizeProgram(Program &P);

} // namespace sp

#endif // SP_LOWER_FINALIZE_H
