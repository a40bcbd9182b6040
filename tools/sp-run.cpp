//===- sp-run.cpp - Train or evaluate a compiled plan on the CPU ----------===//
//
//   sp-run PLAN [--steps N] (--data FILE | --synthetic-data) [--lr X]
//          [--warmup N] [--min-lr X] [--seed S] [--dropout RATE] [--shuffle]
//          [--eval] [--log-dir DIR] [--checkpoint DIR] [--checkpoint-every N]
//          [--resume] [--checkpoint-on-exit] [--dump DIR] [--export-onnx OUT]
//          [--threads N] [--objective next-token|masked-lm] [--pad-token ID]
//          [--comm threads|mpi] [--comm-timeout S] [--html FILE.html]
//
// Checks the flags, the plan and the files, then runs a Trainer
// (tools/Trainer.h) on every rank. The run drives sp::Executor
// (runtime/Executor.h): batches
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
// Faults (README, "Reliability"): a run killed at any moment resumes from
// its last complete checkpoint (they commit atomically); SIGINT and SIGTERM
// stop it after the step in progress (exit 130, 143); the checkpoint and log
// directories are locked against a second run; a full disk or an unwritable
// directory is one error line that leaves the last checkpoint as it was.
//
//===----------------------------------------------------------------------===//
#include "frontend/OnnxImporter.h"
#include "plan/Plan.h"
#include "runtime/Checkpoint.h"
#include "runtime/DataLoader.h"
#include "runtime/comm/Communicator.h"
#include "runtime/cpu/CpuBackend.h"
#include "runtime/cuda/CudaBackend.h"
#include "tools/HtmlReport.h"
#include "tools/ToolSupport.h"
#include "tools/Trainer.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include <cmath>
#include <csignal>
#include <mutex>
#include <thread>

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
static cl::opt<std::string>
    ValDataFile("val-data",
                cl::desc("Held-out token file (e.g. sp-tokenize --split's): "
                         "the mean validation loss over --eval-steps batches "
                         "every --eval-every steps and at the end, logged "
                         "and plotted beside the training loss"),
                cl::value_desc("file"), cl::cat(Cat));
static cl::opt<int64_t>
    EvalEvery("eval-every",
              cl::desc("Steps between validations (default: a tenth of "
                       "--steps)"),
              cl::value_desc("n"), cl::cat(Cat));
static cl::opt<int64_t>
    EvalSteps("eval-steps",
              cl::desc("Validation batches, the same ones each time (default "
                       "10)"),
              cl::init(10), cl::value_desc("k"), cl::cat(Cat));
static cl::opt<int64_t>
    LogEvery("log-every",
             cl::desc("When stderr is not a terminal: a log line every N "
                      "steps, and at the first and last (default 10; on a "
                      "terminal a progress bar is redrawn every step)"),
             cl::init(10), cl::value_desc("n"), cl::cat(Cat));
static cl::opt<double>
    PeakFlops("peak-flops",
              cl::desc("One rank's peak FLOP/s, for the MFU of the log "
                       "(default: the backend's: a GPU's from its "
                       "architecture, the CPU's measured GEMM rate)"),
              cl::value_desc("x"), cl::cat(Cat));
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
    SamplePrompt("sample",
                 cl::desc("No training: the prompt's continuation, --tokens "
                          "byte-level tokens drawn one at a time (forward "
                          "only; the weights of --checkpoint DIR if given)"),
                 cl::value_desc("prompt"), cl::cat(Cat));
static cl::opt<int64_t>
    SampleTokens("tokens", cl::desc("--sample: tokens to generate (default 200)"),
                 cl::init(200), cl::value_desc("n"), cl::cat(Cat));
static cl::opt<double> Temperature(
    "temperature",
    cl::desc("--sample: softmax temperature (default 0.8; 0: always the most "
             "likely token)"),
    cl::init(0.8), cl::value_desc("t"), cl::cat(Cat));
static cl::opt<int64_t>
    TopK("top-k",
         cl::desc("--sample: draw among the k most likely tokens (default "
                  "200; 0: all)"),
         cl::init(200), cl::value_desc("k"), cl::cat(Cat));
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
static cl::opt<bool> CheckpointOnExit(
    "checkpoint-on-exit",
    cl::desc("On SIGINT or SIGTERM, save a checkpoint of the last finished "
             "step before exiting (130 or 143)"),
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
static cl::opt<std::string>
    Html("html",
         cl::desc("Write the run's report page, one self-contained HTML "
                  "file: the plan's facts, the loss curves and the measured "
                  "memory (written with loss.csv)"),
         cl::value_desc("file.html"), cl::cat(Cat));
static cl::opt<std::string>
    Device("device",
           cl::desc("Where the plan runs: cpu (default), or cuda (one GPU "
                    "per rank: an MPI rank's local rank, a thread rank's "
                    "index; cuda:N starts at GPU N)"),
           cl::init("cpu"), cl::value_desc("cpu|cuda[:N]"), cl::cat(Cat));
static cl::opt<bool> AllowTF32(
    "tf32",
    cl::desc("--device cuda: fp32 GEMMs on TF32 tensor cores (10-bit "
             "mantissa inputs; off by default, as the comparisons with the "
             "CPU backend need)"),
    cl::cat(Cat));
static cl::opt<std::string> CudaAttention(
    "cuda-attention",
    cl::desc("--device cuda: how a plan's fused attention core runs: "
             "unfused (default: its unfused ops on a score-sized "
             "workspace) or blockwise (kernels that store no scores; not "
             "yet run on a GPU)"),
    cl::init("unfused"), cl::value_desc("unfused|blockwise"), cl::cat(Cat));
static cl::opt<bool> CudaEpilogues(
    "cuda-epilogues",
    cl::desc("--device cuda: add a linear layer's bias in the GEMM's "
             "epilogue (cuBLASLt) instead of writing it into the output "
             "first; off by default until it has run on a GPU"),
    cl::cat(Cat));
static cl::opt<bool> Float64(
    "float64",
    cl::desc("Numerical check: run the fp32 plan in float64 (every f32 "
             "buffer widened, twice the memory; dumps are '<f8'), to "
             "measure how far float32 rounding moves its losses, gradients "
             "and logits"),
    cl::cat(Cat));
static cl::opt<bool> ExpandSteps(
    "expand-steps",
    cl::desc("Run a pipelined plan's schedule steps written out as one flat "
             "instruction list (as the CUDA backend does) instead of step by "
             "step over its templates: the same calls in the same order, "
             "more memory; for checking and measuring"),
    cl::cat(Cat));
static cl::opt<int> Threads("threads",
                            cl::desc("Kernel threads, GEMMs included (default: all cores, shared by the ranks of one process)"),
                            cl::init(0), cl::value_desc("n"), cl::cat(Cat));

static cl::opt<std::string>
    CommKind("comm",
             cl::desc("How the ranks of a tensor-parallel plan talk: threads "
                      "(one process, default) or mpi (one process per rank, "
                      "under mpirun)"),
             cl::init("threads"), cl::value_desc("threads|mpi"), cl::cat(Cat));

static cl::opt<double> CommTimeout(
    "comm-timeout",
    cl::desc("Seconds a rank waits in a collective or a receive for the other "
             "ranks before it ends the job, naming the call (default 300); "
             "with --device cuda also its waits for the GPU (then NCCL is "
             "aborted)"),
    cl::init(Communicator::DefaultTimeout.count() / 1000.0),
    cl::value_desc("s"), cl::cat(Cat));

static cl::extrahelp FaultsHelp(R"(
Faults:
  Checkpoints commit atomically (new data files, then one rename of the
  index, each synced), so a run killed at any moment, kill -9 and mid-write
  included, resumes with --resume from its last complete checkpoint, bit for
  bit as if it had not stopped. Leftovers of a killed write are removed.

  SIGINT or SIGTERM: the step in progress finishes, every rank stops after
  the same step, the loss log is written and, with --checkpoint-on-exit, a
  checkpoint of that step; then sp-run prints one line and exits 130
  (SIGINT) or 143 (SIGTERM). A step that cannot finish (a rank blocked on a
  dead or stopped peer) is abandoned after max(10 s, 4 x the slowest step);
  a second signal exits at once. Under mpirun, which forwards SIGTERM to the
  ranks and kills them a second later, raise that delay with
  --mca odls_base_sigkill_timeout S or signal the rank processes directly.

  The checkpoint and log directories are locked (flock on DIR/.sp-run.lock)
  while a run writes them: a second sp-run on them is refused. The kernel
  drops the lock when the process dies, so a killed run leaves none behind.

  A full disk or an unwritable directory ends the run with one error line
  naming the file and the reason; the last checkpoint stays as it was.
  Exit codes: 0 done, 1 error, 130/143 stopped by SIGINT/SIGTERM.
)");

static const char *Tool = "sp-run";

/// --device: std::nullopt for a malformed value; else the GPU index of
/// cuda:N, or -1 for cpu and cuda (the local rank's GPU).
static std::optional<int> deviceIndex(StringRef Dev) {
  if (Dev == "cpu" || Dev == "cuda")
    return -1;
  int N = -1;
  if (!Dev.consume_front("cuda:") || Dev.getAsInteger(10, N) || N < 0)
    return std::nullopt;
  return N;
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
  if (!(CommTimeout > 0) || CommTimeout > 1e6)
    return usageError("--comm-timeout must be a number of seconds in (0, "
                      "1000000]");
  if (CheckpointEvery.getNumOccurrences() && CheckpointEvery <= 0)
    return usageError("--checkpoint-every must be a positive integer");
  bool Sample = SamplePrompt.getNumOccurrences() > 0;
  if (!Sample)
    for (auto [Given, Flag] :
         {std::pair{SampleTokens.getNumOccurrences() > 0, "--tokens"},
          {Temperature.getNumOccurrences() > 0, "--temperature"},
          {TopK.getNumOccurrences() > 0, "--top-k"}})
      if (Given)
        return usageError(Twine(Flag) + " is for --sample \"prompt\"");
  if (Sample) {
    if (SamplePrompt.empty())
      return usageError("--sample needs a prompt of at least one byte, e.g. "
                        "--sample \"def \"");
    if (SampleTokens < 1)
      return usageError(formatv("--tokens {0}: give the number of tokens to "
                                "generate, at least 1",
                                SampleTokens.getValue()));
    if (!(Temperature >= 0 && std::isfinite(Temperature)))
      return usageError(formatv("--temperature {0}: give 0 (greedy) or a "
                                "positive number",
                                format("%g", Temperature.getValue())));
    if (TopK < 0)
      return usageError(formatv("--top-k {0}: give 0 (every token) or a "
                                "positive number",
                                TopK.getValue()));
    for (auto [Given, Flag] :
         {std::pair{Eval.getValue(), "--eval"},
          {!DataFile.empty(), "--data"},
          {SyntheticData.getValue(), "--synthetic-data"},
          {!ValDataFile.empty(), "--val-data"},
          {Steps.getNumOccurrences() > 0, "--steps (give --tokens)"},
          {CheckpointEvery.getNumOccurrences() > 0, "--checkpoint-every"},
          {Resume.getValue(), "--resume"},
          {CheckpointOnExit.getValue(), "--checkpoint-on-exit"},
          {ExportOnnx.getNumOccurrences() > 0, "--export-onnx"},
          {TraceFile.getNumOccurrences() > 0, "--trace"},
          {Html.getNumOccurrences() > 0, "--html"},
          {ObjectiveKind.getNumOccurrences() > 0, "--objective"}})
      if (Given)
        return usageError(Twine("--sample generates text from the weights; "
                                "it cannot be combined with ") +
                          Flag);
  }
  if (!DataFile.empty() && SyntheticData)
    return usageError("--data and --synthetic-data exclude each other");
  if (DataFile.empty() && !SyntheticData && !Sample)
    return usageError("--data FILE is required (a token file from "
                      "sp-tokenize), or --synthetic-data for a benchmark");
  for (auto [Value, Flag] :
       {std::pair{EvalEvery.getNumOccurrences() ? EvalEvery.getValue() : 1,
                  "--eval-every"},
        {EvalSteps.getValue(), "--eval-steps"},
        {LogEvery.getValue(), "--log-every"}})
    if (Value < 1)
      return usageError(formatv("{0} {1}: give a number of steps of at least "
                                "1",
                                Flag, Value));
  if (ValDataFile.empty())
    for (auto [Given, Flag] :
         {std::pair{EvalEvery.getNumOccurrences() > 0, "--eval-every"},
          {EvalSteps.getNumOccurrences() > 0, "--eval-steps"}})
      if (Given)
        return usageError(Twine(Flag) +
                          " needs --val-data FILE (the held-out tokens)");
  if (PeakFlops.getNumOccurrences() &&
      !(PeakFlops > 0 && std::isfinite(PeakFlops)))
    return usageError(formatv("--peak-flops {0}: give one rank's peak in "
                              "FLOP/s, e.g. 312e12 (an A100's bf16)",
                              format("%g", PeakFlops.getValue())));
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
          {!ValDataFile.empty(), "--val-data (evaluate that file with "
                                 "--data)"},
          {Resume.getValue(), "--resume"},
          {CheckpointOnExit.getValue(), "--checkpoint-on-exit"},
          {ExportOnnx.getNumOccurrences() > 0, "--export-onnx"},
          {Html.getNumOccurrences() > 0, "--html (sp-compile --html "
                                         "writes the plan's page)"}})
      if (Given)
        return usageError(Twine("--eval does not train; it cannot be "
                                "combined with ") +
                          Flag);
  }
  if (Float64)
    for (auto [Given, Flag] :
         {std::pair{CheckpointDir.getNumOccurrences() > 0, "--checkpoint"},
          {CheckpointEvery.getNumOccurrences() > 0, "--checkpoint-every"},
          {Resume.getValue(), "--resume"},
          {CheckpointOnExit.getValue(), "--checkpoint-on-exit"},
          {ExportOnnx.getNumOccurrences() > 0, "--export-onnx"}})
      if (Given)
        return usageError(Twine("--float64 is a numerical check whose "
                                "weights are float64; it cannot be "
                                "combined with ") +
                          Flag);
  if (!deviceIndex(Device))
    return usageError("--device must be cpu, cuda or cuda:N (N a GPU "
                      "index), got '" +
                      Device + "'");
  if (AllowTF32 && Device == "cpu")
    return usageError("--tf32 is for --device cuda");
  if (CudaAttention != "unfused" && CudaAttention != "blockwise")
    return usageError("--cuda-attention must be unfused or blockwise, got '" +
                      CudaAttention + "'");
  if (CudaAttention.getNumOccurrences() && Device == "cpu")
    return usageError("--cuda-attention is for --device cuda");
  if (CudaEpilogues && Device == "cpu")
    return usageError("--cuda-epilogues is for --device cuda");
  if (Float64 && Device != "cpu")
    return usageError("--float64 runs on --device cpu (the CUDA kernels are "
                      "float32)");
  if (!Eval && !Sample && CheckpointDir.getNumOccurrences() &&
      !CheckpointEvery &&
      !CheckpointOnExit && !Resume)
    return usageError("--checkpoint DIR needs --checkpoint-every N or "
                      "--checkpoint-on-exit (to write) or --resume (to read)");
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

int main(int Argc, char **Argv) {
  InitLLVM X(Argc, Argv);
  // A file-size limit (ulimit -f) makes write() fail with EFBIG, reported
  // with the file, instead of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  cl::HideUnrelatedOptions(Cat);
  cl::ParseCommandLineOptions(
      Argc, Argv,
      "sp-run: train or evaluate a compiled plan on the CPU or on GPUs\n");
  auto Fail = [](Error E) { return reportError(Tool, std::move(E)); };
  if (auto E = checkFlags())
    return Fail(std::move(E));
  bool Cuda = Device != "cpu";
  // Before anything is read or written: a GPU this process can use.
  if (Cuda)
    if (auto E = checkCudaDevice())
      return Fail(std::move(E));

  std::string CkptPath = CheckpointDir.getNumOccurrences()
                             ? CheckpointDir.getValue()
                             : PlanDir + "/checkpoint";
  std::string LogPath =
      LogDir.getNumOccurrences() ? LogDir.getValue() : PlanDir + "/run";
  bool Sample = SamplePrompt.getNumOccurrences() > 0;
  bool LoadCheckpoint =
      Resume || ((Eval || Sample) && CheckpointDir.getNumOccurrences());

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
      // A checkpoint at --steps is a finished run (killed, perhaps, before
      // it wrote its logs): resuming writes them and trains nothing.
      if (M->Step > Steps)
        return Fail(usageError(formatv(
            "checkpoint '{0}' is at step {1}, past --steps {2} (--steps is "
            "the total, not the steps to add)",
            CkptPath, M->Step, Steps.getValue())));
    }
    Resumed = std::move(*M);
  }

  auto P = readPlan(PlanDir);
  if (!P)
    return Fail(P.takeError());
  if (Float64) {
    std::string Dtype = P->Manifest.value("dtype", "f32");
    if (Dtype != "f32")
      return Fail(usageError("--float64: the plan computes in " + Dtype +
                             "; widen an fp32 plan (sp-compile --dtype "
                             "fp32)"));
    *P = widenToFloat64(*P);
  }
  if (Sample) {
    // Drawing a token after the text needs a model whose positions see
    // only the ones before them.
    const auto &Model = P->Manifest.value("model", nlohmann::json::object());
    if (!Model.value("causal", false))
      return Fail(usageError(
          "--sample: the model's attention is bidirectional (an encoder, "
          "such as BERT); sampling needs a causal decoder (GPT, Llama)"));
    int64_t Vocab = Model.value("vocab", int64_t(0));
    for (unsigned char C : SamplePrompt.getValue())
      if (Vocab > 0 && C >= Vocab)
        return Fail(usageError(formatv(
            "--sample: the prompt's byte {0} is not below the model's "
            "vocabulary of {1} (the byte-level tokenizer's ids are byte "
            "values)",
            unsigned(C), Vocab)));
  }
  std::string Fingerprint = planFingerprint(*P);
  std::string ModelPrint = modelFingerprint(*P);
  // Another plan's checkpoint is resharded when it is of the same model
  // (format 3 records the layout); an older one only resumes its own plan.
  if (Resumed && Resumed->PlanFingerprint != Fingerprint) {
    if (Resumed->ModelFingerprint.empty())
      return Fail(usageError(formatv(
          "checkpoint '{0}' was written for another plan (fingerprint {1}, "
          "plan '{2}' has {3}); resume with the plan that wrote it",
          CkptPath, Resumed->PlanFingerprint, PlanDir, Fingerprint)));
    if (Resumed->ModelFingerprint != ModelPrint)
      return Fail(usageError(formatv(
          "checkpoint '{0}' was written for another model (model fingerprint "
          "{1}, plan '{2}' trains {3}); resume with a plan of the model that "
          "wrote it",
          CkptPath, Resumed->ModelFingerprint, PlanDir, ModelPrint)));
  }
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
  if (CheckpointEvery || CheckpointOnExit)
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
  // The outputs written after training must be writable before it starts.
  for (auto [Path, Flag] : {std::pair{&TraceFile, "--trace"},
                            {&ExportOnnx, "--export-onnx"},
                            {&Html, "--html"}})
    if (!Path->empty())
      if (auto Err = checkWritableFile(*Path))
        return Fail(usageError(Twine(Flag) + ": " + toString(std::move(Err))));
  if (!DumpDir.empty()) {
    SmallString<128> Part(DumpDir); // the nearest part of it that exists
    while (!Part.empty() && !sys::fs::exists(Part))
      sys::path::remove_filename(Part);
    if (!Part.empty() && !sys::fs::is_directory(Part))
      return Fail(usageError("--dump '" + DumpDir + "': '" + Part +
                             "' is not a directory"));
  }

  int NumThreads = Threads
                       ? Threads.getValue()
                       : int(std::max(1u, std::thread::hardware_concurrency()));

  registerOnnxDataLoader();
  ProcessGrid Grid = planGrid(*P);
  int TP = Grid.Tensor, PP = Grid.Pipeline;
  if (CommKind != "threads" && CommKind != "mpi")
    return Fail(usageError("--comm must be threads or mpi, got '" + CommKind +
                           "'"));
  int Ranks = Grid.size();
  if (Ranks > 1)
    NumThreads = std::max(1, NumThreads / Ranks); // threads per rank
  CpuBackend::setThreads(NumThreads);

  TrainerOptions O;
  O.PlanDir = PlanDir;
  O.Steps = Steps;
  O.LR = LR;
  O.MinLR = MinLR.getNumOccurrences() ? MinLR.getValue() : LR / 10;
  O.Warmup = Warmup;
  O.Seed = RunSeed;
  if (Dropout.getNumOccurrences())
    O.Dropout = Dropout.getValue();
  O.Shuffle = Shuffle;
  O.Obj = Obj;
  O.DataFile = DataFile;
  O.Synthetic = SyntheticData;
  O.ValDataFile = ValDataFile;
  O.EvalEvery = EvalEvery.getNumOccurrences()
                    ? EvalEvery.getValue()
                    : std::max<int64_t>(1, Steps / 10);
  O.EvalSteps = EvalSteps;
  O.LogEvery = LogEvery;
  if (PeakFlops.getNumOccurrences())
    O.PeakFlops = PeakFlops.getValue();
  O.Eval = Eval;
  if (Sample)
    O.Sample = TrainerOptions::SampleOptions{SamplePrompt, SampleTokens,
                                             Temperature, TopK};
  O.LogPath = LogPath;
  O.CheckpointPath = CkptPath;
  O.CheckpointEvery = CheckpointEvery;
  O.CheckpointOnExit = CheckpointOnExit;
  O.Resumed = std::move(Resumed);
  O.Resume = Resume;
  O.Fingerprint = Fingerprint;
  O.ModelFingerprint = ModelPrint;
  O.TraceFile = TraceFile;
  O.DumpDir = DumpDir;
  O.ExportOnnx = ExportOnnx;
  O.HtmlPath = Html;
  O.CommandLine = commandLine(Argc, Argv);
  O.Source = Source;
  O.ThreadsPerRank = NumThreads;
  O.Float64 = Float64;
  O.ExpandSteps = ExpandSteps;
  O.Cuda = Cuda;
  if (int N = *deviceIndex(Device); N >= 0) // checked by checkFlags
    O.CudaDevice = N;
  O.AllowTF32 = AllowTF32;
  O.BlockwiseAttention = CudaAttention == "blockwise";
  O.CublasLtEpilogues = CudaEpilogues;
  O.ThreadRanks = CommKind == "threads" && Ranks > 1;
  Trainer T(*P, std::move(O));
  auto Timeout = std::chrono::milliseconds(
      std::max<int64_t>(1, int64_t(CommTimeout * 1000)));
  auto Body = [&](Communicator *World) {
    if (World) // the groups split from it inherit it
      World->setTimeout(Timeout);
    return T.runRank(World);
  };

  // How a run that ended without an error stopped: 0, or 128 + the signal
  // with one line.
  auto Finished = [&](bool Print) {
    if (!T.stoppedBy())
      return 0;
    if (Print) {
      errs() << Tool << ": " << T.stopMessage() << "\n";
      errs().flush();
    }
    return 128 + T.stoppedBy();
  };
  // A step blocked on a dead or stopped rank must not hold a stop up.
  constexpr double MinStopGraceSeconds = 10;

  if (CommKind == "mpi") {
    auto C = createMpiCommunicator(&Argc, &Argv);
    if (!C)
      return Fail(C.takeError());
    // Every rank sees the mismatch: report it once and exit cleanly.
    if ((*C)->size() != Ranks) {
      if ((*C)->rank() == 0)
        Fail(usageError(formatv("the plan was compiled for {0}--tp {1} and "
                                "--pp {2}; run it with mpirun -np {3} (got "
                                "{4} processes)",
                                Grid.Data > 1 ? formatv("--dp {0}, ", Grid.Data).str() : "",
                                TP, PP, Ranks, (*C)->size())));
      return 1;
    }
    installStopHandlers(); // after MPI_Init, which may set its own
    startStopWatchdog(MinStopGraceSeconds,
                      formatv("rank {0}: ", (*C)->rank()).str());
    bool Lead = (*C)->rank() == 0;
    if (auto Err = Body(C->get())) {
      // An error every rank agreed on: each exits; rank 0 says why.
      if (Err.isA<AgreedError>()) {
        if (Lead)
          return Fail(std::move(Err));
        consumeError(std::move(Err));
        return 1;
      }
      (*C)->abort(toString(std::move(Err)));
      return 1;
    }
    return Finished(Lead);
  }
  installStopHandlers();
  startStopWatchdog(MinStopGraceSeconds, "");
  if (Ranks == 1) {
    if (auto Err = Body(nullptr))
      return Fail(std::move(Err));
    return Finished(true);
  }
  // Thread ranks: an agreed error is every rank's; report it once.
  std::mutex AgreedMutex;
  std::optional<std::string> Agreed;
  if (auto Err = runOnThreadRanks(Ranks, [&](Communicator &C) -> Error {
        Error E = Body(&C);
        return handleErrors(std::move(E), [&](const AgreedError &A) {
          std::lock_guard<std::mutex> Lock(AgreedMutex);
          Agreed = A.text();
        });
      }))
    return Fail(std::move(Err));
  if (Agreed)
    return Fail(usageError(*Agreed));
  return Finished(true);
}
