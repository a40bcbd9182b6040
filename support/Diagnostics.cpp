//===- Diagnostics.cpp - One-line errors of the command-line tools --------===//
//
// See Diagnostics.h.
//
//===----------------------------------------------------------------------===//
#include "support/Diagnostics.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;

namespace sp {

Error usageError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), Msg);
}

int reportError(StringRef Tool, Error E) {
  std::string Msg = toString(std::move(E));
  // Keep diagnostics on one line.
  for (char &C : Msg)
    if (C == '\n')
      C = ' ';
  errs() << Tool << ": error: " << Msg << "\n";
  return 1;
}

} // namespace sp
