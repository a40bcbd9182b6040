//===- Launch.h - A run on every rank of its plan's grid --------*- C++ -*-===//
//
// The whole of a run as a tool makes it: check the options (validate), the
// device (the registry entry's CheckAvailable) and the plan and files
// (prepareRun), before anything is written; share the kernel threads among
// the ranks; then run a Trainer on every rank of the plan's grid: threads
// of this process (--comm threads), MPI processes (--comm mpi, under
// mpirun), or one; and report how it ended.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TRAIN_LAUNCH_H
#define SP_TRAIN_LAUNCH_H

#include "train/TrainOptions.h"
#include "llvm/ADT/StringRef.h"

namespace sp {

/// Runs O. Errors are printed as one line, "TOOL: error: ...", a stop by a
/// signal as "TOOL: interrupted by ...". Argc and Argv are main's (MPI_Init
/// may take its arguments). Returns the exit code: 0 done, 1 error, 128 +
/// the signal that stopped the run (130, 143).
int runTraining(const TrainOptions &O, llvm::StringRef Tool, int *Argc,
                char ***Argv);

} // namespace sp

#endif // SP_TRAIN_LAUNCH_H
