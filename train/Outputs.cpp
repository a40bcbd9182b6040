//===- Outputs.cpp - What a run writes besides its logs -------------------===//
//
// --dump (the logits before training, the first step's gradients, the
// trained weights, loss.csv and memory.json: every tensor whole, gathered
// over the ranks), --export-onnx (the trained weights in a copy of the
// source model, every pipeline stage's sent to the writer), the trace, and
// the summary the lead prints at the end of a training run.
//
//===----------------------------------------------------------------------===//
#include "frontend/OnnxExport.h"
#include "ir/ContextLayout.h"
#include "plan/AtomicFile.h"
#include "runtime/Npy.h"
#include "support/Diagnostics.h"
#include "support/Format.h"
#include "train/RankRun.h"
#include "train/Stops.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"
#include <deque>

using namespace llvm;

namespace sp {

/// A parameter name as a file name: '/' (and '\') would make directories.
static std::string fileNameFor(StringRef Name) {
  std::string R = Name.str();
  for (char &C : R)
    if (C == '/' || C == '\\')
      C = '_';
  return R;
}

Error RankRun::dumpFirstLogits() {
  if (O.DumpDir.empty())
    return Error::success();
  if (Lead)
    if (auto Err = makeDir(O.DumpDir, "--dump"))
      return Err;
  // The logits come from a forward-only evaluation (every stage takes part
  // in a pipelined plan's).
  return dumpLogits(O.DumpDir);
}

Error RankRun::dumpLogits(StringRef Dir) {
  Executor &E = *Exec;
  Data->getBatch(1, Batch);
  if (auto L = E.evalLoss(Batch); !L)
    return L.takeError();
  if (auto Err = E.download())
    return Err;
  // The last pipeline stage computes them; its first tensor-parallel rank
  // of the first replica writes them.
  bool LastStage = E.stage() == E.numStages() - 1;
  auto Logits = E.logits();
  if (!Logits) {
    if (!LastStage)
      return Error::success();
    return usageError("the plan exposes no logits to dump");
  }
  SmallVector<int64_t, 4> Shape(Logits->FullType.Shape.begin(),
                                Logits->FullType.Shape.end());
  if (Shape.size() == 2 && Shape[0] == E.batch() * E.seq())
    Shape = {E.batch(), E.seq(), Shape[1]};
  if (Communicator *Cp = Groups.Context.get())
    return writeContextLogits((Dir + "/logits.npy").str(), *Logits, Shape, *Cp);
  if (Communicator *DataGroup = Groups.Data.get()) {
    // Every replica's rows, in replica order: the whole batch's logits.
    Shape[0] *= DataGroup->size();
    return writeGathered((Dir + "/logits.npy").str(), *Logits, Shape,
                         StageLead, DataGroup);
  }
  return writeGathered((Dir + "/logits.npy").str(), *Logits, Shape,
                       StageLead);
}

Error RankRun::writeGathered(StringRef Path, const TensorView &T,
                         ArrayRef<int64_t> Shape, bool Writes,
                         Communicator *Across) {
  Executor &E = *Exec;
  // The whole tensor (every rank's shard; the whole vocabulary), in the
  // run's precision: a float64 run (--float64) writes '<f8' files. With
  // Across, the concatenation of every member's whole tensor.
  auto Write = [&](auto Full, CommType Type) -> Error {
    if (!Full)
      return Full.takeError();
    auto Data = std::move(*Full);
    if (Across) {
      decltype(Data) All(Data.size() * Across->size());
      if (auto Err = Across->allGather(All.data(), Data.data(),
                                       int64_t(Data.size()), Type))
        return Err;
      Data = std::move(All);
    }
    return Writes ? writeNpy(Path, Shape, Data) : Error::success();
  };
  if (E.float64())
    return Write(E.gather64(T), CommType::F64);
  return Write(E.gather(T), CommType::F32);
}

Error RankRun::writeContextLogits(StringRef Path, const TensorView &T,
                                  ArrayRef<int64_t> LocalShape,
                                  Communicator &Cp) {
  Executor &E = *Exec;
  // [b, s/C, V] of each rank of the data group, ordered (replica, context
  // rank): every replica's rows, each position put back in its place.
  Communicator &All = *Groups.Data; // holds the context group
  const int C = Cp.size(), Ranks = All.size();
  const ContextLayout L{C, true, LocalShape[1] * C};
  SmallVector<int64_t, 4> Shape(LocalShape.begin(), LocalShape.end());
  Shape[0] *= Ranks / C;
  Shape[1] = L.Seq;
  auto Write = [&](auto Full, CommType Type) -> Error {
    if (!Full)
      return Full.takeError();
    auto Mine = std::move(*Full);
    decltype(Mine) Got(Mine.size() * Ranks), Whole(Mine.size() * Ranks);
    if (auto Err =
            All.allGather(Got.data(), Mine.data(), int64_t(Mine.size()), Type))
      return Err;
    const int64_t Rows = LocalShape[0], V = LocalShape[2],
                  Local = LocalShape[1];
    for (int K = 0; K < Ranks; ++K)
      for (const ContextLayout::Run &R : L.runs(K % C))
        for (int64_t B = 0; B < Rows; ++B)
          std::copy_n(Got.begin() + ((K * Rows + B) * Local + R.Local) * V,
                      R.Length * V,
                      Whole.begin() +
                          (((K / C) * Rows + B) * L.Seq + R.Global) * V);
    return StageLead ? writeNpy(Path, Shape, Whole) : Error::success();
  };
  if (E.float64())
    return Write(E.gather64(T), CommType::F64);
  return Write(E.gather(T), CommType::F32);
}

Error RankRun::dumpTensors(StringRef Dir, ArrayRef<TensorView> Tensors) {
  if (StageLead)
    if (auto Err = makeDir(Dir, "--dump"))
      return Err;
  for (const TensorView &T : Tensors) {
    // A copy of a weight another stage owns (a tied embedding) is dumped
    // by its owner.
    if (StringRef(T.Name).contains('@'))
      continue;
    // Full shape, unsharded: the source parameter's.
    if (auto Err =
            writeGathered((Dir + "/" + fileNameFor(T.Name) + ".npy").str(), T,
                          T.FullType.Shape, StageLead))
      return Err;
  }
  return Error::success();
}

Error RankRun::writeMemory(StringRef Dir) {
  if (!Lead)
    return Error::success();
  const Executor &E = *Exec;
  MemoryStats M = E.memory();
  nlohmann::json J = {{"arena_bytes", M.ArenaBytes},
                      {"persistent_bytes", M.PersistentBytes},
                      {"high_water_bytes", M.HighWaterBytes},
                      {"peak_live_temp_bytes", M.PeakLiveTempBytes},
                      {"planned_arena_bytes",
                       P.Manifest.value("arena_bytes", P.Prog.ArenaBytes)}};
  // Stored activations, measured on this rank (the first pipeline stage),
  // beside what the plan says. Per layer: the bytes of one microbatch.
  nlohmann::json Planned = P.Manifest.value("memory", nlohmann::json::object());
  int64_t Microbatches = E.microbatches();
  int Layer = Planned.value("activation_layer", 0);
  if (!M.StoredActivationBytesByLayer.count(Layer))
    for (auto &[L, Bytes] : M.StoredActivationBytesByLayer)
      if (L >= 0) {
        Layer = L; // the middle layer is on another stage: this one's first
        break;
      }
  auto It = M.StoredActivationBytesByLayer.find(Layer);
  J["stored_activation_bytes"] = M.StoredActivationBytes;
  J["activation_layer"] = Layer;
  J["activation_bytes_per_layer"] =
      It == M.StoredActivationBytesByLayer.end() ? 0
                                                 : It->second / Microbatches;
  nlohmann::json ByLayer = nlohmann::json::array();
  for (auto &[L, Bytes] : M.StoredActivationBytesByLayer)
    ByLayer.push_back({{"layer", L}, {"bytes", Bytes / Microbatches}});
  J["stored_bytes_by_layer"] = ByLayer;
  J["planned"] = {
      {"stored_activation_bytes",
       Planned.value("first_stage_activation_bytes", int64_t(-1))},
      {"activation_bytes_per_layer",
       Planned.value("activation_bytes_per_layer", int64_t(-1))},
      {"stored_bytes_by_layer",
       Planned.value("stored_bytes_by_layer", nlohmann::json::array())}};
  std::string Text = J.dump(1) + "\n";
  return writeFileAtomically((Dir + "/memory.json").str(),
                         [&](raw_ostream &OS) { OS << Text; });
}

void printMemory(raw_ostream &OS, const Plan &P, const MemoryStats &M) {
  OS << formatv(
      "memory: arena {0} (planned {1}), persistent {2}, "
      "high-water {3}, peak live temporaries {4}\n",
      humanBytes(M.ArenaBytes),
      humanBytes(P.Manifest.value("arena_bytes", P.Prog.ArenaBytes)),
      humanBytes(M.PersistentBytes), humanBytes(M.HighWaterBytes),
      humanBytes(M.PeakLiveTempBytes));
}

/// For --export-onnx of a pipelined plan: every stage's whole parameters
/// (Weights, held in Full) sent to stage 0 over the pipeline group, which
/// adds them to its own (each stage sends the weights it owns: the copy of a
/// tied embedding on another stage is left out before).
static Error collectStageWeights(Communicator &Pipe,
                                 std::deque<std::vector<float>> &Full,
                                 StringMap<ArrayRef<float>> &Weights) {
  const int Tag = 1 << 24; // after training: no message of the plan is left
  if (Pipe.rank() != 0) {
    int64_t Count = Weights.size();
    if (auto E = Pipe.send(&Count, sizeof Count, 0, Tag))
      return E;
    for (const auto &W : Weights) {
      int64_t Sizes[2] = {int64_t(W.getKey().size()),
                          int64_t(W.getValue().size())};
      if (auto E = Pipe.send(Sizes, sizeof Sizes, 0, Tag))
        return E;
      if (auto E = Pipe.send(W.getKey().data(), Sizes[0], 0, Tag))
        return E;
      if (auto E = Pipe.send(W.getValue().data(), Sizes[1] * 4, 0, Tag))
        return E;
    }
    return Error::success();
  }
  for (int S = 1; S < Pipe.size(); ++S) {
    int64_t Count = 0;
    if (auto E = Pipe.recv(&Count, sizeof Count, S, Tag))
      return E;
    for (int64_t K = 0; K < Count; ++K) {
      int64_t Sizes[2];
      if (auto E = Pipe.recv(Sizes, sizeof Sizes, S, Tag))
        return E;
      std::string Name(Sizes[0], '\0');
      if (auto E = Pipe.recv(Name.data(), Sizes[0], S, Tag))
        return E;
      std::vector<float> Data(Sizes[1]);
      if (auto E = Pipe.recv(Data.data(), Sizes[1] * 4, S, Tag))
        return E;
      if (Weights.count(Name))
        return createStringError(inconvertibleErrorCode(),
                                 "--export-onnx: two stages own weight '%s'",
                                 Name.c_str());
      Full.push_back(std::move(Data));
      Weights[Name] = Full.back();
    }
  }
  return Error::success();
}

/// Milliseconds per step in each phase's instructions, without the first
/// step when there are others.
static void printTiming(raw_ostream &OS, TimeStats T, const TimeStats &First) {
  if (T.Steps > First.Steps) {
    for (int P = 0; P < 4; ++P)
      T.PhaseSeconds[P] -= First.PhaseSeconds[P];
    T.Steps -= First.Steps;
  }
  if (!T.Steps)
    return;
  auto Ms = [&](Phase P) { return 1000 * T.PhaseSeconds[int(P)] / T.Steps; };
  OS << formatv("time per step: forward {0:F2} ms, backward {1:F2} ms, "
                "recompute {2:F2} ms, optimizer {3:F2} ms (mean of {4} "
                "steps)\n",
                Ms(Phase::Forward), Ms(Phase::Backward), Ms(Phase::Recompute),
                Ms(Phase::Optimizer), T.Steps);
}

Error RankRun::exportOnnx() {
  Executor &E = *Exec;
  std::vector<TensorView> Params = E.parameters();
  std::deque<std::vector<float>> Full;
  StringMap<ArrayRef<float>> Weights;
  for (const TensorView &T : Params) {
    auto W = E.gather(T);
    if (!W)
      return W.takeError();
    // A copy of a weight another stage owns (a tied embedding) is
    // exported by its owner.
    if (StringRef(T.Name).contains('@'))
      continue;
    Full.push_back(std::move(*W));
    Weights[T.Name] = Full.back();
  }
  // Pipelined: stage 0's lead (the writer) receives every other stage's
  // parameters from that stage's lead, over their pipeline group.
  Communicator *Pipe = Groups.Pipeline.get();
  if (Pipe && Pipe->size() > 1 && StageLead)
    if (auto Err = collectStageWeights(*Pipe, Full, Weights))
      return Err;
  if (Lead)
    if (auto Err = exportOnnxWeights(T.R.Source, O.ExportOnnx, Weights))
      return Err;
  return Error::success();
}

/// The summary of a training run (the lead's).
static void printSummary(RankRun &R) {
  const TrainOptions &O = R.O;
  raw_ostream &Out = R.Out;
  int64_t FirstStep = R.FirstStep;
  int64_t Trained = O.Steps - FirstStep + 1;
  if (Trained <= 0)
    Out << formatv("checkpoint '{0}' is at step {1} of {1}: nothing left to "
                   "train; final loss {2:F4}\n",
                   O.checkpointDir(), O.Steps, R.Rows.back().Loss);
  else {
    double Rate = double(R.TokensPerStep * Trained) /
                  std::max(R.TrainSeconds, 1e-9);
    std::string Flops;
    if (std::isfinite(R.ModelFlopsPerStep)) {
      double F = R.ModelFlopsPerStep * double(Trained) /
                 std::max(R.TrainSeconds, 1e-9);
      Flops = ", " + flopRate(F);
      if (R.JobPeak > 0)
        Flops += formatv(" (MFU {0:F1}%)", 100 * F / R.JobPeak).str();
    }
    Out << formatv(
        "trained steps {0}-{1}: final loss {2:F4}, {3} tok/s{6} "
        "({4} tokens in {5:F2} s)\n",
        FirstStep, O.Steps, R.Rows.back().Loss,
        groupThousands(int64_t(std::llround(Rate))),
        groupThousands(R.TokensPerStep * Trained), R.TrainSeconds, Flops);
    for (auto It = R.Rows.rbegin(); It != R.Rows.rend(); ++It)
      if (std::isfinite(It->ValLoss)) {
        Out << formatv("validation loss {0:F4} at step {1}\n", It->ValLoss,
                       It->Step);
        break;
      }
  }
  printMemory(Out, R.P, R.Exec->memory());
  printTiming(Out, R.Exec->timing(), R.FirstStepTime);
  Out << "wrote " << O.logDir() << "/loss.csv and loss.svg\n";
  if (!O.HtmlPath.empty())
    Out << "wrote report page " << O.HtmlPath << "\n";
  if (O.CheckpointEvery && Trained > 0)
    Out << "wrote checkpoint " << O.checkpointDir() << " (step " << O.Steps
        << ")\n";
  if (!O.DumpDir.empty())
    Out << "wrote dumps to " << O.DumpDir << "\n";
  if (!O.ExportOnnx.empty())
    Out << "exported the trained weights to " << O.ExportOnnx << "\n";
}

Error RankRun::finish() {
  WritingScope Writing; // a stop lets the outputs below finish
  // Resumed from the last step (a run killed after its final checkpoint):
  // its logs, from the checkpoint's loss history.
  if (FirstStep > O.Steps)
    if (auto Err = writeLogs())
      return Err;
  Executor &E = *Exec;
  if (auto Err = E.download()) // the trained weights, for dumps and export
    return Err;
  if (!O.DumpDir.empty()) {
    std::string Csv = lossCsv(Rows);
    if (Lead)
      if (auto Err = writeFileAtomically(O.DumpDir + "/loss.csv",
                                         [&](raw_ostream &OS) { OS << Csv; }))
        return Err;
    if (auto Err = dumpTensors(O.DumpDir + "/weights", E.parameters()))
      return Err;
    if (auto Err = writeMemory(O.DumpDir))
      return Err;
  }
  if (!O.TraceFile.empty())
    if (auto Err = writeTrace(O.TraceFile, World, E, Grid.Tensor))
      return Err;
  if (!O.ExportOnnx.empty())
    if (auto Err = exportOnnx())
      return Err;
  printSummary(*this);
  return Error::success();
}

} // namespace sp
