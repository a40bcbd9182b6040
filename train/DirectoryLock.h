//===- DirectoryLock.h - A directory one run writes, locked -----*- C++ -*-===//
//
// sp-run's checkpoint and log directories are locked while a run writes
// them, so that a second run on them is refused instead of interleaving its
// files with the first's.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TRAIN_DIRECTORYLOCK_H
#define SP_TRAIN_DIRECTORYLOCK_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <memory>
#include <string>
#include <vector>

namespace sp {

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

} // namespace sp

#endif // SP_TRAIN_DIRECTORYLOCK_H
