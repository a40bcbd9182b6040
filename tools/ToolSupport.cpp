//===- ToolSupport.cpp ----------------------------------------------------===//
#include "tools/ToolSupport.h"
#include "ir/AsmFormat.h"
#include "ir/Verifier.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include <cerrno>
#include <cmath>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

using namespace llvm;

namespace sp {

std::string humanBytes(double B) {
  const char *Units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  unsigned U = 0;
  while (B >= 1024 && U + 1 < std::size(Units)) {
    B /= 1024;
    ++U;
  }
  return formatv("{0:F2} {1}", B, Units[U]).str();
}

std::string humanSeconds(double S) {
  double A = std::abs(S);
  return A >= 1 || A == 0 ? formatv("{0:F3} s", S).str()
         : A >= 1e-3      ? formatv("{0:F3} ms", S * 1e3).str()
                          : formatv("{0:F3} us", S * 1e6).str();
}

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

int reportError(StringRef Tool, Error E) {
  std::string Msg = toString(std::move(E));
  // Keep diagnostics on one line.
  for (char &C : Msg)
    if (C == '\n')
      C = ' ';
  errs() << Tool << ": error: " << Msg << "\n";
  return 1;
}

namespace {
struct ImportCL {
  cl::OptionCategory Cat{"Import options"};
  cl::opt<int64_t> Batch{"batch",
                         cl::desc("Micro-batch size: binds a symbolic batch "
                                  "dimension (dim 0 of the first input)"),
                         cl::init(0), cl::cat(Cat)};
  cl::opt<int64_t> Seq{"seq",
                       cl::desc("Sequence length: binds a symbolic sequence "
                                "dimension (dim 1 of the first input)"),
                       cl::init(0), cl::cat(Cat)};
  cl::list<std::string> Dims{"dim",
                             cl::desc("Binds another symbolic dimension"),
                             cl::value_desc("name=N"), cl::cat(Cat)};
};
ImportCL *Import = nullptr;
} // namespace

cl::OptionCategory &registerImportCLOptions() {
  static ImportCL Options;
  Import = &Options;
  return Options.Cat;
}

Expected<ImportOptions> importOptionsFromCL() {
  assert(Import && "call registerImportCLOptions first");
  ImportOptions O;
  for (auto [Name, Opt] : {std::pair{"--batch", &Import->Batch},
                           {"--seq", &Import->Seq}})
    if (Opt->getNumOccurrences() && *Opt <= 0)
      return createStringError(inconvertibleErrorCode(),
                               "%s must be a positive integer", Name);
  O.Batch = Import->Batch;
  O.Seq = Import->Seq;
  for (StringRef D : Import->Dims) {
    auto [Name, Value] = D.split('=');
    int64_t N;
    if (Name.empty() || Value.getAsInteger(10, N) || N <= 0)
      return createStringError(inconvertibleErrorCode(),
                               "--dim expects NAME=N with a positive N, got "
                               "'%s'",
                               D.str().c_str());
    O.DimValues[Name] = N;
  }
  return O;
}

Expected<std::unique_ptr<Graph>> loadGraph(StringRef Path,
                                           const ImportOptions &Opts) {
  if (Path.endswith(".onnx"))
    return importOnnx(Path, Opts);
  auto Buf = MemoryBuffer::getFileOrSTDIN(Path);
  if (!Buf)
    return createStringError(Buf.getError(), "cannot read '%s': %s",
                             Path.str().c_str(),
                             Buf.getError().message().c_str());
  auto G = parseGraph((*Buf)->getBuffer(), Path == "-" ? "<stdin>" : Path);
  if (!G)
    return G.takeError();
  if (auto E = verifyGraph(**G))
    return createStringError(inconvertibleErrorCode(), "%s: %s",
                             Path.str().c_str(), toString(std::move(E)).c_str());
  return G;
}

} // namespace sp
