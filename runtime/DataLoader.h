//===- DataLoader.h - Token batches for training ---------------*- C++ -*-===//
//
// The token file is little-endian token ids, nothing else: uint16 (nanoGPT's
// .bin) unless its sidecar FILE.json says uint32 (text/TokenFile.h; what
// sp-tokenize writes for vocabularies over 65,536). It is memory-mapped and
// checked once when opened (a whole number of ids, as many as the sidecar
// says, at least S + 1, every id below the model's vocabulary, the
// sidecar's vocabulary no larger than the model's, and, without a sidecar,
// not the look of uint32 ids: every second uint16 zero), so no batch can
// fail later.
//
// Batches (B rows of S tokens; k = step - 1 is the 0-based batch number):
//   row r of batch k reads inputs [o, o + S) and targets [o + 1, o + S + 1)
//   without shuffling: o = ((k * B + r) * S) mod (T - S)
//   with shuffling:    o = mix(mix(mix(seed) ^ k) ^ r) mod (T - S)
// where T is the number of tokens and mix is SplitMix64's finalizer (a
// counter-based hash: the offsets of a step depend on nothing but the seed,
// the step and the row, so a resumed run reads what an uninterrupted one
// would have read).
//
// Synthetic data (benchmarks) is a virtual stream of 2^40 tokens with
// token(i) = mix(seed ^ mix(i)) mod vocab, batched by the same rules.
//
// The objective turns a row's tokens x_0 .. x_{S-1} (and x_S) into inputs,
// targets and an attention mask. A position whose token is the pad token
// (when there is one) is padding: mask 0, and it predicts nothing (target
// -100, IgnoreTarget); every other position has mask 1.
//   next-token: input x_j, target x_{j+1} (-100 if x_j or x_{j+1} is
//     padding).
//   masked-LM (BERT): with h = mix(mix(mix(mix(seed ^ 0x6d6c6d) ^ k) ^ r) ^ j)
//     and u(h) = (h >> 11) / 2^53 in [0, 1), a non-padding position is
//     chosen when u(h) < rate. A chosen position predicts x_j; its input is
//     the mask token when u(h2) < 0.8, the token mix(h2) mod vocab when
//     u(h2) < 0.9, and x_j otherwise (h2 = mix(h)). Other positions keep
//     x_j and predict nothing. Like the offsets, the choice depends only on
//     the seed, the step, the row and the position.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_DATALOADER_H
#define SP_RUNTIME_DATALOADER_H

#include "ir/IR.h"
#include "text/TokenFile.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"
#include <cstdint>
#include <memory>
#include <vector>

namespace sp {

/// SplitMix64's output function: a bijective 64-bit mix.
uint64_t mix64(uint64_t X);

/// One step's data: Batch rows of Seq positions each, row-major.
struct TokenBatch {
  std::vector<int64_t> Tokens;
  /// The token each position predicts, or IgnoreTarget (-100): none.
  std::vector<int64_t> Targets;
  /// The attention mask: 1 for a token, 0 for padding. Empty: all tokens.
  std::vector<uint8_t> Real;
};

/// What the model learns to predict from a row of tokens (rules above).
struct Objective {
  enum KindT { NextToken, MaskedLM } Kind = NextToken;
  /// The padding token id, or -1: the data has no padding.
  int64_t PadToken = -1;
  /// Masked-LM: the id that replaces a chosen token, and the share of the
  /// non-padding positions chosen.
  int64_t MaskToken = -1;
  double MaskRate = 0.15;
  uint64_t Seed = 0;
};

/// Checks an objective against the vocabulary; the error names the flag
/// (--pad-token, --mask-token, --mask-rate) and what it needs.
llvm::Error checkObjective(const Objective &O, int64_t Vocab);

/// The first token of row Row of the 0-based batch K (formulas above).
int64_t batchRowOffset(int64_t K, int64_t Row, int64_t Batch, int64_t Seq,
                       int64_t NumTokens, bool Shuffle, uint64_t Seed);

/// The most tokens a batch may hold (a batch holds 16 bytes per token).
constexpr int64_t MaxBatchTokens = int64_t(1) << 32;

/// Fails unless Batch, Seq and Vocab are positive and a batch of Batch x
/// Seq tokens holds at most MaxBatchTokens.
llvm::Error checkBatchShape(int64_t Batch, int64_t Seq, int64_t Vocab);

class DataLoader {
public:
  /// Opens and checks a token file (and its sidecar, if any) for batches of
  /// Batch x Seq tokens with ids below Vocab (checkBatchShape). Errors name
  /// the file.
  static llvm::Expected<std::unique_ptr<DataLoader>>
  open(llvm::StringRef Path, int64_t Batch, int64_t Seq, int64_t Vocab);
  /// The same on a token file already read, of the width and vocabulary
  /// Info gives (default: uint16, no sidecar); errors name the buffer's
  /// identifier.
  static llvm::Expected<std::unique_ptr<DataLoader>>
  create(std::unique_ptr<llvm::MemoryBuffer> Buffer, int64_t Batch, int64_t Seq,
         int64_t Vocab, const TokenFileInfo &Info = {});
  /// Random tokens from Seed (benchmarks without a data file).
  static std::unique_ptr<DataLoader> synthetic(uint64_t Seed, int64_t Batch,
                                               int64_t Seq, int64_t Vocab);

  /// Random offsets from Seed instead of consecutive ones.
  void setShuffle(bool On, uint64_t Seed) {
    Shuffle = On;
    ShuffleSeed = Seed;
  }
  /// The objective of every later batch (checked by checkObjective).
  void setObjective(const Objective &O) { Obj = O; }
  /// Data parallelism: the step's batch is Size replicas' batches, and this
  /// loader gives replica Rank its rows, [Rank B, (Rank + 1) B) of the
  /// Size B rows the formulas above number (the global row r' = Rank B + r
  /// in place of r), so that Size replicas read what one loader of the
  /// whole batch reads.
  void setDataParallel(int Rank, int Size) {
    DpRank = Rank;
    DpSize = Size;
  }

  int64_t numTokens() const { return NumTokens; }
  /// Bytes per id in the file: 2 or 4.
  unsigned tokenWidth() const { return Width; }
  int64_t batch() const { return Batch; }
  int64_t seq() const { return Seq; }

  /// The first token of this replica's row Row of the 1-based Step.
  int64_t rowOffset(int64_t Step, int64_t Row) const {
    return batchRowOffset(Step - 1, globalRow(Row), Batch * DpSize, Seq,
                          NumTokens, Shuffle, ShuffleSeed);
  }
  int64_t globalRow(int64_t Row) const { return DpRank * Batch + Row; }
  /// The inputs, targets and mask of the 1-based Step.
  void getBatch(int64_t Step, TokenBatch &B) const;

private:
  DataLoader() = default;
  int64_t token(int64_t I) const;

  std::unique_ptr<llvm::MemoryBuffer> Buffer; // null for synthetic data
  const uint8_t *Bytes = nullptr;
  unsigned Width = 2;
  int64_t NumTokens = 0;
  int64_t Batch = 0, Seq = 0, Vocab = 0;
  uint64_t SyntheticSeed = 0;
  bool Shuffle = false;
  uint64_t ShuffleSeed = 0;
  Objective Obj;
  int DpRank = 0, DpSize = 1;
};

} // namespace sp

#endif // SP_RUNTIME_DATALOADER_H
