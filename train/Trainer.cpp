//===- Trainer.cpp - One training, evaluation or sampling run of a plan ---===//
//
// See Trainer.h. runRank is the order of the steps; RankRun.h says where
// each step is.
//
//===----------------------------------------------------------------------===//
#include "train/Trainer.h"
#include "train/DirectoryLock.h"
#include "train/RankRun.h"
#include "train/Stops.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

ProcessGrid planGrid(const Plan &P) {
  ProcessGrid G;
  G.Pipeline = P.numStages();
  G.Tensor = P.Manifest.value("tp", 1);
  G.Data = P.Manifest.value("dp", 1);
  G.Context = P.Manifest.value("cp", 1);
  return G;
}

bool isPipelined(const Plan &P) {
  return P.numStages() > 1 || P.Manifest.value("microbatches", 1) > 1;
}

Error makeDir(StringRef Dir, StringRef Flag) {
  if (sys::fs::exists(Dir) && !sys::fs::is_directory(Dir))
    return usageError(Flag + " '" + Dir + "' exists and is not a directory");
  if (std::error_code EC = sys::fs::create_directories(Dir))
    return createStringError(EC, "cannot create '%s': %s", Dir.str().c_str(),
                             EC.message().c_str());
  return Error::success();
}

/// The registry's entry of a validated --device.
static const BackendEntry &deviceEntry(const TrainOptions &O) {
  const BackendEntry *E = BackendRegistry::instance().find(O.deviceName());
  assert(E && "TrainOptions::validate checks --device");
  return *E;
}

Trainer::Trainer(const TrainOptions &O, const PreparedRun &R,
                 int ThreadsPerRank, bool ThreadRanks)
    : O(O), R(R), P(R.P), Device(deviceEntry(O)), Grid(planGrid(R.P)),
      ThreadsPerRank(ThreadsPerRank), ThreadRanks(ThreadRanks) {}

Trainer::~Trainer() = default;

std::string Trainer::stopMessage() const {
  int Sig = StopSignal.load();
  if (!Sig)
    return "";
  if (O.Eval)
    return formatv("interrupted by {0} after batch {1} of {2}; no mean loss",
                   signalName(Sig), StopStep.load(), O.Steps)
        .str();
  int64_t Saved = SavedStep.load(), Last = StopStep.load();
  std::string Dir = O.checkpointDir(), What;
  if (Saved >= 0 && Saved == Last)
    What = formatv("{0} checkpoint '{1}' (step {2}); continue with --resume",
                   SavedOnExit.load() ? "wrote" : "the last step is in", Dir,
                   Saved)
               .str();
  else if (Saved >= 0)
    What = formatv("checkpoint '{0}' holds step {1} (--checkpoint-on-exit "
                   "saves the last step); continue with --resume",
                   Dir, Saved)
               .str();
  else
    What = "no checkpoint (--checkpoint-on-exit saves one)";
  return formatv("interrupted by {0} after step {1} of {2}; {3}",
                 signalName(Sig), StopStep.load(), O.Steps, What)
      .str();
}

/// A null stream of this thread's own (llvm::nulls() is one buffered stream for the process, and thread
/// ranks writing into it at once race on its buffer: TSan found the
/// progress bar's writes at t = 4 corrupting the heap).
raw_ostream &nowhere() {
  thread_local raw_null_ostream Nowhere;
  return Nowhere;
}

RankRun::RankRun(Trainer &T, Communicator *World)
    : T(T), O(T.O), P(T.P), Grid(T.Grid), World(World),
      Lead(!World || World->rank() == 0),
      Out(Lead ? static_cast<raw_ostream &>(outs()) : nowhere()) {}

std::vector<TensorView> RankRun::checkpointTensors() const {
  std::vector<TensorView> All = Exec->parameters();
  for (TensorView &S : Exec->optimizerState())
    All.push_back(std::move(S));
  return All;
}

void RankRun::markStopped(int64_t Last, int Sig) {
  T.SavedStep.store(SavedStep);
  T.StopStep.store(Last);
  T.StopSignal.store(Sig);
  Stopped = true;
}

void RankRun::markSavedOnExit() { T.SavedOnExit.store(true); }

Error Trainer::runRank(Communicator *World) {
  RankRun Run(*this, World);
  if (Error E = Run.setUp())
    return E;
  if (Error E = Run.lockDirectories())
    return E;
  if (Error E = Run.restore())
    return E;
  if (O.sampling())
    return Run.generate();
  // From here on, files are written.
  if (Error E = Run.dumpFirstLogits())
    return E;
  if (O.Eval)
    return Run.evaluate();
  if (Error E = Run.measureThroughput())
    return E;
  Run.announce();
  if (Error E = Run.train())
    return E;
  if (Run.stopped())
    return Error::success();
  return Run.finish();
}

} // namespace sp
