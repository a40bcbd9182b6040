//===- Checkpointing.cpp - Writing a run's checkpoint from every rank -----===//
//
// RankRun::writeCheckpointAt (RankRun.h): every rank writes its shard; rank
// 0 gathers their descriptions and commits the index (runtime/Checkpoint.h:
// atomically). A failure anywhere is every rank's AgreedError, and the
// checkpoint already in the directory stays as it was.
//
//===----------------------------------------------------------------------===//
#include "train/Agreement.h"
#include "train/RankRun.h"
#include "train/Stops.h"
#include "runtime/Checkpoint.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

Error RankRun::writeCheckpointAt(int64_t Step) {
  WritingScope Writing;
  Executor &E = *Exec;
  std::string Dir = O.checkpointDir();
  int Rank = World ? World->rank() : 0, Ranks = World ? World->size() : 1;
  auto Failed = [&](Error Err) -> Error {
    std::string Msg = toString(std::move(Err));
    Msg += SavedStep >= 0
               ? formatv("; '{0}' still holds the checkpoint of step {1}",
                         Dir, SavedStep)
                     .str()
               : "; no checkpoint was written";
    return make_error<AgreedError>(Msg);
  };
  std::string Mine;
  Error Local = E.download();
  auto Model = Local ? Expected<std::vector<Executor::ModelTensor>>(
                           std::vector<Executor::ModelTensor>())
                     : E.modelTensors();
  if (!Model && !Local)
    Local = Model.takeError();
  if (!Local) {
    auto Shard =
        writeCheckpointShard(Dir, Step, Rank, Ranks, checkpointTensors(),
                             *Model, foldContext(Groups.At, Grid));
    if (Shard)
      Mine = std::move(*Shard);
    else
      Local = Shard.takeError();
  }
  if (Error Err = agreeOnError(World, std::move(Local)))
    return Err.isA<AgreedError>() ? Failed(std::move(Err)) : std::move(Err);
  constexpr int ShardTag = 32001;
  auto Shards = gatherOnRankZero(World, std::move(Mine), ShardTag);
  if (!Shards)
    return Shards.takeError();
  auto Commit = [&]() -> Error {
    CheckpointMeta M;
    M.Step = Step;
    M.Seed = T.R.Seed;
    M.PlanFingerprint = T.R.Fingerprint;
    M.ModelFingerprint = T.R.ModelFingerprint;
    M.Grid = foldContext(Grid);
    M.Losses = Rows;
    M.Ranks = Ranks;
    if (const auto &LS = E.lossScaling()) {
      M.LossScale = LS->Scale;
      M.LossScaleGoodSteps = LS->GoodSteps;
    }
    M.SkippedUpdates = E.skippedUpdates();
    return commitCheckpoint(Dir, M, *Shards);
  };
  if (Error Err = agreeOnError(World, Rank == 0 ? Commit() : Error::success()))
    return Err.isA<AgreedError>() ? Failed(std::move(Err)) : std::move(Err);
  SavedStep = Step;
  noteSavedStep(Step);
  return Error::success();
}

} // namespace sp
