//===- TrainLoop.cpp - The steps of a training or evaluation run ----------===//
//
// RankRun::evaluate (--eval: the mean loss over --steps batches, forward
// only) and RankRun::train: each step's batch and learning rate, the
// update, its row of the loss log (throughput, MFU, validation), the
// progress line, the first step's gradient dumps, periodic checkpoints and
// logs; a stop signal ends the loop after the same step on every rank.
//
//===----------------------------------------------------------------------===//
#include "train/RankRun.h"
#include "train/Stops.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"
#include <chrono>

using namespace llvm;

namespace sp {

namespace {
using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point Start) {
  return std::chrono::duration<double>(Clock::now() - Start).count();
}
} // namespace

Error RankRun::evaluate() {
  Executor &E = *Exec;
  double Sum = 0;
  auto Start = Clock::now();
  for (int64_t Step = 1; Step <= O.Steps; ++Step) {
    auto Sig = agreedStop(World);
    if (!Sig)
      return Sig.takeError();
    if (*Sig) {
      markStopped(Step - 1, *Sig);
      return Error::success();
    }
    Data->getBatch(Step, Batch);
    auto L = E.evalLoss(Batch);
    if (!L)
      return L.takeError();
    Sum += *L;
  }
  double Seconds = secondsSince(Start);
  Out << formatv(
      "eval: mean loss {0:F4} over {1} batches of {2} x {3} "
      "tokens ({4} tok/s)\n",
      Sum / double(O.Steps), O.Steps, E.batch(), E.seq(),
      groupThousands(int64_t(std::llround(double(TokensPerStep * O.Steps) /
                                          std::max(Seconds, 1e-9)))));
  printMemory(Out, P, E.memory());
  if (!O.DumpDir.empty())
    if (auto Err = writeMemory(O.DumpDir))
      return Err;
  return Error::success();
}

namespace {

/// The loop's own state: the progress line, the validation batch, when
/// the logs were last written.
struct Loop {
  RankRun &R;
  ProgressBar Progress;
  TokenBatch ValBatch;
  Clock::time_point LastLogWrite = Clock::now();

  /// The mean loss of the validation batches (every rank takes part).
  Expected<double> validate() {
    double Sum = 0;
    for (int64_t K = 1; K <= R.O.EvalSteps; ++K) {
      R.ValData->getBatch(K, ValBatch);
      auto L = R.Exec->evalLoss(ValBatch);
      if (!L)
        return L.takeError();
      Sum += *L;
    }
    return Sum / double(R.O.EvalSteps);
  }
  /// Err, after the logs of the steps so far are written.
  Error failAfterLogs(Error Err) {
    Progress.finish();
    consumeError(R.writeLogs()); // keep what the run got to
    return Err;
  }
  /// Stops after the step before Step on signal Sig (saved first with
  /// --checkpoint-on-exit).
  Error stop(int64_t Step, int Sig);
  /// Trains step Step.
  Error step(int64_t Step);
  /// The first step's gradients (--dump).
  Error dumpGradients();
};

} // namespace

Error Loop::stop(int64_t Step, int Sig) {
  Progress.finish();
  int64_t Last = Step - 1;
  if (R.O.CheckpointOnExit && Last >= R.FirstStep && R.SavedStep != Last) {
    if (auto Err = R.writeCheckpointAt(Last))
      return failAfterLogs(std::move(Err));
    R.markSavedOnExit();
  }
  R.Page.RunStatus = formatv("stopped by {0} after step {1} of {2}",
                             signalName(Sig), Last, R.O.Steps);
  if (Last >= R.FirstStep)
    if (auto Err = R.writeLogs())
      return Err;
  R.markStopped(Last, Sig);
  return Error::success();
}

Error Loop::dumpGradients() {
  Executor &E = *R.Exec;
  if (auto Err = E.download())
    return Err;
  std::vector<TensorView> Grads;
  for (const TensorView &Param : E.parameters()) {
    if (StringRef(Param.Name).contains('@'))
      continue; // a copy of another stage's weight
    auto G = E.gradient(Param.Name);
    if (!G)
      return usageError("the plan exposes no gradient of parameter '" +
                        Param.Name + "'");
    G->Name = Param.Name;
    Grads.push_back(*G);
  }
  return R.dumpTensors(R.O.DumpDir + "/grads", Grads);
}

Error Loop::step(int64_t Step) {
  const TrainOptions &O = R.O;
  Executor &E = *R.Exec;
  noteStepRunning(Step);
  double StepLR = learningRate(Step, O.Steps, O.Warmup, O.LR, O.minLR());
  R.Data->getBatch(Step, R.Batch);
  auto Start = Clock::now();
  double ScaleBefore = E.lossScaling() ? E.lossScaling()->Scale : 1;
  auto L = E.trainStep(R.Batch, StepLR, Step);
  double StepSeconds = secondsSince(Start);
  R.TrainSeconds += StepSeconds;
  noteStepSeconds(StepSeconds);
  if (!L)
    return failAfterLogs(
        usageError(formatv("step {0}: {1}", Step, toString(L.takeError()))));
  if (E.lastStepSkipped() && R.Lead) {
    // fp16: the scaled gradients overflowed; nothing was updated.
    R.Out << formatv("step {0}: gradients overflowed at loss scale 2^{1}; "
                     "update skipped, loss scale now 2^{2}\n",
                     Step, std::ilogb(ScaleBefore),
                     std::ilogb(E.lossScaling()->Scale));
    R.Out.flush();
  }
  if (E.lastStepSkipped() && ScaleBefore <= 1)
    return failAfterLogs(usageError(formatv(
        "step {0}: the gradients overflow fp16 even at loss scale 1 (or "
        "the forward does); train this model with --dtype bf16 or fp32",
        Step)));
  if (!std::isfinite(*L) && !E.lastStepSkipped())
    return failAfterLogs(usageError(
        formatv("step {0}: the loss is {1}; try a lower --lr (now {2})", Step,
                *L, O.LR)));
  LossRow Row{Step, *L, StepLR};
  Row.GradNorm = E.lastGradNorm();
  Row.TokensPerSecond =
      double(R.TokensPerStep) / std::max(StepSeconds, 1e-9);
  Row.FlopsPerSecond = R.ModelFlopsPerStep / std::max(StepSeconds, 1e-9);
  if (R.JobPeak > 0)
    Row.MFU = Row.FlopsPerSecond / R.JobPeak;
  if (Step == R.FirstStep)
    R.FirstStepTime = E.timing(); // page faults and warm caches
  if (R.ValData && (Step % O.evalEvery() == 0 || Step == O.Steps)) {
    auto V = validate();
    if (!V)
      return failAfterLogs(usageError(
          formatv("step {0}: validation: {1}", Step, toString(V.takeError()))));
    Row.ValLoss = *V;
  }
  R.Rows.push_back(Row);
  Progress.update(O.Steps, Row, R.FirstStep);
  if (std::isfinite(Row.ValLoss))
    Progress.note(formatv("step {0}: validation loss {1:F4} (training {2:F4}"
                          ")",
                          Step, Row.ValLoss, *L)
                      .str());
  if (!O.DumpDir.empty() && Step == R.FirstStep)
    if (auto Err = dumpGradients())
      return failAfterLogs(std::move(Err));
  bool Periodic = O.CheckpointEvery && Step % O.CheckpointEvery == 0;
  if (O.CheckpointEvery && (Periodic || Step == O.Steps))
    if (auto Err = R.writeCheckpointAt(Step))
      return failAfterLogs(std::move(Err));
  auto Now = Clock::now();
  if (Step == O.Steps || Periodic ||
      Now - LastLogWrite > std::chrono::seconds(30)) {
    if (auto Err = R.writeLogs())
      return failAfterLogs(std::move(Err));
    LastLogWrite = Now;
  }
  return Error::success();
}

Error RankRun::train() {
  raw_ostream &Progress = Lead ? static_cast<raw_ostream &>(errs()) : nowhere();
  Loop L{*this, ProgressBar(Progress, Lead && errs().is_displayed(),
                            O.LogEvery),
         TokenBatch()};
  for (int64_t Step = FirstStep; Step <= O.Steps; ++Step) {
    // A signal: every rank stops here, after the same step; with
    // --checkpoint-on-exit they save it first.
    auto Sig = agreedStop(World);
    if (!Sig)
      return L.failAfterLogs(Sig.takeError());
    if (*Sig)
      return L.stop(Step, *Sig);
    if (auto Err = L.step(Step))
      return Err;
  }
  L.Progress.finish();
  return Error::success();
}

} // namespace sp
