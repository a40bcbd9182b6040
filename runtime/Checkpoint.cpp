//===- Checkpoint.cpp - Training checkpoints ------------------------------===//
#include "runtime/Checkpoint.h"
#include "plan/AtomicFile.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CRC.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
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

/// Parses and checks the text of checkpoint.json.
static Expected<std::pair<json, CheckpointMeta>> parseIndex(StringRef Dir,
                                                            StringRef Text) {
  auto Corrupt = [&](const Twine &Why) {
    return fail("checkpoint '" + Dir + "' is corrupt: " + Why);
  };
  json Index = json::parse(Text.begin(), Text.end(), nullptr,
                           /*allow_exceptions=*/false);
  if (Index.is_discarded() || !Index.is_object())
    return Corrupt(Twine(IndexName) + " is not valid JSON");
  if (!Index.contains("checksum") ||
      !isIntegerIn(Index["checksum"], 0, UINT32_MAX) ||
      Index["checksum"].get<uint32_t>() != indexChecksum(Index))
    return Corrupt(Twine(IndexName) + " fails its checksum");
  // The checksum holds: what follows is a damaged writer or a hand edit.
  if (Index.value("format", json()) != "sp-checkpoint")
    return Corrupt(Twine(IndexName) + " is not an sp checkpoint index");
  const json Version = Index.value("version", json(-1));
  if (!Version.is_number_integer())
    return Corrupt(Twine(IndexName) + ": 'version' is not an integer");
  if (Version != CheckpointFormatVersion)
    return fail(formatv("checkpoint '{0}' has format version {1}, this sp-run "
                        "reads version {2}",
                        Dir, Version.dump(), CheckpointFormatVersion));
  auto Field = [&](const json &J, const char *Key) -> const json * {
    auto It = J.find(Key);
    return It == J.end() ? nullptr : &*It;
  };
  auto Bad = [&](const Twine &What, StringRef Want) {
    return Corrupt(Twine(IndexName) + ": " + What + " must be " + Want);
  };
  CheckpointMeta Meta;
  const json *Step = Field(Index, "step");
  if (!Step || !isIntegerIn(*Step, 0, INT64_MAX))
    return Bad("'step'", "a non-negative integer");
  Meta.Step = Step->get<int64_t>();
  const json *Seed = Field(Index, "seed");
  if (!Seed || !Seed->is_number_unsigned())
    return Bad("'seed'", "a non-negative integer");
  Meta.Seed = Seed->get<uint64_t>();
  const json *Fingerprint = Field(Index, "plan_fingerprint");
  if (!Fingerprint || !Fingerprint->is_string())
    return Bad("'plan_fingerprint'", "a string");
  Meta.PlanFingerprint = Fingerprint->get<std::string>();
  const json *Losses = Field(Index, "losses");
  if (!Losses || !Losses->is_array())
    return Bad("'losses'", "a list");
  // JSON has no NaN: the writer's json writes a NaN loss as null.
  auto Number = [](const json &J) -> std::optional<double> {
    if (J.is_number())
      return J.get<double>();
    if (J.is_null())
      return std::nan("");
    return std::nullopt;
  };
  for (const json &R : *Losses) {
    std::optional<double> Loss, LR;
    if (R.is_array() && R.size() == 3 && isIntegerIn(R[0], 0, INT64_MAX)) {
      Loss = Number(R[1]);
      LR = Number(R[2]);
    }
    if (!Loss || !LR)
      return Bad("every entry of 'losses'", "[step, loss, learning rate]");
    Meta.Losses.push_back(LossRow{R[0].get<int64_t>(), *Loss, *LR});
  }
  return std::pair{std::move(Index), std::move(Meta)};
}

/// Reads, parses and checks DIR/checkpoint.json.
static Expected<std::pair<json, CheckpointMeta>> readIndex(StringRef Dir) {
  if (!checkpointExists(Dir))
    return fail("there is no checkpoint in '" + Dir +
                "' (write one with --checkpoint-every N)");
  std::string IndexPath = (Dir + "/" + IndexName).str();
  auto IndexBuf = MemoryBuffer::getFile(IndexPath);
  if (!IndexBuf)
    return createStringError(IndexBuf.getError(), "cannot read '%s': %s",
                             IndexPath.c_str(),
                             IndexBuf.getError().message().c_str());
  return parseIndex(Dir, (*IndexBuf)->getBuffer());
}

Expected<CheckpointMeta> readCheckpointMeta(StringRef Dir) {
  auto R = readIndex(Dir);
  if (!R)
    return R.takeError();
  return std::move(R->second);
}

/// Checks a parsed index against the plan's tensors and the data, and only
/// then copies the data into the tensors.
static Expected<CheckpointMeta>
restore(StringRef Dir, json &Index, CheckpointMeta &Meta,
        function_ref<Expected<StringRef>()> ReadData,
        StringRef PlanFingerprint, ArrayRef<TensorView> Tensors) {
  auto Corrupt = [&](const Twine &Why) {
    return fail("checkpoint '" + Dir + "' is corrupt: " + Why);
  };
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
  StringSet<> Seen;
  auto Bad = [&](const Twine &What, StringRef Want) {
    return Corrupt(Twine(IndexName) + ": " + What + " must be " + Want);
  };
  const json &DataBytes = Index.value("data_bytes", json());
  if (!isIntegerIn(DataBytes, 0, INT64_MAX))
    return Bad("'data_bytes'", "a non-negative integer");
  const json &List = Index.value("tensors", json());
  if (!List.is_array())
    return Bad("'tensors'", "a list");
  for (const json &E : List) {
    auto Member = [&](const char *Key) {
      return E.is_object() && E.contains(Key) ? E[Key] : json();
    };
    json Name = Member("name"), Shape = Member("shape"),
         Offset = Member("offset"), Bytes = Member("bytes"),
         Crc = Member("crc32");
    if (!Name.is_string() || !Shape.is_array() ||
        !all_of(Shape, [](const json &D) {
          return isIntegerIn(D, 0, INT64_MAX);
        }) ||
        !isIntegerIn(Offset, 0, INT64_MAX) ||
        !isIntegerIn(Bytes, 0, INT64_MAX) || !isIntegerIn(Crc, 0, UINT32_MAX))
      return Bad("every entry of 'tensors'",
                 "{name, shape, offset, bytes, crc32}");
    std::string N = Name.get<std::string>();
    const TensorView *V = ByName.lookup(N);
    if (!V)
      return fail("checkpoint '" + Dir +
                  "' does not match the plan: the "
                  "plan has no tensor '" +
                  N + "'");
    if (ArrayRef<int64_t>(Shape.get<std::vector<int64_t>>()) !=
        ArrayRef<int64_t>(V->Type.Shape))
      return fail("checkpoint '" + Dir +
                  "' does not match the plan: "
                  "tensor '" +
                  N + "' has another shape");
    if (!Seen.insert(N).second)
      return Corrupt(Twine(IndexName) + " lists tensor '" + N + "' twice");
    Entries.push_back(Entry{V, Offset.get<int64_t>(), Bytes.get<int64_t>(),
                            Crc.get<uint32_t>()});
  }
  for (const TensorView &T : Tensors)
    if (!Seen.count(T.Name))
      return fail("checkpoint '" + Dir +
                  "' does not match the plan: it has "
                  "no tensor '" +
                  T.Name + "'");

  auto Data = ReadData();
  if (!Data)
    return Corrupt(formatv("cannot read {0}: {1}", DataName,
                           toString(Data.takeError())));
  int64_t Size = Data->size();
  if (Size != DataBytes.get<int64_t>())
    return Corrupt(formatv("{0} has {1} bytes, the index needs {2}", DataName,
                           Size, DataBytes.get<int64_t>()));
  const char *Base = Data->data();
  for (const Entry &E : Entries) {
    // Offset and Bytes are non-negative: Offset > Size - Bytes cannot
    // overflow where Offset + Bytes > Size would.
    if (E.Bytes != E.View->size() * int64_t(sizeof(float)) ||
        E.Bytes > Size || E.Offset > Size - E.Bytes)
      return Corrupt("tensor '" + E.View->Name + "' lies outside " + DataName);
    if (crcOf(Base + E.Offset, E.Bytes) != E.Crc)
      return Corrupt("tensor '" + E.View->Name + "' fails its checksum");
  }
  // All verified: now write the values back.
  for (const Entry &E : Entries)
    if (E.Bytes) // an empty tensor's pointers may be null
      std::memcpy(E.View->Data, Base + E.Offset, E.Bytes);
  return Meta;
}

Expected<CheckpointMeta> readCheckpoint(StringRef Dir,
                                        StringRef PlanFingerprint,
                                        ArrayRef<TensorView> Tensors) {
  auto R = readIndex(Dir);
  if (!R)
    return R.takeError();
  std::unique_ptr<MemoryBuffer> Data;
  auto ReadData = [&]() -> Expected<StringRef> {
    auto Buf = MemoryBuffer::getFile(Dir + "/" + DataName, /*IsText=*/false,
                                     /*RequiresNullTerminator=*/false);
    if (!Buf)
      return errorCodeToError(Buf.getError());
    Data = std::move(*Buf);
    return Data->getBuffer();
  };
  return restore(Dir, R->first, R->second, ReadData, PlanFingerprint, Tensors);
}

Expected<CheckpointMeta>
readCheckpoint(StringRef Dir, StringRef Index,
               function_ref<Expected<StringRef>()> ReadData,
               StringRef PlanFingerprint, ArrayRef<TensorView> Tensors) {
  auto R = parseIndex(Dir, Index);
  if (!R)
    return R.takeError();
  return restore(Dir, R->first, R->second, ReadData, PlanFingerprint, Tensors);
}

} // namespace sp
