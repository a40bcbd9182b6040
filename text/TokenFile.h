//===- TokenFile.h - The width and vocabulary of a token file ---*- C++ -*-===//
//
// A token file (sp-tokenize's output, sp-run --data's input) is a flat
// array of little-endian token ids, nothing else: nanoGPT's .bin when they
// are uint16. Ids of a vocabulary over 65,536 (Llama 3's 128,256) need
// uint32, which the file alone cannot tell; so sp-tokenize writes beside
// FILE a sidecar FILE.json:
//   {"dtype": "uint32", "vocab": 128256, "tokens": 1234567,
//    "tokenizer": "tokenizer.json"}
// dtype is "uint16" when the vocabulary fits in 16 bits, "uint32" when not;
// vocab is the tokenizer's vocabulary size (every id is below it); tokens
// the number of ids in FILE; tokenizer names what made them (a file name,
// or "bytes" for the byte-level one). A file without a sidecar is uint16
// (nanoGPT's .bin, and sp-tokenize's output before the sidecar).
//
//===----------------------------------------------------------------------===//
#ifndef SP_TEXT_TOKENFILE_H
#define SP_TEXT_TOKENFILE_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <string>

namespace sp {

struct TokenFileInfo {
  /// Bytes per id: 2 (uint16) or 4 (uint32).
  unsigned Width = 2;
  /// The tokenizer's vocabulary size; 0 when unknown (no sidecar).
  int64_t Vocab = 0;
  /// The number of ids; -1 when unknown (no sidecar).
  int64_t Tokens = -1;
  std::string Tokenizer;
  /// Whether it came from a sidecar.
  bool HasSidecar = false;
};

/// The width a vocabulary of Vocab ids needs: 2 up to 65,536, else 4.
inline unsigned tokenWidthFor(int64_t Vocab) { return Vocab <= 65536 ? 2 : 4; }

/// FILE.json for FILE.
std::string tokenSidecarPath(llvm::StringRef TokenFile);

/// The sidecar's text for Info (one JSON object and a newline).
std::string tokenSidecarText(const TokenFileInfo &Info);

/// Reads TokenFile's sidecar, or gives uint16 when it has none. Errors name
/// the sidecar and what is wrong in it (not JSON, an unknown dtype, a
/// vocabulary too wide for its dtype).
llvm::Expected<TokenFileInfo> readTokenFileInfo(llvm::StringRef TokenFile);

/// The same from a sidecar's text (Name for messages).
llvm::Expected<TokenFileInfo> parseTokenSidecar(llvm::StringRef Text,
                                                llvm::StringRef Name);

} // namespace sp

#endif // SP_TEXT_TOKENFILE_H
