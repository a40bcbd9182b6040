//===- Finalize.cpp - The last steps of lowering a program -----------------===//
#include "lower/Finalize.h"
#include "lower/MemoryPlan.h"
#include "lower/Overlap.h"

namespace sp {

void finalizeProgram(Program &P) {
  placeCollectives(P);
  planMemory(P);
}

} // namespace sp
