//===- Role.h - What a node plays in a Transformer --------------*- C++ -*-===//
//
// Every role is one line of ir/Roles.def: its name, the part of the model it
// belongs to and its properties. detect-transformer tags a model's nodes
// with roles; the passes after it ask the role's properties (tensor
// parallelism how to shard a node, sequence parallelism which parameters see
// sequence shards and which full-sequence values to split, selective
// recomputation which nodes form the attention core), never its name. The
// textual IR and the plan write the name; parsing an unknown name fails, so
// a misspelt role is an error where it is read, not a silent default.
//
//===----------------------------------------------------------------------===//
#ifndef SP_IR_ROLE_H
#define SP_IR_ROLE_H

#include "llvm/ADT/StringRef.h"
#include <cstdint>
#include <optional>

namespace sp {

enum class Role : uint8_t {
#define SP_ROLE(Enum, Name, Group, ...) Enum,
#include "ir/Roles.def"
};

inline constexpr unsigned NumRoles = 0
#define SP_ROLE(Enum, Name, Group, ...) +1
#include "ir/Roles.def"
    ;

/// The part of the model a role belongs to (the memory report's groups).
enum class RoleGroup : uint8_t {
  Other,
  Embedding,
  Attention,
  AttentionCore,
  Mlp,
  Head,
  Training,
};

/// How tensor parallelism shards a node of the role.
enum class RoleTp : uint8_t {
  Replicated,     ///< computed whole on every rank
  Column,         ///< linear split by output columns; an f before it
  Row,            ///< linear split by input rows; an f-bar after it
  VocabEmbedding, ///< embedding table split by vocabulary rows
  VocabHead,      ///< lm head split by vocabulary columns
  Heads,          ///< a head reshaping whose head count is divided by t
};

/// What --recompute selective does with a node of the role.
enum class RecomputeClass : uint8_t {
  Layer,         ///< stored; recomputed only by full recomputation
  AttentionCore, ///< the softmax-sized activations (Section 5 of the paper)
};

/// A role's properties (ir/Roles.def says what each field means).
struct RoleProps {
  RoleTp Parallel = RoleTp::Replicated;
  int Blocks = 1;
  Role F = Role::None, Bias = Role::None;
  Role Regather = Role::None;
  Role Split = Role::None;
  Role CpSlice = Role::None;
  RecomputeClass Recompute = RecomputeClass::Layer;
  bool SeqShardedParams = false;
};

llvm::StringRef roleName(Role R);
/// The role named Name ("" is Role::None), or nothing for an unknown name.
std::optional<Role> parseRole(llvm::StringRef Name);
const RoleProps &roleProps(Role R);
RoleGroup roleGroup(Role R);
llvm::StringRef roleGroupName(RoleGroup G);

/// The backward all-gather of communication recomputation (some role's
/// Regather).
bool isRegatherRole(Role R);

/// Recomputed by --recompute selective.
inline bool isAttentionCoreRole(Role R) {
  return roleProps(R).Recompute == RecomputeClass::AttentionCore;
}

} // namespace sp

#endif // SP_IR_ROLE_H
