//===- GradientBuckets.h - Data-parallel gradient sums in buckets -*- C++ -*-===//
//
// The data-parallel pass sums every gradient over the replicas with one
// optimizer-phase all_reduce {group = "dp"} each (passes/DataParallel.cpp),
// or with ZeRO one flat reduce_scatter {group = "dp"} each.
// Here, where the program's order is final, those sums become buckets, as
// PyTorch DDP and Megatron's distributed optimizer make them:
//
//  - the gradients are taken in the order the backward finishes them (the
//    last instruction writing each: with microbatches, its last
//    accumulation), and grouped greedily into buckets of at most
//    bucket_bytes (a larger gradient is a bucket of its own);
//  - each bucket is one all_reduce (reduce_scatter) of several operands,
//    placed right after the instruction that finishes its last gradient, so
//    that on a backend with a communication stream the sum runs beside the
//    rest of the backward instead of after it.
//
// A pipelined rank's compact program is finalized template by template
// (lower/Finalize.cpp), and its sums are the epilogue's: there the buckets
// run after every step, not beside the last microbatch's backward, which
// Megatron overlaps them with (not yet done here).
//
// Every rank of a data-parallel group runs the same program, so they issue
// the same buckets in the same order. The sums are elementwise, so the
// results are those of the one-gradient sums; the gradient of a bucket
// dies at its sum instead of living until the optimizer.
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_GRADIENTBUCKETS_H
#define SP_LOWER_GRADIENTBUCKETS_H

#include "plan/Program.h"

namespace sp {

/// Buckets P's data-parallel gradient sums as above and recomputes the live
/// ranges; returns the number of buckets (0: nothing to do).
int bucketGradientSums(Program &P);

/// ZeRO's gathers of the updated parameters (gather_param, one per
/// parameter after the updates): consecutive ones of the same group become
/// one gather_param of several parameters, greedily up to bucket_bytes of
/// parameters each, so that a replica exchanges its chunks in a few calls
/// rather than one per parameter. Returns the number of buckets.
int bucketParamGathers(Program &P);

} // namespace sp

#endif // SP_LOWER_GRADIENTBUCKETS_H
