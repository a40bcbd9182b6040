//===- Plan.cpp - Reading and writing plan directories --------------------===//
#include "plan/Plan.h"
#include "plan/AtomicFile.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include <algorithm>
#include <limits>

using namespace llvm;
using json = nlohmann::json;

namespace sp {

static Error writeJson(const Twine &Path, const json &J) {
  std::string Text = J.dump(1) + "\n";
  return writeFileAtomically(Path.str(), [&](raw_ostream &OS) { OS << Text; });
}

Error checkPlanOutput(StringRef Dir) {
  if (sys::fs::exists(Dir)) {
    SmallString<128> Manifest(Dir);
    sys::path::append(Manifest, "manifest.json");
    if (!sys::fs::is_directory(Dir) || !sys::fs::exists(Manifest))
      return createStringError(inconvertibleErrorCode(),
                               "refusing to overwrite '%s': it exists and is "
                               "not a plan directory",
                               Dir.str().c_str());
  }
  return checkWritableDirectory(Dir);
}

Error writePlan(StringRef Dir, const Plan &P) {
  if (auto E = checkPlanOutput(Dir))
    return E;
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
    for (const auto &File : P.Files)
      if (auto E = writeFileAtomically(
              (Tmp + "/" + File.first).str(),
              [&](raw_ostream &OS) { OS << File.second; }))
        return E;
    return writeJson(Tmp + "/program.json", programToJson(P.Prog));
  });
}

static Error makeError(StringRef Dir, const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(),
                           "plan '" + Dir + "': " + Msg);
}

static Expected<json> readJson(StringRef Dir, StringRef Name,
                               PlanFileReader ReadFile) {
  auto Text = ReadFile(Name);
  if (!Text)
    return Text.takeError();
  json J = json::parse(Text->begin(), Text->end(), nullptr,
                       /*allow_exceptions=*/false);
  if (J.is_discarded())
    return createStringError(inconvertibleErrorCode(),
                             "'%s/%s' is not valid JSON", Dir.str().c_str(),
                             Name.str().c_str());
  return J;
}

/// A file the manifest names must be a file of the plan directory.
static bool isPlanFileName(const json &J) {
  if (!J.is_string())
    return false;
  StringRef Name = J.get_ref<const std::string &>();
  return !Name.empty() && Name != "." && Name != ".." &&
         !Name.contains('/') && !Name.contains('\0');
}

/// The manifest entries that sp-run and the executor read (with
/// json::value, which throws on another type) must have their type; every
/// other entry is kept as is.
static Error checkManifest(StringRef Dir, const json &M) {
  auto Bad = [&](const Twine &Key, StringRef Want) {
    return makeError(Dir, "manifest.json: '" + Key + "' must be " + Want);
  };
  auto CheckInt = [&](const json &Obj, StringRef Prefix, const char *Key,
                      int64_t Min, int64_t Max) -> Error {
    auto It = Obj.find(Key);
    if (It == Obj.end())
      return Error::success();
    if (!isIntegerIn(*It, Min, Max))
      return Bad(Prefix + Key,
                 formatv("an integer in [{0}, {1}]", Min, Max).str());
    return Error::success();
  };
  constexpr int64_t IntMax = std::numeric_limits<int>::max();
  constexpr int64_t Int64Max = std::numeric_limits<int64_t>::max();
  for (const char *Key : {"tp", "dp", "pp", "interleave", "microbatches"})
    if (auto E = CheckInt(M, "", Key, 1, IntMax))
      return E;
  if (auto E = CheckInt(M, "", "arena_bytes", 0, Int64Max))
    return E;
  for (const char *Key : {"dtype", "source", "schedule"})
    if (M.contains(Key) && !M[Key].is_string())
      return Bad(Key, "a string");
  if (M.contains("dtype")) {
    auto D = parseDType(M["dtype"].get<std::string>());
    if (!D || !isFloat(*D))
      return Bad("dtype", "a floating-point type (f32, bf16, f16)");
  }
  if (M.contains("sp") && !M["sp"].is_boolean())
    return Bad("sp", "true or false");
  if (M.contains("program") && !isPlanFileName(M["program"]))
    return Bad("program", "the name of a file in the plan directory");
  if (M.contains("stage_programs")) {
    const json &S = M["stage_programs"];
    if (!S.is_array() || !all_of(S, isPlanFileName))
      return Bad("stage_programs",
                 "a list of names of files in the plan directory");
  }
  if (M.contains("model")) {
    const json &Model = M["model"];
    if (!Model.is_object())
      return Bad("model", "an object");
    for (const char *Key :
         {"vocab", "batch", "seq", "layers", "hidden", "heads"})
      if (auto E = CheckInt(Model, "model.", Key, 0, Int64Max))
        return E;
  }
  if (M.contains("memory")) {
    const json &Memory = M["memory"];
    if (!Memory.is_object())
      return Bad("memory", "an object");
    if (auto E = CheckInt(Memory, "memory.", "activation_layer", -1, IntMax))
      return E;
    for (const char *Key :
         {"first_stage_activation_bytes", "activation_bytes_per_layer"})
      if (auto E = CheckInt(Memory, "memory.", Key, -1, Int64Max))
        return E;
  }
  return Error::success();
}

/// Every buffer must hold its tensor: the runtime's kernels write a
/// buffer's whole type. The compiler plans a floating-point activation in
/// the plan's dtype (M["dtype"]) and everything else in its own type
/// (lower/LowerGraph.cpp, plannedBytes), so no buffer is smaller than the
/// smaller of the two.
static Error checkBufferSizes(StringRef Dir, const json &M,
                              const Program &Prog) {
  DType Act = *parseDType(M.value("dtype", "f32"));
  for (const ProgramBuffer &B : Prog.Buffers) {
    unsigned Size = dtypeSize(B.Type.Dtype);
    if (isFloat(B.Type.Dtype))
      Size = std::min(Size, dtypeSize(Act));
    int64_t Needs = B.Type.numElements() * Size;
    if (B.Bytes < Needs)
      return makeError(Dir, formatv("malformed program: buffer '{0}' holds "
                                    "{1} in {2} bytes; it needs {3}",
                                    B.Name, B.Type.str(), B.Bytes, Needs));
  }
  return Error::success();
}

Expected<Plan> readPlan(StringRef Dir) {
  if (!sys::fs::is_directory(Dir))
    return createStringError(inconvertibleErrorCode(),
                             "'%s' is not a plan directory (make one with "
                             "sp-compile MODEL.onnx -o %s)",
                             Dir.str().c_str(), Dir.str().c_str());
  return readPlan(Dir, [&](StringRef Name) -> Expected<std::string> {
    std::string Path = (Dir + "/" + Name).str();
    auto Buf = MemoryBuffer::getFile(Path);
    if (!Buf)
      return createStringError(Buf.getError(), "cannot read '%s': %s",
                               Path.c_str(), Buf.getError().message().c_str());
    return (*Buf)->getBuffer().str();
  });
}

Expected<Plan> readPlan(StringRef Dir, PlanFileReader ReadFile) {
  Plan P;
  auto M = readJson(Dir, "manifest.json", ReadFile);
  if (!M)
    return M.takeError();
  P.Manifest = std::move(*M);
  if (!P.Manifest.is_object())
    return makeError(Dir, "manifest.json is not a JSON object");
  const json &Version = P.Manifest.value("format_version", json(-1));
  if (!Version.is_number_integer())
    return makeError(Dir, "manifest.json: 'format_version' must be an "
                          "integer");
  if (Version != PlanFormatVersion)
    return createStringError(
        inconvertibleErrorCode(),
        "plan '%s' has format version %s, this sp-run reads version %d; "
        "recompile the model with this sp-compile",
        Dir.str().c_str(), Version.dump().c_str(), PlanFormatVersion);
  if (auto E = checkManifest(Dir, P.Manifest))
    return E;
  auto ReadProgram = [&](const std::string &Name) -> Expected<Program> {
    auto J = readJson(Dir, Name, ReadFile);
    if (!J)
      return J.takeError();
    auto Prog = programFromJson(*J);
    if (!Prog)
      return makeError(Dir, toString(Prog.takeError()));
    if (auto E = checkBufferSizes(Dir, P.Manifest, *Prog))
      return E;
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

Plan widenToFloat64(const Plan &P) {
  Plan W = P;
  auto Widen = [](Program &Prog) {
    for (ProgramBuffer &B : Prog.Buffers) {
      if (B.Type.Dtype == DType::F32)
        B.Type.Dtype = DType::F64;
      B.Offset *= 2;
      B.Bytes *= 2;
      B.Stride *= 2;
    }
    for (SlotRegion &S : Prog.Slots) {
      S.Offset *= 2;
      S.Stride *= 2;
    }
    Prog.ArenaBytes *= 2;
    Prog.PersistentBytes *= 2;
  };
  Widen(W.Prog);
  for (Program &S : W.Stages)
    Widen(S);
  W.Manifest["dtype"] = "f64";
  if (W.Manifest.contains("arena_bytes") &&
      W.Manifest["arena_bytes"].is_number_integer())
    W.Manifest["arena_bytes"] = W.Manifest["arena_bytes"].get<int64_t>() * 2;
  return W;
}

} // namespace sp
