//===- Prepare.h - A run's plan and files, checked before it starts -*- C++ -*-===//
//
// What a run needs besides its options, read and checked before any rank
// starts and before anything is written: the plan (widened for --float64),
// the checkpoint it loads, the seed it runs with (a resumed run keeps its
// checkpoint's), the objective, the model --export-onnx copies, and that
// every output can be written. A bad run fails here with one line, leaving
// existing files alone.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TRAIN_PREPARE_H
#define SP_TRAIN_PREPARE_H

#include "plan/Plan.h"
#include "runtime/Checkpoint.h"
#include "runtime/DataLoader.h"
#include "text/BpeTokenizer.h"
#include "train/TrainOptions.h"
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sp {

struct PreparedRun {
  Plan P;
  /// The run's seed, and the objective with it.
  uint64_t Seed = 0;
  Objective Obj;
  /// The checkpoint loaded (to resume, or to evaluate or sample from).
  std::optional<CheckpointMeta> Resumed;
  /// Of the plan and of its model, for checkpoints.
  std::string Fingerprint, ModelFingerprint;
  /// The source model --export-onnx copies (empty without it).
  std::string Source;
  /// --sample: the prompt's token ids, and the tokenizer that made them
  /// (null: bytes).
  std::vector<int64_t> PromptIds;
  std::shared_ptr<const BpeTokenizer> Tokenizer;
};

/// Reads and checks the plan and the files O names (O is validated).
llvm::Expected<PreparedRun> prepareRun(const TrainOptions &O);

} // namespace sp

#endif // SP_TRAIN_PREPARE_H
