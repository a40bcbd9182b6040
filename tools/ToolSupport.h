//===- ToolSupport.h - Shared pieces of the command-line tools -*- C++ -*-===//
#ifndef SP_TOOLS_TOOLSUPPORT_H
#define SP_TOOLS_TOOLSUPPORT_H

#include "frontend/OnnxImporter.h"
#include "ir/IR.h"
#include "plan/AtomicFile.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sp {

/// A byte count for people: "5.28 MiB", "2.23 TiB".
std::string humanBytes(double Bytes);

/// A duration for people, three decimals in s, ms or us:
/// "1.234 s", "12.345 ms", "56.789 us".
std::string humanSeconds(double Seconds);

/// Prints "TOOL: error: MESSAGE" on one line and returns the exit code 1.
int reportError(llvm::StringRef Tool, llvm::Error E);

/// The import flags shared by the tools: --batch, --seq and --dim NAME=N.
/// Call before ParseCommandLine; returns their category.
llvm::cl::OptionCategory &registerImportCLOptions();
/// Reads them (after ParseCommandLine); fails on a malformed --dim or a
/// non-positive size, naming the flag.
llvm::Expected<ImportOptions> importOptionsFromCL();

/// An exclusive lock on a directory that one run writes (sp-run's
/// checkpoint and log directories), held until it is destroyed or the
/// process ends: flock on DIR/.sp-run.lock, which records the holder's pid.
/// The kernel drops the lock when the process dies, kill -9 included, so a
/// killed run leaves no stale lock (the file stays, unlocked).
class DirectoryLock {
public:
  DirectoryLock(int FD, std::string LockFile, bool CreatedFile,
                std::vector<std::string> CreatedDirs)
      : FD(FD), LockFile(std::move(LockFile)), CreatedFile(CreatedFile),
        CreatedDirs(std::move(CreatedDirs)) {}
  DirectoryLock(const DirectoryLock &) = delete;
  DirectoryLock &operator=(const DirectoryLock &) = delete;
  ~DirectoryLock();

  /// For a run refused before it wrote anything: drops the lock and
  /// removes what taking it created (the lock file, and the directories
  /// lockDirectory made, while they are empty), so the refusal leaves the
  /// file system as it found it.
  void discard();

private:
  int FD;
  std::string LockFile;
  bool CreatedFile;
  std::vector<std::string> CreatedDirs; // deepest first
};

/// The name of the lock file in a locked directory.
extern const char *const DirectoryLockName;

/// Creates Dir if missing and locks it. Fails if another process holds the
/// lock: "WHAT 'DIR': another sp-run (pid N) is using it; wait for that run
/// to end or give this one another FLAG".
llvm::Expected<std::unique_ptr<DirectoryLock>>
lockDirectory(llvm::StringRef Dir, llvm::StringRef What, llvm::StringRef Flag);

/// Loads a model: ONNX (by the .onnx extension) or textual IR ("-" reads
/// stdin).
llvm::Expected<std::unique_ptr<Graph>> loadGraph(llvm::StringRef Path,
                                                 const ImportOptions &Opts);

} // namespace sp

#endif // SP_TOOLS_TOOLSUPPORT_H
