//===- Finalize.h - The last steps of lowering a program -------*- C++ -*-===//
//
// Every path that makes a program from a graph (the plan's programs, the
// recompute planner's estimates, the paper table) ends here, so that what
// it measures is what sp-run runs: the program passes of
// lower/ProgramPasses.def in the table's order (the instruction fusions, the
// causal structure of the attention products, the data-parallel buckets, the
// placement of the collectives beside the GEMMs they overlap), then the
// memory plan. A compact program (a pipelined rank's) runs them on each
// template alone, then marks the causal products its templates share.
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_FINALIZE_H
#define SP_LOWER_FINALIZE_H

#include "plan/Program.h"

namespace sp {

void finalizeProgram(Program &P);

} // namespace sp

#endif // SP_LOWER_FINALIZE_H
