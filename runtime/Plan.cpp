//===- Plan.cpp - Reading and writing plan directories --------------------===//
#include "runtime/Plan.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;
using json = nlohmann::json;

namespace sp {

static Error writeJson(const Twine &Path, const json &J) {
  std::error_code EC;
  raw_fd_ostream OS(Path.str(), EC);
  if (EC)
    return createStringError(EC, "cannot write '%s': %s", Path.str().c_str(),
                             EC.message().c_str());
  OS << J.dump(1) << "\n";
  OS.close();
  if (OS.has_error())
    return createStringError(OS.error(), "cannot write '%s'",
                             Path.str().c_str());
  return Error::success();
}

Error writePlan(StringRef Dir, const Plan &P) {
  SmallString<128> Parent(Dir);
  sys::path::remove_filename(Parent);
  if (Parent.empty())
    Parent = ".";
  // createUniqueDirectory puts relative names under the system temp folder;
  // the temporary must sit beside the plan for the final rename.
  if (std::error_code EC = sys::fs::make_absolute(Parent))
    return createStringError(EC, "cannot resolve '%s'", Dir.str().c_str());
  if (sys::fs::exists(Dir)) {
    SmallString<128> Manifest(Dir);
    sys::path::append(Manifest, "manifest.json");
    if (!sys::fs::is_directory(Dir) || !sys::fs::exists(Manifest))
      return createStringError(inconvertibleErrorCode(),
                               "refusing to overwrite '%s': it exists and is "
                               "not a plan directory",
                               Dir.str().c_str());
  }
  SmallString<128> Tmp;
  SmallString<128> Model(Parent);
  sys::path::append(Model, "." + sys::path::filename(Dir) + ".tmp-%%%%%%");
  if (std::error_code EC = sys::fs::createUniqueDirectory(Model, Tmp))
    return createStringError(EC, "cannot create a directory beside '%s': %s",
                             Dir.str().c_str(), EC.message().c_str());
  // createUniqueDirectory treats the model as a prefix; use what it made.
  auto Fail = [&](Error E) {
    sys::fs::remove_directories(Tmp);
    return E;
  };
  json Manifest = P.Manifest;
  Manifest["format_version"] = PlanFormatVersion;
  Manifest["program"] = "program.json";
  Manifest["arena_bytes"] = P.Prog.ArenaBytes;
  if (auto E = writeJson(Tmp + "/manifest.json", Manifest))
    return Fail(std::move(E));
  if (auto E = writeJson(Tmp + "/program.json", programToJson(P.Prog)))
    return Fail(std::move(E));
  // Swap into place: move an old plan aside first, then remove it.
  SmallString<128> Old;
  if (sys::fs::exists(Dir)) {
    Old = (Tmp + ".old").str();
    if (std::error_code EC = sys::fs::rename(Dir, Old))
      return Fail(createStringError(EC, "cannot replace '%s': %s",
                                    Dir.str().c_str(), EC.message().c_str()));
  }
  if (std::error_code EC = sys::fs::rename(Tmp, Dir)) {
    if (!Old.empty())
      sys::fs::rename(Old, Dir);
    return Fail(createStringError(EC, "cannot write '%s': %s",
                                  Dir.str().c_str(), EC.message().c_str()));
  }
  if (!Old.empty())
    sys::fs::remove_directories(Old);
  return Error::success();
}

static Expected<json> readJson(const Twine &Path) {
  auto Buf = MemoryBuffer::getFile(Path);
  if (!Buf)
    return createStringError(Buf.getError(), "cannot read '%s': %s",
                             Path.str().c_str(),
                             Buf.getError().message().c_str());
  json J = json::parse((*Buf)->getBuffer().begin(), (*Buf)->getBuffer().end(),
                       nullptr, /*allow_exceptions=*/false);
  if (J.is_discarded())
    return createStringError(inconvertibleErrorCode(),
                             "'%s' is not valid JSON", Path.str().c_str());
  return J;
}

Expected<Plan> readPlan(StringRef Dir) {
  if (!sys::fs::is_directory(Dir))
    return createStringError(inconvertibleErrorCode(),
                             "'%s' is not a plan directory (make one with "
                             "sp-compile MODEL.onnx -o %s)",
                             Dir.str().c_str(), Dir.str().c_str());
  Plan P;
  auto M = readJson(Dir + "/manifest.json");
  if (!M)
    return M.takeError();
  P.Manifest = std::move(*M);
  int Version = P.Manifest.value("format_version", -1);
  if (Version != PlanFormatVersion)
    return createStringError(inconvertibleErrorCode(),
                             "plan '%s' has format version %d, this sp-run "
                             "reads version %d; recompile the model with this "
                             "sp-compile",
                             Dir.str().c_str(), Version, PlanFormatVersion);
  auto J = readJson(Dir + "/" + P.Manifest.value("program", "program.json"));
  if (!J)
    return J.takeError();
  auto Prog = programFromJson(*J);
  if (!Prog)
    return createStringError(inconvertibleErrorCode(), "plan '%s': %s",
                             Dir.str().c_str(),
                             toString(Prog.takeError()).c_str());
  P.Prog = std::move(*Prog);
  return P;
}

} // namespace sp
