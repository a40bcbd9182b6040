//===- sp-tokenize.cpp - Text to a token file -----------------------------===//
//
//   sp-tokenize IN.txt -o OUT.bin [--split F [--val-output VAL.bin]]
//
// A byte-level tokenizer: every byte of the input is one token whose id is
// the byte's value (vocabulary 256). The output is nanoGPT's .bin format,
// which sp-run --data reads: little-endian uint16 ids, nothing else. The
// output is written atomically; an empty input, and an output that is the
// input, are refused.
//
// --split F (0 < F < 1) cuts the tokens in two: the first F of them go to
// OUT.bin (training), the rest to VAL.bin (validation; default: OUT.bin's
// name with ".val" before the extension), for sp-run --val-data. The cut is
// at a line break near F when there is one in the last 1% before it, so
// that neither file starts mid-line. Each part must hold at least two
// tokens.
//
//===----------------------------------------------------------------------===//
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
          cl::desc("Write the first F of the tokens to -o and the rest to "
                   "--val-output (a held-out validation set)"),
          cl::value_desc("F"), cl::cat(Cat));
static cl::opt<std::string>
    ValOutput("val-output",
              cl::desc("With --split: the validation file (default: -o's "
                       "name with .val before its extension)"),
              cl::value_desc("val.bin"), cl::cat(Cat));
static cl::opt<bool> Quiet("quiet", cl::desc("Do not print the summary"),
                           cl::cat(Cat));

int main(int Argc, char **Argv) {
  InitLLVM X(Argc, Argv);
  cl::HideUnrelatedOptions(Cat);
  cl::ParseCommandLineOptions(
      Argc, Argv,
      "sp-tokenize: byte-level tokenizer (token id = byte value, vocabulary "
      "256) writing little-endian uint16 ids\n");
  // Writing the tokens over the text would destroy it.
  bool Same = false;
  if (Input != "-" && Output != "-" &&
      !sys::fs::equivalent(Input, Output, Same) && Same)
    return reportError("sp-tokenize",
                       createStringError(inconvertibleErrorCode(),
                                         "-o '%s' is the input file; name "
                                         "another file for the tokens",
                                         Output.c_str()));
  auto Buf = MemoryBuffer::getFileOrSTDIN(Input, /*IsText=*/false,
                                          /*RequiresNullTerminator=*/false);
  if (!Buf)
    return reportError("sp-tokenize",
                       createStringError(Buf.getError(), "cannot read '%s': %s",
                                         Input.c_str(),
                                         Buf.getError().message().c_str()));
  StringRef Text = (*Buf)->getBuffer();
  if (Text.empty())
    return reportError("sp-tokenize",
                       createStringError(inconvertibleErrorCode(),
                                         "'%s' is empty; there is nothing to "
                                         "tokenize",
                                         Input.c_str()));
  auto Encode = [](StringRef Part) {
    std::string Tokens(Part.size() * 2, '\0');
    for (size_t I = 0; I < Part.size(); ++I)
      Tokens[2 * I] = Part[I]; // the high byte of an id below 256 is 0
    return Tokens;
  };
  if (Split.getNumOccurrences() == 0) {
    if (ValOutput.getNumOccurrences())
      return reportError("sp-tokenize",
                         createStringError(inconvertibleErrorCode(),
                                           "--val-output needs --split F"));
    std::string Tokens = Encode(Text);
    if (auto E = writeFileAtomically(Output,
                                     [&](raw_ostream &OS) { OS << Tokens; }))
      return reportError("sp-tokenize", std::move(E));
    if (!Quiet && Output != "-")
      outs() << formatv("wrote {0} tokens (vocabulary 256) to {1}\n",
                        Text.size(), Output);
    return 0;
  }

  if (!(Split > 0 && Split < 1))
    return reportError("sp-tokenize",
                       createStringError(inconvertibleErrorCode(),
                                         "--split %g: give the training share, "
                                         "a number between 0 and 1 (e.g. 0.9)",
                                         double(Split)));
  std::string Val = ValOutput;
  if (Val.empty()) {
    if (Output == "-")
      return reportError("sp-tokenize",
                         createStringError(inconvertibleErrorCode(),
                                           "--split with -o -: name the "
                                           "validation file with --val-output"));
    SmallString<256> Name(Output);
    std::string Ext = sys::path::extension(Name).str();
    sys::path::replace_extension(Name, ".val" + Ext);
    Val = Name.str().str();
  }
  Same = false;
  if (Val == Output ||
      (!sys::fs::equivalent(Val, Output, Same) && Same) ||
      (Input != "-" && !sys::fs::equivalent(Input, Val, Same) && Same))
    return reportError("sp-tokenize",
                       createStringError(inconvertibleErrorCode(),
                                         "--val-output '%s' is the input or "
                                         "the -o file; name another file",
                                         Val.c_str()));
  size_t Cut = size_t(double(Text.size()) * Split);
  // Back to just after a line break in the last 1% before the cut.
  size_t Floor = Cut - std::min(Cut, Text.size() / 100);
  size_t Break = Text.rfind('\n', Cut ? Cut - 1 : 0);
  if (Break != StringRef::npos && Break >= Floor && Break + 1 < Text.size())
    Cut = Break + 1;
  if (Cut < 2 || Text.size() - Cut < 2)
    return reportError(
        "sp-tokenize",
        createStringError(inconvertibleErrorCode(),
                          "--split %g of %zu tokens leaves %zu for training "
                          "and %zu for validation; each needs at least 2",
                          double(Split), Text.size(), Cut, Text.size() - Cut));
  std::string Train = Encode(Text.take_front(Cut)),
              Held = Encode(Text.drop_front(Cut));
  // The validation file first: a failure leaves no training file that
  // looks complete beside a missing validation one.
  if (auto E = writeFileAtomically(Val, [&](raw_ostream &OS) { OS << Held; }))
    return reportError("sp-tokenize", std::move(E));
  if (auto E =
          writeFileAtomically(Output, [&](raw_ostream &OS) { OS << Train; })) {
    sys::fs::remove(Val);
    return reportError("sp-tokenize", std::move(E));
  }
  if (!Quiet && Output != "-")
    outs() << formatv("wrote {0} tokens (vocabulary 256) to {1} and {2} to "
                      "{3}\n",
                      Cut, Output, Text.size() - Cut, Val);
  return 0;
}
