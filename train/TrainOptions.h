//===- TrainOptions.h - What one training run is asked to do ----*- C++ -*-===//
//
// Every setting of a run of the training library, one field per sp-run
// flag (train/TrainFlags.h binds each flag to its field, so the command
// line fills this struct directly), and the check of the settings against
// each other: validate() returns the first problem as one line that names
// the flag and says what to give instead. What needs the plan or the files
// (a checkpoint to resume, the plan's dtype) is checked by prepareRun
// (train/Prepare.h).
//
// Whether a flag was given matters for some (--seed against a resumed
// checkpoint, --steps with --sample): Given holds the names of the flags
// given, and the accessors below resolve the defaults that depend on other
// settings (--min-lr is --lr / 10 unless given).
//
//===----------------------------------------------------------------------===//
#ifndef SP_TRAIN_TRAINOPTIONS_H
#define SP_TRAIN_TRAINOPTIONS_H

#include "runtime/DataLoader.h"
#include "runtime/comm/Communicator.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace sp {

struct TrainOptions {
  /// The compiled plan's directory.
  std::string PlanDir;
  /// The total number of steps (a resumed run continues to it); with Eval,
  /// the batches evaluated.
  int64_t Steps = 10;

  /// The data: a token file, or random tokens from the seed.
  std::string DataFile;
  bool SyntheticData = false;
  /// What the model learns to predict, the padding and masked-LM tokens
  /// (Obj.Seed is the run's seed, set by prepareRun).
  Objective Obj;
  /// Batches at random offsets (from the seed and the step).
  bool Shuffle = false;

  /// Validation: the mean loss over batches 1..EvalSteps of ValDataFile
  /// (forward only, no dropout) every EvalEvery-th step and at the last.
  std::string ValDataFile;
  int64_t EvalEvery = 0; // default: evalEvery()
  int64_t EvalSteps = 10;

  /// Peak rate, linear warmup, cosine decay to MinLR (default: minLR()).
  double LR = 1e-3, MinLR = 0;
  int64_t Warmup = 0;
  /// The run's seed: dropout masks, shuffled offsets, masked-LM choices.
  unsigned long long Seed = 1234;
  /// Overrides every dropout ratio when given (dropout()).
  double Dropout = 0;

  /// Evaluate (forward only, no update) instead of training.
  bool Eval = false;
  /// Generate text instead of training (when SamplePrompt is given):
  /// SampleTokens byte-level tokens after it, each drawn from the last
  /// position's logits at Temperature (0: the most likely token) among the
  /// TopK most likely (0: all), with the run's seed.
  std::string SamplePrompt;
  /// --sample: the byte-level BPE tokenizer.json that encodes the prompt
  /// and decodes the text (empty: bytes, token id = byte value).
  std::string SampleTokenizer;
  int64_t SampleTokens = 200;
  double Temperature = 0.8;
  int64_t TopK = 200;

  /// Logs: loss.csv, loss.svg (default: PLAN/run), a log line every LogEvery
  /// steps when stderr is not a terminal, one rank's peak FLOP/s for the
  /// MFU (default: the backend's).
  std::string LogDir;
  int64_t LogEvery = 10;
  double PeakFlops = 0;

  /// Checkpoints (default directory: PLAN/checkpoint): every N steps and
  /// at the end, continued with Resume, saved on SIGINT/SIGTERM with
  /// CheckpointOnExit.
  std::string CheckpointDir;
  int64_t CheckpointEvery = 0;
  bool Resume = false;
  bool CheckpointOnExit = false;

  /// Outputs, empty for none: the Chrome trace, debugging dumps, the
  /// trained weights in a copy of the source model, the report page.
  std::string TraceFile, DumpDir, ExportOnnx, HtmlPath;

  /// Where it runs (runtime/BackendRegistry.h: NAME or NAME:N), and the
  /// backend's own flags that were given (name -> value).
  std::string Device = "cpu";
  std::map<std::string, std::string> BackendFlags;
  /// The plan widened to float64 (widenToFloat64), a numerical check.
  bool Float64 = false;
  /// A compact program run written out (RunOptions::ExpandCompact).
  bool ExpandSteps = false;
  /// Kernel threads of the process (0: all cores), shared by its ranks.
  int Threads = 0;
  /// How the ranks talk: "threads" (one process) or "mpi"; how long a rank
  /// waits for the others, in seconds.
  std::string Comm = "threads";
  double CommTimeout = Communicator::DefaultTimeout.count() / 1000.0;

  /// The flags given (names without "--"), and the command line, for the
  /// report page.
  llvm::StringSet<> Given;
  std::string CommandLine;

  bool given(llvm::StringRef Flag) const { return Given.contains(Flag); }
  /// Generating text (--sample).
  bool sampling() const { return given("sample"); }
  double minLR() const { return given("min-lr") ? MinLR : LR / 10; }
  int64_t evalEvery() const {
    return given("eval-every") ? EvalEvery
                               : std::max<int64_t>(1, Steps / 10);
  }
  std::optional<double> dropout() const {
    return given("dropout") ? std::optional<double>(Dropout) : std::nullopt;
  }
  std::optional<double> peakFlops() const {
    return given("peak-flops") ? std::optional<double>(PeakFlops)
                               : std::nullopt;
  }
  std::string checkpointDir() const {
    return given("checkpoint") ? CheckpointDir : PlanDir + "/checkpoint";
  }
  std::string logDir() const {
    return given("log-dir") ? LogDir : PlanDir + "/run";
  }
  /// Reading a checkpoint's weights: to resume, or to evaluate or sample
  /// from them.
  bool loadsCheckpoint() const {
    return Resume || ((Eval || sampling()) && given("checkpoint"));
  }
  /// Training (not --eval, not --sample): it writes the logs.
  bool trains() const { return !Eval && !sampling(); }
  /// The --device name ("cuda" of "cuda:1").
  std::string deviceName() const;

  /// The settings that are wrong whatever the plan and the files: the first
  /// as a one-line error naming the flag and what to give.
  llvm::Error validate() const;
};

} // namespace sp

#endif // SP_TRAIN_TRAINOPTIONS_H
