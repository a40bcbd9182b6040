//===- sp-fuzz-checkpoint-reader.cpp - Fuzz the checkpoint reader ---------===//
//
// An input is a checkpoint in one buffer: a flags byte, the text of
// checkpoint.json, a NUL byte, and the bytes of tensors.bin. It is read
// (runtime/Checkpoint.cpp) into four tensors, as sp-run --resume restores a
// plan's parameters and AdamW moments:
//   w f32[2, 3], b f32[3], adam.m.w f32[2, 3], adam.v.b f32[3]
// with the plan fingerprint 0123456789abcdef.
//
// The index carries a CRC-32 of itself and one per tensor, which random
// mutations almost never keep right; the flags ask the harness to put them
// right after mutating, so that the checks behind them are fuzzed too:
//   bit 0: recompute the index's checksum;
//   bit 1: recompute the CRC-32 of each tensor whose offset and size lie
//          inside tensors.bin (before the index's).
// Besides crashes, leaks and sanitizer reports, this aborts: a read that
// fails but changed a tensor (a corrupt checkpoint must change nothing).
//
//===----------------------------------------------------------------------===//
#include "FuzzSupport.h"
#include "runtime/Checkpoint.h"
#include "llvm/Support/CRC.h"
#include <cstdint>
#include <cstring>

using namespace llvm;
using namespace sp;
using namespace sp::fuzz;
using json = nlohmann::json;

namespace {

uint32_t crcOf(StringRef S) {
  return crc32(ArrayRef<uint8_t>(reinterpret_cast<const uint8_t *>(S.data()),
                                 S.size()));
}

/// The index with the checksums the flags ask for recomputed (as
/// writeCheckpoint computes them), or as it is if it is not a JSON object.
std::string fixChecksums(StringRef Index, StringRef Data, uint8_t Flags) {
  json J = json::parse(Index.begin(), Index.end(), nullptr,
                       /*allow_exceptions=*/false);
  if (J.is_discarded() || !J.is_object() || !(Flags & 3))
    return Index.str();
  if ((Flags & 2) && J.contains("tensors") && J["tensors"].is_array())
    for (json &E : J["tensors"]) {
      if (!E.is_object())
        continue;
      const json &Offset = E.value("offset", json()),
                 &Bytes = E.value("bytes", json());
      if (!isIntegerIn(Offset, 0, Data.size()) ||
          !isIntegerIn(Bytes, 0, Data.size() - Offset.get<int64_t>()))
        continue;
      E["crc32"] = crcOf(Data.substr(Offset.get<int64_t>(),
                                     Bytes.get<int64_t>()));
    }
  if (Flags & 1) {
    json Unsummed = J;
    Unsummed.erase("checksum");
    J["checksum"] = crcOf(Unsummed.dump());
  }
  return J.dump(1);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  if (Size == 0)
    return 0;
  uint8_t Flags = Data[0];
  StringRef Index, Bytes;
  std::tie(Index, Bytes) =
      StringRef(reinterpret_cast<const char *>(Data) + 1, Size - 1).split('\0');
  std::string Text = fixChecksums(Index, Bytes, Flags);

  std::vector<float> W(6, -1), B(3, -1), MW(6, -1), VB(3, -1);
  std::vector<TensorView> Tensors = {
      {"w", TensorType(DType::F32, {2, 3}), W.data(), {}, {}},
      {"b", TensorType(DType::F32, {3}), B.data(), {}, {}},
      {"adam.m.w", TensorType(DType::F32, {2, 3}), MW.data(), {}, {}},
      {"adam.v.b", TensorType(DType::F32, {3}), VB.data(), {}, {}}};
  auto Meta = readCheckpoint(
      "fuzz.ckpt", Text, [&]() -> Expected<StringRef> { return Bytes; },
      "0123456789abcdef", Tensors);
  if (!Meta) {
    checkMessage(Meta.takeError());
    // A checkpoint that does not read changes nothing.
    for (const std::vector<float> *T : {&W, &B, &MW, &VB})
      for (float F : *T)
        if (F != -1)
          invariantFailed("a checkpoint that failed to read changed a tensor");
  }
  return 0;
}
