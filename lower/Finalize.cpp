//===- Finalize.cpp - The last steps of lowering a program -----------------===//
#include "lower/Finalize.h"
#include "lower/FuseAttention.h"
#include "lower/GradientBuckets.h"
#include "lower/MemoryPlan.h"
#include "lower/Overlap.h"

namespace sp {

void finalizeProgram(Program &P) {
  fuseAttentionSoftmax(P);
  bucketGradientSums(P);
  bucketParamGathers(P);
  placeCollectives(P);
  planMemory(P);
}

} // namespace sp
