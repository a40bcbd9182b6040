//===- DataLoader.h - Token batches for training ---------------*- C++ -*-===//
//
// The token file is nanoGPT's .bin: little-endian uint16 token ids, nothing
// else. It is memory-mapped and checked once when opened (an even size, at
// least S + 1 tokens, every id below the vocabulary), so no batch can fail
// later.
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
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_DATALOADER_H
#define SP_RUNTIME_DATALOADER_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"
#include <cstdint>
#include <memory>
#include <vector>

namespace sp {

/// SplitMix64's output function: a bijective 64-bit mix.
uint64_t mix64(uint64_t X);

/// The first token of row Row of the 0-based batch K (formulas above).
int64_t batchRowOffset(int64_t K, int64_t Row, int64_t Batch, int64_t Seq,
                       int64_t NumTokens, bool Shuffle, uint64_t Seed);

class DataLoader {
public:
  /// Opens and checks a token file for batches of Batch x Seq tokens with
  /// ids below Vocab. Errors name the file.
  static llvm::Expected<std::unique_ptr<DataLoader>>
  open(llvm::StringRef Path, int64_t Batch, int64_t Seq, int64_t Vocab);
  /// Random tokens from Seed (benchmarks without a data file).
  static std::unique_ptr<DataLoader> synthetic(uint64_t Seed, int64_t Batch,
                                               int64_t Seq, int64_t Vocab);

  /// Random offsets from Seed instead of consecutive ones.
  void setShuffle(bool On, uint64_t Seed) {
    Shuffle = On;
    ShuffleSeed = Seed;
  }

  int64_t numTokens() const { return NumTokens; }
  int64_t batch() const { return Batch; }
  int64_t seq() const { return Seq; }

  int64_t rowOffset(int64_t Step, int64_t Row) const {
    return batchRowOffset(Step - 1, Row, Batch, Seq, NumTokens, Shuffle,
                          ShuffleSeed);
  }
  /// The inputs and targets ([Batch, Seq] each, row-major) of the 1-based
  /// Step.
  void getBatch(int64_t Step, std::vector<int64_t> &Idx,
                std::vector<int64_t> &Targets) const;

private:
  DataLoader() = default;
  int64_t token(int64_t I) const;

  std::unique_ptr<llvm::MemoryBuffer> Buffer; // null for synthetic data
  const uint8_t *Bytes = nullptr;
  int64_t NumTokens = 0;
  int64_t Batch = 0, Seq = 0, Vocab = 0;
  uint64_t SyntheticSeed = 0;
  bool Shuffle = false;
  uint64_t ShuffleSeed = 0;
};

} // namespace sp

#endif // SP_RUNTIME_DATALOADER_H
