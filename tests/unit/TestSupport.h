//===- TestSupport.h - Small helpers the unit tests share -------*- C++ -*-===//
//
// What several test files need and none owns: the text of an error, a
// scratch folder, an attribute list written inline, the int64 limits.
// (The tests build as unity translation units, so a helper kept in two
// files' anonymous namespaces would clash; it lives here once instead.)
//
//===----------------------------------------------------------------------===//
#ifndef SP_TESTS_UNIT_TESTSUPPORT_H
#define SP_TESTS_UNIT_TESTSUPPORT_H

#include "ir/Attribute.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "gtest/gtest.h"
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace sp::test {

constexpr int64_t I64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t I64Min = std::numeric_limits<int64_t>::min();

/// The message of E, or "" on success.
inline std::string errorText(llvm::Error E) {
  return E ? llvm::toString(std::move(E)) : std::string();
}

/// The message of E's error, or "" when it holds a value.
template <typename T> std::string errorText(llvm::Expected<T> &E) {
  return E ? std::string() : llvm::toString(E.takeError());
}

/// N values drawn from the standard normal distribution (mt19937 seeded
/// with Seed), in double and rounded to T: the same values in float and
/// double runs.
template <typename T> std::vector<T> normalVector(size_t N, uint32_t Seed) {
  std::mt19937 Rng(Seed);
  std::normal_distribution<double> G(0, 1);
  std::vector<T> V(N);
  for (auto &X : V)
    X = T(G(Rng));
  return V;
}

/// A scratch folder, removed at the end of the test.
class TempDir {
public:
  TempDir() {
    llvm::SmallString<128> P;
    if (llvm::sys::fs::createUniqueDirectory("sp-unit-test", P))
      ADD_FAILURE() << "cannot create a temporary folder";
    Path = std::string(P);
  }
  ~TempDir() { llvm::sys::fs::remove_directories(Path); }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;

  /// Path/Name.
  std::string file(llvm::StringRef Name) const {
    llvm::SmallString<128> P(Path);
    llvm::sys::path::append(P, Name);
    return std::string(P);
  }

  std::string Path;
};

/// An attribute list written inline: attrs({{"axis", int64_t(1)}}).
inline AttrList
attrs(std::initializer_list<std::pair<const char *, Attribute>> L) {
  AttrList A;
  for (const auto &[Name, V] : L)
    A.set(Name, V);
  return A;
}

} // namespace sp::test

#endif // SP_TESTS_UNIT_TESTSUPPORT_H
