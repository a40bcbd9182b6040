//===- Stops.h - Graceful stops on SIGINT and SIGTERM -----------*- C++ -*-===//
//
// installStopHandlers makes SIGINT and SIGTERM only record the signal
// (async-signal-safe); a second one exits at once with 128 + the signal
// (whatever is being written stays whole: checkpoints commit atomically).
// The Trainer checks the record between steps: the ranks agree on it with a
// collective (agreedStop), so they all stop after the same step; with
// --checkpoint-on-exit they save that step, then the run ends and sp-run
// exits with 128 + the signal (130, 143) and one line.
//
// The watchdog keeps a stop prompt when a step cannot finish (a rank blocked
// in a collective on a dead or stopped peer). It reads what the ranks record
// here: the step running, the slowest step so far, the step the checkpoint
// holds, and whether files are being written (WritingScope).
//
//===----------------------------------------------------------------------===//
#ifndef SP_TRAIN_STOPS_H
#define SP_TRAIN_STOPS_H

#include "runtime/comm/Communicator.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <string>

namespace sp {

void installStopHandlers();
/// The signal that asked the run to stop, or 0.
int pendingStopSignal();
/// "SIGINT", "SIGTERM", or "a signal".
const char *signalName(int Sig);

/// Starts the thread that keeps a stop prompt: once a stop was asked, a step
/// still running after max(MinGraceSeconds, 4 x the slowest step so far) is
/// abandoned: the process prints one line (Label first: "rank 3: " under
/// MPI) and exits with 128 + the signal. Checkpoint and log writes in
/// progress are let finish.
void startStopWatchdog(double MinGraceSeconds, std::string Label);

/// The first stop signal any rank of World has seen (0: none), the same on
/// every rank: they stop after the same step. A collective.
llvm::Expected<int> agreedStop(Communicator *World);

/// What the ranks tell the watchdog: the step running, a step's duration
/// (the slowest is kept), and the step the last checkpoint holds.
void noteStepRunning(int64_t Step);
void noteStepSeconds(double Seconds);
void noteSavedStep(int64_t Step);

/// Counts a rank as writing files (checkpoint, logs) while it lives: the
/// watchdog lets that finish.
struct WritingScope {
  WritingScope();
  ~WritingScope();
  WritingScope(const WritingScope &) = delete;
  WritingScope &operator=(const WritingScope &) = delete;
};

} // namespace sp

#endif // SP_TRAIN_STOPS_H
