//===- Trainer.h - One training or evaluation run of a plan -----*- C++ -*-===//
//
// What sp-run does once its flags are checked: on every rank of the plan's
// grid, create the executor, read the data by the objective, resume from a
// checkpoint, then train (loss log, progress, periodic checkpoints, dumps,
// the trace, the ONNX export) or evaluate, and print the summary. sp-run's
// main validates the flags and files, fills TrainerOptions, and runs
// Trainer::runRank on each rank (threads, MPI, or one).
//
//===----------------------------------------------------------------------===//
#ifndef SP_TOOLS_TRAINER_H
#define SP_TOOLS_TRAINER_H

#include "plan/Plan.h"
#include "runtime/Checkpoint.h"
#include "runtime/DataLoader.h"
#include "runtime/comm/ProcessGrid.h"
#include <optional>
#include <string>

namespace sp {

struct TrainerOptions {
  std::string PlanDir;
  /// The total number of steps (a resumed run continues to it).
  int64_t Steps = 10;
  /// Peak rate, linear warmup, cosine decay to MinLR.
  double LR = 1e-3, MinLR = 1e-4;
  int64_t Warmup = 0;
  /// The run's seed: dropout masks, shuffled offsets, masked-LM choices.
  uint64_t Seed = 1234;
  std::optional<double> Dropout;
  bool Shuffle = false;
  Objective Obj;
  std::string DataFile; // or Synthetic data
  bool Synthetic = false;
  /// Evaluate (forward only, no update) instead of training.
  bool Eval = false;
  std::string LogPath, CheckpointPath;
  int64_t CheckpointEvery = 0;
  /// The checkpoint to load (Resume: to continue training from it).
  std::optional<CheckpointMeta> Resumed;
  bool Resume = false;
  std::string Fingerprint; // of the plan, for checkpoints
  /// Outputs: empty for none. Source is the model --export-onnx copies.
  std::string TraceFile, DumpDir, ExportOnnx, Source;
  /// Kernel threads of each rank (for the summary line).
  int ThreadsPerRank = 1;
};

/// The grid of ranks a plan runs on (pipeline stages x tensor-parallel
/// ranks).
ProcessGrid planGrid(const Plan &P);
/// Whether the plan unrolls a pipeline schedule (stages or microbatches).
bool isPipelined(const Plan &P);

class Trainer {
public:
  Trainer(const Plan &P, TrainerOptions O);

  /// One rank's run; World is null for a one-rank run. A collective: every
  /// rank of World calls it. World's rank 0 prints and writes the files.
  llvm::Error runRank(Communicator *World);

private:
  const Plan &P;
  TrainerOptions O;
  ProcessGrid Grid;
};

/// One-line errors of sp-run's own (bad flags, files, values).
llvm::Error usageError(const llvm::Twine &Msg);
/// "1.0e-03".
std::string sci(double X);

} // namespace sp

#endif // SP_TOOLS_TRAINER_H
