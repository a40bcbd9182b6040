//===- Checkpoint.cpp - Training checkpoints ------------------------------===//
#include "runtime/Checkpoint.h"
#include "plan/AtomicFile.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/CRC.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include <cstring>
#include <nlohmann/json.hpp>

using namespace llvm;
using json = nlohmann::json;

namespace sp {

static_assert(sizeof(float) == 4, "checkpoints hold float32");

static const char *IndexName = "checkpoint.json";
static const char *DataName = "tensors.bin";

static Error fail(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), Msg);
}

static uint64_t fnv1a64(StringRef S) {
  uint64_t H = 0xcbf29ce484222325ULL;
  for (unsigned char C : S) {
    H ^= C;
    H *= 0x100000001b3ULL;
  }
  return H;
}

static uint32_t crcOf(const void *Data, size_t Size) {
  return crc32(ArrayRef<uint8_t>(static_cast<const uint8_t *>(Data), Size));
}

std::string planFingerprint(const Program &P) {
  json Full = programToJson(P);
  json Key = json::object();
  json Buffers = json::array();
  for (const json &B : Full["buffers"])
    Buffers.push_back({{"name", B.value("name", "")},
                       {"kind", B.value("kind", "")},
                       {"dtype", B.value("dtype", "")},
                       {"shape", B.value("shape", json::array())}});
  Key["buffers"] = std::move(Buffers);
  Key["instructions"] = Full.value("instructions", json::array());
  Key["outputs"] = Full.value("outputs", json::array());
  return formatv("{0:x16}", fnv1a64(Key.dump())).str();
}

bool checkpointExists(StringRef Dir) {
  return sys::fs::exists(Dir + "/" + IndexName);
}

/// The index's own checksum: CRC-32 of its dump without the "checksum" key.
static uint32_t indexChecksum(json J) {
  J.erase("checksum");
  std::string S = J.dump();
  return crcOf(S.data(), S.size());
}

Error checkCheckpointTarget(StringRef Dir) {
  if (!sys::fs::exists(Dir))
    return Error::success();
  std::error_code EC;
  bool Empty =
      sys::fs::is_directory(Dir) &&
      sys::fs::directory_iterator(Dir, EC) == sys::fs::directory_iterator();
  if (!sys::fs::is_directory(Dir) || (!Empty && !checkpointExists(Dir)))
    return fail("refusing to overwrite '" + Dir +
                "': it exists and is not a checkpoint directory");
  return Error::success();
}

Error writeCheckpoint(StringRef Dir, const CheckpointMeta &Meta,
                      ArrayRef<TensorView> Tensors) {
  if (auto E = checkCheckpointTarget(Dir))
    return E;
  SmallString<128> Parent(Dir);
  sys::path::remove_filename(Parent);
  if (Parent.empty())
    Parent = ".";
  if (std::error_code EC = sys::fs::create_directories(Parent))
    return createStringError(EC, "cannot create '%s': %s",
                             Parent.str().str().c_str(), EC.message().c_str());
  // createUniqueDirectory puts a relative model under the system's temporary
  // folder; the temporary must be beside Dir for the rename.
  return writeDirectoryAtomically(Dir, [&](StringRef Tmp) -> Error {
    json Index;
    Index["format"] = "sp-checkpoint";
    Index["version"] = CheckpointFormatVersion;
    Index["step"] = Meta.Step;
    Index["seed"] = Meta.Seed;
    Index["plan_fingerprint"] = Meta.PlanFingerprint;
    Index["data"] = DataName;
    json Losses = json::array();
    for (const LossRow &R : Meta.Losses)
      Losses.push_back({R.Step, R.Loss, R.LR});
    Index["losses"] = std::move(Losses);
    json Entries = json::array();
    int64_t Offset = 0;
    Error Data = writeFileAtomically(
        (Tmp + "/" + DataName).str(), [&](raw_ostream &OS) {
          for (const TensorView &T : Tensors) {
            size_t Bytes = size_t(T.size()) * sizeof(float);
            OS.write(reinterpret_cast<const char *>(T.Data), Bytes);
            Entries.push_back(
                {{"name", T.Name},
                 {"shape", std::vector<int64_t>(T.Type.Shape.begin(),
                                                T.Type.Shape.end())},
                 {"offset", Offset},
                 {"bytes", Bytes},
                 {"crc32", crcOf(T.Data, Bytes)}});
            Offset += Bytes;
          }
        });
    if (Data)
      return Data;
    Index["data_bytes"] = Offset;
    Index["tensors"] = std::move(Entries);
    Index["checksum"] = indexChecksum(Index);
    std::string Text = Index.dump(1) + "\n";
    return writeFileAtomically((Tmp + "/" + IndexName).str(),
                               [&](raw_ostream &OS) { OS << Text; });
  });
}

/// Reads, parses and checks checkpoint.json.
static Expected<std::pair<json, CheckpointMeta>> readIndex(StringRef Dir) {
  auto Corrupt = [&](const Twine &Why) {
    return fail("checkpoint '" + Dir + "' is corrupt: " + Why);
  };
  if (!checkpointExists(Dir))
    return fail("there is no checkpoint in '" + Dir +
                "' (write one with --checkpoint-every N)");
  std::string IndexPath = (Dir + "/" + IndexName).str();
  auto IndexBuf = MemoryBuffer::getFile(IndexPath);
  if (!IndexBuf)
    return createStringError(IndexBuf.getError(), "cannot read '%s': %s",
                             IndexPath.c_str(),
                             IndexBuf.getError().message().c_str());
  json Index = json::parse((*IndexBuf)->getBuffer().begin(),
                           (*IndexBuf)->getBuffer().end(), nullptr,
                           /*allow_exceptions=*/false);
  if (Index.is_discarded() || !Index.is_object())
    return Corrupt(Twine(IndexName) + " is not valid JSON");
  if (!Index.contains("checksum") || !Index["checksum"].is_number_unsigned() ||
      Index["checksum"].get<uint32_t>() != indexChecksum(Index))
    return Corrupt(Twine(IndexName) + " fails its checksum");
  if (Index.value("format", "") != "sp-checkpoint")
    return Corrupt(Twine(IndexName) + " is not an sp checkpoint index");
  int Version = Index.value("version", -1);
  if (Version != CheckpointFormatVersion)
    return fail(formatv("checkpoint '{0}' has format version {1}, this sp-run "
                        "reads version {2}",
                        Dir, Version, CheckpointFormatVersion));
  CheckpointMeta Meta;
  try {
    Meta.Step = Index.at("step").get<int64_t>();
    Meta.Seed = Index.at("seed").get<uint64_t>();
    Meta.PlanFingerprint = Index.at("plan_fingerprint").get<std::string>();
    for (const json &R : Index.at("losses"))
      Meta.Losses.push_back(LossRow{R.at(0).get<int64_t>(),
                                    R.at(1).get<double>(),
                                    R.at(2).get<double>()});
  } catch (const json::exception &E) {
    return Corrupt(Twine(IndexName) + ": " + E.what());
  }
  return std::pair{std::move(Index), std::move(Meta)};
}

Expected<CheckpointMeta> readCheckpointMeta(StringRef Dir) {
  auto R = readIndex(Dir);
  if (!R)
    return R.takeError();
  return std::move(R->second);
}

Expected<CheckpointMeta> readCheckpoint(StringRef Dir,
                                        StringRef PlanFingerprint,
                                        ArrayRef<TensorView> Tensors) {
  auto Corrupt = [&](const Twine &Why) {
    return fail("checkpoint '" + Dir + "' is corrupt: " + Why);
  };
  auto R = readIndex(Dir);
  if (!R)
    return R.takeError();
  json &Index = R->first;
  CheckpointMeta &Meta = R->second;
  if (Meta.PlanFingerprint != PlanFingerprint)
    return fail(formatv("checkpoint '{0}' was written for another plan "
                        "(fingerprint {1}, this plan has {2}); resume with the "
                        "plan that wrote it",
                        Dir, Meta.PlanFingerprint, PlanFingerprint));

  // Names and shapes: the checkpoint and the executor hold the same tensors.
  struct Entry {
    const TensorView *View;
    int64_t Offset, Bytes;
    uint32_t Crc;
  };
  StringMap<const TensorView *> ByName;
  for (const TensorView &T : Tensors)
    ByName[T.Name] = &T;
  std::vector<Entry> Entries;
  StringMap<bool> Seen;
  int64_t DataBytes = 0;
  try {
    DataBytes = Index.at("data_bytes").get<int64_t>();
    for (const json &E : Index.at("tensors")) {
      std::string Name = E.at("name").get<std::string>();
      auto Shape = E.at("shape").get<std::vector<int64_t>>();
      const TensorView *V = ByName.lookup(Name);
      if (!V)
        return fail("checkpoint '" + Dir +
                    "' does not match the plan: the "
                    "plan has no tensor '" +
                    Name + "'");
      if (ArrayRef<int64_t>(Shape) != ArrayRef<int64_t>(V->Type.Shape))
        return fail("checkpoint '" + Dir +
                    "' does not match the plan: "
                    "tensor '" +
                    Name + "' has another shape");
      Seen[Name] = true;
      Entries.push_back(Entry{V, E.at("offset").get<int64_t>(),
                              E.at("bytes").get<int64_t>(),
                              E.at("crc32").get<uint32_t>()});
    }
  } catch (const json::exception &E) {
    return Corrupt(Twine(IndexName) + ": " + E.what());
  }
  for (const TensorView &T : Tensors)
    if (!Seen.count(T.Name))
      return fail("checkpoint '" + Dir +
                  "' does not match the plan: it has "
                  "no tensor '" +
                  T.Name + "'");

  std::string DataPath = (Dir + "/" + DataName).str();
  auto Data = MemoryBuffer::getFile(DataPath, /*IsText=*/false,
                                    /*RequiresNullTerminator=*/false);
  if (!Data)
    return Corrupt(
        formatv("cannot read {0}: {1}", DataName, Data.getError().message()));
  int64_t Size = (*Data)->getBufferSize();
  if (Size != DataBytes)
    return Corrupt(formatv("{0} has {1} bytes, the index needs {2}", DataName,
                           Size, DataBytes));
  const char *Base = (*Data)->getBufferStart();
  for (const Entry &E : Entries) {
    if (E.Bytes != E.View->size() * int64_t(sizeof(float)) || E.Offset < 0 ||
        E.Offset + E.Bytes > Size)
      return Corrupt("tensor '" + E.View->Name + "' lies outside " + DataName);
    if (crcOf(Base + E.Offset, E.Bytes) != E.Crc)
      return Corrupt("tensor '" + E.View->Name + "' fails its checksum");
  }
  // All verified: now write the values back.
  for (const Entry &E : Entries)
    std::memcpy(E.View->Data, Base + E.Offset, E.Bytes);
  return Meta;
}

} // namespace sp
