//===- AtomicFile.cpp -----------------------------------------------------===//
#include "plan/AtomicFile.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

using namespace llvm;

namespace sp {

// An exception out of a writer (nlohmann::json's dump throws on a string
// that is not UTF-8, any allocation can throw) becomes an Error here, after
// the temporary is removed: an exception that no caller catches ends the
// process without unwinding, and would leave the temporary behind.

static Error writeError(std::error_code EC, StringRef Path) {
  return createStringError(EC, "cannot write '%s': %s", Path.str().c_str(),
                           EC.message().c_str());
}

/// The folder that will hold Path, absolute: createUnique* put relative
/// names under the system temp folder, and the final rename must not cross
/// file systems.
static Expected<SmallString<128>> parentOf(StringRef Path) {
  SmallString<128> Dir(Path);
  sys::path::remove_filename(Dir);
  if (Dir.empty())
    Dir = ".";
  if (std::error_code EC = sys::fs::make_absolute(Dir))
    return writeError(EC, Path);
  return Dir;
}

/// The folder Path goes in exists.
static Error checkParent(StringRef Path) {
  auto Dir = parentOf(Path);
  if (!Dir)
    return Dir.takeError();
  sys::fs::file_status Status;
  if (std::error_code EC = sys::fs::status(*Dir, Status))
    return writeError(EC, Path);
  if (!sys::fs::is_directory(Status))
    return writeError(std::make_error_code(std::errc::not_a_directory), Path);
  return Error::success();
}

Error checkWritableFile(StringRef Path) {
  if (Path == "-")
    return Error::success();
  if (sys::fs::is_directory(Path))
    return writeError(std::make_error_code(std::errc::is_a_directory), Path);
  return checkParent(Path);
}

Error checkWritableDirectory(StringRef Dir) {
  if (sys::fs::exists(Dir) && !sys::fs::is_directory(Dir))
    return writeError(std::make_error_code(std::errc::not_a_directory), Dir);
  return checkParent(Dir);
}

Error writeFileAtomically(StringRef Path,
                          function_ref<void(raw_ostream &)> Write) {
  if (Path == "-") {
    Write(outs());
    outs().flush();
    return Error::success();
  }
  // A folder is never replaced by a file; checked first, since renaming
  // onto "." or ".." fails with a puzzling "Device or resource busy".
  if (sys::fs::is_directory(Path))
    return writeError(std::make_error_code(std::errc::is_a_directory), Path);
  auto Dir = parentOf(Path);
  if (!Dir)
    return Dir.takeError();
  SmallString<128> Model(*Dir), Tmp;
  sys::path::append(Model, "." + sys::path::filename(Path) + ".tmp-%%%%%%");
  int FD;
  if (std::error_code EC = sys::fs::createUniqueFile(Model, FD, Tmp))
    return writeError(EC, Path);
  {
    raw_fd_ostream OS(FD, /*shouldClose=*/true);
    try {
      Write(OS);
    } catch (const std::exception &E) {
      OS.close();
      OS.clear_error();
      sys::fs::remove(Tmp);
      return createStringError(inconvertibleErrorCode(),
                               "cannot write '%s': %s", Path.str().c_str(),
                               E.what());
    }
    OS.close();
    if (OS.has_error()) {
      std::error_code EC = OS.error();
      OS.clear_error();
      sys::fs::remove(Tmp);
      return writeError(EC, Path);
    }
  }
  if (std::error_code EC = sys::fs::rename(Tmp, Path)) {
    sys::fs::remove(Tmp);
    return writeError(EC, Path);
  }
  return Error::success();
}

Error writeDirectoryAtomically(StringRef Dir,
                               function_ref<Error(StringRef Tmp)> Fill) {
  auto Parent = parentOf(Dir);
  if (!Parent)
    return Parent.takeError();
  SmallString<128> Model(*Parent), Tmp;
  sys::path::append(Model, "." + sys::path::filename(Dir) + ".tmp-%%%%%%");
  if (std::error_code EC = sys::fs::createUniqueDirectory(Model, Tmp))
    return writeError(EC, Dir);
  auto FillCatching = [&]() -> Error {
    try {
      return Fill(Tmp);
    } catch (const std::exception &E) {
      return createStringError(inconvertibleErrorCode(),
                               "cannot write '%s': %s", Dir.str().c_str(),
                               E.what());
    }
  };
  if (Error E = FillCatching()) {
    sys::fs::remove_directories(Tmp);
    return E;
  }
  SmallString<128> Old;
  if (sys::fs::exists(Dir)) {
    Old = (Tmp + ".old").str();
    if (std::error_code EC = sys::fs::rename(Dir, Old)) {
      sys::fs::remove_directories(Tmp);
      return createStringError(EC, "cannot replace '%s': %s",
                               Dir.str().c_str(), EC.message().c_str());
    }
  }
  if (std::error_code EC = sys::fs::rename(Tmp, Dir)) {
    if (!Old.empty())
      sys::fs::rename(Old, Dir);
    sys::fs::remove_directories(Tmp);
    return writeError(EC, Dir);
  }
  if (!Old.empty())
    sys::fs::remove_directories(Old);
  return Error::success();
}

} // namespace sp
