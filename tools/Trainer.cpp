//===- Trainer.cpp - One training or evaluation run of a plan -------------===//
#include "tools/Trainer.h"
#include "frontend/OnnxExport.h"
#include "plan/AtomicFile.h"
#include "runtime/Executor.h"
#include "runtime/LossLog.h"
#include "runtime/Npy.h"
#include "runtime/Sample.h"
#include "runtime/cpu/Bf16Gemm.h"
#include "runtime/cpu/CpuBackend.h"
#include "runtime/cuda/CudaBackend.h"
#include "tools/HtmlReport.h"
#include "tools/ToolSupport.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <random>
#include <thread>
#include <unistd.h>

using namespace llvm;

namespace sp {

char AgreedError::ID = 0;

//===----------------------------------------------------------------------===//
// Stops: signals, the watchdog, and the ranks' agreement
//===----------------------------------------------------------------------===//

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

/// Counts a rank as writing files (checkpoint, logs) while it lives: the
/// watchdog lets that finish.
struct WritingScope {
  WritingScope() { Stop.Writing.fetch_add(1); }
  ~WritingScope() { Stop.Writing.fetch_sub(1); }
};

} // namespace

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

/// The first stop signal any rank has seen (0: none), the same on every
/// rank: they stop after the same step.
static Expected<int> agreedStop(Communicator *World) {
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

/// Local is this rank's outcome of a step every rank took (a lock, a
/// checkpoint shard, a restore): if any rank failed, every rank returns the
/// lowest failing rank's error as an AgreedError, so that none goes on to
/// wait for the others.
static Error agreeOnError(Communicator *World, Error Local) {
  bool Failed = bool(Local);
  if (!World || World->size() == 1) {
    if (!Failed)
      return Error::success();
    return make_error<AgreedError>(toString(std::move(Local)));
  }
  int64_t Mine = Failed;
  std::vector<int64_t> All(World->size());
  if (auto Err = World->allGather(All.data(), &Mine, 1, CommType::I64)) {
    consumeError(std::move(Local));
    return Err;
  }
  int First = -1;
  for (int R = 0; R < World->size() && First < 0; ++R)
    if (All[R])
      First = R;
  if (First < 0)
    return Error::success(); // Local is success
  std::string Msg = Failed ? toString(std::move(Local)) : "";
  if (!Failed)
    consumeError(std::move(Local));
  if (World->rank() != First)
    Msg.clear();
  int64_t Len = Msg.size();
  if (auto Err = World->broadcast(&Len, sizeof(Len), First))
    return Err;
  Msg.resize(size_t(Len));
  if (Len)
    if (auto Err = World->broadcast(Msg.data(), Len, First))
      return Err;
  return make_error<AgreedError>(Msg);
}

/// Every rank's string on rank 0, in rank order (others get nothing).
static Expected<std::vector<std::string>>
gatherOnRankZero(Communicator *World, std::string Mine, int Tag) {
  if (!World || World->size() == 1)
    return std::vector<std::string>{std::move(Mine)};
  if (World->rank() != 0) {
    int64_t Bytes = Mine.size();
    if (auto Err = World->send(&Bytes, sizeof Bytes, 0, Tag))
      return Err;
    if (auto Err = World->send(Mine.data(), Bytes, 0, Tag))
      return Err;
    return std::vector<std::string>{};
  }
  std::vector<std::string> All{std::move(Mine)};
  for (int R = 1; R < World->size(); ++R) {
    int64_t Bytes = 0;
    if (auto Err = World->recv(&Bytes, sizeof Bytes, R, Tag))
      return Err;
    std::string Text(size_t(Bytes), '\0');
    if (auto Err = World->recv(Text.data(), Bytes, R, Tag))
      return Err;
    All.push_back(std::move(Text));
  }
  return All;
}

Error usageError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), Msg);
}

/// "1.0e-03".
std::string sci(double X) {
  char Text[32];
  std::snprintf(Text, sizeof(Text), "%.1e", X);
  return Text;
}

/// A parameter name as a file name: '/' (and '\') would make directories.
static std::string fileNameFor(StringRef Name) {
  std::string R = Name.str();
  for (char &C : R)
    if (C == '/' || C == '\\')
      C = '_';
  return R;
}

/// An output directory: created if missing, refused if it is a file.
static Error makeDir(StringRef Dir, StringRef Flag) {
  if (sys::fs::exists(Dir) && !sys::fs::is_directory(Dir))
    return usageError(Flag + " '" + Dir + "' exists and is not a directory");
  if (std::error_code EC = sys::fs::create_directories(Dir))
    return createStringError(EC, "cannot create '%s': %s", Dir.str().c_str(),
                             EC.message().c_str());
  return Error::success();
}

namespace {

/// One run: everything main() set up, and what it writes.
struct Run {
  /// Rank 0 of the group prints and writes files; every rank takes part in
  /// the collectives (training steps, gathers for dumps and the export).
  /// With pipeline stages, the first tensor-parallel rank of each stage
  /// writes the dumps of that stage's parameters (StageLead).
  bool Lead;
  bool StageLead;
  const Plan &P;
  Executor &E;
  const DataLoader &Data;
  Communicator *World; // null for one rank
  Communicator *DataGroup; // the replicas of this rank; null without --dp
  std::string ModelName;
  std::string LogDirPath, CheckpointPath;
  std::string Fingerprint, ModelFingerprint;
  ProcessGrid Grid;
  GridCoord At;
  uint64_t RunSeed = 0;
  std::vector<LossRow> Rows;
  TokenBatch Batch;
  /// The step the checkpoint in CheckpointPath holds (-1: none).
  int64_t SavedStep = -1;
  /// Sampling: where --dump writes the drawn positions' logits, and whose
  /// weights these are (for the summary line).
  std::string DumpDirFor = {}, WeightsFrom = {};
  /// --html (the lead's): the page, its plan part filled once.
  std::string HtmlPath = {};
  ReportPage Page = {};

  Error dumpLogits(StringRef Dir);
  Error dumpTensors(StringRef Dir, ArrayRef<TensorView> Tensors);
  /// Gathers T (a collective) and, when Writes, writes it to Path.
  Error writeGathered(StringRef Path, const TensorView &T,
                      ArrayRef<int64_t> Shape, bool Writes,
                      Communicator *Across = nullptr);
  Error writeLogs();
  Error writePage(StringRef LossSvg);
  Error writeCheckpointAt(int64_t Step);
  /// sp-run --sample: the prompt's continuation, printed by the lead.
  Error generate(const TrainerOptions::SampleOptions &S);
  Error writeMemory(StringRef Dir);
  std::vector<TensorView> checkpointTensors() const {
    std::vector<TensorView> T = E.parameters();
    for (TensorView &S : E.optimizerState())
      T.push_back(std::move(S));
    return T;
  }
};

} // namespace

Error Run::dumpLogits(StringRef Dir) {
  Data.getBatch(1, Batch);
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
  if (DataGroup) {
    // Every replica's rows, in replica order: the whole batch's logits.
    Shape[0] *= DataGroup->size();
    return writeGathered((Dir + "/logits.npy").str(), *Logits, Shape,
                         StageLead, DataGroup);
  }
  return writeGathered((Dir + "/logits.npy").str(), *Logits, Shape,
                       StageLead);
}

Error Run::writeGathered(StringRef Path, const TensorView &T,
                         ArrayRef<int64_t> Shape, bool Writes,
                         Communicator *Across) {
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

Error Run::dumpTensors(StringRef Dir, ArrayRef<TensorView> Tensors) {
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

Error Run::generate(const TrainerOptions::SampleOptions &S) {
  // Every rank runs the same forwards: each step's batch holds the last
  // seq() tokens of the text in every row, the rest of the row padding
  // that a causal model's earlier positions never see. The last stage's
  // first tensor-parallel rank of the first replica draws the next token
  // from the logits of the text's last position, and the ranks agree on it
  // with a sum (the others add 0).
  int64_t B = E.batch(), Seq = E.seq(),
          Allowed = std::min<int64_t>(E.vocab(), 256); // bytes
  bool LastStage = E.stage() == E.numStages() - 1;
  bool Draws = LastStage && (E.groupSize() == 1 || E.rank() == 0) &&
               At.Data == 0;
  std::vector<int64_t> Text;
  for (unsigned char C : S.Prompt)
    Text.push_back(C);
  std::mt19937_64 Rng(RunSeed);
  std::vector<float> Drawn; // the logits of each drawn position (--dump)
  auto Start = std::chrono::steady_clock::now();
  for (int64_t K = 0; K < S.Tokens; ++K) {
    int64_t First = std::max<int64_t>(0, int64_t(Text.size()) - Seq);
    int64_t Len = int64_t(Text.size()) - First;
    Batch.Tokens.assign(B * Seq, 0);
    Batch.Targets.assign(B * Seq, IgnoreTarget);
    Batch.Real.clear();
    for (int64_t Row = 0; Row < B; ++Row)
      std::copy(Text.begin() + First, Text.end(),
                Batch.Tokens.begin() + Row * Seq);
    if (auto L = E.evalLoss(Batch); !L)
      return L.takeError();
    double Token = 0;
    if (LastStage) {
      if (auto Err = E.download())
        return Err;
      auto Logits = E.logits();
      if (!Logits)
        return usageError("the plan exposes no logits to sample from");
      auto Whole = E.gather(*Logits); // every tensor-parallel part
      if (!Whole)
        return Whole.takeError();
      int64_t V = int64_t(Whole->size()) / (B * Seq);
      if (Draws) {
        ArrayRef<float> Row(Whole->data() + (Len - 1) * V, size_t(V));
        double U = double(Rng() >> 11) * 0x1.0p-53;
        Token = double(sampleToken(Row, Allowed, S.Temperature, S.TopK, U));
        Drawn.insert(Drawn.end(), Row.begin(), Row.end());
      }
    }
    if (World)
      if (auto Err = World->allReduceSum(&Token, 1))
        return Err;
    Text.push_back(int64_t(Token));
  }
  double Seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - Start)
          .count();
  if (Draws && !DumpDirFor.empty()) {
    int64_t V = S.Tokens ? int64_t(Drawn.size()) / S.Tokens : 0;
    if (auto Err = makeDir(DumpDirFor, "--dump"))
      return Err;
    if (auto Err = writeNpy(DumpDirFor + "/sample_logits.npy", {S.Tokens, V},
                            Drawn))
      return Err;
  }
  if (!Lead)
    return Error::success();
  std::string Generated;
  for (size_t I = S.Prompt.size(); I < Text.size(); ++I)
    Generated += char(Text[I]);
  raw_ostream &Out = outs();
  Out << formatv("sp-run: sampling {0}: {1} tokens after a {2}-byte prompt, "
                 "{3}, seed {4}, {5} ({6:F2} s)\n",
                 ModelName, S.Tokens, S.Prompt.size(),
                 S.Temperature <= 0
                     ? std::string("greedy")
                     : formatv("temperature {0}, top-k {1}", S.Temperature,
                               S.TopK ? std::to_string(S.TopK) : "all")
                           .str(),
                 RunSeed, WeightsFrom, Seconds);
  Out << S.Prompt << Generated << "\n";
  Out.flush();
  return Error::success();
}

Error Run::writeLogs() {
  if (!Lead)
    return Error::success();
  WritingScope Writing;
  if (auto Err = makeDir(LogDirPath, "--log-dir"))
    return Err;
  std::string Csv = lossCsv(Rows);
  if (auto Err = writeFileAtomically(LogDirPath + "/loss.csv",
                                 [&](raw_ostream &OS) { OS << Csv; }))
    return Err;
  std::string Svg = lossSvg(Rows, ModelName + ": training loss");
  if (auto Err = writeFileAtomically(LogDirPath + "/loss.svg",
                                     [&](raw_ostream &OS) { OS << Svg; }))
    return Err;
  return writePage(Svg);
}

/// --html: the page with the rows so far, their chart and the memory this
/// rank measured (once a step ran).
Error Run::writePage(StringRef LossSvg) {
  if (HtmlPath.empty())
    return Error::success();
  Page.Loss.clear();
  for (const LossRow &R : Rows)
    Page.Loss.push_back({R.Step, R.Loss, R.ValLoss, R.LR, R.GradNorm,
                         R.TokensPerSecond, R.MFU});
  Page.LossChart = {LossSvg.str(),
                    "The training loss of every step, its moving average and "
                    "the validation loss (loss.svg; loss.csv holds the "
                    "numbers)."};
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
  return writeReportPage(HtmlPath, Page);
}

/// What the --html page lists of the run's settings (the command line has
/// the rest).
static std::vector<std::pair<std::string, std::string>>
pageSettings(const TrainerOptions &O, const ProcessGrid &G) {
  std::vector<std::pair<std::string, std::string>> S = {
      {"steps", std::to_string(O.Steps)},
      {"learning rate", formatv("peak {0}, {1} warmup steps, cosine decay "
                                "to {2}",
                                sci(O.LR), O.Warmup, sci(O.MinLR))},
      {"seed", std::to_string(O.Seed)},
      {"training data", O.Synthetic ? "synthetic" : O.DataFile}};
  if (!O.ValDataFile.empty())
    S.push_back({"validation data",
                 formatv("{0}: {1} batches every {2} steps and at the end",
                         O.ValDataFile, O.EvalSteps, O.EvalEvery)});
  S.push_back({"ranks", formatv("{0} (d {1} x p {2} x t {3}){4}", G.size(),
                                G.Data, G.Pipeline, G.Tensor,
                                O.ThreadRanks ? ", threads of one process"
                                              : "")});
  S.push_back({"device", O.Cuda ? "cuda" : "cpu"});
  if (O.Resume)
    S.push_back({"resumed from", O.CheckpointPath});
  return S;
}

/// Every rank writes its shard; rank 0 gathers their descriptions and
/// commits the index. A failure anywhere is every rank's AgreedError, and
/// the checkpoint already in the directory stays as it was.
Error Run::writeCheckpointAt(int64_t Step) {
  WritingScope Writing;
  int Rank = World ? World->rank() : 0, Ranks = World ? World->size() : 1;
  auto Failed = [&](Error Err) -> Error {
    std::string Msg = toString(std::move(Err));
    Msg += SavedStep >= 0
               ? formatv("; '{0}' still holds the checkpoint of step {1}",
                         CheckpointPath, SavedStep)
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
    auto Shard = writeCheckpointShard(CheckpointPath, Step, Rank, Ranks,
                                      checkpointTensors(), *Model, At);
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
    M.Seed = RunSeed;
    M.PlanFingerprint = Fingerprint;
    M.ModelFingerprint = ModelFingerprint;
    M.Grid = Grid;
    M.Losses = Rows;
    M.Ranks = Ranks;
    if (const auto &LS = E.lossScaling()) {
      M.LossScale = LS->Scale;
      M.LossScaleGoodSteps = LS->GoodSteps;
    }
    M.SkippedUpdates = E.skippedUpdates();
    return commitCheckpoint(CheckpointPath, M, *Shards);
  };
  if (Error Err = agreeOnError(World, Rank == 0 ? Commit() : Error::success()))
    return Err.isA<AgreedError>() ? Failed(std::move(Err)) : std::move(Err);
  SavedStep = Step;
  Stop.SavedStep.store(Step);
  return Error::success();
}

Error Run::writeMemory(StringRef Dir) {
  if (!Lead)
    return Error::success();
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

static void printMemory(raw_ostream &OS, const Plan &P, const MemoryStats &M) {
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

/// This rank's instructions as Chrome trace events (complete events, one
/// process per rank).
static nlohmann::json traceEvents(const Executor &E, int Rank, int TP) {
  nlohmann::json Events = nlohmann::json::array();
  std::string Name = formatv("rank {0} (stage {1}, tensor-parallel rank {2})",
                             Rank, Rank / TP, Rank % TP)
                         .str();
  Events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", Rank},
                    {"args", {{"name", Name}}}});
  Events.push_back({{"name", "process_sort_index"},
                    {"ph", "M"},
                    {"pid", Rank},
                    {"args", {{"sort_index", Rank}}}});
  // Two rows per rank: computation, and communication (the CUDA backend's
  // two streams; the CPU backend runs both rows' calls one after another).
  for (int Tid : {0, 1})
    Events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", Rank},
                      {"tid", Tid},
                      {"args", {{"name", Tid ? "communication" : "compute"}}}});
  const Program &P = E.program();
  for (const TraceEvent &T : E.trace()) {
    const Instruction &I = P.Instrs[T.Instruction];
    bool Comm = isCommunicationOp(I.Op);
    std::string Label = opName(I.Op).str();
    if (I.Role != Role::None)
      Label += " " + roleName(I.Role).str();
    nlohmann::json Args = {{"instruction", T.Instruction},
                           {"step", T.Step},
                           {"phase", phaseName(I.Ph).str()}};
    if (I.Layer >= 0)
      Args["layer"] = I.Layer;
    if (T.ScheduleStep >= 0) {
      // A compact program's step: its template's instruction I on the
      // step's microbatch.
      Args["schedule_step"] = T.ScheduleStep;
      if (int Mb = P.Steps[T.ScheduleStep].Microbatch; Mb >= 0)
        Args["microbatch"] = Mb;
    } else if (I.Attrs.has("microbatch")) {
      Args["microbatch"] = I.Attrs.getInt("microbatch", 0);
    }
    if (I.Beside >= 0) {
      // The GEMM the plan runs this collective beside (lower/Overlap.h).
      const Instruction &G = P.Instrs[I.Beside];
      Args["beside"] = formatv("{0} {1} (instruction {2})", opName(G.Op),
                               roleName(G.Role), I.Beside)
                           .str();
    }
    Events.push_back({{"name", Label},
                      {"cat", Comm ? "communication" : phaseName(I.Ph).str()},
                      {"ph", "X"},
                      {"ts", T.StartUs},
                      {"dur", T.DurationUs},
                      {"pid", Rank},
                      {"tid", T.Stream >= 0 ? T.Stream : Comm ? 1 : 0},
                      {"args", Args}});
  }
  return Events;
}

/// Gathers every rank's events on rank 0 (point to point over the world
/// group, so it works on threads and on MPI) and writes the trace there.
static Error writeTrace(StringRef Path, Communicator *World, const Executor &E,
                        int TP) {
  int Rank = World ? World->rank() : 0, Size = World ? World->size() : 1;
  std::string Mine = traceEvents(E, Rank, TP).dump();
  constexpr int Tag = 32000;
  if (Rank != 0) {
    int64_t Bytes = Mine.size();
    if (auto Err = World->send(&Bytes, sizeof Bytes, 0, Tag))
      return Err;
    return World->send(Mine.data(), Bytes, 0, Tag);
  }
  nlohmann::json All = nlohmann::json::parse(Mine);
  for (int R = 1; R < Size; ++R) {
    int64_t Bytes = 0;
    if (auto Err = World->recv(&Bytes, sizeof Bytes, R, Tag))
      return Err;
    std::string Text(Bytes, '\0');
    if (auto Err = World->recv(Text.data(), Bytes, R, Tag))
      return Err;
    for (auto &Ev : nlohmann::json::parse(Text))
      All.push_back(std::move(Ev));
  }
  nlohmann::json Trace = {{"traceEvents", All}, {"displayTimeUnit", "ms"}};
  std::string Text = Trace.dump() + "\n";
  return writeFileAtomically(Path,
                             [&](raw_ostream &OS) { OS << Text; });
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

ProcessGrid planGrid(const Plan &P) {
  ProcessGrid G;
  G.Pipeline = P.numStages();
  G.Tensor = P.Manifest.value("tp", 1);
  G.Data = P.Manifest.value("dp", 1);
  return G;
}

bool isPipelined(const Plan &P) {
  return P.numStages() > 1 || P.Manifest.value("microbatches", 1) > 1;
}

Trainer::Trainer(const Plan &P, TrainerOptions O)
    : P(P), O(std::move(O)), Grid(planGrid(P)) {}

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
  std::string What;
  if (Saved >= 0 && Saved == Last)
    What = formatv("{0} checkpoint '{1}' (step {2}); continue with --resume",
                   SavedOnExit.load() ? "wrote" : "the last step is in",
                   O.CheckpointPath, Saved)
               .str();
  else if (Saved >= 0)
    What = formatv("checkpoint '{0}' holds step {1} (--checkpoint-on-exit "
                   "saves the last step); continue with --resume",
                   O.CheckpointPath, Saved)
               .str();
  else
    What = "no checkpoint (--checkpoint-on-exit saves one)";
  return formatv("interrupted by {0} after step {1} of {2}; {3}",
                 signalName(Sig), StopStep.load(), O.Steps, What)
      .str();
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

Error Trainer::runRank(Communicator *World) {
  bool Lead = !World || World->rank() == 0;
  // The other ranks write nowhere: into a null stream of their own thread
  // (llvm::nulls() is one buffered stream for the process, and thread ranks
  // writing into it at once race on its buffer: TSan found the progress
  // bar's writes at t = 4 corrupting the heap).
  thread_local raw_null_ostream Nowhere;
  raw_ostream &Out = Lead ? static_cast<raw_ostream &>(outs()) : Nowhere;
  RankGroups Groups;
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
  RO.Trace = !O.TraceFile.empty();
  RO.ExpandCompact = O.ExpandSteps;
  RO.Seed = O.Seed;
  RO.Dropout = O.Dropout;
  RO.AllowFloat64 = O.Float64;
  // The backend the executor takes; it outlives the block that makes it.
  std::unique_ptr<Backend> Made;
  if (O.Cuda) {
    // Every rank makes its backend (a collective: NCCL communicators per
    // group), and a failure on one is every rank's.
    CudaBackendOptions CO;
    CO.Device = O.CudaDevice;
    if (O.ThreadRanks && World)
      CO.Device = O.CudaDevice.value_or(0) + World->rank();
    CO.World = World;
    CO.Tensor = Groups.Tensor.get();
    CO.Pipeline = Groups.Pipeline.get();
    CO.Data = Groups.Data.get();
    CO.AllowTF32 = O.AllowTF32;
    CO.BlockwiseAttention = O.BlockwiseAttention;
    CO.CublasLtEpilogues = O.CublasLtEpilogues;
    CO.AgreeBeforeCollectives = [World](Error Own) {
      return agreeOnError(World, std::move(Own));
    };
    Error Err = [&]() -> Error {
      auto B = createCudaBackend(CO);
      if (!B)
        return B.takeError();
      Made = std::move(*B);
      return Error::success();
    }();
    if (Error E = agreeOnError(World, std::move(Err)))
      return E;
    RO.MakeBackend = [&Made] { return std::move(Made); };
  }
  auto Exec = Executor::create(P, RO);
  if (!Exec)
    return Exec.takeError();
  Executor &E = **Exec;

  if (auto Err = checkObjective(O.Obj, E.vocab()))
    return usageError(toString(std::move(Err)));
  std::unique_ptr<DataLoader> Data;
  if (O.Synthetic || O.Sample) { // sampling reads no data
    Data = DataLoader::synthetic(O.Seed, E.batch(), E.seq(), E.vocab());
  } else {
    auto D = DataLoader::open(O.DataFile, E.batch(), E.seq(), E.vocab());
    if (!D)
      return D.takeError();
    Data = std::move(*D);
  }
  Data->setShuffle(O.Shuffle, O.Seed);
  Data->setObjective(O.Obj);
  Data->setDataParallel(Groups.At.Data, Grid.Data);
  // The held-out batches: read in order, the same ones at every
  // validation, each replica its rows of them.
  std::unique_ptr<DataLoader> ValData;
  if (!O.ValDataFile.empty()) {
    auto D = DataLoader::open(O.ValDataFile, E.batch(), E.seq(), E.vocab());
    if (!D)
      return usageError("--val-data: " + toString(D.takeError()));
    ValData = std::move(*D);
    ValData->setObjective(O.Obj);
    ValData->setDataParallel(Groups.At.Data, Grid.Data);
  }

  std::string ModelName =
      sys::path::stem(P.Manifest.value("source", std::string("model"))).str();
  // The first tensor-parallel rank of each stage of the first replica
  // (replicas hold the same parameters).
  bool StageLead = (!C || C->rank() == 0) && Groups.At.Data == 0;
  Run R{Lead,
        StageLead,
        P,
        E,
        *Data,
        World,
        Groups.Data.get(),
        ModelName,
        O.LogPath,
        O.CheckpointPath,
        O.Fingerprint,
        O.ModelFingerprint,
        Grid,
        Groups.At,
        O.Seed,
        {},
        {}};
  if (Lead && !O.HtmlPath.empty()) {
    R.HtmlPath = O.HtmlPath;
    R.Page = planReportPage(P.Manifest, O.PlanDir);
    R.Page.CommandLine = O.CommandLine;
    R.Page.Steps = O.Steps;
    R.Page.RunSettings = pageSettings(O, Grid);
  }

  // The directories this run writes: rank 0 locks them for the whole run
  // (another sp-run writing them is refused) and removes what a killed run
  // left there.
  bool WritesCheckpoints = !O.Eval && !O.Sample &&
                           (O.CheckpointEvery > 0 || O.CheckpointOnExit);
  bool WritesLogs = !O.Eval && !O.Sample;
  auto LockAndClean = [&]() -> Error {
    std::vector<std::tuple<std::string, const char *, const char *>> Dirs;
    if (WritesCheckpoints)
      Dirs.emplace_back(O.CheckpointPath, "checkpoint directory",
                        "--checkpoint DIR");
    if (WritesLogs)
      Dirs.emplace_back(O.LogPath, "log directory", "--log-dir DIR");
    std::vector<std::string> Held; // real paths: one directory, one lock
    for (auto &[Dir, What, Flag] : Dirs) {
      SmallString<256> Real;
      if (!sys::fs::real_path(Dir, Real) && is_contained(Held, Real.str()))
        continue;
      auto L = lockDirectory(Dir, What, Flag);
      if (!L)
        return L.takeError();
      Locks.push_back(std::move(*L));
      if (!sys::fs::real_path(Dir, Real))
        Held.push_back(Real.str().str());
    }
    if (WritesCheckpoints)
      if (auto Removed = cleanCheckpointDir(O.CheckpointPath); !Removed)
        consumeError(Removed.takeError()); // a bad index: --resume says so
    if (WritesLogs)
      removeLogTemporaries(O.LogPath);
    return Error::success();
  };
  // A run refused before it writes anything (a locked directory, a
  // checkpoint that cannot be restored) leaves no directory or lock file
  // that taking the locks created.
  // The locks are the lead's (Locks is shared by the thread ranks).
  auto DiscardLocks = [&] {
    if (!Lead)
      return;
    for (auto &L : Locks)
      L->discard();
    Locks.clear();
  };
  if (Error Err =
          agreeOnError(World, Lead ? LockAndClean() : Error::success())) {
    DiscardLocks();
    return Err;
  }

  int64_t FirstStep = 1;
  if (O.Resumed) {
    // Each rank restores its own part; a failure on one is every rank's.
    std::optional<CheckpointMeta> M;
    Error Restored = [&]() -> Error {
      std::vector<TensorView> Tensors = R.checkpointTensors();
      Expected<CheckpointMeta> Read = CheckpointMeta();
      if (O.Resumed->PlanFingerprint == O.Fingerprint) {
        Read = readCheckpoint(O.CheckpointPath, O.Fingerprint, Tensors,
                              World ? World->rank() : 0,
                              World ? World->size() : 1);
      } else {
        // Another layout of the same model: reshard (sp-run checked the
        // model's fingerprint).
        auto Model = E.modelTensors();
        if (!Model)
          return Model.takeError();
        Read = readCheckpointResharded(O.CheckpointPath, O.ModelFingerprint,
                                       Tensors, *Model, Groups.At);
      }
      if (!Read)
        return Read.takeError();
      M = std::move(*Read);
      return E.upload(); // the restored views, to the backend
    }();
    if (Error Err = agreeOnError(World, std::move(Restored))) {
      DiscardLocks();
      return Err;
    }
    // The optimizer's count and fp16's loss scale go on (a checkpoint of a
    // plan without loss scaling leaves this plan's initial scale).
    E.restoreSkippedUpdates(M->SkippedUpdates);
    if (M->LossScale)
      E.restoreLossScaling(*M->LossScale, M->LossScaleGoodSteps);
    if (O.Resume) {
      FirstStep = M->Step + 1;
      R.SavedStep = M->Step;
      for (const LossRow &Row : M->Losses)
        if (Row.Step <= M->Step)
          R.Rows.push_back(Row);
    }
  }
  SavedStep.store(R.SavedStep);
  Stop.SavedStep.store(R.SavedStep);

  if (O.Sample) {
    R.DumpDirFor = O.DumpDir;
    R.WeightsFrom =
        O.Resumed ? formatv("the weights of checkpoint '{0}' (step {1})",
                            O.CheckpointPath, O.Resumed->Step)
                        .str()
                  : std::string("the model's own weights (no --checkpoint)");
    return R.generate(*O.Sample);
  }

  // From here on, files are written.
  if (!O.DumpDir.empty()) {
    if (Lead)
      if (auto Err = makeDir(O.DumpDir, "--dump"))
        return Err;
    // The logits come from a forward-only evaluation (every stage takes
    // part in a pipelined plan's).
    if (auto Err = R.dumpLogits(O.DumpDir))
      return Err;
  }

  int64_t TokensPerStep = E.batch() * E.seq() * Grid.Data; // every replica
  if (O.Eval) {
    double Sum = 0;
    auto Start = std::chrono::steady_clock::now();
    for (int64_t Step = 1; Step <= O.Steps; ++Step) {
      auto Sig = agreedStop(World);
      if (!Sig)
        return Sig.takeError();
      if (*Sig) {
        StopStep.store(Step - 1);
        StopSignal.store(*Sig);
        return Error::success();
      }
      Data->getBatch(Step, R.Batch);
      auto L = E.evalLoss(R.Batch);
      if (!L)
        return L.takeError();
      Sum += *L;
    }
    double Seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - Start)
            .count();
    Out << formatv(
        "eval: mean loss {0:F4} over {1} batches of {2} x {3} "
        "tokens ({4} tok/s)\n",
        Sum / double(O.Steps), O.Steps, E.batch(), E.seq(),
        groupThousands(int64_t(std::llround(double(TokensPerStep * O.Steps) /
                                            std::max(Seconds, 1e-9)))));
    printMemory(Out, P, E.memory());
    if (!O.DumpDir.empty())
      if (auto Err = R.writeMemory(O.DumpDir))
        return Err;
    return Error::success();
  }

  // Throughput: the model FLOPs of one step of the whole job (forward and
  // backward of every replica, recomputation not counted: the paper's
  // "model FLOPs"), from the plan's FLOP report; the job's peak, from
  // --peak-flops (per rank) or the backends' (the CPU's is the process's,
  // which its thread ranks share). A collective: every rank takes part.
  double ModelFlopsPerStep = NAN;
  if (auto F = P.Manifest.find("flops");
      F != P.Manifest.end() && F->is_object()) {
    auto M = F->find("model_flops_per_iteration");
    if (M != F->end() && M->is_number())
      ModelFlopsPerStep = M->get<double>() * Grid.Data;
  }
  int WorldSize = World ? World->size() : 1;
  double JobPeak = 0;
  std::string PeakSource;
  if (O.PeakFlops) {
    JobPeak = *O.PeakFlops * WorldSize;
    PeakSource = formatv("--peak-flops {0} x {1} rank{2}",
                         flopRate(*O.PeakFlops), WorldSize,
                         WorldSize > 1 ? "s" : "")
                     .str();
  } else {
    bool Measures = O.Cuda || !O.ThreadRanks || !World || World->rank() == 0;
    double Mine = Measures ? E.peakFlops() : 0;
    double Sums[2] = {Mine, Measures && !(Mine > 0) ? 1.0 : 0.0};
    if (World)
      if (auto Err = World->allReduceSum(Sums, 2))
        return Err;
    if (Sums[1] == 0)
      JobPeak = Sums[0];
    PeakSource = O.Cuda ? "the GPUs' dense GEMM peak"
                        : "this CPU's measured float32 GEMM rate";
  }

  std::string Layout;
  if (Grid.size() > 1)
    Layout = formatv(", ranks d {0} x p {1} x t {2}", Grid.Data,
                     Grid.Pipeline, Grid.Tensor)
                 .str();
  if (Grid.Data > 1)
    Layout += formatv(" ({0} replicas of batch {1})", Grid.Data, E.batch());
  std::string StepsText =
      FirstStep > O.Steps ? formatv("step {0} reached", O.Steps).str()
                          : formatv("steps {0}-{1}", FirstStep, O.Steps).str();
  Out << formatv("sp-run: training {0} (plan '{1}'): {2}, batch "
                 "{3} x {4} tokens{9}, lr {5} (warmup {6}, cosine to {7}), "
                 "{8} threads\n",
                 ModelName, O.PlanDir, StepsText,
                 E.batch() * Grid.Data, E.seq(), sci(O.LR), O.Warmup,
                 sci(O.MinLR), O.ThreadsPerRank, Layout);
  // How the CPU computes a 16-bit plan (runtime/cpu/CpuBackend.cpp).
  std::string Dtype = P.Manifest.value("dtype", "f32");
  if (!O.Cuda && Dtype == "bf16")
    Out << (cpu::bf16DotEnabled()
                ? formatv("bf16 compute: GEMMs on {0} (float32 sums){1}; "
                          "other ops in float32; each result rounded once\n",
                          cpu::bf16KernelName(cpu::Bf16Kernel::Best),
                          cpu::hasAmxBf16() && !cpu::amxEnabled()
                              ? ", not AMX (SP_CPU_AMX=0)"
                              : "")
                      .str()
                : formatv("bf16 compute: float32 on widened copies, each "
                          "result rounded once ({0})\n",
                          cpu::hasBf16Dot() || cpu::hasAmxBf16()
                              ? "SP_CPU_BF16_DOT=0"
                              : "this CPU has no AVX-512 BF16 or AMX")
                      .str());
  else if (!O.Cuda && Dtype == "f16")
    Out << "fp16 compute: float32 on widened copies, each result rounded "
           "once\n";
  else if (O.Cuda && (Dtype == "bf16" || Dtype == "f16"))
    Out << (Dtype == "bf16" ? "bf16" : "fp16")
        << " compute: GEMMs on tensor cores (float32 sums), other ops in "
           "float32 on widened copies; each result rounded once\n";
  // How the GPU runs a fused attention core (runtime/cuda/AttentionPlan.h).
  if (O.Cuda && llvm::any_of(P.Prog.Instrs, [](const Instruction &I) {
        return I.Op == OpKind::Attention;
      }))
    Out << (O.BlockwiseAttention
                ? "attention core: the blockwise kernels (heads above 128 as "
                  "unfused ops)\n"
                : "attention core: its unfused ops on a float32 workspace "
                  "(--cuda-attention blockwise for the blockwise kernels; "
                  "or compile with --attention unfused)\n");
  if (O.Cuda && O.CublasLtEpilogues)
    Out << "linear biases: in the GEMM's epilogue (cuBLASLt) where it offers "
           "an algorithm\n";
  if (O.Resumed && O.Resumed->PlanFingerprint != O.Fingerprint) {
    const ProcessGrid &W = O.Resumed->Grid;
    Out << formatv("resharded checkpoint '{0}' (step {1}) of another plan of "
                   "this model, written by d {2} x p {3} x t {4}\n",
                   O.CheckpointPath, O.Resumed->Step, W.Data, W.Pipeline,
                   W.Tensor);
  }
  // A CPU whose BLAS runs older kernels than it could says so (a VM that
  // hides the CPU model), on the line of the GEMM rate that shows it.
  std::string BlasNote;
  if (!O.Cuda) {
    std::string Chosen, Better = CpuBackend::betterBlasCore(&Chosen);
    if (!Better.empty())
      BlasNote =
          formatv("; note: OpenBLAS runs its {0} kernels on this "
                  "{1} CPU (its model is hidden, as in many VMs): "
                  "export OPENBLAS_CORETYPE={2} for faster GEMMs",
                  Chosen, Better == "SkylakeX" ? "AVX-512" : "AVX2", Better)
              .str();
  }
  if (std::isfinite(ModelFlopsPerStep))
    Out << formatv("{0} per step (model FLOPs){1}{2}\n",
                   flopCount(ModelFlopsPerStep),
                   JobPeak > 0 ? formatv("; MFU against {0} ({1})",
                                         flopRate(JobPeak), PeakSource)
                                     .str()
                               : std::string(),
                   BlasNote);
  if (ValData)
    Out << formatv("validation: {0} batches of '{1}' every {2} steps and at "
                   "the end\n",
                   O.EvalSteps, O.ValDataFile, O.EvalEvery);
  Out.flush();
  ProgressBar Progress(Lead ? static_cast<raw_ostream &>(errs()) : Nowhere,
                       Lead && errs().is_displayed(),
                       O.LogEvery);
  // The mean loss of the validation batches (every rank takes part).
  TokenBatch ValBatch;
  auto Validate = [&]() -> Expected<double> {
    double Sum = 0;
    for (int64_t K = 1; K <= O.EvalSteps; ++K) {
      ValData->getBatch(K, ValBatch);
      auto L = E.evalLoss(ValBatch);
      if (!L)
        return L.takeError();
      Sum += *L;
    }
    return Sum / double(O.EvalSteps);
  };
  double TrainSeconds = 0;
  TimeStats FirstStepTime;
  auto LastLogWrite = std::chrono::steady_clock::now();
  auto FailAfterLogs = [&](Error Err) {
    Progress.finish();
    consumeError(R.writeLogs()); // keep what the run got to
    return Err;
  };
  for (int64_t Step = FirstStep; Step <= O.Steps; ++Step) {
    // A signal: every rank stops here, after the same step; with
    // --checkpoint-on-exit they save it first.
    auto Sig = agreedStop(World);
    if (!Sig)
      return FailAfterLogs(Sig.takeError());
    if (*Sig) {
      Progress.finish();
      int64_t Last = Step - 1;
      if (O.CheckpointOnExit && Last >= FirstStep && R.SavedStep != Last) {
        if (auto Err = R.writeCheckpointAt(Last))
          return FailAfterLogs(std::move(Err));
        SavedOnExit.store(true);
      }
      R.Page.RunStatus = formatv("stopped by {0} after step {1} of {2}",
                                 signalName(*Sig), Last, O.Steps);
      if (Last >= FirstStep)
        if (auto Err = R.writeLogs())
          return Err;
      SavedStep.store(R.SavedStep);
      StopStep.store(Last);
      StopSignal.store(*Sig);
      return Error::success();
    }
    Stop.Step.store(Step);
    double StepLR = learningRate(Step, O.Steps, O.Warmup, O.LR, O.MinLR);
    Data->getBatch(Step, R.Batch);
    auto Start = std::chrono::steady_clock::now();
    double ScaleBefore = E.lossScaling() ? E.lossScaling()->Scale : 1;
    auto L = E.trainStep(R.Batch, StepLR, Step);
    double StepSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - Start)
            .count();
    TrainSeconds += StepSeconds;
    int64_t StepMs = int64_t(StepSeconds * 1000);
    for (int64_t Slowest = Stop.SlowestStepMs.load();
         StepMs > Slowest &&
         !Stop.SlowestStepMs.compare_exchange_weak(Slowest, StepMs);)
      ;
    if (!L)
      return FailAfterLogs(
          usageError(formatv("step {0}: {1}", Step, toString(L.takeError()))));
    if (E.lastStepSkipped() && Lead) {
      // fp16: the scaled gradients overflowed; nothing was updated.
      Out << formatv("step {0}: gradients overflowed at loss scale 2^{1}; "
                     "update skipped, loss scale now 2^{2}\n",
                     Step, std::ilogb(ScaleBefore),
                     std::ilogb(E.lossScaling()->Scale));
      Out.flush();
    }
    if (E.lastStepSkipped() && ScaleBefore <= 1)
      return FailAfterLogs(usageError(formatv(
          "step {0}: the gradients overflow fp16 even at loss scale 1 (or "
          "the forward does); train this model with --dtype bf16 or fp32",
          Step)));
    if (!std::isfinite(*L) && !E.lastStepSkipped())
      return FailAfterLogs(usageError(
          formatv("step {0}: the loss is {1}; try a lower --lr (now {2})", Step,
                  *L, O.LR)));
    LossRow Row{Step, *L, StepLR};
    Row.GradNorm = E.lastGradNorm();
    Row.TokensPerSecond = double(TokensPerStep) / std::max(StepSeconds, 1e-9);
    Row.FlopsPerSecond = ModelFlopsPerStep / std::max(StepSeconds, 1e-9);
    if (JobPeak > 0)
      Row.MFU = Row.FlopsPerSecond / JobPeak;
    if (Step == FirstStep)
      FirstStepTime = E.timing(); // page faults and warm caches
    if (ValData && (Step % O.EvalEvery == 0 || Step == O.Steps)) {
      auto V = Validate();
      if (!V)
        return FailAfterLogs(usageError(
            formatv("step {0}: validation: {1}", Step, toString(V.takeError()))));
      Row.ValLoss = *V;
    }
    R.Rows.push_back(Row);
    Progress.update(O.Steps, Row, FirstStep);
    if (std::isfinite(Row.ValLoss))
      Progress.note(formatv("step {0}: validation loss {1:F4} (training {2:F4}"
                            ")",
                            Step, Row.ValLoss, *L)
                        .str());
    if (!O.DumpDir.empty() && Step == FirstStep) {
      if (auto Err = E.download())
        return FailAfterLogs(std::move(Err));
      std::vector<TensorView> Grads;
      for (const TensorView &Param : E.parameters()) {
        if (StringRef(Param.Name).contains('@'))
          continue; // a copy of another stage's weight
        auto G = E.gradient(Param.Name);
        if (!G)
          return FailAfterLogs(
              usageError("the plan exposes no gradient of parameter '" +
                         Param.Name + "'"));
        G->Name = Param.Name;
        Grads.push_back(*G);
      }
      if (auto Err = R.dumpTensors(O.DumpDir + "/grads", Grads))
        return FailAfterLogs(std::move(Err));
    }
    if (O.CheckpointEvery && (Step % O.CheckpointEvery == 0 || Step == O.Steps))
      if (auto Err = R.writeCheckpointAt(Step))
        return FailAfterLogs(std::move(Err));
    auto Now = std::chrono::steady_clock::now();
    if (Step == O.Steps || (O.CheckpointEvery && Step % O.CheckpointEvery == 0) ||
        Now - LastLogWrite > std::chrono::seconds(30)) {
      if (auto Err = R.writeLogs())
        return FailAfterLogs(std::move(Err));
      LastLogWrite = Now;
    }
  }
  Progress.finish();
  WritingScope Writing; // a stop lets the outputs below finish
  // Resumed from the last step (a run killed after its final checkpoint):
  // its logs, from the checkpoint's loss history.
  if (FirstStep > O.Steps)
    if (auto Err = R.writeLogs())
      return Err;
  if (auto Err = E.download()) // the trained weights, for dumps and export
    return Err;

  if (!O.DumpDir.empty()) {
    std::string Csv = lossCsv(R.Rows);
    if (Lead)
      if (auto Err = writeFileAtomically(O.DumpDir + "/loss.csv",
                                     [&](raw_ostream &OS) { OS << Csv; }))
        return Err;
    if (auto Err = R.dumpTensors(O.DumpDir + "/weights", E.parameters()))
      return Err;
    if (auto Err = R.writeMemory(O.DumpDir))
      return Err;
  }
  if (!O.TraceFile.empty())
    if (auto Err = writeTrace(O.TraceFile, World, E, Grid.Tensor))
      return Err;
  if (!O.ExportOnnx.empty()) {
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
      if (auto Err = exportOnnxWeights(O.Source, O.ExportOnnx, Weights))
        return Err;
  }

  int64_t Trained = O.Steps - FirstStep + 1;
  if (Trained <= 0)
    Out << formatv("checkpoint '{0}' is at step {1} of {1}: nothing left to "
                   "train; final loss {2:F4}\n",
                   O.CheckpointPath, O.Steps, R.Rows.back().Loss);
  else
  {
    double Rate = double(TokensPerStep * Trained) / std::max(TrainSeconds, 1e-9);
    std::string Flops;
    if (std::isfinite(ModelFlopsPerStep)) {
      double F = ModelFlopsPerStep * double(Trained) /
                 std::max(TrainSeconds, 1e-9);
      Flops = ", " + flopRate(F);
      if (JobPeak > 0)
        Flops += formatv(" (MFU {0:F1}%)", 100 * F / JobPeak).str();
    }
    Out << formatv(
        "trained steps {0}-{1}: final loss {2:F4}, {3} tok/s{6} "
        "({4} tokens in {5:F2} s)\n",
        FirstStep, O.Steps, R.Rows.back().Loss,
        groupThousands(int64_t(std::llround(Rate))),
        groupThousands(TokensPerStep * Trained), TrainSeconds, Flops);
    for (auto It = R.Rows.rbegin(); It != R.Rows.rend(); ++It)
      if (std::isfinite(It->ValLoss)) {
        Out << formatv("validation loss {0:F4} at step {1}\n", It->ValLoss,
                       It->Step);
        break;
      }
  }
  printMemory(Out, P, E.memory());
  printTiming(Out, E.timing(), FirstStepTime);
  Out << "wrote " << O.LogPath << "/loss.csv and loss.svg\n";
  if (!O.HtmlPath.empty())
    Out << "wrote report page " << O.HtmlPath << "\n";
  if (O.CheckpointEvery && Trained > 0)
    Out << "wrote checkpoint " << O.CheckpointPath << " (step " << O.Steps
        << ")\n";
  if (!O.DumpDir.empty())
    Out << "wrote dumps to " << O.DumpDir << "\n";
  if (!O.ExportOnnx.empty())
    Out << "exported the trained weights to " << O.ExportOnnx << "\n";

  return Error::success();
}

} // namespace sp
