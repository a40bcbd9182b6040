//===- ToolSupport.cpp ----------------------------------------------------===//
#include "tools/ToolSupport.h"
#include "ir/AsmFormat.h"
#include "ir/Verifier.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

using namespace llvm;

namespace sp {

int reportError(StringRef Tool, Error E) {
  std::string Msg = toString(std::move(E));
  // Keep diagnostics on one line.
  for (char &C : Msg)
    if (C == '\n')
      C = ' ';
  errs() << Tool << ": error: " << Msg << "\n";
  return 1;
}

Error writeFileAtomically(StringRef Path,
                          std::function<void(raw_ostream &)> Write) {
  if (Path == "-") {
    Write(outs());
    outs().flush();
    return Error::success();
  }
  SmallString<128> Dir(Path);
  sys::path::remove_filename(Dir);
  if (Dir.empty())
    Dir = ".";
  SmallString<128> Model(Dir);
  sys::path::append(Model, "." + sys::path::filename(Path) + ".tmp-%%%%%%");
  int FD;
  SmallString<128> Tmp;
  if (std::error_code EC = sys::fs::createUniqueFile(Model, FD, Tmp))
    return createStringError(EC, "cannot write '%s': %s", Path.str().c_str(),
                             EC.message().c_str());
  {
    raw_fd_ostream OS(FD, /*shouldClose=*/true);
    Write(OS);
    OS.close();
    if (OS.has_error()) {
      std::error_code EC = OS.error();
      OS.clear_error();
      sys::fs::remove(Tmp);
      return createStringError(EC, "cannot write '%s': %s",
                               Path.str().c_str(), EC.message().c_str());
    }
  }
  if (std::error_code EC = sys::fs::rename(Tmp, Path)) {
    sys::fs::remove(Tmp);
    return createStringError(EC, "cannot write '%s': %s", Path.str().c_str(),
                             EC.message().c_str());
  }
  return Error::success();
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
