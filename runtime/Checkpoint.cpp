//===- Checkpoint.cpp - Training checkpoints ------------------------------===//
#include "runtime/Checkpoint.h"
#include "runtime/TensorLayout.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CRC.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unistd.h>

using namespace llvm;
using json = nlohmann::json;

namespace sp {

static_assert(sizeof(float) == 4, "checkpoints hold float32");

static const char *IndexName = "checkpoint.json";
static const char *V1DataName = "tensors.bin";
static const char *LockName = ".sp-run.lock";
static const char *IndexTmpPrefix = ".checkpoint.json.tmp-";

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

std::string planFingerprint(const Plan &P) {
  if (P.numStages() == 1)
    return planFingerprint(P.Prog);
  std::string All;
  for (int K = 0; K < P.numStages(); ++K)
    All += planFingerprint(P.stage(K)) + ";";
  return formatv("{0:x16}", fnv1a64(All)).str();
}

std::string modelFingerprint(const Plan &P) {
  std::set<std::string> Keys;
  for (int K = 0; K < P.numStages(); ++K)
    for (const ProgramBuffer &B : P.stage(K).Buffers)
      if (B.K == ProgramBuffer::Param) {
        std::string Key = StringRef(B.Name).split('@').first.str() + ":";
        for (int64_t D : wholeShape(B))
          Key += std::to_string(D) + ",";
        Keys.insert(std::move(Key));
      }
  std::string All;
  for (const std::string &K : Keys)
    All += K + ";";
  return formatv("{0:x16}", fnv1a64(All)).str();
}

/// A tensor's layout in a format-3 index.
static json layoutToJson(const Sharding &S) {
  json J = {{"kind", S.K == Sharding::Split ? "split" : "whole"}};
  if (S.K == Sharding::Split)
    J.update({{"dim", S.Dim}, {"parts", S.Parts}, {"blocks", S.Blocks},
              {"padded", S.Padded}});
  if (S.DataChunks)
    J["dp_chunks"] = S.DataChunks;
  return J;
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

//===----------------------------------------------------------------------===//
// Files: written whole and synced, with errno in the message
//===----------------------------------------------------------------------===//

/// "tensors-12.bin", "tensors-12-rank3.bin", "tensors-12.g1.bin": a data
/// file's name as the writer makes it and the reader accepts it (a plain
/// name in the directory, no path).
static bool isDataFileName(StringRef Name) {
  if (!Name.startswith("tensors") || !Name.endswith(".bin") ||
      Name.size() > 200)
    return false;
  return all_of(Name,
                [](char C) {
                  return isAlnum(C) || C == '-' || C == '_' || C == '.';
                }) &&
         !Name.contains("..");
}

/// A leftover of a killed write, or the lock: what may be in a checkpoint
/// directory besides the index and what it names.
static bool isWriterFile(StringRef Name) {
  return Name == LockName || Name.startswith(IndexTmpPrefix) ||
         isDataFileName(Name);
}

/// The test hook (see Checkpoint.h): a third of SP_TEST_CHECKPOINT_DELAY_MS.
static void testDelay() {
  static const long Ms = [] {
    const char *V = std::getenv("SP_TEST_CHECKPOINT_DELAY_MS");
    return V ? std::max(0L, std::strtol(V, nullptr, 10)) : 0L;
  }();
  if (Ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(Ms / 3));
}

namespace {
/// A file opened for writing; closed (not synced) if not finished.
struct OutFile {
  int FD = -1;
  ~OutFile() {
    if (FD >= 0)
      ::close(FD);
  }
};
} // namespace

/// errno as text: "No space left on device".
static std::string errnoText(int E) {
  return std::error_code(E, std::generic_category()).message();
}

/// Writes all of Bytes to FD, retrying short writes and EINTR.
static int writeAll(int FD, const char *Bytes, size_t Size) {
  while (Size) {
    ssize_t N = ::write(FD, Bytes, std::min<size_t>(Size, size_t(1) << 30));
    if (N < 0) {
      if (errno == EINTR)
        continue;
      return errno;
    }
    if (N == 0)
      return EIO;
    Bytes += N;
    Size -= size_t(N);
  }
  return 0;
}

/// fsync of a directory, so that the names created or renamed in it last.
static int syncDirectory(StringRef Dir) {
  int FD = ::open(Dir.str().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (FD < 0)
    return errno;
  int E = ::fsync(FD) ? errno : 0;
  ::close(FD);
  // Some file systems cannot sync a directory; the data is synced anyway.
  return E == EINVAL || E == EROFS ? 0 : E;
}

/// Creates Dir/Name exclusively (EEXIST is for the caller), writes the
/// pieces Write produces, fsyncs and closes it. Returns errno (0 on
/// success); on failure the file is removed.
static int writeSyncedFile(
    StringRef Dir, StringRef Name,
    function_ref<int(function_ref<int(const void *, size_t)> Put)> Write) {
  std::string Path = (Dir + "/" + Name).str();
  OutFile F;
  F.FD = ::open(Path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (F.FD < 0)
    return errno;
  auto Put = [&](const void *Data, size_t Size) {
    return writeAll(F.FD, static_cast<const char *>(Data), Size);
  };
  int E = Write(Put);
  if (!E && ::fsync(F.FD))
    E = errno;
  int FD = F.FD;
  F.FD = -1;
  if (::close(FD) && !E)
    E = errno; // NFS reports write errors at close
  if (E)
    ::unlink(Path.c_str());
  return E;
}

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

Error checkCheckpointTarget(StringRef Dir) {
  if (!sys::fs::exists(Dir))
    return Error::success();
  auto Refuse = [&] {
    return makeError("refusing to overwrite '" + Dir +
                     "': it exists and is not a checkpoint directory");
  };
  if (!sys::fs::is_directory(Dir))
    return Refuse();
  if (checkpointExists(Dir))
    return Error::success();
  std::error_code EC;
  for (sys::fs::directory_iterator I(Dir, EC), E; I != E && !EC;
       I.increment(EC))
    if (!isWriterFile(sys::path::filename(I->path())))
      return Refuse();
  if (EC)
    return createStringError(EC, "cannot read '%s': %s", Dir.str().c_str(),
                             EC.message().c_str());
  return Error::success();
}

static Expected<std::pair<json, CheckpointMeta>> readIndex(StringRef Dir);

Expected<int> cleanCheckpointDir(StringRef Dir) {
  if (!sys::fs::is_directory(Dir))
    return 0;
  StringSet<> Named;
  if (checkpointExists(Dir)) {
    // Remove nothing beside an index this reader cannot read: it may name
    // the files.
    auto R = readIndex(Dir);
    if (!R)
      return R.takeError();
    for (const json &S : R->first["shards"])
      Named.insert(S["data"].get<std::string>());
  }
  std::vector<std::string> Doomed;
  std::error_code EC;
  for (sys::fs::directory_iterator I(Dir, EC), E; I != E && !EC;
       I.increment(EC)) {
    StringRef Name = sys::path::filename(I->path());
    if ((isDataFileName(Name) && !Named.count(Name)) ||
        Name.startswith(IndexTmpPrefix))
      Doomed.push_back(I->path());
  }
  if (EC)
    return createStringError(EC, "cannot read '%s': %s", Dir.str().c_str(),
                             EC.message().c_str());
  int Removed = 0;
  for (const std::string &Path : Doomed)
    if (!sys::fs::remove(Path))
      ++Removed;
  return Removed;
}

Expected<std::string> writeCheckpointShard(StringRef Dir, int64_t Step,
                                           int Rank, int Ranks,
                                           ArrayRef<TensorView> Tensors,
                                           ArrayRef<Executor::ModelTensor> Model,
                                           GridCoord At) {
  if (!Model.empty() && Model.size() != Tensors.size())
    return makeError(formatv("checkpoint '{0}': {1} tensors but {2} layouts",
                             Dir, Tensors.size(), Model.size()));
  auto Failed = [&](const Twine &What, int E) {
    return makeError(
        formatv("cannot write checkpoint '{0}' (step {1}): {2}: {3}", Dir, Step,
                What.str(), errnoText(E)));
  };
  if (auto E = checkCheckpointTarget(Dir))
    return E;
  if (std::error_code EC = sys::fs::create_directories(Dir))
    return Failed("cannot create the directory", EC.value());
  std::string Base = Ranks > 1
                         ? formatv("tensors-{0}-rank{1}", Step, Rank).str()
                         : formatv("tensors-{0}", Step).str();
  int64_t Total = 0;
  for (const TensorView &T : Tensors)
    Total += T.size() * int64_t(sizeof(float));
  json Entries;
  std::string Name;
  int E = EEXIST;
  // Never touch a file that exists: the index may name it (a rewrite of the
  // step the checkpoint holds).
  for (int G = 0; E == EEXIST && G < 1000; ++G) {
    Name = Base + (G ? formatv(".g{0}", G).str() : "") + ".bin";
    E = writeSyncedFile(Dir, Name, [&](auto Put) {
      Entries = json::array();
      int64_t Offset = 0;
      bool Paused = false;
      for (const TensorView &T : Tensors) {
        int64_t Bytes = T.size() * int64_t(sizeof(float));
        if (int Err = Bytes ? Put(T.Data, size_t(Bytes)) : 0)
          return Err;
        Entries.push_back({{"name", T.Name},
                           {"shape", std::vector<int64_t>(T.Type.Shape.begin(),
                                                          T.Type.Shape.end())},
                           {"offset", Offset},
                           {"bytes", Bytes},
                           {"crc32", crcOf(T.Data, size_t(Bytes))}});
        if (!Model.empty()) {
          const Executor::ModelTensor &M = Model[&T - Tensors.data()];
          Entries.back().update({{"key", M.Key},
                                 {"whole", M.Whole},
                                 {"layout", layoutToJson(M.Shard)}});
        }
        Offset += Bytes;
        if (!Paused && 2 * Offset >= Total) {
          Paused = true;
          testDelay(); // halfway through the data
        }
      }
      return 0;
    });
  }
  if (E)
    return Failed(Name, E);
  if (int SyncErr = syncDirectory(Dir))
    return Failed("syncing the directory", SyncErr);
  testDelay(); // the data is written, the commit still to come
  json Shard = {{"rank", Rank},
                {"data", Name},
                {"data_bytes", Total},
                {"tensors", std::move(Entries)}};
  if (!Model.empty())
    Shard["at"] = {At.Data, At.Pipeline, At.Tensor};
  return Shard.dump();
}

Error commitCheckpoint(StringRef Dir, const CheckpointMeta &Meta,
                       ArrayRef<std::string> Shards) {
  if (auto E = checkCheckpointTarget(Dir))
    return E;
  if (Meta.Ranks < 1 || size_t(Meta.Ranks) != Shards.size())
    return makeError(formatv("checkpoint '{0}': {1} shards for {2} ranks", Dir,
                             Shards.size(), Meta.Ranks));
  json Index;
  Index["format"] = "sp-checkpoint";
  Index["version"] = CheckpointFormatVersion;
  Index["step"] = Meta.Step;
  Index["seed"] = Meta.Seed;
  Index["plan_fingerprint"] = Meta.PlanFingerprint;
  Index["ranks"] = Meta.Ranks;
  if (!Meta.ModelFingerprint.empty())
    Index["model_fingerprint"] = Meta.ModelFingerprint;
  if (Meta.LossScale)
    Index["loss_scale"] = {{"scale", *Meta.LossScale},
                           {"good_steps", Meta.LossScaleGoodSteps}};
  if (Meta.SkippedUpdates)
    Index["skipped_updates"] = Meta.SkippedUpdates;
  if (Meta.Grid.size() == Meta.Ranks) // unset by writers without layouts
    Index["grid"] = {Meta.Grid.Data, Meta.Grid.Pipeline, Meta.Grid.Tensor};
  json Losses = json::array();
  for (const LossRow &R : Meta.Losses)
    Losses.push_back({R.Step, R.Loss, R.LR, R.GradNorm, R.ValLoss});
  Index["losses"] = std::move(Losses);
  json List = json::array();
  for (const std::string &S : Shards)
    List.push_back(json::parse(S));
  Index["shards"] = std::move(List);
  Index["checksum"] = indexChecksum(Index);
  std::string Text = Index.dump(1) + "\n";

  auto Failed = [&](const Twine &What, int E) {
    return makeError(
        formatv("cannot write checkpoint '{0}' (step {1}): {2}: {3}", Dir,
                Meta.Step, What.str(), errnoText(E)));
  };
  std::random_device Random;
  std::string Tmp;
  int E = EEXIST;
  for (int Try = 0; E == EEXIST && Try < 100; ++Try) {
    Tmp = IndexTmpPrefix + formatv("{0:x8}", uint32_t(Random())).str();
    E = writeSyncedFile(
        Dir, Tmp, [&](auto Put) { return Put(Text.data(), Text.size()); });
  }
  if (E)
    return Failed(IndexName, E);
  std::string TmpPath = (Dir + "/" + Tmp).str();
  std::string IndexPath = (Dir + "/" + IndexName).str();
  if (::rename(TmpPath.c_str(), IndexPath.c_str())) {
    int RenameErr = errno;
    ::unlink(TmpPath.c_str());
    return Failed(IndexName, RenameErr);
  }
  // The commit: from here on the new checkpoint is the one in Dir.
  if (int SyncErr = syncDirectory(Dir))
    return Failed("syncing the directory", SyncErr);
  testDelay(); // committed, the old data files not yet removed
  if (auto Removed = cleanCheckpointDir(Dir); !Removed)
    consumeError(Removed.takeError()); // leftovers are harmless
  return Error::success();
}

Error writeCheckpoint(StringRef Dir, const CheckpointMeta &Meta,
                      ArrayRef<TensorView> Tensors) {
  auto Shard = writeCheckpointShard(Dir, Meta.Step, 0, 1, Tensors);
  if (!Shard)
    return Shard.takeError();
  CheckpointMeta One = Meta;
  One.Ranks = 1;
  return commitCheckpoint(Dir, One, {*Shard});
}

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

/// Parses and checks the text of checkpoint.json. The result's "shards"
/// lists every rank's {rank, data, ...} (a version 1 index becomes one
/// shard of its top-level data), each naming a data file.
static Expected<std::pair<json, CheckpointMeta>> parseIndex(StringRef Dir,
                                                            StringRef Text) {
  auto Corrupt = [&](const Twine &Why) {
    return makeError("checkpoint '" + Dir + "' is corrupt: " + Why);
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
  if (Version != 1 && Version != 2 && Version != CheckpointFormatVersion)
    return makeError(
        formatv("checkpoint '{0}' has format version {1}, this sp-run "
                "reads versions 1 to {2}",
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
  if (const json *LS = Field(Index, "loss_scale")) {
    const json *Scale = LS->is_object() ? Field(*LS, "scale") : nullptr;
    const json *Good = LS->is_object() ? Field(*LS, "good_steps") : nullptr;
    if (!Scale || !Scale->is_number() || !(Scale->get<double>() >= 1) ||
        !std::isfinite(Scale->get<double>()) || !Good ||
        !isIntegerIn(*Good, 0, INT64_MAX))
      return Bad("'loss_scale'", "{\"scale\": >= 1, \"good_steps\": >= 0}");
    Meta.LossScale = Scale->get<double>();
    Meta.LossScaleGoodSteps = Good->get<int64_t>();
  }
  if (const json *SU = Field(Index, "skipped_updates")) {
    if (!isIntegerIn(*SU, 0, Meta.Step))
      return Bad("'skipped_updates'", "an integer in [0, step]");
    Meta.SkippedUpdates = SU->get<int64_t>();
  }
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
  // [step, loss, lr] (checkpoints before the gradient norm was logged),
  // or [step, loss, lr, grad_norm, val_loss]; the timings are not kept.
  for (const json &R : *Losses) {
    std::optional<double> Loss, LR, Norm = std::nan(""), Val = std::nan("");
    if (R.is_array() && (R.size() == 3 || R.size() == 5) &&
        isIntegerIn(R[0], 0, INT64_MAX)) {
      Loss = Number(R[1]);
      LR = Number(R[2]);
      if (R.size() == 5) {
        Norm = Number(R[3]);
        Val = Number(R[4]);
      }
    }
    if (!Loss || !LR || !Norm || !Val)
      return Bad("every entry of 'losses'",
                 "[step, loss, learning rate, gradient norm, validation "
                 "loss]");
    LossRow Row{R[0].get<int64_t>(), *Loss, *LR};
    Row.GradNorm = *Norm;
    Row.ValLoss = *Val;
    Meta.Losses.push_back(Row);
  }
  if (Version == 1) {
    // One rank; its data in tensors.bin, described at the top level.
    Meta.Ranks = 1;
    json Shard = {{"rank", 0},
                  {"data", V1DataName},
                  {"data_bytes", Index.value("data_bytes", json())},
                  {"tensors", Index.value("tensors", json())}};
    Index["shards"] = json::array({std::move(Shard)});
    return std::pair{std::move(Index), std::move(Meta)};
  }
  const json *Ranks = Field(Index, "ranks");
  if (!Ranks || !isIntegerIn(*Ranks, 1, 1 << 20))
    return Bad("'ranks'", "a positive integer");
  Meta.Ranks = Ranks->get<int>();
  if (const json *MF = Field(Index, "model_fingerprint")) {
    if (!MF->is_string())
      return Bad("'model_fingerprint'", "a string");
    Meta.ModelFingerprint = MF->get<std::string>();
  }
  if (const json *G = Field(Index, "grid")) {
    if (!G->is_array() || G->size() != 3 ||
        !all_of(*G, [](const json &D) { return isIntegerIn(D, 1, 1 << 20); }))
      return Bad("'grid'", "[d, p, t], positive integers");
    int64_t D = (*G)[0].get<int64_t>(), P = (*G)[1].get<int64_t>(),
            T = (*G)[2].get<int64_t>();
    if (D * P * T != Meta.Ranks) // each at most 2^20: no overflow
      return Bad("'grid'", "a d x p x t grid of 'ranks' ranks");
    Meta.Grid.Data = int(D);
    Meta.Grid.Pipeline = int(P);
    Meta.Grid.Tensor = int(T);
  }
  const json *Shards = Field(Index, "shards");
  if (!Shards || !Shards->is_array() || Shards->size() != size_t(Meta.Ranks))
    return Bad("'shards'", "a list of one entry per rank");
  for (size_t R = 0; R < Shards->size(); ++R) {
    const json &S = (*Shards)[R];
    const json *Rank = S.is_object() ? Field(S, "rank") : nullptr;
    const json *Data = S.is_object() ? Field(S, "data") : nullptr;
    if (!Rank || !isIntegerIn(*Rank, R, R) || !Data || !Data->is_string() ||
        !isDataFileName(Data->get<std::string>()))
      return Bad("every entry of 'shards'",
                 "{rank, data (a data file of the checkpoint), data_bytes, "
                 "tensors}, in rank order");
  }
  return std::pair{std::move(Index), std::move(Meta)};
}

/// Reads, parses and checks DIR/checkpoint.json.
static Expected<std::pair<json, CheckpointMeta>> readIndex(StringRef Dir) {
  if (!checkpointExists(Dir))
    return makeError("there is no checkpoint in '" + Dir +
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

/// Checks a parsed index against the plan's tensors and rank Rank's data,
/// and only then copies the data into the tensors.
static Expected<CheckpointMeta>
restore(StringRef Dir, json &Index, CheckpointMeta &Meta,
        function_ref<Expected<StringRef>(StringRef DataName)> ReadData,
        StringRef PlanFingerprint, ArrayRef<TensorView> Tensors, int Rank,
        int Ranks) {
  auto Corrupt = [&](const Twine &Why) {
    return makeError("checkpoint '" + Dir + "' is corrupt: " + Why);
  };
  if (Meta.PlanFingerprint != PlanFingerprint)
    return makeError(
        formatv("checkpoint '{0}' was written for another plan "
                "(fingerprint {1}, this plan has {2}); resume with the "
                "plan that wrote it",
                Dir, Meta.PlanFingerprint, PlanFingerprint));
  if (Meta.Ranks != Ranks)
    return makeError(
        formatv("checkpoint '{0}' holds {1} ranks, this run has {2}; "
                "resume with the plan that wrote it",
                Dir, Meta.Ranks, Ranks));
  const json &Shard = Index["shards"][size_t(Rank)];
  std::string DataName = Shard["data"].get<std::string>();

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
  const json &DataBytes = Shard.value("data_bytes", json());
  if (!isIntegerIn(DataBytes, 0, INT64_MAX))
    return Bad("'data_bytes'", "a non-negative integer");
  const json &List = Shard.value("tensors", json());
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
      return makeError("checkpoint '" + Dir +
                       "' does not match the plan: the "
                       "plan has no tensor '" +
                       N + "'");
    if (ArrayRef<int64_t>(Shape.get<std::vector<int64_t>>()) !=
        ArrayRef<int64_t>(V->Type.Shape))
      return makeError("checkpoint '" + Dir +
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
      return makeError("checkpoint '" + Dir +
                       "' does not match the plan: it has "
                       "no tensor '" +
                       T.Name + "'");

  auto Data = ReadData(DataName);
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
                                        ArrayRef<TensorView> Tensors, int Rank,
                                        int Ranks) {
  if (Rank < 0 || Rank >= Ranks)
    return makeError(
        formatv("checkpoint '{0}': no rank {1} of {2}", Dir, Rank, Ranks));
  // A writer that commits a newer checkpoint meanwhile removes the data
  // files of the one read here: then read the new index once more.
  for (int Attempt = 0;; ++Attempt) {
    auto R = readIndex(Dir);
    if (!R)
      return R.takeError();
    std::unique_ptr<MemoryBuffer> Data;
    bool Vanished = false;
    auto ReadData = [&](StringRef DataName) -> Expected<StringRef> {
      auto Buf = MemoryBuffer::getFile(Dir + "/" + DataName, /*IsText=*/false,
                                       /*RequiresNullTerminator=*/false);
      if (!Buf) {
        Vanished = Buf.getError() == std::errc::no_such_file_or_directory;
        return errorCodeToError(Buf.getError());
      }
      Data = std::move(*Buf);
      return Data->getBuffer();
    };
    auto M = restore(Dir, R->first, R->second, ReadData, PlanFingerprint,
                     Tensors, Rank, Ranks);
    if (M || !Vanished || Attempt > 0)
      return M;
    consumeError(M.takeError());
  }
}

Expected<CheckpointMeta>
readCheckpoint(StringRef Dir, StringRef Index,
               function_ref<Expected<StringRef>()> ReadData,
               StringRef PlanFingerprint, ArrayRef<TensorView> Tensors) {
  auto R = parseIndex(Dir, Index);
  if (!R)
    return R.takeError();
  return restore(
      Dir, R->first, R->second, [&](StringRef) { return ReadData(); },
      PlanFingerprint, Tensors, 0, 1);
}

//===----------------------------------------------------------------------===//
// Resharding
//===----------------------------------------------------------------------===//

namespace {

/// One tensor of a format-3 index, where it sits in the model.
struct Piece {
  int Shard;                 // the writer rank whose data file holds it
  GridCoord At;              // that rank's place in the writer's grid
  std::vector<int64_t> Whole;
  Sharding Layout;           // over the writer's tensor group, and ZeRO
  int64_t Offset, Bytes, Elements;
  uint32_t Crc;
};

/// The shape of one tensor-parallel rank's part of Whole laid out as S.
std::vector<int64_t> tensorPart(const std::vector<int64_t> &Whole,
                                const Sharding &S) {
  std::vector<int64_t> L = Whole;
  if (S.K == Sharding::Split)
    L[S.Dim] = (S.Padded ? S.Padded : Whole[S.Dim]) / S.Parts;
  return L;
}

/// The element count of Shape, or -1 past 2^48 (a damaged index).
int64_t product(const std::vector<int64_t> &Shape) {
  int64_t N = 1;
  for (int64_t D : Shape)
    if (__builtin_mul_overflow(N, D, &N) || N > (int64_t(1) << 48))
      return -1;
  return N;
}

/// Copies between a whole tensor and tensor-parallel rank R's part of it
/// (split as S; padding rows are zeros in the part and dropped from the
/// whole): ToWhole fills Whole's rows from Part, else Part's from Whole.
void copyPart(const Sharding &S, const std::vector<int64_t> &Whole,
              float *WholeData, float *Part, int R, bool ToWhole) {
  if (S.K != Sharding::Split) {
    int64_t N = product(Whole);
    if (ToWhole)
      std::copy(Part, Part + N, WholeData);
    else
      std::copy(WholeData, WholeData + N, Part);
    return;
  }
  std::vector<int64_t> Local = tensorPart(Whole, S);
  TensorType LT(DType::F32, Local);
  AxisView A = around(LT, S.Dim);
  int64_t L = Local[S.Dim], Src = Whole[S.Dim];
  for (int64_t O = 0; O < A.Outer; ++O)
    for (int64_t J = 0; J < L; ++J) {
      float *P = Part + (O * L + J) * A.Inner;
      int64_t G = sourceIndex(S, Src, L, R, J);
      if (G < 0) {
        if (!ToWhole)
          std::fill(P, P + A.Inner, 0.0f);
        continue;
      }
      float *W = WholeData + (O * Src + G) * A.Inner;
      if (ToWhole)
        std::copy(P, P + A.Inner, W);
      else
        std::copy(W, W + A.Inner, P);
    }
}

} // namespace

Expected<CheckpointMeta>
readCheckpointResharded(StringRef Dir, StringRef ModelFingerprint,
                        ArrayRef<TensorView> Tensors,
                        ArrayRef<Executor::ModelTensor> Model, GridCoord At) {
  auto Corrupt = [&](const Twine &Why) {
    return makeError("checkpoint '" + Dir + "' is corrupt: " + Why);
  };
  if (Model.size() != Tensors.size())
    return makeError(formatv("checkpoint '{0}': {1} tensors but {2} layouts",
                             Dir, Tensors.size(), Model.size()));
  auto R = readIndex(Dir);
  if (!R)
    return R.takeError();
  json &Index = R->first;
  CheckpointMeta &Meta = R->second;
  if (Meta.ModelFingerprint.empty())
    return makeError(
        formatv("checkpoint '{0}' was written for another plan, by a "
                "writer before format 3, which records no layout: "
                "resume with the plan that wrote it",
                Dir));
  if (Meta.ModelFingerprint != ModelFingerprint)
    return makeError(
        formatv("checkpoint '{0}' was written for another model "
                "(model fingerprint {1}, this plan's model has {2}): "
                "resume with a plan of the model that wrote it",
                Dir, Meta.ModelFingerprint, ModelFingerprint));
  // Every piece of every tensor, by key.
  std::map<std::string, std::vector<Piece>> ByKey;
  const json &Shards = Index["shards"];
  auto Bad = [&](const Twine &What, StringRef Want) {
    return Corrupt(Twine(IndexName) + ": " + What + " must be " + Want);
  };
  for (size_t K = 0; K < Shards.size(); ++K) {
    const json &S = Shards[K];
    const json &AtJ = S.value("at", json());
    if (!AtJ.is_array() || AtJ.size() != 3 ||
        !isIntegerIn(AtJ[0], 0, Meta.Grid.Data - 1) ||
        !isIntegerIn(AtJ[1], 0, Meta.Grid.Pipeline - 1) ||
        !isIntegerIn(AtJ[2], 0, Meta.Grid.Tensor - 1))
      return Bad("every shard's 'at'", "[d, p, t] within 'grid'");
    GridCoord C{AtJ[0].get<int>(), AtJ[1].get<int>(), AtJ[2].get<int>()};
    const json &List = S.value("tensors", json());
    if (!List.is_array())
      return Bad("'tensors'", "a list");
    for (const json &E : List) {
      auto Member = [&](const char *Key) {
        return E.is_object() && E.contains(Key) ? E[Key] : json();
      };
      json Key = Member("key"), Whole = Member("whole"),
           Layout = Member("layout"), Shape = Member("shape"),
           Offset = Member("offset"), Bytes = Member("bytes"),
           Crc = Member("crc32");
      auto Dims = [](const json &J) {
        return J.is_array() && J.size() <= 8 &&
               all_of(J, [](const json &D) {
                 return isIntegerIn(D, 0, int64_t(1) << 40);
               });
      };
      if (!Key.is_string() || !Dims(Whole) || !Dims(Shape) ||
          !Layout.is_object() || !isIntegerIn(Offset, 0, INT64_MAX) ||
          !isIntegerIn(Bytes, 0, INT64_MAX) || !isIntegerIn(Crc, 0, UINT32_MAX))
        return Bad("every entry of 'tensors'",
                   "{name, shape, offset, bytes, crc32, key, whole, layout}");
      Piece P{int(K), C, Whole.get<std::vector<int64_t>>(), Sharding(),
              Offset.get<int64_t>(), Bytes.get<int64_t>(),
              product(Shape.get<std::vector<int64_t>>()), Crc.get<uint32_t>()};
      std::string Kind = Layout.value("kind", "");
      json Chunks = Layout.value("dp_chunks", json(0));
      if (!isIntegerIn(Chunks, 0, Meta.Grid.Data))
        return Bad("a layout's 'dp_chunks'", "at most the grid's d");
      P.Layout.DataChunks = Chunks.get<int>();
      if (Kind == "split") {
        json Dim = Layout.value("dim", json()), Parts = Layout.value("parts", json()),
             Blocks = Layout.value("blocks", json()),
             Padded = Layout.value("padded", json());
        if (!isIntegerIn(Dim, 0, int64_t(P.Whole.size()) - 1) ||
            !isIntegerIn(Parts, 1, Meta.Grid.Tensor) ||
            !isIntegerIn(Blocks, 1, 1 << 20) ||
            !isIntegerIn(Padded, 0, int64_t(1) << 40))
          return Bad("a split layout", "{dim, parts, blocks, padded} within "
                                       "the tensor and the grid");
        P.Layout.K = Sharding::Split;
        P.Layout.Dim = Dim.get<int>();
        P.Layout.Parts = Parts.get<int>();
        P.Layout.Blocks = Blocks.get<int>();
        P.Layout.Padded = Padded.get<int64_t>();
        int64_t Axis = P.Layout.Padded ? P.Layout.Padded : P.Whole[P.Layout.Dim];
        if (P.Layout.Padded && P.Layout.Padded < P.Whole[P.Layout.Dim])
          return Bad("a split layout's 'padded'", "at least the axis");
        if (Axis % (int64_t(P.Layout.Parts) * P.Layout.Blocks))
          return Bad("a split layout", "an axis its blocks and parts divide");
      } else if (Kind == "whole") {
        P.Layout.K = Sharding::Replicated;
      } else {
        return Bad("a layout's 'kind'", "'split' or 'whole'");
      }
      int64_t Part = product(tensorPart(P.Whole, P.Layout));
      int64_t Want = P.Layout.DataChunks
                         ? dataChunkElements(Part, P.Layout.DataChunks)
                         : Part;
      if (Part < 0 || P.Elements != Want ||
          P.Bytes != Want * int64_t(sizeof(float)))
        return Corrupt("tensor '" + Key.get<std::string>() +
                       "' does not have the size its layout gives");
      ByKey[Key.get<std::string>()].push_back(std::move(P));
    }
  }

  // Each shard's data, read once and checked before any value is used.
  std::map<int, std::unique_ptr<MemoryBuffer>> Files;
  auto DataOf = [&](const Piece &P) -> Expected<const float *> {
    auto It = Files.find(P.Shard);
    if (It == Files.end()) {
      const json &S = Shards[size_t(P.Shard)];
      std::string Name = S["data"].get<std::string>();
      auto Buf = MemoryBuffer::getFile(Dir + "/" + Name, /*IsText=*/false,
                                       /*RequiresNullTerminator=*/false);
      if (!Buf)
        return Corrupt(formatv("cannot read {0}: {1}", Name,
                               Buf.getError().message()));
      const json &DataBytes = S.value("data_bytes", json());
      if (!isIntegerIn(DataBytes, 0, INT64_MAX) ||
          int64_t((*Buf)->getBufferSize()) != DataBytes.get<int64_t>())
        return Corrupt(Name + " does not have the size its index gives");
      It = Files.emplace(P.Shard, std::move(*Buf)).first;
    }
    int64_t Size = It->second->getBufferSize();
    if (P.Bytes > Size || P.Offset > Size - P.Bytes)
      return Corrupt("a tensor lies outside its data file");
    const char *Base = It->second->getBufferStart() + P.Offset;
    if (crcOf(Base, P.Bytes) != P.Crc)
      return Corrupt("a tensor fails its checksum");
    return reinterpret_cast<const float *>(Base);
  };

  // Every tensor of this rank: the whole tensor from the writer's pieces,
  // then this rank's part of it.
  std::vector<std::vector<float>> Values(Tensors.size());
  for (size_t I = 0; I < Tensors.size(); ++I) {
    const TensorView &V = Tensors[I];
    const Executor::ModelTensor &M = Model[I];
    if (!V.Data)
      return makeError(
          "checkpoints hold float32; a float64 run cannot resume one");
    auto It = ByKey.find(M.Key);
    if (It == ByKey.end())
      return makeError("checkpoint '" + Dir +
                       "' was written for another model: "
                       "it has no '" +
                       M.Key + "'");
    const std::vector<Piece> &Ps = It->second;
    const Piece &First = Ps.front();
    if (First.Whole != M.Whole)
      return makeError("checkpoint '" + Dir +
                       "' was written for another model: "
                       "'" +
                       M.Key + "' has another shape");
    // The writer's layout of this tensor; any stage that holds it (a tied
    // weight's copies are equal), replica 0 unless chunked over replicas.
    const Sharding &WS = First.Layout;
    int Stage = First.At.Pipeline;
    int Parts = WS.K == Sharding::Split ? WS.Parts : 1;
    int Chunks = WS.DataChunks ? WS.DataChunks : 1;
    auto Find = [&](int D, int T) -> const Piece * {
      for (const Piece &P : Ps)
        if (P.At.Pipeline == Stage && P.At.Tensor == T && P.At.Data == D &&
            P.Layout == WS && P.Whole == First.Whole)
          return &P;
      return nullptr;
    };
    std::vector<int64_t> PartShape = tensorPart(M.Whole, WS);
    int64_t PartN = product(PartShape);
    std::vector<float> Whole(product(M.Whole)), Part(PartN);
    for (int T = 0; T < Parts; ++T) {
      // Tensor-parallel rank T's part: whole, or its replicas' chunks.
      for (int D = 0; D < Chunks; ++D) {
        const Piece *P = Find(D, T);
        if (!P)
          return Corrupt(formatv("'{0}' misses the part of rank (d {1}, p "
                                 "{2}, t {3})",
                                 M.Key, D, Stage, T));
        auto Data = DataOf(*P);
        if (!Data)
          return Data.takeError();
        int64_t Begin = std::min(PartN, D * P->Elements),
                End = std::min(PartN, Begin + P->Elements);
        std::copy(*Data, *Data + (End - Begin), Part.data() + Begin);
      }
      copyPart(WS, M.Whole, Whole.data(), Part.data(), T, /*ToWhole=*/true);
    }
    // This rank's part of the whole, as the resuming plan lays it out.
    std::vector<int64_t> Mine = tensorPart(M.Whole, M.Shard);
    int64_t MineN = product(Mine);
    std::vector<float> Out(MineN);
    copyPart(M.Shard, M.Whole, Whole.data(), Out.data(),
             M.Shard.K == Sharding::Split ? At.Tensor : 0, /*ToWhole=*/false);
    if (M.Shard.DataChunks) {
      int64_t C = dataChunkElements(MineN, M.Shard.DataChunks);
      int64_t Begin = std::min(MineN, At.Data * C),
              End = std::min(MineN, Begin + C);
      std::vector<float> Chunk(C, 0.0f);
      std::copy(Out.begin() + Begin, Out.begin() + End, Chunk.begin());
      Out = std::move(Chunk);
    }
    if (int64_t(Out.size()) != V.size())
      return makeError("checkpoint '" + Dir + "': '" + V.Name +
                       "' of this plan "
                       "has " +
                       std::to_string(V.size()) +
                       " elements where its "
                       "layout gives " +
                       std::to_string(Out.size()));
    Values[I] = std::move(Out);
  }
  // All assembled and verified: now write the values.
  for (size_t I = 0; I < Tensors.size(); ++I)
    std::copy(Values[I].begin(), Values[I].end(), Tensors[I].Data);
  return std::move(Meta);
}

} // namespace sp
