//===- Plan.cpp - Reading and writing plan directories --------------------===//
#include "plan/Plan.h"
#include "plan/AtomicFile.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;
using json = nlohmann::json;

namespace sp {

static Error writeJson(const Twine &Path, const json &J) {
  std::string Text = J.dump(1) + "\n";
  return writeFileAtomically(Path.str(), [&](raw_ostream &OS) { OS << Text; });
}

Error writePlan(StringRef Dir, const Plan &P) {
  if (sys::fs::exists(Dir)) {
    SmallString<128> Manifest(Dir);
    sys::path::append(Manifest, "manifest.json");
    if (!sys::fs::is_directory(Dir) || !sys::fs::exists(Manifest))
      return createStringError(inconvertibleErrorCode(),
                               "refusing to overwrite '%s': it exists and is "
                               "not a plan directory",
                               Dir.str().c_str());
  }
  json Manifest = P.Manifest;
  Manifest["format_version"] = PlanFormatVersion;
  Manifest["program"] = "program.json";
  Manifest["arena_bytes"] = P.Prog.ArenaBytes;
  json Stages = json::array();
  for (int K = 1; K < int(P.Stages.size()); ++K)
    Stages.push_back("program-" + std::to_string(K) + ".json");
  if (!P.Stages.empty())
    Manifest["stage_programs"] = Stages;
  return writeDirectoryAtomically(Dir, [&](StringRef Tmp) -> Error {
    if (auto E = writeJson(Tmp + "/manifest.json", Manifest))
      return E;
    for (int K = 1; K < int(P.Stages.size()); ++K)
      if (auto E = writeJson(Tmp + "/program-" + Twine(K) + ".json",
                             programToJson(P.Stages[K])))
        return E;
    for (auto &[Name, Text] : P.Files)
      if (auto E = writeFileAtomically((Tmp + "/" + Name).str(),
                                       [&](raw_ostream &OS) { OS << Text; }))
        return E;
    return writeJson(Tmp + "/program.json", programToJson(P.Prog));
  });
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
  auto ReadProgram = [&](const std::string &Name) -> Expected<Program> {
    auto J = readJson(Dir + "/" + Name);
    if (!J)
      return J.takeError();
    auto Prog = programFromJson(*J);
    if (!Prog)
      return createStringError(inconvertibleErrorCode(), "plan '%s': %s",
                               Dir.str().c_str(),
                               toString(Prog.takeError()).c_str());
    return Prog;
  };
  auto Prog = ReadProgram(P.Manifest.value("program", "program.json"));
  if (!Prog)
    return Prog.takeError();
  P.Prog = std::move(*Prog);
  if (P.Manifest.contains("stage_programs")) {
    P.Stages.push_back(P.Prog);
    for (const json &Name : P.Manifest["stage_programs"]) {
      auto S = ReadProgram(Name.get<std::string>());
      if (!S)
        return S.takeError();
      P.Stages.push_back(std::move(*S));
    }
  }
  return P;
}

} // namespace sp
