//===- PreTokenizer.h - Text to words by a regular expression --*- C++ -*-===//
//
// A byte-level BPE tokenizer first cuts the text into words with a regular
// expression (GPT-2's below; Llama 3's and cl100k's are longer ones of the
// same kind) and then encodes each word on its own. The pattern is compiled
// by PCRE2 (Debian libpcre2-dev) in UTF mode with Unicode properties (\p{L},
// \p{N}, and \s as Unicode white space), and JIT-compiled. As in Hugging
// Face's Split pre-tokenizer ("Isolated"), every match is a word and so is
// every run of text between matches (none for the patterns above: they match
// every character); empty matches are skipped.
//
// PCRE2's \s is Unicode's white space, as Python's regex module's; a few
// rare characters (U+FEFF, U+180E) differ from JavaScript's \s.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TEXT_PRETOKENIZER_H
#define SP_TEXT_PRETOKENIZER_H

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <memory>
#include <string>

namespace sp {

/// GPT-2's pre-tokenizer pattern (also GPT-NeoX's and Hugging Face's
/// ByteLevel pre-tokenizer's).
extern const char *const Gpt2Pattern;
/// Llama 3's pattern (cl100k's without its possessive quantifiers).
extern const char *const Llama3Pattern;

class PreTokenizer {
public:
  /// Compiles Pattern; the error names the pattern and PCRE2's complaint.
  static llvm::Expected<std::unique_ptr<PreTokenizer>>
  compile(llvm::StringRef Pattern);
  ~PreTokenizer();

  /// Calls Word on each word of Text, in order; Text must be valid UTF-8
  /// (checked by the caller). The words cover Text exactly. Safe to call
  /// from several threads at once. Fails only when PCRE2 does (a match
  /// limit), naming the byte offset.
  llvm::Error split(llvm::StringRef Text,
                    llvm::function_ref<void(llvm::StringRef)> Word) const;

  llvm::StringRef pattern() const { return Pattern; }

private:
  PreTokenizer() = default;
  std::string Pattern;
  void *Code = nullptr; // pcre2_code_8
};

/// The byte offset of the first byte of Text that is not part of valid
/// UTF-8, or Text.size() when all of it is.
size_t firstInvalidUtf8(llvm::StringRef Text);

} // namespace sp

#endif // SP_TEXT_PRETOKENIZER_H
