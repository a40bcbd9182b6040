//===- Diagnostics.h - One-line errors --------------------------*- C++ -*-===//
//
// The tools and the training library report what the user got wrong (a
// flag, a file, a value) as one line, "TOOL: error: MESSAGE", and exit 1.
// usageError makes such an error; reportError prints one. makeError is the
// one maker of the libraries' other one-line errors.
//
//===----------------------------------------------------------------------===//
#ifndef SP_SUPPORT_DIAGNOSTICS_H
#define SP_SUPPORT_DIAGNOSTICS_H

#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/Error.h"

namespace sp {

/// An error carrying Msg: what a library function returns when it refuses
/// its input (a graph, a plan, a file), in one line naming what.
inline llvm::Error makeError(const llvm::Twine &Msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), Msg);
}

/// An error of the user's own (bad flags, files, values), said in Msg.
llvm::Error usageError(const llvm::Twine &Msg);

/// Prints "TOOL: error: MESSAGE" on one line (newlines in the message become
/// spaces) and returns the exit code 1.
int reportError(llvm::StringRef Tool, llvm::Error E);

} // namespace sp

#endif // SP_SUPPORT_DIAGNOSTICS_H
