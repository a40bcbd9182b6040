//===- sp-run.cpp - Train or evaluate a compiled plan on the CPU ----------===//
//
//   sp-run PLAN [--steps N] (--data FILE | --synthetic-data) [--lr X]
//          [--warmup N] [--min-lr X] [--seed S] [--dropout RATE] [--shuffle]
//          [--eval] [--log-dir DIR] [--checkpoint DIR] [--checkpoint-every N]
//          [--resume] [--dump DIR] [--export-onnx OUT] [--threads N]
//
// Drives sp::Executor (runtime/Executor.h) through a training run: batches
// from a memory-mapped token file (runtime/DataLoader.h), the learning-rate
// schedule, the loss log and plot and a progress line (runtime/LossLog.h),
// atomic checkpoints and resume (runtime/Checkpoint.h), debugging dumps as
// .npy (runtime/Npy.h), and the trained weights written back into a copy of
// the source ONNX model (frontend/OnnxExport.h). Each header states its part
// of the contract (data offsets, schedule, checkpoint format).
//
// Everything the flags and inputs can get wrong is checked before anything
// is written: a bad run prints one error line, exits non-zero and leaves
// existing files alone.
//
//===----------------------------------------------------------------------===//
#include "frontend/OnnxExport.h"
#include "frontend/OnnxImporter.h"
#include "runtime/Checkpoint.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/ProcessGrid.h"
#include "runtime/cpu/Parallel.h"
#include "runtime/DataLoader.h"
#include "runtime/Executor.h"
#include "runtime/LossLog.h"
#include "runtime/Npy.h"
#include "plan/Plan.h"
#include "tools/ToolSupport.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

// OpenBLAS's thread control (cblas.h declares it too; declared here so that
// sp-run does not depend on where a distribution puts that header).
extern "C" void openblas_set_num_threads(int NumThreads);

using namespace llvm;
using namespace sp;

static cl::OptionCategory Cat("sp-run options");
static cl::opt<std::string> PlanDir(cl::Positional, cl::desc("<plan>"),
                                    cl::Required, cl::cat(Cat));
static cl::opt<int64_t> Steps("steps", cl::desc("Training steps (default 10)"),
                              cl::init(10), cl::value_desc("n"), cl::cat(Cat));
static cl::opt<std::string>
    DataFile("data",
             cl::desc("Token file: little-endian uint16 ids (nanoGPT .bin), "
                      "e.g. from sp-tokenize"),
             cl::value_desc("file"), cl::cat(Cat));
static cl::opt<bool> SyntheticData(
    "synthetic-data",
    cl::desc("Random tokens from --seed instead of --data (benchmarks)"),
    cl::cat(Cat));
static cl::opt<double> LR("lr", cl::desc("Peak learning rate (default 1e-3)"),
                          cl::init(1e-3), cl::value_desc("x"), cl::cat(Cat));
static cl::opt<int64_t> Warmup("warmup",
                               cl::desc("Linear warmup steps (default 0)"),
                               cl::init(0), cl::value_desc("n"), cl::cat(Cat));
static cl::opt<double>
    MinLR("min-lr",
          cl::desc("Final learning rate of the cosine decay (default lr/10)"),
          cl::value_desc("x"), cl::cat(Cat));
static cl::opt<unsigned long long>
    Seed("seed", cl::desc("Dropout and shuffling seed (default 1234)"),
         cl::init(1234), cl::value_desc("s"), cl::cat(Cat));
static cl::opt<double>
    Dropout("dropout",
            cl::desc("Override every dropout ratio (0 turns dropout off)"),
            cl::value_desc("rate"), cl::cat(Cat));
static cl::opt<bool> Shuffle("shuffle",
                             cl::desc("Batches at random offsets (from --seed "
                                      "and the step)"),
                             cl::cat(Cat));
static cl::opt<Objective::KindT> ObjectiveKind(
    "objective", cl::desc("What the model learns to predict (default next-token)"),
    cl::values(clEnumValN(Objective::NextToken, "next-token",
                          "each position's next token (GPT, Llama)"),
               clEnumValN(Objective::MaskedLM, "masked-lm",
                          "BERT's masked-LM: --mask-rate of the positions, "
                          "chosen from --seed, predict their own token")),
    cl::init(Objective::NextToken), cl::cat(Cat));
static cl::opt<int64_t>
    PadToken("pad-token",
             cl::desc("Padding token id: its positions are masked out of "
                      "attention (the model's attention-mask input) and "
                      "predict nothing"),
             cl::init(-1), cl::value_desc("id"), cl::cat(Cat));
static cl::opt<int64_t>
    MaskToken("mask-token",
              cl::desc("masked-lm: the id that replaces a chosen token"),
              cl::init(-1), cl::value_desc("id"), cl::cat(Cat));
static cl::opt<double>
    MaskRate("mask-rate",
             cl::desc("masked-lm: the share of positions chosen (default "
                      "0.15)"),
             cl::init(0.15), cl::value_desc("x"), cl::cat(Cat));
static cl::opt<bool>
    Eval("eval",
         cl::desc("No training: the mean loss over --steps batches, forward "
                  "only, no dropout (the weights of --checkpoint DIR if "
                  "given)"),
         cl::cat(Cat));
static cl::opt<std::string>
    LogDir("log-dir",
           cl::desc("Where loss.csv and loss.svg go (default "
                    "PLAN/run)"),
           cl::value_desc("dir"), cl::cat(Cat));
static cl::opt<std::string>
    CheckpointDir("checkpoint",
                  cl::desc("Checkpoint directory (default PLAN/checkpoint)"),
                  cl::value_desc("dir"), cl::cat(Cat));
static cl::opt<int64_t> CheckpointEvery(
    "checkpoint-every",
    cl::desc("Write a checkpoint every N steps and at the end (atomically)"),
    cl::init(0), cl::value_desc("n"), cl::cat(Cat));
static cl::opt<bool>
    Resume("resume",
           cl::desc("Continue from the checkpoint in --checkpoint DIR"),
           cl::cat(Cat));
static cl::opt<std::string>
    TraceFile("trace",
              cl::desc("Write a Chrome trace (chrome://tracing, Perfetto) of "
                       "the training steps: every instruction of every rank"),
              cl::value_desc("file.json"), cl::cat(Cat));
static cl::opt<std::string>
    DumpDir("dump",
            cl::desc("Debugging dumps: logits.npy, loss.csv, grads/*.npy "
                     "after the first step, weights/*.npy at the end, "
                     "memory.json"),
            cl::value_desc("dir"), cl::cat(Cat));
static cl::opt<std::string>
    ExportOnnx("export-onnx",
               cl::desc("Write the trained weights into a copy of the source "
                        "model"),
               cl::value_desc("out.onnx"), cl::cat(Cat));
static cl::opt<int> Threads("threads",
                            cl::desc("Kernel threads, GEMMs included (default: all cores, shared by the ranks of one process)"),
                            cl::init(0), cl::value_desc("n"), cl::cat(Cat));

static cl::opt<std::string>
    CommKind("comm",
             cl::desc("How the ranks of a tensor-parallel plan talk: threads "
                      "(one process, default) or mpi (one process per rank, "
                      "under mpirun)"),
             cl::init("threads"), cl::value_desc("threads|mpi"), cl::cat(Cat));

static const char *Tool = "sp-run";

static Error usageError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), Msg);
}

/// "5.28 MiB".

/// "1.0e-03".
static std::string sci(double X) {
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

/// Flags that are wrong whatever the plan and the files.
static Error checkFlags() {
  if (Steps <= 0)
    return usageError("--steps must be a positive integer");
  if (!(LR > 0) || !std::isfinite(LR))
    return usageError("--lr must be a positive number");
  if (MinLR.getNumOccurrences() && (!(MinLR >= 0) || !std::isfinite(MinLR)))
    return usageError("--min-lr must be a non-negative number");
  if (MinLR.getNumOccurrences() && MinLR > LR)
    return usageError("--min-lr " + sci(MinLR) + " is above the peak --lr " +
                      sci(LR));
  if (Warmup < 0)
    return usageError("--warmup must not be negative");
  if (Dropout.getNumOccurrences() && !(Dropout >= 0 && Dropout < 1))
    return usageError("--dropout must be in [0, 1)");
  if (Threads.getNumOccurrences() && Threads <= 0)
    return usageError("--threads must be a positive integer");
  if (CheckpointEvery.getNumOccurrences() && CheckpointEvery <= 0)
    return usageError("--checkpoint-every must be a positive integer");
  if (!DataFile.empty() && SyntheticData)
    return usageError("--data and --synthetic-data exclude each other");
  if (DataFile.empty() && !SyntheticData)
    return usageError("--data FILE is required (a token file from "
                      "sp-tokenize), or --synthetic-data for a benchmark");
  if (ObjectiveKind != Objective::MaskedLM)
    for (auto [Given, Flag] :
         {std::pair{MaskToken.getNumOccurrences() > 0, "--mask-token"},
          {MaskRate.getNumOccurrences() > 0, "--mask-rate"}})
      if (Given)
        return usageError(Twine(Flag) + " is for --objective masked-lm");
  if (Eval) {
    for (auto [Given, Flag] :
         {std::pair{CheckpointEvery.getNumOccurrences() > 0,
                    "--checkpoint-every"},
          {Resume.getValue(), "--resume"},
          {ExportOnnx.getNumOccurrences() > 0, "--export-onnx"}})
      if (Given)
        return usageError(Twine("--eval does not train; it cannot be "
                                "combined with ") +
                          Flag);
  } else if (CheckpointDir.getNumOccurrences() && !CheckpointEvery && !Resume) {
    return usageError("--checkpoint DIR needs --checkpoint-every N (to "
                      "write) or --resume (to read)");
  }
  return Error::success();
}

/// The source model the plan was compiled from: the manifest's "source", or
/// else the model a parameter's data lives in (absolute).
static std::string findSourceModel(const Plan &P) {
  std::string Source = P.Manifest.value("source", "");
  if (!Source.empty() && sys::fs::exists(Source))
    return Source;
  for (const ProgramBuffer &B : P.Prog.Buffers)
    if (B.Data && B.Data->ref().K == DataRef::OnnxInitializer &&
        sys::fs::exists(B.Data->ref().Path))
      return B.Data->ref().Path;
  return "";
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
  std::string ModelName;
  std::string LogDirPath, CheckpointPath;
  std::string Fingerprint;
  uint64_t RunSeed = 0;
  std::vector<LossRow> Rows;
  TokenBatch Batch;

  Error dumpLogits(StringRef Dir);
  Error dumpTensors(StringRef Dir, ArrayRef<TensorView> Tensors);
  Error writeLogs();
  Error writeCheckpointAt(int64_t Step);
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
  auto Logits = E.logits();
  if (!Logits)
    return usageError("the plan exposes no logits to dump");
  auto Full = E.gather(*Logits); // the whole vocabulary
  if (!Full)
    return Full.takeError();
  if (!Lead)
    return Error::success();
  SmallVector<int64_t, 4> Shape(Logits->FullType.Shape.begin(),
                                Logits->FullType.Shape.end());
  if (Shape.size() == 2 && Shape[0] == E.batch() * E.seq())
    Shape = {E.batch(), E.seq(), Shape[1]};
  return writeNpy((Dir + "/logits.npy").str(), Shape, *Full);
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
    auto Full = E.gather(T);
    if (!Full)
      return Full.takeError();
    if (!StageLead)
      continue;
    if (auto Err = writeNpy((Dir + "/" + fileNameFor(T.Name) + ".npy").str(),
                            T.FullType.Shape, *Full))
      return Err;
  }
  return Error::success();
}

Error Run::writeLogs() {
  if (!Lead)
    return Error::success();
  if (auto Err = makeDir(LogDirPath, "--log-dir"))
    return Err;
  std::string Csv = lossCsv(Rows);
  if (auto Err = writeFileAtomically(LogDirPath + "/loss.csv",
                                 [&](raw_ostream &OS) { OS << Csv; }))
    return Err;
  std::string Svg = lossSvg(Rows, ModelName + ": training loss");
  return writeFileAtomically(LogDirPath + "/loss.svg",
                         [&](raw_ostream &OS) { OS << Svg; });
}

Error Run::writeCheckpointAt(int64_t Step) {
  CheckpointMeta M;
  M.Step = Step;
  M.Seed = RunSeed;
  M.PlanFingerprint = Fingerprint;
  M.Losses = Rows;
  return writeCheckpoint(CheckpointPath, M, checkpointTensors());
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
  const Program &P = E.program();
  for (const TraceEvent &T : E.trace()) {
    const Instruction &I = P.Instrs[T.Instruction];
    bool Comm = I.Op == OpKind::Send || I.Op == OpKind::Recv ||
                I.Op == OpKind::AllReduce || I.Op == OpKind::AllGather ||
                I.Op == OpKind::ReduceScatter ||
                I.Op == OpKind::PipeAllReduce ||
                I.Op == OpKind::PipeBroadcast;
    std::string Label = opName(I.Op).str();
    if (!I.Role.empty())
      Label += " " + I.Role;
    nlohmann::json Args = {{"instruction", T.Instruction},
                           {"step", T.Step},
                           {"phase", phaseName(I.Ph).str()}};
    if (I.Layer >= 0)
      Args["layer"] = I.Layer;
    if (I.Attrs.has("microbatch"))
      Args["microbatch"] = I.Attrs.getInt("microbatch", 0);
    Events.push_back({{"name", Label},
                      {"cat", Comm ? "communication" : phaseName(I.Ph).str()},
                      {"ph", "X"},
                      {"ts", T.StartUs},
                      {"dur", T.DurationUs},
                      {"pid", Rank},
                      {"tid", Comm ? 1 : 0},
                      {"args", Args}});
  }
  return Events;
}

/// Gathers every rank's events on rank 0 (point to point over the world
/// group, so it works on threads and on MPI) and writes the trace there.
static Error writeTrace(Communicator *World, const Executor &E, int TP) {
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
  return writeFileAtomically(TraceFile.getValue(),
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

int main(int Argc, char **Argv) {
  InitLLVM X(Argc, Argv);
  cl::HideUnrelatedOptions(Cat);
  cl::ParseCommandLineOptions(
      Argc, Argv, "sp-run: train or evaluate a compiled plan on the CPU\n");
  auto Fail = [](Error E) { return reportError(Tool, std::move(E)); };
  if (auto E = checkFlags())
    return Fail(std::move(E));

  std::string CkptPath = CheckpointDir.getNumOccurrences()
                             ? CheckpointDir.getValue()
                             : PlanDir + "/checkpoint";
  std::string LogPath =
      LogDir.getNumOccurrences() ? LogDir.getValue() : PlanDir + "/run";
  bool LoadCheckpoint = Resume || (Eval && CheckpointDir.getNumOccurrences());

  // A resumed run keeps its seed: dropout masks and shuffled offsets are
  // functions of it.
  uint64_t RunSeed = Seed;
  std::optional<CheckpointMeta> Resumed;
  if (LoadCheckpoint) {
    if (!checkpointExists(CkptPath))
      return Fail(usageError(
          formatv("{0}: there is no checkpoint in '{1}' (write one with "
                  "--checkpoint-every N)",
                  Resume ? "--resume" : "--checkpoint", CkptPath)));
    auto M = readCheckpointMeta(CkptPath);
    if (!M)
      return Fail(M.takeError());
    if (Resume) {
      if (Seed.getNumOccurrences() && Seed != M->Seed)
        return Fail(usageError(formatv(
            "--seed {0} differs from the seed {1} of checkpoint '{2}'; a "
            "resumed run keeps its seed",
            Seed.getValue(), M->Seed, CkptPath)));
      RunSeed = M->Seed;
      if (M->Step >= Steps)
        return Fail(usageError(formatv(
            "checkpoint '{0}' is at step {1}; --steps {2} leaves nothing to "
            "train (--steps is the total, not the steps to add)",
            CkptPath, M->Step, Steps.getValue())));
    }
    Resumed = std::move(*M);
  }

  auto P = readPlan(PlanDir);
  if (!P)
    return Fail(P.takeError());
  std::string Fingerprint = planFingerprint(P->Prog);
  if (Resumed && Resumed->PlanFingerprint != Fingerprint)
    return Fail(usageError(formatv(
        "checkpoint '{0}' was written for another plan (fingerprint {1}, "
        "plan '{2}' has {3}); resume with the plan that wrote it",
        CkptPath, Resumed->PlanFingerprint, PlanDir, Fingerprint)));
  Objective Obj;
  Obj.Kind = ObjectiveKind;
  Obj.PadToken = PadToken;
  Obj.MaskToken = MaskToken;
  Obj.MaskRate = MaskRate;
  Obj.Seed = RunSeed;
  if (Obj.PadToken >= 0 &&
      none_of(P->Prog.Buffers, [](const ProgramBuffer &B) {
        return B.K == ProgramBuffer::Input && B.Feed == InputRole::Mask;
      }))
    return Fail(usageError(
        "--pad-token: the model has no attention-mask input, so every "
        "token would attend to the padding; export it with its "
        "attention_mask input (or bind one with sp-compile --input "
        "NAME=mask)"));
  std::string Source;
  if (!ExportOnnx.empty()) {
    Source = findSourceModel(*P);
    if (Source.empty())
      return Fail(usageError(
          formatv("--export-onnx: the plan's source model '{0}' is not found",
                  P->Manifest.value("source", std::string("?")))));
  }
  if (CheckpointEvery)
    if (auto Err = checkCheckpointTarget(CkptPath))
      return Fail(std::move(Err));
  if (!ExportOnnx.empty() && sys::fs::is_directory(ExportOnnx))
    return Fail(usageError("--export-onnx '" + ExportOnnx +
                           "' is a directory; name the model file to write"));
  for (auto [Dir, Flag] : {std::pair{StringRef(DumpDir), "--dump"},
                           {StringRef(LogDir), "--log-dir"}})
    if (!Dir.empty() && sys::fs::exists(Dir) && !sys::fs::is_directory(Dir))
      return Fail(usageError(Twine(Flag) + " '" + Dir +
                             "' exists and is not a "
                             "directory"));

  int NumThreads = Threads
                       ? Threads.getValue()
                       : int(std::max(1u, std::thread::hardware_concurrency()));

  registerOnnxDataLoader();
  int TP = P->Manifest.value("tp", 1);
  int PP = P->numStages();
  if (TP > 1 && (CheckpointEvery || LoadCheckpoint))
    return Fail(usageError(formatv(
        "checkpoints of tensor-parallel plans (--tp {0}) are not supported "
        "yet; train without --checkpoint-every/--resume",
        TP)));
  bool Pipelined = PP > 1 || P->Manifest.value("microbatches", 1) > 1;
  if (Pipelined && (CheckpointEvery || LoadCheckpoint || Eval ||
                    !ExportOnnx.empty()))
    return Fail(usageError(
        "checkpoints, --eval and --export-onnx of pipelined plans (--pp, "
        "--microbatches) are not supported yet; compile without them for "
        "those"));
  if (CommKind != "threads" && CommKind != "mpi")
    return Fail(usageError("--comm must be threads or mpi, got '" + CommKind +
                           "'"));
  int Ranks = TP * PP;
  if (Ranks > 1)
    NumThreads = std::max(1, NumThreads / Ranks); // threads per rank
  // The kernel threads run everything, GEMMs included (split by rows of C,
  // each block a one-thread BLAS call): OpenBLAS's own workers would spin
  // between GEMMs against the elementwise kernels.
  openblas_set_num_threads(1);
  cpu::setKernelThreads(NumThreads);

  // One rank of the pipeline x tensor grid (runtime/comm/ProcessGrid.h);
  // rank 0 writes the files.
  ProcessGrid Grid;
  Grid.Pipeline = PP;
  Grid.Tensor = TP;
  auto Body = [&](Communicator *World) -> Error {
    bool Lead = !World || World->rank() == 0;
    raw_ostream &Out = Lead ? outs() : nulls();
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
    RO.Trace = !TraceFile.empty();
    RO.Seed = RunSeed;
    if (Dropout.getNumOccurrences())
      RO.Dropout = Dropout.getValue();
    auto Exec = Executor::create(*P, RO);
    if (!Exec)
      return Exec.takeError();
    Executor &E = **Exec;

    if (auto Err = checkObjective(Obj, E.vocab()))
      return usageError(toString(std::move(Err)));
    std::unique_ptr<DataLoader> Data;
    if (SyntheticData) {
      Data = DataLoader::synthetic(RunSeed, E.batch(), E.seq(), E.vocab());
    } else {
      auto D = DataLoader::open(DataFile, E.batch(), E.seq(), E.vocab());
      if (!D)
        return D.takeError();
      Data = std::move(*D);
    }
    Data->setShuffle(Shuffle, RunSeed);
    Data->setObjective(Obj);
    Data->setDataParallel(Groups.At.Data, Grid.Data);

    std::string ModelName =
        sys::path::stem(P->Manifest.value("source", std::string("model"))).str();
    bool StageLead = !C || C->rank() == 0;
    Run R{Lead,     StageLead,   *P,      E,  *Data, ModelName, LogPath,
          CkptPath, Fingerprint, RunSeed, {}, {}};
    int64_t FirstStep = 1;
    if (Resumed) {
      std::vector<TensorView> Tensors = R.checkpointTensors();
      auto M = readCheckpoint(CkptPath, Fingerprint, Tensors);
      if (!M)
        return M.takeError();
      if (Resume) {
        FirstStep = M->Step + 1;
        for (const LossRow &Row : M->Losses)
          if (Row.Step <= M->Step)
            R.Rows.push_back(Row);
      }
    }

    // From here on, files are written.
    if (!DumpDir.empty()) {
      if (Lead)
        if (auto Err = makeDir(DumpDir, "--dump"))
          return Err;
      // The logits come from a forward-only evaluation, which pipelined
      // plans do not have.
      if (!Pipelined)
        if (auto Err = R.dumpLogits(DumpDir))
          return Err;
    }

    int64_t TokensPerStep = E.batch() * E.seq();
    if (Eval) {
      double Sum = 0;
      auto Start = std::chrono::steady_clock::now();
      for (int64_t Step = 1; Step <= Steps; ++Step) {
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
          Sum / double(Steps), Steps.getValue(), E.batch(), E.seq(),
          groupThousands(int64_t(std::llround(double(TokensPerStep * Steps) /
                                              std::max(Seconds, 1e-9)))));
      printMemory(Out, *P, E.memory());
      if (!DumpDir.empty())
        if (auto Err = R.writeMemory(DumpDir))
          return Err;
      return Error::success();
    }

    double Min = MinLR.getNumOccurrences() ? MinLR.getValue() : LR / 10;
    Out << formatv("sp-run: training {0} (plan '{1}'): steps {2}-{3}, batch "
                      "{4} x {5} tokens, lr {6} (warmup {7}, cosine to "
                      "{8}), {9} threads\n",
                      ModelName, PlanDir.getValue(), FirstStep, Steps.getValue(),
                      E.batch(), E.seq(), sci(LR), Warmup.getValue(), sci(Min),
                      NumThreads);
    Out.flush();
    ProgressBar Progress(Lead ? errs() : nulls(), Lead && errs().is_displayed());
    double TrainSeconds = 0;
    TimeStats FirstStepTime;
    auto LastLogWrite = std::chrono::steady_clock::now();
    auto FailAfterLogs = [&](Error Err) {
      Progress.finish();
      consumeError(R.writeLogs()); // keep what the run got to
      return Err;
    };
    for (int64_t Step = FirstStep; Step <= Steps; ++Step) {
      double StepLR = learningRate(Step, Steps, Warmup, LR, Min);
      Data->getBatch(Step, R.Batch);
      auto Start = std::chrono::steady_clock::now();
      auto L = E.trainStep(R.Batch, StepLR, Step);
      TrainSeconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - Start)
              .count();
      if (!L)
        return FailAfterLogs(
            usageError(formatv("step {0}: {1}", Step, toString(L.takeError()))));
      if (!std::isfinite(*L))
        return FailAfterLogs(usageError(
            formatv("step {0}: the loss is {1}; try a lower --lr (now {2})", Step,
                    *L, LR.getValue())));
      R.Rows.push_back(LossRow{Step, *L, StepLR});
      if (Step == FirstStep)
        FirstStepTime = E.timing(); // page faults and warm caches
      Progress.update(Step, Steps, *L, StepLR,
                      double(TokensPerStep * (Step - FirstStep + 1)) /
                          std::max(TrainSeconds, 1e-9));
      if (!DumpDir.empty() && Step == FirstStep) {
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
        if (auto Err = R.dumpTensors(DumpDir + "/grads", Grads))
          return FailAfterLogs(std::move(Err));
      }
      if (CheckpointEvery && (Step % CheckpointEvery == 0 || Step == Steps))
        if (auto Err = R.writeCheckpointAt(Step))
          return FailAfterLogs(std::move(Err));
      auto Now = std::chrono::steady_clock::now();
      if (Step == Steps || (CheckpointEvery && Step % CheckpointEvery == 0) ||
          Now - LastLogWrite > std::chrono::seconds(30)) {
        if (auto Err = R.writeLogs())
          return FailAfterLogs(std::move(Err));
        LastLogWrite = Now;
      }
    }
    Progress.finish();

    if (!DumpDir.empty()) {
      std::string Csv = lossCsv(R.Rows);
      if (Lead)
        if (auto Err = writeFileAtomically(DumpDir + "/loss.csv",
                                       [&](raw_ostream &OS) { OS << Csv; }))
          return Err;
      if (auto Err = R.dumpTensors(DumpDir + "/weights", E.parameters()))
        return Err;
      if (auto Err = R.writeMemory(DumpDir))
        return Err;
    }
    if (!TraceFile.empty())
      if (auto Err = writeTrace(World, E, TP))
        return Err;
    if (!ExportOnnx.empty()) {
      std::vector<TensorView> Params = E.parameters();
      std::vector<std::vector<float>> Full;
      Full.reserve(Params.size());
      StringMap<ArrayRef<float>> Weights;
      for (const TensorView &T : Params) {
        auto W = E.gather(T);
        if (!W)
          return W.takeError();
        Full.push_back(std::move(*W));
        Weights[T.Name] = Full.back();
      }
      if (Lead)
        if (auto Err = exportOnnxWeights(Source, ExportOnnx, Weights))
          return Err;
    }

    int64_t Trained = Steps - FirstStep + 1;
    Out << formatv(
        "trained steps {0}-{1}: final loss {2:F4}, {3} tok/s "
        "({4} tokens in {5:F2} s)\n",
        FirstStep, Steps.getValue(), R.Rows.back().Loss,
        groupThousands(int64_t(std::llround(double(TokensPerStep * Trained) /
                                            std::max(TrainSeconds, 1e-9)))),
        groupThousands(TokensPerStep * Trained), TrainSeconds);
    printMemory(Out, *P, E.memory());
    printTiming(Out, E.timing(), FirstStepTime);
    Out << "wrote " << LogPath << "/loss.csv and loss.svg\n";
    if (CheckpointEvery)
      Out << "wrote checkpoint " << CkptPath << " (step " << Steps << ")\n";
    if (!DumpDir.empty())
      Out << "wrote dumps to " << DumpDir << "\n";
    if (!ExportOnnx.empty())
      Out << "exported the trained weights to " << ExportOnnx << "\n";

    return Error::success();
  };

  if (CommKind == "mpi") {
    auto C = createMpiCommunicator(&Argc, &Argv);
    if (!C)
      return Fail(C.takeError());
    // Every rank sees the mismatch: report it once and exit cleanly.
    if ((*C)->size() != Ranks) {
      if ((*C)->rank() == 0)
        Fail(usageError(formatv("the plan was compiled for --tp {0} and --pp "
                                "{1}; run it with mpirun -np {2} (got {3} "
                                "processes)",
                                TP, PP, Ranks, (*C)->size())));
      return 1;
    }
    if (auto Err = Body(C->get())) {
      (*C)->abort(toString(std::move(Err)));
      return 1;
    }
    return 0;
  }
  if (Ranks == 1) {
    if (auto Err = Body(nullptr))
      return Fail(std::move(Err));
    return 0;
  }
  if (auto Err =
          runOnThreadRanks(Ranks, [&](Communicator &C) { return Body(&C); }))
    return Fail(std::move(Err));
  return 0;
}
