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
  auto Info = readTokenFileInfo(Path);
  if (!Info)
    return Info.takeError();
  return create(std::move(*Buf), Batch, Seq, Vocab, *Info);
}

Error checkBatchShape(int64_t Batch, int64_t Seq, int64_t Vocab) {
  int64_t Tokens;
  if (Batch < 1 || Seq < 1 || Vocab < 1 ||
      __builtin_mul_overflow(Batch, Seq, &Tokens) || Tokens > MaxBatchTokens)
    return createStringError(
        inconvertibleErrorCode(),
        formatv("batches of {0} x {1} tokens with a vocabulary of {2}: the "
                "batch, the sequence and the vocabulary must be positive, and "
                "a batch at most {3} tokens",
                Batch, Seq, Vocab, MaxBatchTokens));
  return Error::success();
}

/// Whether ids read as uint16 look like uint32 ones: among the first 4096,
/// every second one (a high half) is 0 and some other one is not.
static bool looksLikeUint32(const uint8_t *Bytes, int64_t N) {
  int64_t M = std::min<int64_t>(N, 4096) & ~int64_t(1);
  if (M < 64)
    return false;
  bool LowNonZero = false;
  for (int64_t I = 0; I < M; I += 2) {
    if (Bytes[2 * I + 2] | Bytes[2 * I + 3])
      return false;
    LowNonZero |= (Bytes[2 * I] | Bytes[2 * I + 1]) != 0;
  }
  return LowNonZero;
}

Expected<std::unique_ptr<DataLoader>>
DataLoader::create(std::unique_ptr<MemoryBuffer> Buf, int64_t Batch,
                   int64_t Seq, int64_t Vocab, const TokenFileInfo &Info) {
  if (auto E = checkBatchShape(Batch, Seq, Vocab))
    return E;
  StringRef Path = Buf->getBufferIdentifier();
  size_t Size = Buf->getBufferSize();
  unsigned W = Info.Width;
  const char *DType = W == 4 ? "uint32" : "uint16";
  if (W == 2 && Size % 2)
    return createStringError(
        inconvertibleErrorCode(),
        formatv("data file '{0}' has an odd size ({1} bytes); a token file "
                "holds little-endian uint16 ids (make one with sp-tokenize)",
                Path, Size));
  if (Size % W)
    return createStringError(
        inconvertibleErrorCode(),
        formatv("data file '{0}' has {1} bytes, not a whole number of the "
                "uint32 ids its sidecar says it holds; make both again with "
                "sp-tokenize",
                Path, Size));
  int64_t N = int64_t(Size / W);
  if (Info.Tokens >= 0 && Info.Tokens != N)
    return createStringError(
        inconvertibleErrorCode(),
        formatv("data file '{0}' holds {1} {2} ids but its sidecar '{3}' "
                "says {4}: they are not of one sp-tokenize run; make both "
                "again with sp-tokenize",
                Path, N, DType, tokenSidecarPath(Path), Info.Tokens));
  if (Info.Vocab > Vocab)
    return createStringError(
        inconvertibleErrorCode(),
        formatv("data file '{0}' was tokenized with a vocabulary of {1} "
                "({2}), larger than the model's {3}; tokenize the text with "
                "the model's own tokenizer",
                Path, Info.Vocab,
                Info.Tokenizer.empty() ? "its sidecar says" : Info.Tokenizer,
                Vocab));
  const auto *Bytes = reinterpret_cast<const uint8_t *>(Buf->getBufferStart());
  if (!Info.HasSidecar && looksLikeUint32(Bytes, N))
    return createStringError(
        inconvertibleErrorCode(),
        formatv("data file '{0}' has no sidecar '{1}' and looks like uint32 "
                "ids (every second uint16 is 0), not uint16 ones; restore "
                "the sidecar sp-tokenize wrote beside it, or make both again "
                "with sp-tokenize",
                Path, tokenSidecarPath(Path)));
  if (N <= Seq)
    return createStringError(
        inconvertibleErrorCode(),
        formatv("data file '{0}' has {1} tokens; a batch row needs S + 1 = {2}",
                Path, N, Seq + 1));
  std::unique_ptr<DataLoader> D(new DataLoader());
  D->Buffer = std::move(Buf);
  D->Bytes = Bytes;
  D->Width = W;
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
                  Path, I, int64_t(W) * I, T, Vocab));
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
  const uint8_t *P = Bytes + Width * I;
  int64_t T = int64_t(P[0]) | (int64_t(P[1]) << 8);
  if (Width == 4)
    T |= (int64_t(P[2]) << 16) | (int64_t(P[3]) << 24);
  return T;
}

/// A uniform double in [0, 1) from the top 53 bits of H.
static double unitInterval(uint64_t H) { return double(H >> 11) * 0x1p-53; }

void DataLoader::getBatch(int64_t Step, TokenBatch &B) const {
  assert(Step >= 1 && "steps are 1-based");
  int64_t N = Batch * Seq;
  B.Tokens.resize(N);
  B.Targets.resize(N);
  B.Real.assign(Obj.PadToken >= 0 ? N : 0, 1);
  auto IsPad = [&](int64_t T) { return T == Obj.PadToken; };
  for (int64_t R = 0; R < Batch; ++R) {
    int64_t O = rowOffset(Step, R);
    uint64_t RowHash =
        Obj.Kind == Objective::MaskedLM
            ? mix64(mix64(mix64(Obj.Seed ^ 0x6d6c6dULL) ^ uint64_t(Step - 1)) ^
                    uint64_t(globalRow(R)))
            : 0;
    for (int64_t J = 0; J < Seq; ++J) {
      int64_t I = R * Seq + J, X = token(O + J);
      bool Pad = IsPad(X);
      if (Pad)
        B.Real[I] = 0;
      B.Tokens[I] = X;
      if (Obj.Kind == Objective::NextToken) {
        int64_t Next = token(O + J + 1);
        B.Targets[I] = Pad || IsPad(Next) ? IgnoreTarget : Next;
        continue;
      }
      uint64_t H = mix64(RowHash ^ uint64_t(J));
      if (Pad || unitInterval(H) >= Obj.MaskRate) {
        B.Targets[I] = IgnoreTarget;
        continue;
      }
      B.Targets[I] = X;
      uint64_t H2 = mix64(H);
      double U = unitInterval(H2);
      if (U < 0.8)
        B.Tokens[I] = Obj.MaskToken;
      else if (U < 0.9)
        B.Tokens[I] = int64_t(mix64(H2) % uint64_t(Vocab));
    }
  }
}

Error checkObjective(const Objective &O, int64_t Vocab) {
  auto Bad = [](const Twine &Msg) {
    return createStringError(inconvertibleErrorCode(), Msg);
  };
  if (O.PadToken < -1 || O.PadToken >= Vocab)
    return Bad(formatv("--pad-token {0} is not a token id of the model's "
                       "vocabulary [0, {1})",
                       O.PadToken, Vocab));
  if (O.Kind != Objective::MaskedLM)
    return Error::success();
  if (O.MaskToken < 0 || O.MaskToken >= Vocab)
    return Bad(formatv("--objective masked-lm needs --mask-token ID, the id "
                       "of the mask token in the model's vocabulary [0, {0})",
                       Vocab));
  if (O.MaskToken == O.PadToken)
    return Bad(formatv("--mask-token and --pad-token are both {0}; the mask "
                       "token must differ from the padding",
                       O.MaskToken));
  if (!(O.MaskRate > 0 && O.MaskRate <= 1))
    return createStringError(inconvertibleErrorCode(),
                             "--mask-rate %g must be in (0, 1]", O.MaskRate);
  return Error::success();
}

} // namespace sp
