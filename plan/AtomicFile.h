//===- AtomicFile.h - Writing files and folders all or nothing -*- C++ -*-===//
//
// Every output of the tools (reports, plans, checkpoints, dumps, exported
// models) goes through these, so a failure never leaves a half-written file
// or folder behind and an existing one is replaced whole.
//
//===----------------------------------------------------------------------===//
#ifndef SP_PLAN_ATOMICFILE_H
#define SP_PLAN_ATOMICFILE_H

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

namespace sp {

/// Writes Path through a temporary file beside it and a rename. "-" writes
/// to stdout.
llvm::Error
writeFileAtomically(llvm::StringRef Path,
                    llvm::function_ref<void(llvm::raw_ostream &)> Write);

/// Whether writeFileAtomically(Path) can write Path: it is not a folder and
/// the folder it goes in exists. A tool with several outputs checks each
/// first, so that a bad one fails before any is written. The error reads as
/// writeFileAtomically's would ("cannot write 'x/r.json': Not a directory").
llvm::Error checkWritableFile(llvm::StringRef Path);

/// Whether writeDirectoryAtomically(Dir) can write Dir: it is not a file
/// and the folder it goes in exists (errors as checkWritableFile's).
llvm::Error checkWritableDirectory(llvm::StringRef Dir);

/// Builds the folder Dir: Fill writes into a temporary folder beside it,
/// which is then renamed into place (an existing Dir is moved aside first and
/// removed after). On failure nothing changes and the temporary is removed.
llvm::Error
writeDirectoryAtomically(llvm::StringRef Dir,
                         llvm::function_ref<llvm::Error(llvm::StringRef Tmp)> Fill);

} // namespace sp

#endif // SP_PLAN_ATOMICFILE_H
