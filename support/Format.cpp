//===- Format.cpp - Numbers and sizes as text for people ------------------===//
//
// See Format.h. Fixed decimals are written by LLVM's write_double, as
// formatv's "{0:F2}" writes them (NaN as "nan", infinity as "INF").
//
//===----------------------------------------------------------------------===//
#include "support/Format.h"
#include "llvm/Support/NativeFormatting.h"
#include "llvm/Support/raw_ostream.h"
#include <cmath>
#include <cstdio>
#include <iterator>

namespace sp {

std::string humanBytes(double B) {
  const char *Units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  unsigned U = 0;
  while (B >= 1024 && U + 1 < std::size(Units)) {
    B /= 1024;
    ++U;
  }
  return fixedNumber(B, 2) + " " + Units[U];
}

std::string humanSeconds(double S) {
  double A = std::abs(S);
  return A >= 1 || A == 0 ? fixedNumber(S, 3) + " s"
         : A >= 1e-3      ? fixedNumber(S * 1e3, 3) + " ms"
                          : fixedNumber(S * 1e6, 3) + " us";
}

std::string shortNumber(double V) {
  char Text[32];
  std::snprintf(Text, sizeof(Text), "%.4g", V);
  return Text;
}

std::string generalNumber(double V) {
  char Text[32];
  std::snprintf(Text, sizeof(Text), "%g", V);
  return Text;
}

std::string sci(double V) {
  char Text[32];
  std::snprintf(Text, sizeof(Text), "%.1e", V);
  return Text;
}

std::string fixedNumber(double V, int Decimals) {
  std::string S;
  llvm::raw_string_ostream OS(S);
  llvm::write_double(OS, V, llvm::FloatStyle::Fixed, size_t(Decimals));
  return OS.str();
}

} // namespace sp
