//===- Finalize.cpp - The last steps of lowering a program -----------------===//
#include "lower/Finalize.h"
#include "lower/MemoryPlan.h"

namespace sp {

void finalizeProgram(Program &P) { planMemory(P); }

} // namespace sp
