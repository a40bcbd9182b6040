//===- Announce.cpp - A training run's throughput basis and header --------===//
//
// Before the first step: the model FLOPs of one step of the whole job and
// the job's peak FLOP/s (the MFU's denominator), then the header the lead
// prints: what is trained and how, the backend's notes (runtime/
// BackendRegistry.h: how it computes a 16-bit plan, its attention core,
// a slow BLAS core), a resharded checkpoint, the FLOPs and the validation.
//
//===----------------------------------------------------------------------===//
#include "train/RankRun.h"
#include "support/Format.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

// The model FLOPs of one step of the whole job (forward and backward of
// every replica, recomputation not counted: the paper's "model FLOPs"),
// from the plan's FLOP report; the job's peak, from --peak-flops (per rank)
// or the backends' (a backend whose peak is the process's, as the CPU's,
// is measured once by its thread ranks). A collective: every rank takes
// part.
Error RankRun::measureThroughput() {
  if (auto F = P.Manifest.find("flops");
      F != P.Manifest.end() && F->is_object()) {
    auto M = F->find("model_flops_per_iteration");
    if (M != F->end() && M->is_number())
      ModelFlopsPerStep = M->get<double>() * Grid.Data;
  }
  int WorldSize = World ? World->size() : 1;
  if (auto Peak = O.peakFlops()) {
    JobPeak = *Peak * WorldSize;
    PeakSource = formatv("--peak-flops {0} x {1} rank{2}", flopRate(*Peak),
                         WorldSize, WorldSize > 1 ? "s" : "")
                     .str();
    return Error::success();
  }
  bool Measures = !T.Device.PeakIsPerProcess || !T.ThreadRanks || !World ||
                  World->rank() == 0;
  double Mine = Measures ? Exec->peakFlops() : 0;
  double Sums[2] = {Mine, Measures && !(Mine > 0) ? 1.0 : 0.0};
  if (World)
    if (auto Err = World->allReduceSum(Sums, 2))
      return Err;
  if (Sums[1] == 0)
    JobPeak = Sums[0];
  PeakSource = T.Device.PeakSource;
  return Error::success();
}

void RankRun::announce() {
  const Executor &E = *Exec;
  std::string Layout;
  if (Grid.size() > 1)
    Layout =
        formatv(", ranks d {0} x p {1}{2} x t {3}", Grid.Data, Grid.Pipeline,
                Grid.Context > 1 ? formatv(" x c {0}", Grid.Context).str()
                                 : std::string(),
                Grid.Tensor)
            .str();
  if (Grid.Data > 1)
    Layout += formatv(" ({0} replicas of batch {1})", Grid.Data, E.batch());
  std::string StepsText =
      FirstStep > O.Steps ? formatv("step {0} reached", O.Steps).str()
                          : formatv("steps {0}-{1}", FirstStep, O.Steps).str();
  Out << formatv("sp-run: training {0} (plan '{1}'): {2}, batch "
                 "{3} x {4} tokens{9}, lr {5} (warmup {6}, cosine to {7}), "
                 "{8} threads\n",
                 ModelName, O.PlanDir, StepsText, E.batch() * Grid.Data,
                 E.seq(), sci(O.LR), O.Warmup, sci(O.minLR()),
                 T.ThreadsPerRank, Layout);
  BackendNotes Notes;
  if (T.Device.Notes)
    Notes = T.Device.Notes(P, Context);
  for (const std::string &Line : Notes.Lines)
    Out << Line << "\n";
  const std::optional<CheckpointMeta> &Resumed = T.R.Resumed;
  if (Resumed && Resumed->PlanFingerprint != T.R.Fingerprint) {
    const ProcessGrid &W = Resumed->Grid;
    Out << formatv("resharded checkpoint '{0}' (step {1}) of another plan of "
                   "this model, written by d {2} x p {3} x t {4}\n",
                   O.checkpointDir(), Resumed->Step, W.Data, W.Pipeline,
                   W.Tensor);
  }
  if (std::isfinite(ModelFlopsPerStep))
    Out << formatv("{0} per step (model FLOPs){1}{2}\n",
                   flopCount(ModelFlopsPerStep),
                   JobPeak > 0 ? formatv("; MFU against {0} ({1})",
                                         flopRate(JobPeak), PeakSource)
                                     .str()
                               : std::string(),
                   Notes.PeakNote);
  if (ValData)
    Out << formatv("validation: {0} batches of '{1}' every {2} steps and at "
                   "the end\n",
                   O.EvalSteps, O.ValDataFile, O.evalEvery());
  Out.flush();
}

} // namespace sp
