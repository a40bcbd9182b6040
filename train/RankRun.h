//===- RankRun.h - One rank's part of a run (the library's own) -*- C++ -*-===//
//
// Trainer::runRank as named steps over one rank's state: set up the groups,
// the backend, the executor and the data (RankSetUp.cpp); lock the output
// directories and restore a checkpoint (RankSetUp.cpp); then generate text
// (Sampling.cpp), evaluate or train (TrainLoop.cpp, after the header of
// Announce.cpp), and write the outputs and the summary (Outputs.cpp). Logs,
// the report page and checkpoints are written by Logs.cpp and
// Checkpointing.cpp, the trace by Trace.cpp.
//
// Only the lead (rank 0 of the world) prints and writes the logs; every rank
// takes part in the collectives (steps, gathers for dumps and the export).
// With pipeline stages, the first tensor-parallel rank of each stage of the
// first replica writes the dumps of that stage's parameters (StageLead).
//
//===----------------------------------------------------------------------===//
#ifndef SP_TRAIN_RANKRUN_H
#define SP_TRAIN_RANKRUN_H

#include "html/HtmlReport.h"
#include "runtime/BackendRegistry.h"
#include "runtime/Executor.h"
#include "runtime/LossLog.h"
#include "train/Trainer.h"
#include "llvm/Support/raw_ostream.h"
#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace sp {

class RankRun {
public:
  RankRun(Trainer &T, Communicator *World);

  // The steps of Trainer::runRank, in order.
  llvm::Error setUp();
  llvm::Error lockDirectories();
  /// A run refused before it wrote anything: the lead drops the locks and
  /// what taking them created.
  void discardLocks();
  llvm::Error restore();
  /// --sample: the prompt's continuation, printed by the lead.
  llvm::Error generate();
  /// --dump: the logits of a forward-only evaluation, before training.
  llvm::Error dumpFirstLogits();
  /// --eval: the mean loss over the batches.
  llvm::Error evaluate();
  /// The model FLOPs of a step and the job's peak (a collective).
  llvm::Error measureThroughput();
  /// The run's header: what it trains, the backend's notes.
  void announce();
  /// The steps; returns success too when a signal stopped the run
  /// (stopped()).
  llvm::Error train();
  bool stopped() const { return Stopped; }
  /// A signal stopped the run after step Last (the Trainer's record).
  void markStopped(int64_t Last, int Sig);
  /// The stop saved a checkpoint of its last step (--checkpoint-on-exit).
  void markSavedOnExit();
  /// The outputs after training (dumps, the trace, the export) and the
  /// summary.
  llvm::Error finish();

  // What the steps share.
  llvm::Error dumpLogits(llvm::StringRef Dir);
  llvm::Error dumpTensors(llvm::StringRef Dir,
                          llvm::ArrayRef<TensorView> Tensors);
  /// Gathers T (a collective) and, when Writes, writes it to Path.
  llvm::Error writeGathered(llvm::StringRef Path, const TensorView &T,
                            llvm::ArrayRef<int64_t> Shape, bool Writes,
                            Communicator *Across = nullptr);
  /// The logits of a context-parallel plan (this rank's positions of its
  /// replica's rows, LocalShape [b, s / C, V]): every replica's rows with
  /// every position in place.
  llvm::Error writeContextLogits(llvm::StringRef Path, const TensorView &T,
                                 llvm::ArrayRef<int64_t> LocalShape,
                                 Communicator &Cp);
  llvm::Error writeLogs();
  llvm::Error writePage(llvm::StringRef LossSvg);
  llvm::Error writeCheckpointAt(int64_t Step);
  llvm::Error writeMemory(llvm::StringRef Dir);
  llvm::Error exportOnnx();
  std::vector<TensorView> checkpointTensors() const;

  Trainer &T;
  const TrainOptions &O;
  const Plan &P;
  const ProcessGrid &Grid;
  Communicator *World; // null for one rank
  bool Lead;
  bool StageLead = false;
  /// The lead's stdout; the other ranks' null stream.
  llvm::raw_ostream &Out;
  RankGroups Groups;
  /// The backend's context (its flags, this rank's groups).
  BackendContext Context;
  std::unique_ptr<Executor> Exec;
  std::unique_ptr<DataLoader> Data, ValData;
  std::string ModelName;
  std::vector<LossRow> Rows;
  TokenBatch Batch;
  /// The first step to train, and the step the checkpoint in O's
  /// directory holds (-1: none).
  int64_t FirstStep = 1;
  int64_t SavedStep = -1;
  /// --html (the lead's): the page, its plan part filled once.
  bool WritesPage = false;
  ReportPage Page = {};
  /// Throughput: tokens and model FLOPs of one step of the whole job, and
  /// the job's peak FLOP/s (0: unknown) with what it is.
  int64_t TokensPerStep = 0;
  double ModelFlopsPerStep = NAN;
  double JobPeak = 0;
  std::string PeakSource;
  /// Training time, and the timing of the first step (page faults, warm
  /// caches), left out of the mean.
  double TrainSeconds = 0;
  TimeStats FirstStepTime;
  bool Stopped = false;
};

/// This rank's instructions as Chrome trace events gathered on rank 0 of
/// World, which writes the trace to Path (Trace.cpp).
llvm::Error writeTrace(llvm::StringRef Path, Communicator *World,
                       const Executor &E, int TP);

/// What the --html page lists of the run's settings, Seed the run's
/// (Logs.cpp).
std::vector<std::pair<std::string, std::string>>
pageSettings(const TrainOptions &O, const ProcessGrid &G, bool ThreadRanks,
             uint64_t Seed);

/// Where the ranks other than the lead print: a null stream of the calling
/// thread's own (Trainer.cpp says why).
llvm::raw_ostream &nowhere();

/// The memory line of the summary: what the executor measured against the
/// plan (Outputs.cpp).
void printMemory(llvm::raw_ostream &OS, const Plan &P, const MemoryStats &M);

/// An output directory: created if missing, refused if it is a file.
llvm::Error makeDir(llvm::StringRef Dir, llvm::StringRef Flag);

} // namespace sp

#endif // SP_TRAIN_RANKRUN_H
