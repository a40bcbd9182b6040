//===- FuzzSupport.h - Shared pieces of the fuzz targets -------*- C++ -*-===//
//
// The targets report a broken invariant the way a sanitizer reports memory
// misuse, so that libFuzzer keeps the input: a message on stderr, then
// abort. Expected failures (an llvm::Error for bad input) are not bugs and
// are consumed.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TESTS_FUZZ_FUZZSUPPORT_H
#define SP_TESTS_FUZZ_FUZZSUPPORT_H

#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include <cstdlib>

namespace sp::fuzz {

[[noreturn]] inline void invariantFailed(const llvm::Twine &Msg) {
  llvm::errs() << "fuzz invariant failed: " << Msg << "\n";
  llvm::errs().flush();
  std::abort();
}

/// The message of an error for bad input, which must say something. With
/// SP_FUZZ_VERBOSE set it is printed (to see what a corpus input is refused
/// with: run the target on the file).
inline std::string messageOf(llvm::Error E) {
  std::string Msg = llvm::toString(std::move(E));
  if (Msg.empty())
    invariantFailed("an error with an empty message");
  if (std::getenv("SP_FUZZ_VERBOSE"))
    llvm::errs() << "refused: " << Msg << "\n";
  return Msg;
}

inline void checkMessage(llvm::Error E) { (void)messageOf(std::move(E)); }

inline bool isUtf8(llvm::StringRef S) {
  const auto *P = reinterpret_cast<const llvm::UTF8 *>(S.begin());
  return llvm::isLegalUTF8String(&P,
                                 reinterpret_cast<const llvm::UTF8 *>(S.end()));
}

} // namespace sp::fuzz

#endif // SP_TESTS_FUZZ_FUZZSUPPORT_H
