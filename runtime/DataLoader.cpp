//===- DataLoader.cpp - Token batches for training ------------------------===//
#include "runtime/DataLoader.h"
#include "llvm/Support/FormatVariadic.h"
#include <cassert>

using namespace llvm;

namespace sp {

uint64_t mix64(uint64_t X) {
  X += 0x9e3779b97f4a7c15ULL;
  X = (X ^ (X >> 30)) * 0xbf58476d1ce4e5b9ULL;
  X = (X ^ (X >> 27)) * 0x94d049bb133111ebULL;
  return X ^ (X >> 31);
}

int64_t batchRowOffset(int64_t K, int64_t Row, int64_t Batch, int64_t Seq,
                       int64_t NumTokens, bool Shuffle, uint64_t Seed) {
  assert(NumTokens > Seq && K >= 0 && Row >= 0 && "bad batch coordinates");
  uint64_t Span = uint64_t(NumTokens - Seq);
  if (Shuffle)
    return int64_t(mix64(mix64(mix64(Seed) ^ uint64_t(K)) ^ uint64_t(Row)) %
                   Span);
  // ((k * B + r) * S) mod (T - S), without overflow for any step count.
  unsigned __int128 O =
      (unsigned __int128)(uint64_t(K) * uint64_t(Batch) + uint64_t(Row)) *
      uint64_t(Seq);
  return int64_t(O % Span);
}

Expected<std::unique_ptr<DataLoader>>
DataLoader::open(StringRef Path, int64_t Batch, int64_t Seq, int64_t Vocab) {
  auto Buf = MemoryBuffer::getFile(Path, /*IsText=*/false,
                                   /*RequiresNullTerminator=*/false);
  if (!Buf)
    return createStringError(Buf.getError(), "cannot read data file '%s': %s",
                             Path.str().c_str(),
                             Buf.getError().message().c_str());
  size_t Size = (*Buf)->getBufferSize();
  if (Size % 2)
    return createStringError(
        inconvertibleErrorCode(),
        formatv("data file '{0}' has an odd size ({1} bytes); a token file "
                "holds little-endian uint16 ids (make one with sp-tokenize)",
                Path, Size));
  int64_t N = int64_t(Size / 2);
  if (N < Seq + 1)
    return createStringError(
        inconvertibleErrorCode(),
        formatv("data file '{0}' has {1} tokens; a batch row needs S + 1 = {2}",
                Path, N, Seq + 1));
  std::unique_ptr<DataLoader> D(new DataLoader());
  D->Buffer = std::move(*Buf);
  D->Bytes = reinterpret_cast<const uint8_t *>(D->Buffer->getBufferStart());
  D->NumTokens = N;
  D->Batch = Batch;
  D->Seq = Seq;
  D->Vocab = Vocab;
  // One pass over the file: every id must be a row of the embedding.
  for (int64_t I = 0; I < N; ++I) {
    int64_t T = D->token(I);
    if (T >= Vocab)
      return createStringError(
          inconvertibleErrorCode(),
          formatv("data file '{0}': token {1} (byte offset {2}) is {3}, not "
                  "below the model's vocabulary size {4}",
                  Path, I, 2 * I, T, Vocab));
  }
  return D;
}

std::unique_ptr<DataLoader> DataLoader::synthetic(uint64_t Seed, int64_t Batch,
                                                  int64_t Seq, int64_t Vocab) {
  std::unique_ptr<DataLoader> D(new DataLoader());
  D->NumTokens = int64_t(1) << 40;
  D->Batch = Batch;
  D->Seq = Seq;
  D->Vocab = Vocab;
  D->SyntheticSeed = Seed;
  return D;
}

int64_t DataLoader::token(int64_t I) const {
  if (!Bytes)
    return int64_t(mix64(SyntheticSeed ^ mix64(uint64_t(I))) % uint64_t(Vocab));
  return int64_t(Bytes[2 * I]) | (int64_t(Bytes[2 * I + 1]) << 8);
}

void DataLoader::getBatch(int64_t Step, std::vector<int64_t> &Idx,
                          std::vector<int64_t> &Targets) const {
  assert(Step >= 1 && "steps are 1-based");
  Idx.resize(Batch * Seq);
  Targets.resize(Batch * Seq);
  for (int64_t R = 0; R < Batch; ++R) {
    int64_t O = rowOffset(Step, R);
    for (int64_t J = 0; J < Seq; ++J) {
      Idx[R * Seq + J] = token(O + J);
      Targets[R * Seq + J] = token(O + J + 1);
    }
  }
}

} // namespace sp
