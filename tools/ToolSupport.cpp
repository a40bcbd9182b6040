//===- ToolSupport.cpp - Shared pieces of the command-line tools ----------===//
//
// See ToolSupport.h.
//
//===----------------------------------------------------------------------===//
#include "tools/ToolSupport.h"
#include "ir/AsmFormat.h"
#include "ir/Verifier.h"
#include "llvm/Support/MemoryBuffer.h"

using namespace llvm;

namespace sp {

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
