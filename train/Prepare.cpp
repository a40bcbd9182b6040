//===- Prepare.cpp - A run's plan and files, checked before it starts -----===//
//
// See Prepare.h. The checks run in sp-run's order: the checkpoint, the plan,
// the mode's needs (sampling), the checkpoint's plan, the objective, then
// the outputs.
//
//===----------------------------------------------------------------------===//
#include "train/Prepare.h"
#include "plan/AtomicFile.h"
#include "support/Diagnostics.h"
#include "text/TokenizerFiles.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

using namespace llvm;

namespace sp {

/// The checkpoint to load, if any; Seed becomes a resumed run's.
static Expected<std::optional<CheckpointMeta>>
readResumed(const TrainOptions &O, uint64_t &Seed) {
  if (!O.loadsCheckpoint())
    return std::nullopt;
  std::string Dir = O.checkpointDir();
  if (!checkpointExists(Dir))
    return usageError(formatv("{0}: there is no checkpoint in '{1}' (write "
                              "one with --checkpoint-every N)",
                              O.Resume ? "--resume" : "--checkpoint", Dir));
  auto M = readCheckpointMeta(Dir);
  if (!M)
    return M.takeError();
  if (O.Resume) {
    // A resumed run keeps its seed: dropout masks and shuffled offsets are
    // functions of it.
    if (O.given("seed") && O.Seed != M->Seed)
      return usageError(formatv(
          "--seed {0} differs from the seed {1} of checkpoint '{2}'; a "
          "resumed run keeps its seed",
          O.Seed, M->Seed, Dir));
    Seed = M->Seed;
    // A checkpoint at --steps is a finished run (killed, perhaps, before
    // it wrote its logs): resuming writes them and trains nothing.
    if (M->Step > O.Steps)
      return usageError(formatv(
          "checkpoint '{0}' is at step {1}, past --steps {2} (--steps is "
          "the total, not the steps to add)",
          Dir, M->Step, O.Steps));
  }
  return std::optional<CheckpointMeta>(std::move(*M));
}

/// --sample: drawing a token after the text needs a model whose positions
/// see only the ones before them, and a prompt of its vocabulary; the
/// prompt's ids (by --tokenizer's tokenizer, or bytes) go into R.
static Error checkSampling(const TrainOptions &O, PreparedRun &R) {
  const auto &Model = R.P.Manifest.value("model", nlohmann::json::object());
  if (!Model.value("causal", false))
    return usageError(
        "--sample: the model's attention is bidirectional (an encoder, "
        "such as BERT); sampling needs a causal decoder (GPT, Llama)");
  int64_t Vocab = Model.value("vocab", int64_t(0));
  if (O.SampleTokenizer.empty()) {
    for (unsigned char C : O.SamplePrompt) {
      if (Vocab > 0 && C >= Vocab)
        return usageError(formatv(
            "--sample: the prompt's byte {0} is not below the model's "
            "vocabulary of {1} (the byte-level tokenizer's ids are byte "
            "values)",
            unsigned(C), Vocab));
      R.PromptIds.push_back(C);
    }
    return Error::success();
  }
  auto Spec = readTokenizerJson(O.SampleTokenizer);
  if (!Spec)
    return usageError("--tokenizer: " + toString(Spec.takeError()));
  auto Tok = BpeTokenizer::create(std::move(*Spec));
  if (!Tok)
    return usageError("--tokenizer: " + toString(Tok.takeError()));
  auto Ids = (*Tok)->encode(O.SamplePrompt, 1);
  if (!Ids)
    return usageError("--sample: " + toString(Ids.takeError()));
  for (uint32_t Id : *Ids) {
    if (Vocab > 0 && Id >= Vocab)
      return usageError(formatv(
          "--sample: the prompt's token {0} (of --tokenizer '{1}') is not "
          "below the model's vocabulary of {2}; give the model's own "
          "tokenizer",
          Id, O.SampleTokenizer, Vocab));
    R.PromptIds.push_back(Id);
  }
  R.Tokenizer = std::move(*Tok);
  return Error::success();
}

/// Context parallelism: what this runtime does not do with such a plan yet,
/// refused before anything runs.
static Error checkContextParallel(const TrainOptions &O, const Plan &P) {
  int Cp = P.Manifest.value("cp", 1);
  if (Cp == 1)
    return Error::success();
  if (O.sampling() && !O.DumpDir.empty())
    return usageError(formatv("--sample --dump: not yet supported for a "
                              "context-parallel plan (--cp {0}); sample from "
                              "its checkpoint with a plan compiled without "
                              "--cp",
                              Cp));
  return Error::success();
}

/// Another plan's checkpoint is resharded when it is of the same model
/// (format 3 records the layout); an older one only resumes its own plan.
static Error checkResumedPlan(const TrainOptions &O, const PreparedRun &R) {
  if (!R.Resumed || R.Resumed->PlanFingerprint == R.Fingerprint)
    return Error::success();
  if (R.Resumed->ModelFingerprint.empty())
    return usageError(formatv(
        "checkpoint '{0}' was written for another plan (fingerprint {1}, "
        "plan '{2}' has {3}); resume with the plan that wrote it",
        O.checkpointDir(), R.Resumed->PlanFingerprint, O.PlanDir,
        R.Fingerprint));
  if (R.Resumed->ModelFingerprint != R.ModelFingerprint)
    return usageError(formatv(
        "checkpoint '{0}' was written for another model (model fingerprint "
        "{1}, plan '{2}' trains {3}); resume with a plan of the model that "
        "wrote it",
        O.checkpointDir(), R.Resumed->ModelFingerprint, O.PlanDir,
        R.ModelFingerprint));
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

/// Every output the run writes can be written, before it starts.
static Error checkOutputs(const TrainOptions &O) {
  if (O.CheckpointEvery || O.CheckpointOnExit)
    if (auto Err = checkCheckpointTarget(O.checkpointDir()))
      return Err;
  if (!O.ExportOnnx.empty() && sys::fs::is_directory(O.ExportOnnx))
    return usageError("--export-onnx '" + O.ExportOnnx +
                      "' is a directory; name the model file to write");
  for (auto [Dir, Flag] : {std::pair{StringRef(O.DumpDir), "--dump"},
                           {StringRef(O.LogDir), "--log-dir"}})
    if (!Dir.empty() && sys::fs::exists(Dir) && !sys::fs::is_directory(Dir))
      return usageError(Twine(Flag) + " '" + Dir +
                        "' exists and is not a directory");
  // The outputs written after training must be writable before it starts.
  for (auto [Path, Flag] : {std::pair{&O.TraceFile, "--trace"},
                            {&O.ExportOnnx, "--export-onnx"},
                            {&O.HtmlPath, "--html"}})
    if (!Path->empty())
      if (auto Err = checkWritableFile(*Path))
        return usageError(Twine(Flag) + ": " + toString(std::move(Err)));
  if (!O.DumpDir.empty()) {
    SmallString<128> Part(O.DumpDir); // the nearest part of it that exists
    while (!Part.empty() && !sys::fs::exists(Part))
      sys::path::remove_filename(Part);
    if (!Part.empty() && !sys::fs::is_directory(Part))
      return usageError("--dump '" + O.DumpDir + "': '" + Part +
                        "' is not a directory");
  }
  return Error::success();
}

Expected<PreparedRun> prepareRun(const TrainOptions &O) {
  uint64_t Seed = O.Seed;
  auto Resumed = readResumed(O, Seed);
  if (!Resumed)
    return Resumed.takeError();
  auto P = readPlan(O.PlanDir);
  if (!P)
    return P.takeError();
  PreparedRun R;
  R.P = std::move(*P);
  R.Seed = Seed;
  R.Resumed = std::move(*Resumed);
  if (O.Float64) {
    std::string Dtype = R.P.Manifest.value("dtype", "f32");
    if (Dtype != "f32")
      return usageError("--float64: the plan computes in " + Dtype +
                        "; widen an fp32 plan (sp-compile --dtype fp32)");
    R.P = widenToFloat64(R.P);
  }
  if (O.sampling())
    if (auto Err = checkSampling(O, R))
      return Err;
  if (auto Err = checkContextParallel(O, R.P))
    return Err;
  R.Fingerprint = planFingerprint(R.P);
  R.ModelFingerprint = modelFingerprint(R.P);
  if (auto Err = checkResumedPlan(O, R))
    return Err;
  R.Obj = O.Obj;
  R.Obj.Seed = Seed;
  if (R.Obj.PadToken >= 0 &&
      none_of(R.P.Prog.Buffers, [](const ProgramBuffer &B) {
        return B.K == ProgramBuffer::Input && B.Feed == InputRole::Mask;
      }))
    return usageError(
        "--pad-token: the model has no attention-mask input, so every "
        "token would attend to the padding; export it with its "
        "attention_mask input (or bind one with sp-compile --input "
        "NAME=mask)");
  if (!O.ExportOnnx.empty()) {
    R.Source = findSourceModel(R.P);
    if (R.Source.empty())
      return usageError(
          formatv("--export-onnx: the plan's source model '{0}' is not found",
                  R.P.Manifest.value("source", std::string("?"))));
  }
  if (auto Err = checkOutputs(O))
    return Err;
  return R;
}

} // namespace sp
