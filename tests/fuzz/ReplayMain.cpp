//===- ReplayMain.cpp - Run a fuzz target over files, without libFuzzer ---===//
//
// The ordinary build links each fuzz target (but the token loader's, which
// needs clang's FuzzedDataProvider) with this main instead of libFuzzer's,
// and ctest replays the committed corpus through it (fuzz-corpus-TARGET):
// the seeds and every regress-* input of a fixed bug run on every test run,
// without clang. A bug shows as a crash or a failed invariant (abort).
//
//   sp-replay-TARGET FILE_OR_DIR...
//
//===----------------------------------------------------------------------===//
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size);

using namespace llvm;

int main(int Argc, char **Argv) {
  std::vector<std::string> Files;
  for (int I = 1; I < Argc; ++I) {
    if (!sys::fs::is_directory(Argv[I])) {
      Files.push_back(Argv[I]);
      continue;
    }
    std::error_code EC;
    for (sys::fs::directory_iterator It(Argv[I], EC), End; It != End && !EC;
         It.increment(EC))
      if (sys::fs::is_regular_file(It->path()))
        Files.push_back(It->path());
    if (EC) {
      errs() << Argv[0] << ": cannot list " << Argv[I] << ": " << EC.message()
             << "\n";
      return 1;
    }
  }
  llvm::sort(Files); // the same order everywhere
  if (Files.empty()) {
    errs() << Argv[0] << ": no inputs\n";
    return 1;
  }
  for (const std::string &F : Files) {
    auto Buf = MemoryBuffer::getFile(F, /*IsText=*/false,
                                     /*RequiresNullTerminator=*/false);
    if (!Buf) {
      errs() << Argv[0] << ": cannot read " << F << ": "
             << Buf.getError().message() << "\n";
      return 1;
    }
    // A crash or a failed invariant names the input on the way down.
    errs() << "replaying " << F << "\n";
    LLVMFuzzerTestOneInput(
        reinterpret_cast<const uint8_t *>((*Buf)->getBufferStart()),
        (*Buf)->getBufferSize());
  }
  outs() << Files.size() << " inputs replayed\n";
  return 0;
}
