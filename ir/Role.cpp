//===- Role.cpp - The role table, from ir/Roles.def -----------------------===//
#include "ir/Role.h"
#include "llvm/ADT/StringMap.h"
#include <iterator>

using namespace llvm;

namespace sp {

namespace {
struct RoleRecord {
  StringRef Name;
  RoleGroup Group;
  RoleProps Props;
};

const RoleRecord Records[] = {
#define SP_ROLE(Enum, Name, Group, ...)                                        \
  {Name, RoleGroup::Group, RoleProps{__VA_ARGS__}},
#include "ir/Roles.def"
};

const StringMap<Role> &byName() {
  static const StringMap<Role> M = [] {
    StringMap<Role> M;
    for (size_t I = 0; I < std::size(Records); ++I)
      M.try_emplace(Records[I].Name, Role(I));
    return M;
  }();
  return M;
}
} // namespace

StringRef roleName(Role R) { return Records[size_t(R)].Name; }

std::optional<Role> parseRole(StringRef Name) {
  auto It = byName().find(Name);
  if (It == byName().end())
    return std::nullopt;
  return It->second;
}

const RoleProps &roleProps(Role R) { return Records[size_t(R)].Props; }

bool isRegatherRole(Role R) {
  for (const RoleRecord &Rec : Records)
    if (R != Role::None && Rec.Props.Regather == R)
      return true;
  return false;
}

RoleGroup roleGroup(Role R) { return Records[size_t(R)].Group; }

StringRef roleGroupName(RoleGroup G) {
  static const char *const Names[] = {"other",          "embedding", "attention",
                                      "attention_core", "mlp",       "head",
                                      "training"};
  return Names[size_t(G)];
}

} // namespace sp
