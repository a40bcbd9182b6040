//===- Launch.cpp - A run on every rank of its plan's grid ----------------===//
//
// See Launch.h. Under MPI an error every rank agreed on (AgreedError) is
// reported once by rank 0 and every rank exits 1; any other error aborts
// the job. Thread ranks report an agreed error once.
//
//===----------------------------------------------------------------------===//
#include "train/Launch.h"
#include "train/Agreement.h"
#include "train/Prepare.h"
#include "train/Stops.h"
#include "train/Trainer.h"
#include "frontend/OnnxImporter.h"
#include "runtime/BackendRegistry.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"
#include <mutex>
#include <thread>

using namespace llvm;

namespace sp {

namespace {

/// A step blocked on a dead or stopped rank must not hold a stop up.
constexpr double MinStopGraceSeconds = 10;

/// The ranks of one run, and how it ended.
struct Launch {
  const TrainOptions &O;
  StringRef Tool;
  Trainer &T;
  int Ranks;

  int fail(Error E) const { return reportError(Tool, std::move(E)); }
  Error body(Communicator *World) const {
    if (World) // the groups split from it inherit it
      World->setTimeout(std::chrono::milliseconds(
          std::max<int64_t>(1, int64_t(O.CommTimeout * 1000))));
    return T.runRank(World);
  }
  /// How a run that ended without an error stopped: 0, or 128 + the signal
  /// with one line (when Print).
  int finished(bool Print) const {
    if (!T.stoppedBy())
      return 0;
    if (Print) {
      errs() << Tool << ": " << T.stopMessage() << "\n";
      errs().flush();
    }
    return 128 + T.stoppedBy();
  }
  int overMpi(int *Argc, char ***Argv, const ProcessGrid &Grid) const;
  int overThreads() const;
};

} // namespace

int Launch::overMpi(int *Argc, char ***Argv, const ProcessGrid &Grid) const {
  auto C = createMpiCommunicator(Argc, Argv);
  if (!C)
    return fail(C.takeError());
  // Every rank sees the mismatch: report it once and exit cleanly.
  if ((*C)->size() != Ranks) {
    if ((*C)->rank() == 0)
      fail(usageError(formatv(
          "the plan was compiled for {0}--tp {1} and --pp {2}; run it with "
          "mpirun -np {3} (got {4} processes)",
          Grid.Data > 1 ? formatv("--dp {0}, ", Grid.Data).str() : "",
          Grid.Tensor, Grid.Pipeline, Ranks, (*C)->size())));
    return 1;
  }
  installStopHandlers(); // after MPI_Init, which may set its own
  startStopWatchdog(MinStopGraceSeconds,
                    formatv("rank {0}: ", (*C)->rank()).str());
  bool Lead = (*C)->rank() == 0;
  if (auto Err = body(C->get())) {
    // An error every rank agreed on: each exits; rank 0 says why.
    if (Err.isA<AgreedError>()) {
      if (Lead)
        return fail(std::move(Err));
      consumeError(std::move(Err));
      return 1;
    }
    (*C)->abort(toString(std::move(Err)));
    return 1;
  }
  return finished(Lead);
}

int Launch::overThreads() const {
  installStopHandlers();
  startStopWatchdog(MinStopGraceSeconds, "");
  if (Ranks == 1) {
    if (auto Err = body(nullptr))
      return fail(std::move(Err));
    return finished(true);
  }
  // Thread ranks: an agreed error is every rank's; report it once.
  std::mutex AgreedMutex;
  std::optional<std::string> Agreed;
  if (auto Err = runOnThreadRanks(Ranks, [&](Communicator &C) -> Error {
        Error E = body(&C);
        return handleErrors(std::move(E), [&](const AgreedError &A) {
          std::lock_guard<std::mutex> Lock(AgreedMutex);
          Agreed = A.text();
        });
      }))
    return fail(std::move(Err));
  if (Agreed)
    return fail(usageError(*Agreed));
  return finished(true);
}

int runTraining(const TrainOptions &O, StringRef Tool, int *Argc,
                char ***Argv) {
  auto Fail = [&](Error E) { return reportError(Tool, std::move(E)); };
  if (auto E = O.validate())
    return Fail(std::move(E));
  const BackendRegistry &Registry = BackendRegistry::instance();
  const BackendEntry &Device = *Registry.find(O.deviceName());
  // Before anything is read or written: a device this process can use.
  if (Device.CheckAvailable)
    if (auto E = Device.CheckAvailable())
      return Fail(std::move(E));
  auto R = prepareRun(O);
  if (!R)
    return Fail(R.takeError());

  registerOnnxDataLoader();
  ProcessGrid Grid = planGrid(R->P);
  int Ranks = Grid.size();
  int Threads = O.Threads
                    ? O.Threads
                    : int(std::max(1u, std::thread::hardware_concurrency()));
  if (Ranks > 1)
    Threads = std::max(1, Threads / Ranks); // threads per rank
  Registry.setThreads(Threads);

  bool Mpi = O.Comm == "mpi";
  Trainer T(O, *R, Threads, !Mpi && Ranks > 1);
  Launch L{O, Tool, T, Ranks};
  return Mpi ? L.overMpi(Argc, Argv, Grid) : L.overThreads();
}

} // namespace sp
