//===- Logs.cpp - A run's loss log, plot and report page ------------------===//
//
// The lead writes loss.csv and loss.svg (runtime/LossLog.h) into the log
// directory, atomically, and with --html the report page
// (html/HtmlReport.h): the plan's facts, the run's settings, the loss
// rows and chart so far, and the memory this rank measured.
//
//===----------------------------------------------------------------------===//
#include "train/RankRun.h"
#include "train/Stops.h"
#include "plan/AtomicFile.h"
#include "support/Format.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

Error RankRun::writeLogs() {
  if (!Lead)
    return Error::success();
  WritingScope Writing;
  std::string Dir = O.logDir();
  if (auto Err = makeDir(Dir, "--log-dir"))
    return Err;
  std::string Csv = lossCsv(Rows);
  if (auto Err = writeFileAtomically(Dir + "/loss.csv",
                                     [&](raw_ostream &OS) { OS << Csv; }))
    return Err;
  std::string Svg = lossSvg(Rows, ModelName + ": training loss");
  if (auto Err = writeFileAtomically(Dir + "/loss.svg",
                                     [&](raw_ostream &OS) { OS << Svg; }))
    return Err;
  return writePage(Svg);
}

/// --html: the page with the rows so far, their chart and the memory this
/// rank measured (once a step ran).
Error RankRun::writePage(StringRef LossSvg) {
  if (!WritesPage)
    return Error::success();
  Page.Loss.clear();
  for (const LossRow &R : Rows)
    Page.Loss.push_back({R.Step, R.Loss, R.ValLoss, R.LR, R.GradNorm,
                         R.TokensPerSecond, R.MFU});
  Page.LossChart = {LossSvg.str(),
                    "The training loss of every step, its moving average and "
                    "the validation loss (loss.svg; loss.csv holds the "
                    "numbers)."};
  const Executor &E = *Exec;
  MemoryStats M = E.memory();
  if (M.HighWaterBytes > 0) {
    ReportMeasuredMemory Got;
    Got.Rank = E.numStages() > 1 ? "rank 0 (the first pipeline stage)"
                                 : "rank 0";
    Got.ArenaBytes = M.ArenaBytes;
    Got.PlannedArenaBytes = P.Prog.ArenaBytes;
    Got.PersistentBytes = M.PersistentBytes;
    Got.HighWaterBytes = M.HighWaterBytes;
    Got.PeakLiveTempBytes = M.PeakLiveTempBytes;
    Got.StoredActivationBytes = M.StoredActivationBytes;
    for (auto &[Layer, Bytes] : M.StoredActivationBytesByLayer)
      Got.StoredBytesByLayer[Layer] = Bytes / E.microbatches();
    Page.Measured = Got;
  }
  return writeReportPage(O.HtmlPath, Page);
}

std::vector<std::pair<std::string, std::string>>
pageSettings(const TrainOptions &O, const ProcessGrid &G, bool ThreadRanks,
             uint64_t Seed) {
  std::vector<std::pair<std::string, std::string>> S = {
      {"steps", std::to_string(O.Steps)},
      {"learning rate", formatv("peak {0}, {1} warmup steps, cosine decay "
                                "to {2}",
                                sci(O.LR), O.Warmup, sci(O.minLR()))},
      {"seed", std::to_string(Seed)},
      {"training data", O.SyntheticData ? "synthetic" : O.DataFile}};
  if (!O.ValDataFile.empty())
    S.push_back({"validation data",
                 formatv("{0}: {1} batches every {2} steps and at the end",
                         O.ValDataFile, O.EvalSteps, O.evalEvery())});
  S.push_back({"ranks", formatv("{0} (d {1} x p {2} x t {3}){4}", G.size(),
                                G.Data, G.Pipeline, G.Tensor,
                                ThreadRanks ? ", threads of one process"
                                            : "")});
  S.push_back({"device", O.deviceName()});
  if (O.Resume)
    S.push_back({"resumed from", O.checkpointDir()});
  return S;
}

} // namespace sp
