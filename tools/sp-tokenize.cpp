//===- sp-tokenize.cpp - Text to a token file -----------------------------===//
//
//   sp-tokenize IN.txt -o OUT.bin
//
// A byte-level tokenizer: every byte of the input is one token whose id is
// the byte's value (vocabulary 256). The output is nanoGPT's .bin format,
// which sp-run --data reads: little-endian uint16 ids, nothing else. The
// output is written atomically; an empty input, and an output that is the
// input, are refused.
//
//===----------------------------------------------------------------------===//
#include "tools/ToolSupport.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"

using namespace llvm;
using namespace sp;

static cl::OptionCategory Cat("sp-tokenize options");
static cl::opt<std::string> Input(cl::Positional, cl::desc("<input text>"),
                                  cl::Required, cl::cat(Cat));
static cl::opt<std::string> Output("o", cl::desc("The token file to write"),
                                   cl::value_desc("out.bin"), cl::Required,
                                   cl::cat(Cat));
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
  std::string Tokens(Text.size() * 2, '\0');
  for (size_t I = 0; I < Text.size(); ++I)
    Tokens[2 * I] = Text[I]; // the high byte of an id below 256 is 0
  if (auto E =
          writeFileAtomically(Output, [&](raw_ostream &OS) { OS << Tokens; }))
    return reportError("sp-tokenize", std::move(E));
  if (!Quiet && Output != "-")
    outs() << formatv("wrote {0} tokens (vocabulary 256) to {1}\n", Text.size(),
                      Output);
  return 0;
}
