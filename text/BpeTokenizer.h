//===- BpeTokenizer.h - Byte-level BPE (GPT-2, GPT-NeoX, Llama 3) -*- C++
//-*-===//
//
// Byte-level byte-pair encoding as GPT-2 defines it and Hugging Face's BPE
// model applies it:
//   1. the pre-tokenizer (PreTokenizer.h) cuts the UTF-8 text into words;
//   2. a word starts as its bytes, each byte the token of that one byte;
//   3. while some adjacent pair of tokens is a merge, the pair of the lowest
//      rank (the leftmost of equal ones) becomes the token it makes.
// With ignore_merges (Llama 3), a word that is itself in the vocabulary is
// that token without step 3. Added (special) tokens such as <|endoftext|>
// are never produced from text: text that spells one is encoded as
// ordinary text (tiktoken's encode_ordinary); they are decoded.
//
// encode runs on several threads over chunks of the text cut where no word
// can straddle the cut: after a line break that has a printable ASCII
// character before and after it (true of every pattern named in
// PreTokenizer.h, whose words never run from a line break into a
// non-space, and which look neither behind nor past a line break that
// ends white space). The ids are therefore those of one thread. Each thread
// keeps a cache of the words it has encoded.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TEXT_BPETOKENIZER_H
#define SP_TEXT_BPETOKENIZER_H

#include "text/PreTokenizer.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sp {

/// What a byte-level BPE tokenizer is made of, as its files give it (the
/// readers are in TokenizerFiles.h). Tokens are raw bytes here, not their
/// byte-level spellings.
struct BpeSpec {
  std::vector<std::pair<std::string, uint32_t>> Vocab;
  /// In rank order: the first is applied first.
  std::vector<std::pair<std::string, std::string>> Merges;
  /// Special tokens: decoded, never encoded from text.
  std::vector<std::pair<std::string, uint32_t>> Added;
  std::string Pattern;
  bool IgnoreMerges = false;
  /// For messages and the token file's sidecar (e.g. the file it came from).
  std::string Name;
};

class BpeTokenizer {
public:
  /// Checks and indexes Spec: every byte has a token, every merge joins two
  /// tokens into a third, ids are unique; errors name the offending entry.
  static llvm::Expected<std::unique_ptr<BpeTokenizer>> create(BpeSpec Spec);

  /// The ids of Text on Threads threads (0: one per core). Fails on text
  /// that is not UTF-8, naming the byte offset.
  llvm::Expected<std::vector<uint32_t>> encode(llvm::StringRef Text,
                                               unsigned Threads = 0) const;
  /// The text of Ids; fails on an id that is no token.
  llvm::Expected<std::string> decode(llvm::ArrayRef<uint32_t> Ids) const;

  /// Whether Id is a token (ids may have gaps).
  bool isToken(uint32_t Id) const { return Id < IsToken.size() && IsToken[Id]; }
  /// One more than the largest id (the embedding rows a model needs).
  uint32_t vocabSize() const { return uint32_t(Pieces.size()); }
  llvm::StringRef name() const { return Name; }
  const PreTokenizer &preTokenizer() const { return *Pre; }

  /// A thread's words already encoded: word -> [offset, offset + size) of
  /// Ids.
  struct WordCache {
    llvm::StringMap<std::pair<uint32_t, uint32_t>> Words;
    std::vector<uint32_t> Ids;
  };
  /// Appends the ids of one word (a pre-tokenizer's match) to Out.
  void encodeWord(llvm::StringRef Word, WordCache &Cache,
                  std::vector<uint32_t> &Out) const;

private:
  BpeTokenizer() = default;
  void mergeWord(llvm::StringRef Word,
                 llvm::SmallVectorImpl<uint32_t> &Tokens) const;
  llvm::Error encodeChunk(llvm::StringRef Chunk, size_t Base, WordCache &Cache,
                          std::vector<uint32_t> &Out) const;

  std::unique_ptr<PreTokenizer> Pre;
  std::array<uint32_t, 256> ByteIds;
  /// (left << 32 | right) -> (rank << 32 | merged id).
  llvm::DenseMap<uint64_t, uint64_t> Merges;
  llvm::StringMap<uint32_t> Vocab; // with IgnoreMerges only
  std::vector<std::string> Pieces; // id -> bytes ("" for a gap in the ids)
  std::vector<bool> IsToken;
  bool IgnoreMerges = false;
  std::string Name;
};

} // namespace sp

#endif // SP_TEXT_BPETOKENIZER_H
