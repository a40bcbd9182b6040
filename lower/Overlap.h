//===- Overlap.h - Collectives placed beside the GEMMs they overlap -*- C++ -*-===//
//
// Megatron-Core overlaps the tensor-parallel communication of a linear layer
// with its GEMMs. In the backward of a column-parallel linear under sequence
// parallelism, the re-all-gather of the saved input shard runs beside the
// dgrad GEMM (dX = dY W), and the reduce-scatter of dX runs beside the wgrad
// GEMM (dW = dY^T X); without sequence parallelism, the all-reduce of dX runs
// beside the wgrad GEMM. This step, the program pass place-collectives
// (lower/ProgramPasses.def: the last rewrite finalizeProgram runs, so that it
// sees the final order), states those overlaps in the program, so that a
// backend with a communication stream can run them and the trace and the
// memory plan agree with what it runs:
//
//  - A tensor-parallel collective (all_gather, reduce_scatter, all_reduce of
//    group "tp") moves up, past instructions it does not depend on, to just
//    before the nearest GEMM (linear, linear_grad_w, batch_matmul) it does not
//    depend on, and its Beside names that GEMM. It never moves past another
//    instruction that communicates (so every rank still issues its
//    collectives in the same order), nor into another phase or microbatch.
//    It moves only where it finds such a GEMM; elsewhere (the forward's
//    LayerNorm -> all-gather -> GEMM chain, where nothing independent comes
//    before the all-gather) it stays and has no Beside.
//  - Live ranges are recomputed for the new order, and the operands of a
//    collective stay live until its GEMM, so that the GEMM's results never
//    reuse their bytes: a collective and the GEMM beside it touch disjoint
//    arena bytes and no stream event orders one after the other
//    (runtime/cuda/StreamPlan.h; checked in tests/gpu/HostLogicTest.cpp).
//
// The reordering moves whole instructions and changes no operand, so every
// backend computes the same bits as before.
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_OVERLAP_H
#define SP_LOWER_OVERLAP_H

#include "plan/Program.h"

namespace sp {

/// Whether an instruction communicates (a collective, a pipeline message, or
/// a kernel that reduces over a group inside: the vocabulary-parallel loss,
/// the global gradient norm).
bool communicates(OpKind Op);

/// Reorders P's collectives as above, sets their Beside, and recomputes the
/// temporaries' live ranges (computeLiveRanges, lower/MemoryPlan.h). Run
/// before the memory plan.
void placeCollectives(Program &P);

} // namespace sp

#endif // SP_LOWER_OVERLAP_H
