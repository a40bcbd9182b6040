//===- sp-tokenize.cpp - Text to a token file -----------------------------===//
//
//   sp-tokenize IN.txt -o OUT.bin [--split F [--val-output VAL.bin]]
//       [--tokenizer tokenizer.json | --encoder encoder.json
//        --merges vocab.bpe] [--threads N]
//
// Without a tokenizer, every byte of the input is one token whose id is the
// byte's value (vocabulary 256). With --tokenizer (Hugging Face's
// tokenizer.json) or --encoder and --merges (GPT-2's encoder.json and
// vocab.bpe), the text is UTF-8 encoded by byte-level BPE (text/, GPT-2,
// GPT-NeoX, Llama 3) on --threads threads, with the same ids as on one.
//
// The output is little-endian ids, nothing else: uint16 (nanoGPT's .bin)
// when the vocabulary has at most 65,536 ids, uint32 when it has more, with
// the width recorded in the sidecar OUT.bin.json (text/TokenFile.h) that
// sp-run --data reads. Both are written atomically, the sidecar first; -o -
// writes uint16 ids to stdout without a sidecar. An empty input, and an
// output that is the input, are refused.
//
// --split F (0 < F < 1) cuts the text in two: the first F of it goes to
// OUT.bin (training), the rest to VAL.bin (validation; default: OUT.bin's
// name with ".val" before the extension), for sp-run --val-data. The cut is
// at a line break near F when there is one in the last 1% before it, so
// that neither file starts mid-line. Each part must hold at least two
// tokens.
//
//===----------------------------------------------------------------------===//
#include "text/BpeTokenizer.h"
#include "text/TokenFile.h"
#include "text/TokenizerFiles.h"
#include "tools/ToolSupport.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

using namespace llvm;
using namespace sp;

static cl::OptionCategory Cat("sp-tokenize options");
static cl::opt<std::string> Input(cl::Positional, cl::desc("<input text>"),
                                  cl::Required, cl::cat(Cat));
static cl::opt<std::string> Output("o", cl::desc("The token file to write"),
                                   cl::value_desc("out.bin"), cl::Required,
                                   cl::cat(Cat));
static cl::opt<double>
    Split("split",
          cl::desc("Write the first F of the text's tokens to -o and the "
                   "rest to --val-output (a held-out validation set)"),
          cl::value_desc("F"), cl::cat(Cat));
static cl::opt<std::string>
    ValOutput("val-output",
              cl::desc("With --split: the validation file (default: -o's "
                       "name with .val before its extension)"),
              cl::value_desc("val.bin"), cl::cat(Cat));
static cl::opt<std::string> TokenizerJson(
    "tokenizer",
    cl::desc("A byte-level BPE tokenizer: Hugging Face's tokenizer.json "
             "(GPT-2, GPT-NeoX, Llama 3)"),
    cl::value_desc("tokenizer.json"), cl::cat(Cat));
static cl::opt<std::string>
    Encoder("encoder",
            cl::desc("GPT-2's encoder.json (with --merges): a byte-level BPE "
                     "tokenizer"),
            cl::value_desc("encoder.json"), cl::cat(Cat));
static cl::opt<std::string> MergesFile("merges",
                                       cl::desc("GPT-2's vocab.bpe (with "
                                                "--encoder)"),
                                       cl::value_desc("vocab.bpe"),
                                       cl::cat(Cat));
static cl::opt<unsigned>
    Threads("threads",
            cl::desc("Threads that encode (default 0: one per core; the ids "
                     "do not depend on it)"),
            cl::init(0), cl::cat(Cat));
static cl::opt<bool> Quiet("quiet", cl::desc("Do not print the summary"),
                           cl::cat(Cat));

static Error toolError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), Msg);
}

/// The tokenizer the flags name, or null for the byte-level one.
static Expected<std::unique_ptr<BpeTokenizer>> loadTokenizer() {
  bool Json = !TokenizerJson.empty(),
       Gpt2 = !Encoder.empty() || !MergesFile.empty();
  if (Json && Gpt2)
    return toolError("give --tokenizer or --encoder and --merges, not both");
  if (Gpt2 && (Encoder.empty() || MergesFile.empty()))
    return toolError("GPT-2's tokenizer is two files: give both --encoder "
                     "encoder.json and --merges vocab.bpe");
  if (!Json && !Gpt2)
    return nullptr;
  auto Spec = Json ? readTokenizerJson(TokenizerJson)
                   : readGpt2Files(Encoder, MergesFile);
  if (!Spec)
    return Spec.takeError();
  return BpeTokenizer::create(std::move(*Spec));
}

/// One token file's ids and what its sidecar says.
struct TokenFileOut {
  std::vector<uint32_t> Ids;
  TokenFileInfo Info;
};

/// Writes T to Path: the sidecar, then the ids (the sidecar is removed if
/// they fail). "-" writes uint16 ids to stdout and no sidecar.
static Error writeTokens(StringRef Path, const TokenFileOut &T) {
  unsigned W = T.Info.Width;
  if (Path == "-" && W != 2)
    return toolError(formatv("-o -: a vocabulary of {0} needs uint32 ids, "
                             "whose width only a sidecar records; name an "
                             "output file",
                             T.Info.Vocab));
  std::string Side = tokenSidecarPath(Path);
  if (Path != "-") {
    if (auto E = writeFileAtomically(
            Side, [&](raw_ostream &OS) { OS << tokenSidecarText(T.Info); }))
      return E;
  }
  std::string Bytes(T.Ids.size() * W, '\0');
  for (size_t I = 0; I < T.Ids.size(); ++I)
    for (unsigned B = 0; B < W; ++B)
      Bytes[W * I + B] = char(T.Ids[I] >> (8 * B));
  if (auto E =
          writeFileAtomically(Path, [&](raw_ostream &OS) { OS << Bytes; })) {
    if (Path != "-")
      sys::fs::remove(Side);
    return E;
  }
  return Error::success();
}

/// "vocabulary 256", or "vocabulary 128256, uint32 ids" for wide ones.
static std::string describe(const TokenFileInfo &Info) {
  return formatv("vocabulary {0}{1}", Info.Vocab,
                 Info.Width == 4 ? ", uint32 ids" : "")
      .str();
}

int main(int Argc, char **Argv) {
  InitLLVM X(Argc, Argv);
  cl::HideUnrelatedOptions(Cat);
  cl::ParseCommandLineOptions(
      Argc, Argv,
      "sp-tokenize: text to a token file, byte-level (id = byte value, "
      "vocabulary 256) or by a byte-level BPE tokenizer (--tokenizer, or "
      "--encoder and --merges)\n");
  auto Fail = [](Error E) { return reportError("sp-tokenize", std::move(E)); };
  // Writing the tokens over the text would destroy it.
  bool Same = false;
  if (Input != "-" && Output != "-" &&
      !sys::fs::equivalent(Input, Output, Same) && Same)
    return Fail(toolError(formatv("-o '{0}' is the input file; name another "
                                  "file for the tokens",
                                  Output)));
  auto Tok = loadTokenizer();
  if (!Tok)
    return Fail(Tok.takeError());
  auto Buf = MemoryBuffer::getFileOrSTDIN(Input, /*IsText=*/false,
                                          /*RequiresNullTerminator=*/false);
  if (!Buf)
    return Fail(toolError(
        formatv("cannot read '{0}': {1}", Input, Buf.getError().message())));
  StringRef Text = (*Buf)->getBuffer();
  if (Text.empty())
    return Fail(toolError(formatv("'{0}' is empty; there is nothing to "
                                  "tokenize",
                                  Input)));
  TokenFileInfo Info;
  Info.Vocab = *Tok ? (*Tok)->vocabSize() : 256;
  Info.Width = tokenWidthFor(Info.Vocab);
  Info.Tokenizer = *Tok ? (*Tok)->name().str() : "bytes";
  auto Encode = [&](StringRef Part) -> Expected<TokenFileOut> {
    TokenFileOut T{{}, Info};
    if (*Tok) {
      auto Ids = (*Tok)->encode(Part, Threads);
      if (!Ids)
        return Ids.takeError();
      T.Ids = std::move(*Ids);
    } else {
      T.Ids.assign(Part.bytes_begin(), Part.bytes_end());
    }
    T.Info.Tokens = int64_t(T.Ids.size());
    return T;
  };

  if (Split.getNumOccurrences() == 0) {
    if (ValOutput.getNumOccurrences())
      return Fail(toolError("--val-output needs --split F"));
    auto T = Encode(Text);
    if (!T)
      return Fail(T.takeError());
    if (Output != "-")
      for (const std::string &F : {Output.getValue(), tokenSidecarPath(Output)})
        if (auto E = checkWritableFile(F))
          return Fail(std::move(E));
    if (auto E = writeTokens(Output, *T))
      return Fail(std::move(E));
    if (!Quiet && Output != "-")
      outs() << formatv("wrote {0} tokens ({1}) to {2}\n", T->Ids.size(),
                        describe(Info), Output);
    return 0;
  }

  if (!(Split > 0 && Split < 1))
    return Fail(createStringError(inconvertibleErrorCode(),
                                  "--split %g: give the training share, a "
                                  "number between 0 and 1 (e.g. 0.9)",
                                  double(Split)));
  std::string Val = ValOutput;
  if (Val.empty()) {
    if (Output == "-")
      return Fail(toolError("--split with -o -: name the validation file "
                            "with --val-output"));
    SmallString<256> Name(Output);
    std::string Ext = sys::path::extension(Name).str();
    sys::path::replace_extension(Name, ".val" + Ext);
    Val = Name.str().str();
  }
  Same = false;
  if (Val == Output || (!sys::fs::equivalent(Val, Output, Same) && Same) ||
      (Input != "-" && !sys::fs::equivalent(Input, Val, Same) && Same))
    return Fail(toolError(formatv("--val-output '{0}' is the input or the -o "
                                  "file; name another file",
                                  Val)));
  size_t Cut = size_t(double(Text.size()) * Split);
  // Back to just after a line break in the last 1% before the cut.
  size_t Floor = Cut - std::min(Cut, Text.size() / 100);
  size_t Break = Text.rfind('\n', Cut ? Cut - 1 : 0);
  if (Break != StringRef::npos && Break >= Floor && Break + 1 < Text.size())
    Cut = Break + 1;
  // Not inside a UTF-8 sequence.
  while (Cut < Text.size() && (uint8_t(Text[Cut]) & 0xC0) == 0x80)
    ++Cut;
  auto Train = Encode(Text.take_front(Cut));
  if (!Train)
    return Fail(Train.takeError());
  auto Held = Encode(Text.drop_front(Cut));
  if (!Held)
    return Fail(Held.takeError());
  if (Train->Ids.size() < 2 || Held->Ids.size() < 2)
    return Fail(createStringError(
        inconvertibleErrorCode(),
        "--split %g of %zu bytes leaves %zu tokens for training and %zu for "
        "validation; each needs at least 2",
        double(Split), Text.size(), Train->Ids.size(), Held->Ids.size()));
  for (StringRef P : {StringRef(Val), StringRef(Output)})
    for (const std::string &F : {P.str(), tokenSidecarPath(P)})
      if (P != "-")
        if (auto E = checkWritableFile(F))
          return Fail(std::move(E));
  // The validation file first: a failure leaves no training file that
  // looks complete beside a missing validation one.
  if (auto E = writeTokens(Val, *Held))
    return Fail(std::move(E));
  if (auto E = writeTokens(Output, *Train)) {
    sys::fs::remove(Val);
    sys::fs::remove(tokenSidecarPath(Val));
    return Fail(std::move(E));
  }
  if (!Quiet && Output != "-")
    outs() << formatv("wrote {0} tokens ({1}) to {2} and {3} to {4}\n",
                      Train->Ids.size(), describe(Info), Output,
                      Held->Ids.size(), Val);
  return 0;
}
