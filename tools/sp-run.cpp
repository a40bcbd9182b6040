//===- sp-run.cpp - Train or evaluate a compiled plan on the CPU or GPUs --===//
//
//   sp-run PLAN [--steps N] (--data FILE | --synthetic-data) [--lr X]
//          [--warmup N] [--min-lr X] [--seed S] [--dropout RATE] [--shuffle]
//          [--eval] [--log-dir DIR] [--checkpoint DIR] [--checkpoint-every N]
//          [--resume] [--checkpoint-on-exit] [--dump DIR] [--export-onnx OUT]
//          [--threads N] [--objective next-token|masked-lm] [--pad-token ID]
//          [--comm threads|mpi] [--comm-timeout S] [--html FILE.html]
//          [--device cpu|cuda[:N]]
//
// The tool is the training library's (train/): its flags fill a
// TrainOptions (train/TrainFlags.h), and runTraining (train/Launch.h)
// checks them, the plan and the files, then runs a Trainer on every rank.
// The run drives sp::Executor (runtime/Executor.h) on the backend of
// --device (runtime/BackendRegistry.h): batches from a memory-mapped token
// file (runtime/DataLoader.h), the learning-rate schedule, the loss log and
// plot and a progress line (runtime/LossLog.h), atomic checkpoints and
// resume (runtime/Checkpoint.h), debugging dumps as .npy (runtime/Npy.h),
// the report page (html/HtmlReport.h), and the trained weights written
// back into a copy of the source ONNX model (frontend/OnnxExport.h). Each
// header states its part of the contract (data offsets, schedule,
// checkpoint format).
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
#include "html/HtmlReport.h"
#include "runtime/BackendRegistry.h"
#include "train/Launch.h"
#include "train/TrainFlags.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include <csignal>

using namespace llvm;
using namespace sp;

int main(int Argc, char **Argv) {
  InitLLVM X(Argc, Argv);
  // A file-size limit (ulimit -f) makes write() fail with EFBIG, reported
  // with the file, instead of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  // --device cuda (runtime/cuda/Register.cpp); the CPU backend is always
  // registered.
  registerCudaBackend();

  cl::OptionCategory Cat("sp-run options");
  TrainOptions O;
  TrainFlags Flags(O, Cat);
  cl::HideUnrelatedOptions(Cat);
  cl::ParseCommandLineOptions(
      Argc, Argv,
      "sp-run: train or evaluate a compiled plan on the CPU or on GPUs\n");
  Flags.collect();
  O.CommandLine = commandLine(Argc, Argv);
  return runTraining(O, "sp-run", &Argc, &Argv);
}
