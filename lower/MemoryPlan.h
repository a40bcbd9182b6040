//===- MemoryPlan.h - Arena offsets from liveness --------------*- C++ -*-===//
#ifndef SP_LOWER_MEMORYPLAN_H
#define SP_LOWER_MEMORYPLAN_H

#include "plan/Program.h"
#include "llvm/ADT/STLFunctionalExtras.h"

namespace sp {

/// Alignment of every buffer in the arena.
constexpr int64_t ArenaAlignment = 64;

/// The bytes a buffer takes in the arena: at least one aligned unit, so
/// that distinct live buffers never share an address.
int64_t alignedSize(const ProgramBuffer &B);

/// Assigns every buffer an offset in one arena and sets PersistentBytes and
/// ArenaBytes (the planned peak).
///
/// Persistent buffers (inputs, parameters, optimizer state, constants) are
/// laid out first, for the whole program. Temporaries live from the
/// instruction that defines them to their last use (outputs: to the end);
/// they are placed largest first, each at the lowest offset that does not
/// overlap a placed temporary whose live range intersects its own (greedy
/// by size, as in TFLite's arena planner). An instruction's outputs never
/// share memory with its inputs, because their live ranges touch at that
/// instruction. Programs of more than 20,000 temporaries (unrolled pipeline
/// schedules) are placed in program order instead, best fit into the holes
/// freed so far, which is about ten times faster there for a peak about 1%
/// higher.
void planMemory(Program &P);
/// The same with the placement chosen: largest first, in program order, or
/// by the program's size as above.
enum class PlanOrder { Auto, BySize, Program };
void planMemory(Program &P, PlanOrder Order);

/// Def and LastUse of every temporary from the instruction order: from its
/// first writer to its last reader (a program output: past the end), and
/// the operands and results of a collective with a Beside (lower/Overlap.h)
/// until that GEMM. For the steps that rewrite a program after lowering.
void computeLiveRanges(Program &P);

/// The largest total size of temporaries live at the same instruction: a
/// lower bound for any placement, reported beside the arena peak.
int64_t peakLiveTempBytes(const Program &P);
/// The same over the temporaries Pick selects.
int64_t peakLiveBytes(const Program &P,
                      llvm::function_ref<bool(const ProgramBuffer &)> Pick);

} // namespace sp

#endif // SP_LOWER_MEMORYPLAN_H
