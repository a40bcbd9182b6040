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
#include <atomic>
#include <memory>
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
  /// Validation: the mean loss over batches 1..EvalSteps of ValDataFile
  /// (forward only, no dropout) after every EvalEvery-th step and the last.
  std::string ValDataFile;
  int64_t EvalEvery = 1, EvalSteps = 10;
  /// A log line every LogEvery steps when stderr is not a terminal.
  int64_t LogEvery = 10;
  /// One rank's peak FLOP/s for the MFU (--peak-flops); else the backend's.
  std::optional<double> PeakFlops;
  /// Evaluate (forward only, no update) instead of training.
  bool Eval = false;
  /// Generate text instead of training: Tokens byte-level tokens after
  /// Prompt, each drawn from the last position's logits (forward only, no
  /// dropout) at Temperature (0: the most likely token) among the TopK
  /// most likely (0: all), with the run's Seed.
  struct SampleOptions {
    std::string Prompt;
    int64_t Tokens = 200;
    double Temperature = 0.8;
    int64_t TopK = 200;
  };
  std::optional<SampleOptions> Sample;
  std::string LogPath, CheckpointPath;
  int64_t CheckpointEvery = 0;
  /// On SIGINT or SIGTERM, save a checkpoint of the last finished step
  /// before exiting.
  bool CheckpointOnExit = false;
  /// The checkpoint to load (Resume: to continue training from it).
  std::optional<CheckpointMeta> Resumed;
  bool Resume = false;
  std::string Fingerprint; // of the plan, for checkpoints
  std::string ModelFingerprint; // of its model, for resharding checkpoints
  /// Outputs: empty for none. Source is the model --export-onnx copies.
  std::string TraceFile, DumpDir, ExportOnnx, Source;
  /// --html: the run's report page (tools/HtmlReport.h), written with the
  /// loss log, and the command line it shows.
  std::string HtmlPath, CommandLine;
  /// The plan is widened to float64 (sp-run --float64, widenToFloat64).
  bool Float64 = false;
  /// --expand-steps: a compact program runs written out
  /// (RunOptions::ExpandCompact).
  bool ExpandSteps = false;
  /// --device cuda[:N]: each rank runs on a GPU (its local rank's, or
  /// CudaDevice), with TF32 GEMMs when AllowTF32.
  bool Cuda = false;
  std::optional<int> CudaDevice;
  bool AllowTF32 = false;
  /// --cuda-attention blockwise (CudaBackendOptions::BlockwiseAttention).
  bool BlockwiseAttention = false;
  /// --cuda-epilogues (CudaBackendOptions::CublasLtEpilogues).
  bool CublasLtEpilogues = false;
  /// The ranks are threads of this process (--comm threads): with --device
  /// cuda, rank r takes GPU (CudaDevice or 0) + r, since the launcher's
  /// local rank is the whole process's.
  bool ThreadRanks = false;
  /// Kernel threads of each rank (for the summary line).
  int ThreadsPerRank = 1;
};

/// The grid of ranks a plan runs on (pipeline stages x tensor-parallel
/// ranks).
ProcessGrid planGrid(const Plan &P);
/// Whether the plan unrolls a pipeline schedule (stages or microbatches).
bool isPipelined(const Plan &P);

class DirectoryLock;

class Trainer {
public:
  Trainer(const Plan &P, TrainerOptions O);
  ~Trainer();

  /// One rank's run; World is null for a one-rank run. A collective: every
  /// rank of World calls it. World's rank 0 locks the checkpoint and log
  /// directories, prints and writes the files; every rank writes its part of
  /// a checkpoint. Errors every rank knows of (a checkpoint that could not
  /// be written, a corrupt one, a locked directory) are AgreedErrors, the
  /// same on every rank.
  llvm::Error runRank(Communicator *World);

  /// After runRank returned success: the signal (SIGINT, SIGTERM) that
  /// stopped the run early, or 0 if it ran to the end, and the one-line
  /// message saying where it stopped and what was saved.
  int stoppedBy() const { return StopSignal.load(); }
  std::string stopMessage() const;

private:
  const Plan &P;
  TrainerOptions O;
  ProcessGrid Grid;
  std::vector<std::unique_ptr<DirectoryLock>> Locks; // rank 0's
  // Where a stopped run stopped (every rank stores the same values).
  std::atomic<int> StopSignal{0};
  std::atomic<int64_t> StopStep{0};
  std::atomic<int64_t> SavedStep{-1}; // the checkpoint's step, -1 for none
  std::atomic<bool> SavedOnExit{false};
};

/// An error that every rank of a run reports the same (they agreed on it
/// with a collective), so that none is left waiting: under MPI the ranks
/// exit with it instead of aborting the job.
class AgreedError : public llvm::ErrorInfo<AgreedError> {
public:
  static char ID;
  explicit AgreedError(std::string Msg) : Msg(std::move(Msg)) {}
  void log(llvm::raw_ostream &OS) const override { OS << Msg; }
  std::error_code convertToErrorCode() const override {
    return llvm::inconvertibleErrorCode();
  }
  const std::string &text() const { return Msg; }

private:
  std::string Msg;
};

/// Graceful stops. installStopHandlers makes SIGINT and SIGTERM only
/// record the signal (async-signal-safe); a second one exits at once with
/// 128 + the signal (whatever is being written stays whole: checkpoints
/// commit atomically). The Trainer checks the record between steps: the
/// ranks agree on it with a collective, so they all stop after the same
/// step; with --checkpoint-on-exit they save that step, then the run ends
/// and sp-run exits with 128 + the signal (130, 143) and one line.
void installStopHandlers();
/// The signal that asked the run to stop, or 0.
int pendingStopSignal();
/// Starts the thread that keeps a stop prompt when a step cannot finish (a
/// rank is blocked in a collective on a dead or stopped peer): once a stop
/// was asked, a step still running after max(MinGraceSeconds, 4 x the
/// slowest step so far) is abandoned: the process prints one line (Label
/// first: "rank 3: " under MPI) and exits with 128 + the signal. Checkpoint
/// and log writes in progress are let finish.
void startStopWatchdog(double MinGraceSeconds, std::string Label);

/// One-line errors of sp-run's own (bad flags, files, values).
llvm::Error usageError(const llvm::Twine &Msg);
/// "1.0e-03".
std::string sci(double X);

} // namespace sp

#endif // SP_TOOLS_TRAINER_H
