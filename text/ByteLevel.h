//===- ByteLevel.h - GPT-2's bytes-to-unicode map ---------------*- C++ -*-===//
//
// Byte-level BPE vocabularies (GPT-2, GPT-NeoX, Llama 3) spell each token's
// bytes as printable characters: the byte b is the character U+00b when that
// is printable Latin-1 ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF), and the
// others, in byte order, are U+0100, U+0101, ... (GPT-2's bytes_to_unicode;
// the space 0x20 is U+0120, "Ġ"). These turn such spellings back into bytes.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TEXT_BYTELEVEL_H
#define SP_TEXT_BYTELEVEL_H

#include "llvm/ADT/StringRef.h"
#include <optional>
#include <string>

namespace sp {

/// The character that spells byte B.
unsigned byteToCodePoint(unsigned char B);

/// The bytes a token's byte-level spelling (UTF-8 of such characters)
/// stands for, or none when Spelling holds another character or is not
/// UTF-8.
std::optional<std::string> byteLevelToBytes(llvm::StringRef Spelling);

} // namespace sp

#endif // SP_TEXT_BYTELEVEL_H
