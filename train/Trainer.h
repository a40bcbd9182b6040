//===- Trainer.h - One training, evaluation or sampling run of a plan -*- C++ -*-===//
//
// What sp-run does once its flags and files are checked (TrainOptions,
// prepareRun): on every rank of the plan's grid, make the backend
// (runtime/BackendRegistry.h, by --device) and the executor, read the data
// by the objective, resume from a checkpoint, then train (loss log,
// progress, periodic checkpoints, dumps, the trace, the ONNX export),
// evaluate or generate text, and print the summary. train/Launch.h runs
// runRank on each rank (threads, MPI, or one).
//
//===----------------------------------------------------------------------===//
#ifndef SP_TRAIN_TRAINER_H
#define SP_TRAIN_TRAINER_H

#include "plan/Plan.h"
#include "runtime/comm/ProcessGrid.h"
#include "train/Prepare.h"
#include "train/TrainOptions.h"
#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace sp {

struct BackendEntry;
class DirectoryLock;
class RankRun;

/// The grid of ranks a plan runs on (replicas x pipeline stages x
/// tensor-parallel ranks).
ProcessGrid planGrid(const Plan &P);
/// Whether the plan unrolls a pipeline schedule (stages or microbatches).
bool isPipelined(const Plan &P);

class Trainer {
public:
  /// O validated, R prepared from it; ThreadsPerRank kernel threads each
  /// (for the summary line); ThreadRanks: the ranks are threads of this
  /// process.
  Trainer(const TrainOptions &O, const PreparedRun &R, int ThreadsPerRank,
          bool ThreadRanks);
  ~Trainer();

  /// One rank's run; World is null for a one-rank run. A collective: every
  /// rank of World calls it. World's rank 0 locks the checkpoint and log
  /// directories, prints and writes the files; every rank writes its part of
  /// a checkpoint. Errors every rank knows of (a checkpoint that could not
  /// be written, a corrupt one, a locked directory) are AgreedErrors
  /// (train/Agreement.h), the same on every rank.
  llvm::Error runRank(Communicator *World);

  /// After runRank returned success: the signal (SIGINT, SIGTERM) that
  /// stopped the run early, or 0 if it ran to the end, and the one-line
  /// message saying where it stopped and what was saved.
  int stoppedBy() const { return StopSignal.load(); }
  std::string stopMessage() const;

private:
  friend class RankRun;
  const TrainOptions &O;
  const PreparedRun &R;
  const Plan &P;
  const BackendEntry &Device;
  ProcessGrid Grid;
  int ThreadsPerRank;
  bool ThreadRanks;
  std::vector<std::unique_ptr<DirectoryLock>> Locks; // rank 0's
  // Where a stopped run stopped (every rank stores the same values).
  std::atomic<int> StopSignal{0};
  std::atomic<int64_t> StopStep{0};
  std::atomic<int64_t> SavedStep{-1}; // the checkpoint's step, -1 for none
  std::atomic<bool> SavedOnExit{false};
};

} // namespace sp

#endif // SP_TRAIN_TRAINER_H
