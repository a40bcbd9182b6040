//===- RankSetUp.cpp - A rank's groups, backend, data and checkpoint ------===//
//
// The first steps of Trainer::runRank (RankRun.h): split the world into the
// rank's groups, make its backend from the registry's entry of --device and
// the executor over it, open the data by the objective; lock the directories
// the run writes; restore the checkpoint it loads.
//
//===----------------------------------------------------------------------===//
#include "train/Agreement.h"
#include "train/DirectoryLock.h"
#include "train/RankRun.h"
#include "train/Stops.h"
#include "runtime/Checkpoint.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <tuple>

using namespace llvm;

namespace sp {

Error RankRun::setUp() {
  if (World) {
    auto G = splitGroups(*World, Grid);
    if (!G)
      return G.takeError();
    Groups = std::move(*G);
  }
  Communicator *C = Groups.Tensor.get();
  RunOptions RO;
  RO.Comm = C;
  RO.PipeComm = Groups.Pipeline.get();
  RO.DataComm = Groups.Data.get();
  RO.ContextComm = Groups.Context.get();
  RO.Trace = !O.TraceFile.empty();
  RO.ExpandCompact = O.ExpandSteps;
  RO.Seed = T.R.Seed;
  RO.Dropout = O.dropout();
  RO.AllowFloat64 = O.Float64;

  // Every rank makes its backend (perhaps a collective: a GPU backend's
  // communicators per group), and a failure on one is every rank's.
  Context.DeviceIndex = BackendRegistry::instance().parseDevice(O.Device)
                            ->Index; // checked by TrainOptions::validate
  Context.ThreadRanks = T.ThreadRanks;
  Context.World = World;
  Context.Tensor = Groups.Tensor.get();
  Context.Pipeline = Groups.Pipeline.get();
  Context.Data = Groups.Data.get();
  Context.Context = Groups.Context.get();
  Context.Flags = O.BackendFlags;
  Communicator *W = World;
  Context.AgreeBeforeCollectives = [W](Error Own) {
    return agreeOnError(W, std::move(Own));
  };
  std::unique_ptr<Backend> Made;
  Error Err = [&]() -> Error {
    auto B = T.Device.Create(Context);
    if (!B)
      return B.takeError();
    Made = std::move(*B);
    return Error::success();
  }();
  if (Error E = agreeOnError(World, std::move(Err)))
    return E;
  RO.MakeBackend = [&Made] { return std::move(Made); };
  auto Created = Executor::create(P, RO);
  if (!Created)
    return Created.takeError();
  Exec = std::move(*Created);
  Executor &E = *Exec;

  if (auto Err = checkObjective(T.R.Obj, E.vocab()))
    return usageError(toString(std::move(Err)));
  if (O.SyntheticData || O.sampling()) { // sampling reads no data
    Data = DataLoader::synthetic(T.R.Seed, E.batch(), E.seq(), E.vocab());
  } else {
    auto D = DataLoader::open(O.DataFile, E.batch(), E.seq(), E.vocab());
    if (!D)
      return D.takeError();
    Data = std::move(*D);
  }
  Data->setShuffle(O.Shuffle, T.R.Seed);
  Data->setObjective(T.R.Obj);
  Data->setDataParallel(Groups.At.Data, Grid.Data);
  // The held-out batches: read in order, the same ones at every
  // validation, each replica its rows of them.
  if (!O.ValDataFile.empty()) {
    auto D = DataLoader::open(O.ValDataFile, E.batch(), E.seq(), E.vocab());
    if (!D)
      return usageError("--val-data: " + toString(D.takeError()));
    ValData = std::move(*D);
    ValData->setObjective(T.R.Obj);
    ValData->setDataParallel(Groups.At.Data, Grid.Data);
  }

  ModelName =
      sys::path::stem(P.Manifest.value("source", std::string("model"))).str();
  // The first tensor-parallel rank of each stage of the first replica
  // (replicas, and the context ranks of one, hold the same parameters).
  StageLead =
      (!C || C->rank() == 0) && Groups.At.Data == 0 && Groups.At.Context == 0;
  TokensPerStep = E.batch() * E.seq() * Grid.Data; // every replica
  if (Lead && !O.HtmlPath.empty()) {
    WritesPage = true;
    Page = planReportPage(P.Manifest, O.PlanDir);
    Page.CommandLine = O.CommandLine;
    Page.Steps = O.Steps;
    Page.RunSettings = pageSettings(O, Grid, T.ThreadRanks, T.R.Seed);
  }
  return Error::success();
}

/// Removes what a killed run left in Dir by writeFileAtomically (the logs'
/// temporaries, ".loss.csv.tmp-XXXXXX").
static void removeLogTemporaries(StringRef Dir) {
  std::error_code EC;
  std::vector<std::string> Doomed;
  for (sys::fs::directory_iterator I(Dir, EC), End; I != End && !EC;
       I.increment(EC)) {
    StringRef Name = sys::path::filename(I->path());
    if (Name.startswith(".loss.csv.tmp-") || Name.startswith(".loss.svg.tmp-"))
      Doomed.push_back(I->path());
  }
  for (const std::string &Path : Doomed)
    sys::fs::remove(Path);
}

Error RankRun::lockDirectories() {
  // The directories this run writes: rank 0 locks them for the whole run
  // (another sp-run writing them is refused) and removes what a killed run
  // left there.
  bool WritesCheckpoints =
      O.trains() && (O.CheckpointEvery > 0 || O.CheckpointOnExit);
  bool WritesLogs = O.trains();
  auto LockAndClean = [&]() -> Error {
    std::vector<std::tuple<std::string, const char *, const char *>> Dirs;
    if (WritesCheckpoints)
      Dirs.emplace_back(O.checkpointDir(), "checkpoint directory",
                        "--checkpoint DIR");
    if (WritesLogs)
      Dirs.emplace_back(O.logDir(), "log directory", "--log-dir DIR");
    std::vector<std::string> Held; // real paths: one directory, one lock
    for (auto &[Dir, What, Flag] : Dirs) {
      SmallString<256> Real;
      if (!sys::fs::real_path(Dir, Real) && is_contained(Held, Real.str()))
        continue;
      auto L = lockDirectory(Dir, What, Flag);
      if (!L)
        return L.takeError();
      T.Locks.push_back(std::move(*L));
      if (!sys::fs::real_path(Dir, Real))
        Held.push_back(Real.str().str());
    }
    if (WritesCheckpoints)
      if (auto Removed = cleanCheckpointDir(O.checkpointDir()); !Removed)
        consumeError(Removed.takeError()); // a bad index: --resume says so
    if (WritesLogs)
      removeLogTemporaries(O.logDir());
    return Error::success();
  };
  if (Error Err =
          agreeOnError(World, Lead ? LockAndClean() : Error::success())) {
    discardLocks();
    return Err;
  }
  return Error::success();
}

void RankRun::discardLocks() {
  // A run refused before it writes anything (a locked directory, a
  // checkpoint that cannot be restored) leaves no directory or lock file
  // that taking the locks created. The locks are the lead's (Locks is
  // shared by the thread ranks).
  if (!Lead)
    return;
  for (auto &L : T.Locks)
    L->discard();
  T.Locks.clear();
}

Error RankRun::restore() {
  const std::optional<CheckpointMeta> &Resumed = T.R.Resumed;
  if (Resumed) {
    Executor &E = *Exec;
    // Each rank restores its own part; a failure on one is every rank's.
    std::optional<CheckpointMeta> M;
    Error Restored = [&]() -> Error {
      std::vector<TensorView> Tensors = checkpointTensors();
      Expected<CheckpointMeta> Read = CheckpointMeta();
      if (Resumed->PlanFingerprint == T.R.Fingerprint) {
        Read = readCheckpoint(O.checkpointDir(), T.R.Fingerprint, Tensors,
                              World ? World->rank() : 0,
                              World ? World->size() : 1);
      } else {
        // Another layout of the same model: reshard (prepareRun checked
        // the model's fingerprint).
        auto Model = E.modelTensors();
        if (!Model)
          return Model.takeError();
        Read = readCheckpointResharded(O.checkpointDir(), T.R.ModelFingerprint,
                                       Tensors, *Model,
                                       foldContext(Groups.At, Grid));
      }
      if (!Read)
        return Read.takeError();
      M = std::move(*Read);
      return E.upload(); // the restored views, to the backend
    }();
    if (Error Err = agreeOnError(World, std::move(Restored))) {
      discardLocks();
      return Err;
    }
    // The optimizer's count and fp16's loss scale go on (a checkpoint of a
    // plan without loss scaling leaves this plan's initial scale).
    E.restoreSkippedUpdates(M->SkippedUpdates);
    if (M->LossScale)
      E.restoreLossScaling(*M->LossScale, M->LossScaleGoodSteps);
    if (O.Resume) {
      FirstStep = M->Step + 1;
      SavedStep = M->Step;
      for (const LossRow &Row : M->Losses)
        if (Row.Step <= M->Step)
          Rows.push_back(Row);
    }
  }
  T.SavedStep.store(SavedStep);
  noteSavedStep(SavedStep);
  return Error::success();
}

} // namespace sp
