//===- Format.h - Numbers and sizes as text for people ---------*- C++ -*-===//
//
// The number formats the tools, the training library, the report page and
// the charts share, so that each is written one way: byte counts, durations,
// a short general number ("%.4g"), a general number ("%g") and a fixed number
// of decimals. Depends on nothing of ours (only LLVM Support), as all of
// support/.
//
//===----------------------------------------------------------------------===//
#ifndef SP_SUPPORT_FORMAT_H
#define SP_SUPPORT_FORMAT_H

#include <string>

namespace sp {

/// A byte count for people: "5.28 MiB", "2.23 TiB".
std::string humanBytes(double Bytes);

/// A duration for people, three decimals in s, ms or us:
/// "1.234 s", "12.345 ms", "56.789 us".
std::string humanSeconds(double Seconds);

/// A number in at most four significant digits ("%.4g"): "0.1235",
/// "1.235e+06", "42".
std::string shortNumber(double V);

/// A number as printf's "%g" writes it, in six significant digits:
/// "0.123457", "1e+06", "42" (the compiler's error messages quote costs so).
std::string generalNumber(double V);

/// V with Decimals digits after the point ("%.*f"): fixedNumber(1.25, 1) is
/// "1.2", fixedNumber(640, 2) is "640.00" (what formatv's "{0:F2}" writes).
std::string fixedNumber(double V, int Decimals);

/// V in scientific notation with one decimal ("%.1e"): "1.0e-03".
std::string sci(double V);

} // namespace sp

#endif // SP_SUPPORT_FORMAT_H
