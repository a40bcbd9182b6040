//===- Attribute.h - Node attributes ---------------------------*- C++ -*-===//
#ifndef SP_IR_ATTRIBUTE_H
#define SP_IR_ATTRIBUTE_H

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace sp {

/// An attribute value: integer, float, string, or a list of integers or floats.
using Attribute = std::variant<int64_t, double, std::string,
                               std::vector<int64_t>, std::vector<double>>;

/// A node's attributes, kept sorted by name so printing is deterministic.
class AttrList {
public:
  void set(llvm::StringRef Name, Attribute V);
  const Attribute *find(llvm::StringRef Name) const;
  bool has(llvm::StringRef Name) const { return find(Name) != nullptr; }
  void erase(llvm::StringRef Name);

  int64_t getInt(llvm::StringRef Name, int64_t Default) const;
  double getFloat(llvm::StringRef Name, double Default) const;
  std::string getString(llvm::StringRef Name, llvm::StringRef Default) const;
  std::vector<int64_t> getInts(llvm::StringRef Name) const;

  using Entry = std::pair<std::string, Attribute>;
  const std::vector<Entry> &entries() const { return Entries; }
  bool empty() const { return Entries.empty(); }

private:
  std::vector<Entry> Entries;
};

} // namespace sp

#endif // SP_IR_ATTRIBUTE_H
