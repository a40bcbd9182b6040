//===- Checkpoint.h - Training checkpoints ---------------------*- C++ -*-===//
//
// A checkpoint is a directory:
//   DIR/checkpoint.json  the index: format and version, step, seed, the plan
//                        fingerprint, the loss history, and for every tensor
//                        its name, kind, shape, byte offset, byte size and
//                        CRC-32; the index carries a CRC-32 of itself
//   DIR/tensors.bin      every tensor as raw little-endian float32, back to
//                        back in index order
// It holds every parameter and AdamW moment (Executor::parameters() and
// optimizerState()), which with the step and the seed is all the state a
// run has: data offsets and dropout masks are functions of (seed, step).
//
// Writing goes through a temporary directory beside DIR that is renamed into
// place (the old checkpoint is moved aside first and removed last), so a
// crash leaves either the old or the new checkpoint whole. Reading checks
// everything (index checksum, plan fingerprint, names and shapes, file size,
// each tensor's checksum) before it writes a single value back into the
// executor, so a corrupt checkpoint changes nothing.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CHECKPOINT_H
#define SP_RUNTIME_CHECKPOINT_H

#include "runtime/Executor.h"
#include "runtime/LossLog.h"
#include "plan/Program.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"
#include <string>
#include <vector>

namespace sp {

constexpr int CheckpointFormatVersion = 1;

/// A hash (FNV-1a 64, hex) of what makes two plans interchangeable for a
/// checkpoint: every buffer's name, kind, dtype and shape, and every
/// instruction (op, operands, attributes). Memory offsets and weight paths
/// do not count.
std::string planFingerprint(const Program &P);

struct CheckpointMeta {
  int64_t Step = 0;  // the last completed step
  uint64_t Seed = 0; // the run's seed
  std::string PlanFingerprint;
  std::vector<LossRow> Losses; // the run's history up to Step
};

/// True if Dir holds a checkpoint index.
bool checkpointExists(llvm::StringRef Dir);

/// Fails if writing a checkpoint to Dir would overwrite something else: Dir
/// exists and is neither a checkpoint nor an empty directory.
llvm::Error checkCheckpointTarget(llvm::StringRef Dir);

/// Writes Tensors and Meta to Dir atomically. An existing Dir that is not a
/// checkpoint (and not empty) is refused.
llvm::Error writeCheckpoint(llvm::StringRef Dir, const CheckpointMeta &Meta,
                            llvm::ArrayRef<TensorView> Tensors);

/// Reads and verifies the index of the checkpoint in Dir (not the tensors):
/// what a run needs to know before it creates its executor (the seed).
llvm::Expected<CheckpointMeta> readCheckpointMeta(llvm::StringRef Dir);

/// Reads the checkpoint in Dir, verifies it against the plan's fingerprint
/// and the tensors' names and shapes, and copies the values into Tensors.
/// Errors: "checkpoint 'DIR' is corrupt: ...", "checkpoint 'DIR' was written
/// for another plan ...", "checkpoint 'DIR' does not match the plan: ...".
llvm::Expected<CheckpointMeta>
readCheckpoint(llvm::StringRef Dir, llvm::StringRef PlanFingerprint,
               llvm::ArrayRef<TensorView> Tensors);

/// readCheckpoint on contents read elsewhere (the fuzzer reads checkpoints
/// from memory): Index is the text of checkpoint.json, and ReadData gives
/// the bytes of tensors.bin, asked for only once the index checks out. Dir
/// names the checkpoint in messages.
llvm::Expected<CheckpointMeta>
readCheckpoint(llvm::StringRef Dir, llvm::StringRef Index,
               llvm::function_ref<llvm::Expected<llvm::StringRef>()> ReadData,
               llvm::StringRef PlanFingerprint,
               llvm::ArrayRef<TensorView> Tensors);

} // namespace sp

#endif // SP_RUNTIME_CHECKPOINT_H
