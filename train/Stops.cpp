//===- Stops.cpp - Graceful stops on SIGINT and SIGTERM -------------------===//
//
// See Stops.h. The signal handler, the ranks and the watchdog share one
// StopState of atomics only.
//
//===----------------------------------------------------------------------===//
#include "train/Stops.h"
#include "llvm/Support/FormatVariadic.h"
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <optional>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace llvm;

namespace sp {

namespace {

/// What the signal handler, the ranks and the watchdog share. Atomics only
/// (lock-free, so the handler may touch them), constant-initialized and
/// trivially destroyed, so the watchdog may read them while the process
/// exits.
struct StopState {
  std::atomic<int> Signal{0};   // the first SIGINT/SIGTERM
  std::atomic<int> Count{0};    // how many arrived
  std::atomic<int> Writing{0};  // ranks writing a checkpoint or the logs
  std::atomic<int64_t> Step{0}; // the step running
  std::atomic<int64_t> SlowestStepMs{0};
  std::atomic<int64_t> SavedStep{-1}; // the checkpoint's step
};
StopState Stop;

extern "C" void onStopSignal(int Sig) {
  if (Stop.Count.fetch_add(1) == 0) {
    Stop.Signal.store(Sig);
    return;
  }
  // The second one: at once. Checkpoints commit with one rename, so
  // whatever is being written is either whole or not there.
  static const char Msg[] =
      "sp-run: second signal: exiting at once, without finishing the step "
      "(the last checkpoint stays whole)\n";
  (void)!::write(2, Msg, sizeof(Msg) - 1);
  ::_exit(128 + Sig);
}

} // namespace

const char *signalName(int Sig) {
  switch (Sig) {
  case SIGINT:
    return "SIGINT";
  case SIGTERM:
    return "SIGTERM";
  default:
    return "a signal";
  }
}

WritingScope::WritingScope() { Stop.Writing.fetch_add(1); }
WritingScope::~WritingScope() { Stop.Writing.fetch_sub(1); }

void noteStepRunning(int64_t Step) { Stop.Step.store(Step); }

void noteStepSeconds(double Seconds) {
  int64_t StepMs = int64_t(Seconds * 1000);
  for (int64_t Slowest = Stop.SlowestStepMs.load();
       StepMs > Slowest &&
       !Stop.SlowestStepMs.compare_exchange_weak(Slowest, StepMs);)
    ;
}

void noteSavedStep(int64_t Step) { Stop.SavedStep.store(Step); }

void installStopHandlers() {
  struct sigaction SA;
  std::memset(&SA, 0, sizeof(SA));
  SA.sa_handler = onStopSignal;
  sigemptyset(&SA.sa_mask);
  SA.sa_flags = SA_RESTART;
  sigaction(SIGINT, &SA, nullptr);
  sigaction(SIGTERM, &SA, nullptr);
}

int pendingStopSignal() { return Stop.Signal.load(); }

void startStopWatchdog(double MinGraceSeconds, std::string Label) {
  std::thread([MinGraceSeconds, Label] {
    using Clock = std::chrono::steady_clock;
    std::optional<Clock::time_point> Deadline;
    double Grace = MinGraceSeconds;
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      int Sig = Stop.Signal.load();
      if (!Sig)
        continue;
      auto Now = Clock::now();
      if (!Deadline || Stop.Writing.load() > 0) {
        Grace = std::max(MinGraceSeconds,
                         4 * double(Stop.SlowestStepMs.load()) / 1000.0);
        Deadline = Now + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(Grace));
      }
      if (Now < *Deadline)
        continue;
      int64_t Saved = Stop.SavedStep.load();
      std::string Line = formatv(
          "sp-run: {0}interrupted by {1}; step {2} did not finish within "
          "{3:F0} s of it (a rank is blocked in a collective: dead or "
          "stopped?); exiting without it; {4}\n",
          Label, signalName(Sig), Stop.Step.load(), Grace,
          Saved >= 0 ? formatv("the checkpoint holds step {0}", Saved).str()
                     : std::string("no checkpoint was written"));
      (void)!::write(2, Line.data(), Line.size());
      ::_exit(128 + Sig);
    }
  }).detach();
}

Expected<int> agreedStop(Communicator *World) {
  int64_t Mine = Stop.Signal.load();
  if (!World || World->size() == 1)
    return int(Mine);
  std::vector<int64_t> All(World->size());
  if (auto Err = World->allGather(All.data(), &Mine, 1, CommType::I64))
    return Err;
  for (int64_t S : All)
    if (S)
      return int(S);
  return 0;
}

} // namespace sp
