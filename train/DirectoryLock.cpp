//===- DirectoryLock.cpp - A directory one run writes, locked -------------===//
//
// See DirectoryLock.h: flock on DIR/.sp-run.lock, which records the holder.
//
//===----------------------------------------------------------------------===//
#include "train/DirectoryLock.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <cerrno>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

using namespace llvm;

namespace sp {

const char *const DirectoryLockName = ".sp-run.lock";

DirectoryLock::~DirectoryLock() {
  if (FD >= 0)
    ::close(FD); // drops the lock
}

void DirectoryLock::discard() {
  if (CreatedFile)
    sys::fs::remove(LockFile); // while still holding it: no one else has it
  if (FD >= 0)
    ::close(FD);
  FD = -1;
  for (const std::string &Dir : CreatedDirs)
    if (sys::fs::remove(Dir)) // fails, as it should, on a non-empty one
      break;
}

Expected<std::unique_ptr<DirectoryLock>>
lockDirectory(StringRef Dir, StringRef What, StringRef Flag) {
  auto Failed = [&](const Twine &Why) {
    return createStringError(inconvertibleErrorCode(), "%s '%s': %s",
                             What.str().c_str(), Dir.str().c_str(),
                             Why.str().c_str());
  };
  if (sys::fs::exists(Dir) && !sys::fs::is_directory(Dir))
    return Failed("it exists and is not a directory");
  // The directories this creates, deepest first (discard removes them).
  std::vector<std::string> Created;
  for (SmallString<256> D(Dir); !D.empty() && !sys::fs::exists(D);
       sys::path::remove_filename(D))
    Created.push_back(D.str().str());
  if (std::error_code EC = sys::fs::create_directories(Dir))
    return Failed("cannot create it: " + EC.message());
  std::string Path = (Dir + "/" + DirectoryLockName).str();
  bool CreatedFile = !sys::fs::exists(Path);
  int FD = ::open(Path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (FD < 0)
    return Failed(Twine("cannot create its lock file ") + DirectoryLockName +
                  ": " +
                  std::error_code(errno, std::generic_category()).message());
  auto Lock = std::make_unique<DirectoryLock>(FD, Path, CreatedFile,
                                              std::move(Created));
  while (::flock(FD, LOCK_EX | LOCK_NB)) {
    if (errno == EINTR)
      continue;
    if (errno != EWOULDBLOCK)
      return Failed(Twine("cannot lock ") + DirectoryLockName + ": " +
                    std::error_code(errno, std::generic_category()).message());
    // The holder wrote its pid when it took the lock.
    char Text[64] = {0};
    ssize_t N = ::pread(FD, Text, sizeof(Text) - 1, 0);
    std::string Holder = N > 0 ? StringRef(Text, size_t(N)).trim().str() : "";
    if (!Holder.empty())
      Holder = " (" + Holder + ")";
    return Failed("another sp-run" + Holder +
                  " is using it; wait for that run to end or give this one "
                  "another " +
                  Flag);
  }
  std::string Me = "pid " + std::to_string(::getpid()) + "\n";
  if (::ftruncate(FD, 0) == 0)
    (void)!::pwrite(FD, Me.data(), Me.size(), 0);
  return Lock;
}

} // namespace sp
