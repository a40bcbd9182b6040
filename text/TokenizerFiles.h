//===- TokenizerFiles.h - Reading byte-level BPE tokenizers -----*- C++ -*-===//
//
// Two spellings of a byte-level BPE tokenizer:
//   - Hugging Face's tokenizer.json: model.type "BPE" with its vocab (token
//     -> id) and merges ("a b" strings or [a, b] pairs, in rank order),
//     added_tokens, and a pre_tokenizer that is ByteLevel (GPT-2's pattern)
//     or a Sequence of a Split by a Regex and a ByteLevel without its own
//     regex (Llama 3). A normalizer, add_prefix_space, byte_fallback, a
//     dropout or subword affixes are refused: sp does not implement them.
//   - GPT-2's own files, encoder.json (token -> id) and vocab.bpe (a
//     "#version" line, then one merge "a b" a line), with GPT-2's pattern.
// Tokens are spelt in GPT-2's byte-level characters (ByteLevel.h) in both.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TEXT_TOKENIZERFILES_H
#define SP_TEXT_TOKENIZERFILES_H

#include "text/BpeTokenizer.h"
#include "llvm/Support/Error.h"

namespace sp {

/// Reads a tokenizer.json; errors name the file and the field.
llvm::Expected<BpeSpec> readTokenizerJson(llvm::StringRef Path);

/// Reads GPT-2's encoder.json and vocab.bpe; errors name the file.
llvm::Expected<BpeSpec> readGpt2Files(llvm::StringRef EncoderJson,
                                      llvm::StringRef VocabBpe);

} // namespace sp

#endif // SP_TEXT_TOKENIZERFILES_H
