//===- Checkpoint.h - Training checkpoints ---------------------*- C++ -*-===//
//
// A checkpoint is a directory that keeps its name across writes:
//   DIR/checkpoint.json   the index, and the commit point: format and
//                         version, step, seed, the plan fingerprint, the
//                         number of ranks, the loss history, and for each
//                         rank its data file and, for every tensor, its name,
//                         shape, byte offset, byte size and CRC-32; the index
//                         carries a CRC-32 of itself. Version 3 adds the
//                         model fingerprint, the d x p x t grid, each rank's
//                         place in it and each tensor's layout-independent
//                         key, whole shape and layout, so that another plan
//                         of the model can resume it (readCheckpointResharded)
//   DIR/tensors-S.bin     (one rank) or DIR/tensors-S-rankR.bin (rank R of a
//                         parallel run): that rank's tensors as raw
//                         little-endian float32, back to back in index order
//                         (S is the step; a rewrite of the same step adds
//                         ".gN" before ".bin")
//   DIR/.sp-run.lock      the lock of the run using it (sp-run, not here)
// It holds every parameter and AdamW moment of every rank (each rank's
// Executor::parameters() and optimizerState(), its own shards), which with
// the step and the seed is all the state a run has: data offsets and dropout
// masks are functions of (seed, step).
//
// Crash safety (kill -9 at any moment, power loss): a write creates new data
// files (never touching the ones the index names), writes and fsyncs them
// and the directory, then writes the index to a temporary file, fsyncs it,
// renames it over checkpoint.json (the commit) and fsyncs the directory, and
// only then removes the data files the new index no longer names. Until the
// rename the old checkpoint is whole; after it the new one is. What a killed
// writer leaves (unnamed data files, temporary index files) is never read
// and is removed by cleanCheckpointDir. Reading checks everything (index
// checksum, plan fingerprint, rank count, names and shapes, file size, each
// tensor's checksum) before it writes a single value back into the
// executor, so a corrupt checkpoint changes nothing.
//
// Version 1 checkpoints (one rank, DIR/tensors.bin, the tensors at the top
// level of the index) are still read.
//
// Test hook: SP_TEST_CHECKPOINT_DELAY_MS=N makes every write sleep N/3 ms
// halfway through each data file, N/3 ms after the data files are synced and
// before the commit, and N/3 ms after the commit before the old files are
// removed, so that a test can kill a run in each phase of a write. It is
// read only here and has no other effect.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CHECKPOINT_H
#define SP_RUNTIME_CHECKPOINT_H

#include "plan/Plan.h"
#include "plan/Program.h"
#include "runtime/Executor.h"
#include "runtime/LossLog.h"
#include "runtime/comm/ProcessGrid.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"
#include <optional>
#include <string>
#include <vector>

namespace sp {

constexpr int CheckpointFormatVersion = 3;

/// A hash (FNV-1a 64, hex) of what makes two plans interchangeable for a
/// checkpoint: every buffer's name, kind, dtype and shape, and every
/// instruction (op, operands, attributes). Memory offsets and weight paths
/// do not count.
std::string planFingerprint(const Program &P);
/// The same over every pipeline stage's program (the program's own for a
/// plan of one stage).
std::string planFingerprint(const Plan &P);
/// A hash of the model a plan trains, whatever its layout: every
/// parameter's name (a stage's copy of a tied weight counted once) and whole
/// shape, over every stage. Checkpoints reshard between plans that have the
/// same one.
std::string modelFingerprint(const Plan &P);

struct CheckpointMeta {
  int64_t Step = 0;  // the last completed step
  uint64_t Seed = 0; // the run's seed
  std::string PlanFingerprint;
  std::vector<LossRow> Losses; // the run's history up to Step
  int Ranks = 1;               // the ranks whose tensors it holds
  /// Format 3: the model's fingerprint and the d x p x t grid that wrote it
  /// (empty, and 1 x 1 x 1, in older checkpoints).
  std::string ModelFingerprint;
  ProcessGrid Grid;
  /// fp16's loss scale and its clean steps (absent: the plan's initial), and
  /// the steps whose update was skipped (AdamW's count is Step less these).
  std::optional<double> LossScale;
  int64_t LossScaleGoodSteps = 0;
  int64_t SkippedUpdates = 0;
};

/// True if Dir holds a checkpoint index.
bool checkpointExists(llvm::StringRef Dir);

/// Fails if writing a checkpoint to Dir would overwrite something else: Dir
/// exists and is neither a checkpoint, nor empty, nor holding only what a
/// checkpoint writer leaves (a killed write's files, the lock file).
llvm::Error checkCheckpointTarget(llvm::StringRef Dir);

/// Removes what killed writers left in Dir: data files the index does not
/// name and temporary index files. Only while no other process writes Dir
/// (sp-run holds its lock). Returns how many files it removed.
llvm::Expected<int> cleanCheckpointDir(llvm::StringRef Dir);

/// Writing in two parts, for runs of several ranks: every rank writes its
/// shard (its data file, synced), then one rank commits the checkpoint with
/// every rank's shard description, in rank order.
///
/// Writes Rank's tensors to a new data file in Dir (created if missing) and
/// returns the shard's description (JSON text) for commitCheckpoint. With
/// Model (one entry per tensor, Executor::modelTensors) and the rank's place
/// At in the grid, the description says where each tensor sits in the
/// model, so that another layout can resume it (readCheckpointResharded).
/// Errors: "cannot write checkpoint 'DIR' (step S): FILE: REASON".
llvm::Expected<std::string>
writeCheckpointShard(llvm::StringRef Dir, int64_t Step, int Rank, int Ranks,
                     llvm::ArrayRef<TensorView> Tensors,
                     llvm::ArrayRef<Executor::ModelTensor> Model = {},
                     GridCoord At = {});
/// Writes the index of Meta and Shards (one per rank, Meta.Ranks of them)
/// atomically: the commit. Then removes the files the new index does not
/// name. An existing Dir that is not a checkpoint is refused.
llvm::Error commitCheckpoint(llvm::StringRef Dir, const CheckpointMeta &Meta,
                             llvm::ArrayRef<std::string> Shards);

/// One rank: writeCheckpointShard and commitCheckpoint.
llvm::Error writeCheckpoint(llvm::StringRef Dir, const CheckpointMeta &Meta,
                            llvm::ArrayRef<TensorView> Tensors);

/// Reads and verifies the index of the checkpoint in Dir (not the tensors):
/// what a run needs to know before it creates its executor (the seed).
llvm::Expected<CheckpointMeta> readCheckpointMeta(llvm::StringRef Dir);

/// Reads rank Rank's part of the checkpoint in Dir (written by Ranks ranks),
/// verifies it against the plan's fingerprint and the tensors' names and
/// shapes, and copies the values into Tensors.
/// Errors: "checkpoint 'DIR' is corrupt: ...", "checkpoint 'DIR' was written
/// for another plan ...", "checkpoint 'DIR' does not match the plan: ...".
llvm::Expected<CheckpointMeta>
readCheckpoint(llvm::StringRef Dir, llvm::StringRef PlanFingerprint,
               llvm::ArrayRef<TensorView> Tensors, int Rank = 0, int Ranks = 1);

/// Resharding: fills Tensors (this rank's, at At in its own grid, laid out
/// as Model says) from a format-3 checkpoint of the same model written by
/// another layout (another t, p or d, with or without ZeRO). Each whole
/// tensor is assembled from the writer's shards (its tensor-parallel parts,
/// its ZeRO chunks, from any stage that holds it) and this rank's part cut
/// from it, exactly: only copies. Every data file read is checked (size,
/// each used tensor's CRC-32) before any value is written.
/// Errors: "checkpoint 'DIR' was written for another model ...", "...
/// cannot be resharded ...", and the corrupt cases of readCheckpoint.
llvm::Expected<CheckpointMeta>
readCheckpointResharded(llvm::StringRef Dir, llvm::StringRef ModelFingerprint,
                        llvm::ArrayRef<TensorView> Tensors,
                        llvm::ArrayRef<Executor::ModelTensor> Model,
                        GridCoord At);

/// readCheckpoint of one rank on contents read elsewhere (the fuzzer reads
/// checkpoints from memory): Index is the text of checkpoint.json, and
/// ReadData gives the bytes of the rank's data file, asked for only once the
/// index checks out. Dir names the checkpoint in messages.
llvm::Expected<CheckpointMeta>
readCheckpoint(llvm::StringRef Dir, llvm::StringRef Index,
               llvm::function_ref<llvm::Expected<llvm::StringRef>()> ReadData,
               llvm::StringRef PlanFingerprint,
               llvm::ArrayRef<TensorView> Tensors);

} // namespace sp

#endif // SP_RUNTIME_CHECKPOINT_H
