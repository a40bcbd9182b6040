//===- Attribute.cpp ------------------------------------------------------===//
#include "ir/Attribute.h"
#include <algorithm>
#include <cmath>
#include <limits>

using namespace llvm;

namespace sp {

void AttrList::set(StringRef Name, Attribute V) {
  auto It = std::lower_bound(
      Entries.begin(), Entries.end(), Name,
      [](const Entry &E, StringRef N) { return StringRef(E.first) < N; });
  if (It != Entries.end() && It->first == Name)
    It->second = std::move(V);
  else
    Entries.insert(It, {Name.str(), std::move(V)});
}

const Attribute *AttrList::find(StringRef Name) const {
  for (const Entry &E : Entries)
    if (E.first == Name)
      return &E.second;
  return nullptr;
}

void AttrList::erase(StringRef Name) {
  Entries.erase(std::remove_if(Entries.begin(), Entries.end(),
                               [&](const Entry &E) { return E.first == Name; }),
                Entries.end());
}

int64_t AttrList::getInt(StringRef Name, int64_t Default) const {
  if (const Attribute *A = find(Name)) {
    if (auto *I = std::get_if<int64_t>(A))
      return *I;
    if (auto *F = std::get_if<double>(A)) {
      // Truncated as a C cast would, saturating where the cast is undefined
      // (NaN, out of range): the attribute comes from the input file.
      if (std::isnan(*F))
        return 0;
      if (*F >= 0x1p63)
        return std::numeric_limits<int64_t>::max();
      if (*F < -0x1p63)
        return std::numeric_limits<int64_t>::min();
      return int64_t(*F);
    }
  }
  return Default;
}

double AttrList::getFloat(StringRef Name, double Default) const {
  if (const Attribute *A = find(Name)) {
    if (auto *F = std::get_if<double>(A))
      return *F;
    if (auto *I = std::get_if<int64_t>(A))
      return double(*I);
  }
  return Default;
}

std::string AttrList::getString(StringRef Name, StringRef Default) const {
  if (const Attribute *A = find(Name))
    if (auto *S = std::get_if<std::string>(A))
      return *S;
  return Default.str();
}

std::vector<int64_t> AttrList::getInts(StringRef Name) const {
  if (const Attribute *A = find(Name)) {
    if (auto *L = std::get_if<std::vector<int64_t>>(A))
      return *L;
    if (auto *I = std::get_if<int64_t>(A))
      return {*I};
  }
  return {};
}

} // namespace sp
