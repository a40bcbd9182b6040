//===- TrainFlags.cpp - sp-run's command line, bound to TrainOptions ------===//
//
// See TrainFlags.h. One add() per flag: its name, its field, its help.
//
//===----------------------------------------------------------------------===//
#include "train/TrainFlags.h"
#include "runtime/BackendRegistry.h"

using namespace llvm;

namespace sp {

template <typename T, typename... Mods>
void TrainFlags::add(const char *Name, T &Field, const Mods &...M) {
  Options.push_back(std::make_unique<cl::opt<T, true>>(
      StringRef(Name), cl::location(Field), cl::cat(Cat), M...));
}

static const char FaultsHelp[] = R"(
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
)";

TrainFlags::TrainFlags(TrainOptions &O, cl::OptionCategory &Cat)
    : O(O), Cat(Cat) {
  static cl::extrahelp Faults(FaultsHelp);
  Options.push_back(std::make_unique<cl::opt<std::string, true>>(
      cl::Positional, cl::desc("<plan>"), cl::Required,
      cl::location(O.PlanDir), cl::cat(Cat)));
  add("steps", O.Steps, cl::desc("Training steps (default 10)"),
      cl::value_desc("n"));
  add("data", O.DataFile,
      cl::desc("Token file: little-endian uint16 ids (nanoGPT .bin), "
               "e.g. from sp-tokenize"),
      cl::value_desc("file"));
  add("val-data", O.ValDataFile,
      cl::desc("Held-out token file (e.g. sp-tokenize --split's): "
               "the mean validation loss over --eval-steps batches "
               "every --eval-every steps and at the end, logged "
               "and plotted beside the training loss"),
      cl::value_desc("file"));
  add("eval-every", O.EvalEvery,
      cl::desc("Steps between validations (default: a tenth of "
               "--steps)"),
      cl::value_desc("n"));
  add("eval-steps", O.EvalSteps,
      cl::desc("Validation batches, the same ones each time (default "
               "10)"),
      cl::value_desc("k"));
  add("log-every", O.LogEvery,
      cl::desc("When stderr is not a terminal: a log line every N "
               "steps, and at the first and last (default 10; on a "
               "terminal a progress bar is redrawn every step)"),
      cl::value_desc("n"));
  add("peak-flops", O.PeakFlops,
      cl::desc("One rank's peak FLOP/s, for the MFU of the log "
               "(default: the backend's: a GPU's from its "
               "architecture, the CPU's measured GEMM rate)"),
      cl::value_desc("x"));
  add("synthetic-data", O.SyntheticData,
      cl::desc("Random tokens from --seed instead of --data (benchmarks)"));
  add("lr", O.LR, cl::desc("Peak learning rate (default 1e-3)"),
      cl::value_desc("x"));
  add("warmup", O.Warmup, cl::desc("Linear warmup steps (default 0)"),
      cl::value_desc("n"));
  add("min-lr", O.MinLR,
      cl::desc("Final learning rate of the cosine decay (default lr/10)"),
      cl::value_desc("x"));
  add("seed", O.Seed, cl::desc("Dropout and shuffling seed (default 1234)"),
      cl::value_desc("s"));
  add("dropout", O.Dropout,
      cl::desc("Override every dropout ratio (0 turns dropout off)"),
      cl::value_desc("rate"));
  add("shuffle", O.Shuffle,
      cl::desc("Batches at random offsets (from --seed and the step)"));
  add("objective", O.Obj.Kind,
      cl::desc("What the model learns to predict (default next-token)"),
      cl::values(clEnumValN(Objective::NextToken, "next-token",
                            "each position's next token (GPT, Llama)"),
                 clEnumValN(Objective::MaskedLM, "masked-lm",
                            "BERT's masked-LM: --mask-rate of the positions, "
                            "chosen from --seed, predict their own token")));
  add("pad-token", O.Obj.PadToken,
      cl::desc("Padding token id: its positions are masked out of "
               "attention (the model's attention-mask input) and "
               "predict nothing"),
      cl::value_desc("id"));
  add("mask-token", O.Obj.MaskToken,
      cl::desc("masked-lm: the id that replaces a chosen token"),
      cl::value_desc("id"));
  add("mask-rate", O.Obj.MaskRate,
      cl::desc("masked-lm: the share of positions chosen (default "
               "0.15)"),
      cl::value_desc("x"));
  add("eval", O.Eval,
      cl::desc("No training: the mean loss over --steps batches, forward "
               "only, no dropout (the weights of --checkpoint DIR if "
               "given)"));
  add("sample", O.SamplePrompt,
      cl::desc("No training: the prompt's continuation, --tokens "
               "byte-level tokens drawn one at a time (forward "
               "only; the weights of --checkpoint DIR if given)"),
      cl::value_desc("prompt"));
  add("tokenizer", O.SampleTokenizer,
      cl::desc("--sample: encode the prompt and decode the text with this "
               "byte-level BPE tokenizer.json (default: bytes)"),
      cl::value_desc("tokenizer.json"));
  add("tokens", O.SampleTokens,
      cl::desc("--sample: tokens to generate (default 200)"),
      cl::value_desc("n"));
  add("temperature", O.Temperature,
      cl::desc("--sample: softmax temperature (default 0.8; 0: always the "
               "most likely token)"),
      cl::value_desc("t"));
  add("top-k", O.TopK,
      cl::desc("--sample: draw among the k most likely tokens (default "
               "200; 0: all)"),
      cl::value_desc("k"));
  add("log-dir", O.LogDir,
      cl::desc("Where loss.csv and loss.svg go (default PLAN/run)"),
      cl::value_desc("dir"));
  add("checkpoint", O.CheckpointDir,
      cl::desc("Checkpoint directory (default PLAN/checkpoint)"),
      cl::value_desc("dir"));
  add("checkpoint-every", O.CheckpointEvery,
      cl::desc("Write a checkpoint every N steps and at the end "
               "(atomically)"),
      cl::value_desc("n"));
  add("resume", O.Resume,
      cl::desc("Continue from the checkpoint in --checkpoint DIR"));
  add("checkpoint-on-exit", O.CheckpointOnExit,
      cl::desc("On SIGINT or SIGTERM, save a checkpoint of the last "
               "finished step before exiting (130 or 143)"));
  add("trace", O.TraceFile,
      cl::desc("Write a Chrome trace (chrome://tracing, Perfetto) of "
               "the training steps: every instruction of every rank"),
      cl::value_desc("file.json"));
  add("dump", O.DumpDir,
      cl::desc("Debugging dumps: logits.npy, loss.csv, grads/*.npy "
               "after the first step, weights/*.npy at the end, "
               "memory.json"),
      cl::value_desc("dir"));
  add("export-onnx", O.ExportOnnx,
      cl::desc("Write the trained weights into a copy of the source "
               "model"),
      cl::value_desc("out.onnx"));
  add("html", O.HtmlPath,
      cl::desc("Write the run's report page, one self-contained HTML "
               "file: the plan's facts, the loss curves and the measured "
               "memory (written with loss.csv)"),
      cl::value_desc("file.html"));
  add("float64", O.Float64,
      cl::desc("Numerical check: run the fp32 plan in float64 (every f32 "
               "buffer widened, twice the memory; dumps are '<f8'), to "
               "measure how far float32 rounding moves its losses, "
               "gradients and logits"));
  add("expand-steps", O.ExpandSteps,
      cl::desc("Run a pipelined plan's schedule steps written out as one "
               "flat instruction list (as the CUDA backend does) instead "
               "of step by step over its templates: the same calls in the "
               "same order, more memory; for checking and measuring"));
  add("threads", O.Threads,
      cl::desc("Kernel threads, GEMMs included (default: all cores, "
               "shared by the ranks of one process)"),
      cl::value_desc("n"));
  add("comm", O.Comm,
      cl::desc("How the ranks of a tensor-parallel plan talk: threads "
               "(one process, default) or mpi (one process per rank, "
               "under mpirun)"),
      cl::value_desc("threads|mpi"));
  add("comm-timeout", O.CommTimeout,
      cl::desc("Seconds a rank waits in a collective or a receive for the "
               "other ranks before it ends the job, naming the call "
               "(default 300); with --device cuda also its waits for the "
               "GPU (then NCCL is aborted)"),
      cl::value_desc("s"));
  addBackendFlags();
}

TrainFlags::~TrainFlags() = default;

/// --device from the registry's entries, and each backend's own flags.
void TrainFlags::addBackendFlags() {
  const BackendRegistry &Registry = BackendRegistry::instance();
  DeviceHelp = "Where the plan runs: ";
  std::vector<const BackendEntry *> Entries = Registry.entries();
  for (size_t I = 0; I < Entries.size(); ++I)
    DeviceHelp += (I ? ", or " : "") + Entries[I]->Description;
  DeviceValueDesc = Registry.deviceValueDesc();
  add("device", O.Device, cl::desc(DeviceHelp),
      cl::value_desc(DeviceValueDesc));
  for (const BackendEntry *E : Entries)
    for (const BackendFlag &F : E->Flags) {
      BackendOption B;
      B.Name = F.Name;
      if (F.Values.empty()) {
        auto Opt = std::make_unique<cl::opt<bool>>(
            StringRef(F.Name), cl::desc(F.Help), cl::cat(Cat));
        B.Switch = Opt.get();
        Options.push_back(std::move(Opt));
      } else {
        auto Opt = std::make_unique<cl::opt<std::string>>(
            StringRef(F.Name), cl::desc(F.Help), cl::init(F.Values.front()),
            cl::value_desc(F.ValueDesc), cl::cat(Cat));
        B.Value = Opt.get();
        Options.push_back(std::move(Opt));
      }
      BackendOptions.push_back(std::move(B));
    }
}

void TrainFlags::collect() {
  for (const auto &Opt : Options)
    if (Opt->getNumOccurrences() && !Opt->ArgStr.empty())
      O.Given.insert(Opt->ArgStr);
  for (const BackendOption &B : BackendOptions) {
    if (B.Switch && *B.Switch)
      O.BackendFlags[B.Name] = "true";
    if (B.Value && B.Value->getNumOccurrences())
      O.BackendFlags[B.Name] = *B.Value;
  }
}

} // namespace sp
