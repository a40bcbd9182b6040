//===- TrainOptions.cpp - What one training run is asked to do ------------===//
//
// See TrainOptions.h. The checks run in the order sp-run has always made
// them, so the first error of a command line is the one it names.
//
//===----------------------------------------------------------------------===//
#include "train/TrainOptions.h"
#include "runtime/BackendRegistry.h"
#include "support/Diagnostics.h"
#include "support/Format.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include <cmath>
#include <initializer_list>

using namespace llvm;

namespace sp {

std::string TrainOptions::deviceName() const {
  return StringRef(Device).split(':').first.str();
}

/// The first flag of Flags that is given, or null.
static const char *
firstGiven(std::initializer_list<std::pair<bool, const char *>> Flags) {
  for (auto [Given, Flag] : Flags)
    if (Given)
      return Flag;
  return nullptr;
}

/// Numbers out of their range.
static Error checkRanges(const TrainOptions &O) {
  if (O.Steps <= 0)
    return usageError("--steps must be a positive integer");
  if (!(O.LR > 0) || !std::isfinite(O.LR))
    return usageError("--lr must be a positive number");
  if (O.given("min-lr") && (!(O.MinLR >= 0) || !std::isfinite(O.MinLR)))
    return usageError("--min-lr must be a non-negative number");
  if (O.given("min-lr") && O.MinLR > O.LR)
    return usageError("--min-lr " + sci(O.MinLR) + " is above the peak --lr " +
                      sci(O.LR));
  if (O.Warmup < 0)
    return usageError("--warmup must not be negative");
  if (O.given("dropout") && !(O.Dropout >= 0 && O.Dropout < 1))
    return usageError("--dropout must be in [0, 1)");
  if (O.given("threads") && O.Threads <= 0)
    return usageError("--threads must be a positive integer");
  if (!(O.CommTimeout > 0) || O.CommTimeout > 1e6)
    return usageError("--comm-timeout must be a number of seconds in (0, "
                      "1000000]");
  if (O.given("checkpoint-every") && O.CheckpointEvery <= 0)
    return usageError("--checkpoint-every must be a positive integer");
  return Error::success();
}

/// --sample and its flags.
static Error checkSampling(const TrainOptions &O) {
  if (!O.sampling()) {
    if (const char *Flag =
            firstGiven({std::pair{O.given("tokens"), "--tokens"},
                        {O.given("temperature"), "--temperature"},
                        {O.given("top-k"), "--top-k"},
                        {O.given("tokenizer"), "--tokenizer"}}))
      return usageError(Twine(Flag) + " is for --sample \"prompt\"");
    return Error::success();
  }
  if (O.SamplePrompt.empty())
    return usageError("--sample needs a prompt of at least one byte, e.g. "
                      "--sample \"def \"");
  if (O.SampleTokens < 1)
    return usageError(formatv("--tokens {0}: give the number of tokens to "
                              "generate, at least 1",
                              O.SampleTokens));
  if (!(O.Temperature >= 0 && std::isfinite(O.Temperature)))
    return usageError(formatv("--temperature {0}: give 0 (greedy) or a "
                              "positive number",
                              format("%g", O.Temperature)));
  if (O.TopK < 0)
    return usageError(formatv("--top-k {0}: give 0 (every token) or a "
                              "positive number",
                              O.TopK));
  if (const char *Flag = firstGiven(
          {std::pair{O.Eval, "--eval"},
           {!O.DataFile.empty(), "--data"},
           {O.SyntheticData, "--synthetic-data"},
           {!O.ValDataFile.empty(), "--val-data"},
           {O.given("steps"), "--steps (give --tokens)"},
           {O.given("checkpoint-every"), "--checkpoint-every"},
           {O.Resume, "--resume"},
           {O.CheckpointOnExit, "--checkpoint-on-exit"},
           {O.given("export-onnx"), "--export-onnx"},
           {O.given("trace"), "--trace"},
           {O.given("html"), "--html"},
           {O.given("objective"), "--objective"}}))
    return usageError(Twine("--sample generates text from the weights; "
                            "it cannot be combined with ") +
                      Flag);
  return Error::success();
}

/// The data, validation, logging and objective flags.
static Error checkData(const TrainOptions &O) {
  if (!O.DataFile.empty() && O.SyntheticData)
    return usageError("--data and --synthetic-data exclude each other");
  if (O.DataFile.empty() && !O.SyntheticData && !O.sampling())
    return usageError("--data FILE is required (a token file from "
                      "sp-tokenize), or --synthetic-data for a benchmark");
  for (auto [Value, Flag] :
       {std::pair{O.given("eval-every") ? O.EvalEvery : 1, "--eval-every"},
        {O.EvalSteps, "--eval-steps"},
        {O.LogEvery, "--log-every"}})
    if (Value < 1)
      return usageError(formatv("{0} {1}: give a number of steps of at least "
                                "1",
                                Flag, Value));
  if (O.ValDataFile.empty())
    if (const char *Flag =
            firstGiven({std::pair{O.given("eval-every"), "--eval-every"},
                        {O.given("eval-steps"), "--eval-steps"}}))
      return usageError(Twine(Flag) +
                        " needs --val-data FILE (the held-out tokens)");
  if (O.given("peak-flops") && !(O.PeakFlops > 0 && std::isfinite(O.PeakFlops)))
    return usageError(formatv("--peak-flops {0}: give one rank's peak in "
                              "FLOP/s, e.g. 312e12 (an A100's bf16)",
                              format("%g", O.PeakFlops)));
  if (O.Obj.Kind != Objective::MaskedLM)
    if (const char *Flag =
            firstGiven({std::pair{O.given("mask-token"), "--mask-token"},
                        {O.given("mask-rate"), "--mask-rate"}}))
      return usageError(Twine(Flag) + " is for --objective masked-lm");
  return Error::success();
}

/// What --eval and --float64 cannot be combined with.
static Error checkModes(const TrainOptions &O) {
  if (O.Eval)
    if (const char *Flag = firstGiven(
            {std::pair{O.given("checkpoint-every"), "--checkpoint-every"},
             {!O.ValDataFile.empty(), "--val-data (evaluate that file with "
                                      "--data)"},
             {O.Resume, "--resume"},
             {O.CheckpointOnExit, "--checkpoint-on-exit"},
             {O.given("export-onnx"), "--export-onnx"},
             {O.given("html"), "--html (sp-compile --html writes the plan's "
                               "page)"}}))
      return usageError(Twine("--eval does not train; it cannot be "
                              "combined with ") +
                        Flag);
  if (O.Float64)
    if (const char *Flag = firstGiven(
            {std::pair{O.given("checkpoint"), "--checkpoint"},
             {O.given("checkpoint-every"), "--checkpoint-every"},
             {O.Resume, "--resume"},
             {O.CheckpointOnExit, "--checkpoint-on-exit"},
             {O.given("export-onnx"), "--export-onnx"}}))
      return usageError(Twine("--float64 is a numerical check whose "
                              "weights are float64; it cannot be "
                              "combined with ") +
                        Flag);
  return Error::success();
}

/// --device, the backends' own flags.
static Error checkDevice(const TrainOptions &O) {
  const BackendRegistry &Registry = BackendRegistry::instance();
  auto Choice = Registry.parseDevice(O.Device);
  if (!Choice)
    return usageError(toString(Choice.takeError()));
  // Each backend flag given: a value it takes, and the device it is for.
  for (const BackendEntry *E : Registry.entries())
    for (const BackendFlag &F : E->Flags) {
      auto It = O.BackendFlags.find(F.Name);
      if (It == O.BackendFlags.end())
        continue;
      if (!F.Values.empty() && !is_contained(F.Values, It->second)) {
        std::string Choices;
        for (size_t I = 0; I < F.Values.size(); ++I)
          Choices += (I == 0 ? "" : I + 1 == F.Values.size() ? " or " : ", ") +
                     F.Values[I];
        return usageError("--" + F.Name + " must be " + Choices + ", got '" +
                          It->second + "'");
      }
      if (E != Choice->Entry)
        return usageError("--" + F.Name + " is for --device " + E->Name);
    }
  if (O.Float64 && !Choice->Entry->NoFloat64Reason.empty()) {
    std::string Runs;
    for (const BackendEntry *E : Registry.entries())
      if (E->NoFloat64Reason.empty())
        Runs += (Runs.empty() ? "" : " or ") + E->Name;
    return usageError("--float64 runs on --device " + Runs + " (" +
                      Choice->Entry->NoFloat64Reason + ")");
  }
  return Error::success();
}

/// Where the run writes and how its ranks talk.
static Error checkRun(const TrainOptions &O) {
  if (O.trains() && O.given("checkpoint") && !O.CheckpointEvery &&
      !O.CheckpointOnExit && !O.Resume)
    return usageError("--checkpoint DIR needs --checkpoint-every N or "
                      "--checkpoint-on-exit (to write) or --resume (to read)");
  if (O.Comm != "threads" && O.Comm != "mpi")
    return usageError("--comm must be threads or mpi, got '" + O.Comm + "'");
  return Error::success();
}

Error TrainOptions::validate() const {
  for (auto Check : {checkRanges, checkSampling, checkData, checkModes,
                     checkDevice, checkRun})
    if (Error E = Check(*this))
      return E;
  return Error::success();
}

} // namespace sp
