//===- ByteLevel.cpp - GPT-2's bytes-to-unicode map -----------------------===//
#include "text/ByteLevel.h"
#include "llvm/Support/ConvertUTF.h"
#include <array>

using namespace llvm;

namespace sp {

static bool isPrintableLatin1(unsigned B) {
  return (B >= '!' && B <= '~') || (B >= 0xA1 && B <= 0xAC) ||
         (B >= 0xAE && B <= 0xFF);
}

/// Code point -> byte for the 512 code points below U+0200 (-1: none).
static const std::array<int, 512> &codePointBytes() {
  static const std::array<int, 512> Table = [] {
    std::array<int, 512> T;
    T.fill(-1);
    for (unsigned B = 0; B < 256; ++B)
      T[byteToCodePoint(B)] = int(B);
    return T;
  }();
  return Table;
}

unsigned byteToCodePoint(unsigned char B) {
  if (isPrintableLatin1(B))
    return B;
  unsigned N = 0; // the non-printable bytes below B
  for (unsigned I = 0; I < B; ++I)
    N += !isPrintableLatin1(I);
  return 256 + N;
}

std::optional<std::string> byteLevelToBytes(StringRef Spelling) {
  std::string Bytes;
  Bytes.reserve(Spelling.size());
  const auto *P = reinterpret_cast<const UTF8 *>(Spelling.begin());
  const auto *End = reinterpret_cast<const UTF8 *>(Spelling.end());
  const auto &Table = codePointBytes();
  while (P < End) {
    UTF32 C;
    if (convertUTF8Sequence(&P, End, &C, strictConversion) != conversionOK ||
        C >= Table.size() || Table[C] < 0)
      return std::nullopt;
    Bytes.push_back(char(Table[C]));
  }
  return Bytes;
}

} // namespace sp
