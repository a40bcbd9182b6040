//===- Roles.h - What each detected role means to the passes ----*- C++ -*-===//
//
// detect-transformer tags every node with a role; the passes after it ask
// the role's properties, never its name: tensor parallelism how to shard a
// node, sequence parallelism which parameters see sequence shards and which
// full-sequence values to split, recomputation and the memory report which
// nodes form the attention core. A family is a layer template of roles
// (Roles.cpp: Templates). detect-transformer's walk recognises blocks (pre- or
// post-norm; a fused qkv, or q/k/v with optional rotary and kv repeat; a GELU
// or SwiGLU MLP) and accepts a model only when every layer fits a template.
// A new family made of these blocks is one template (and its memory formula
// in MemoryReport.cpp); a new block is a detector rule and the properties of
// its roles here.
//
//===----------------------------------------------------------------------===//
#ifndef SP_PASSES_ROLES_H
#define SP_PASSES_ROLES_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include <cstdint>
#include <string>
#include <vector>

namespace sp {

struct RoleProps {
  /// How tensor parallelism shards the node.
  enum class Tp : uint8_t {
    Replicated, ///< computed whole on every rank
    Column,     ///< linear split by output columns; an f before it
    Row,        ///< linear split by input rows; an f-bar after it
    VocabEmbedding, ///< embedding table split by vocabulary rows
    VocabHead,  ///< lm head split by vocabulary columns
    Heads,      ///< a head reshaping whose head count is divided by t
  };
  Tp Parallel = Tp::Replicated;
  /// Column: the fused blocks of the weight (3 for a fused qkv), each split.
  int Blocks = 1;
  /// Column: the role of the f inserted before it (shared by the linears
  /// that read one input). Row: the roles of the f-bar and of the bias add.
  const char *F = "", *Bias = "";
  /// Recomputed by --recompute selective (Section 5 of the paper: the
  /// softmax-sized activations of the attention).
  bool AttentionCore = false;
  /// Under sequence parallelism its parameters are applied to sequence
  /// shards, so each rank's gradient is partial: summed over the group.
  bool SeqShardedParams = false;
  /// A full-sequence value added to the residual stream (position and
  /// token-type embeddings): sequence parallelism keeps this rank's rows.
  bool SplitBySequence = false;
};

/// The properties of a role; an unknown role (or none) is replicated
/// without other properties.
const RoleProps &roleProps(llvm::StringRef Role);

/// The family whose template every layer's roles fit (every required role
/// present, no role outside the template): Family, or the first Layer that
/// fits none or another family than layer 0, and Why.
struct FamilyFit {
  const char *Family = nullptr; ///< "gpt", "llama", "bert"
  int Layer = -1;
  std::string Why;
};
FamilyFit fitFamily(llvm::ArrayRef<std::vector<std::string>> LayerRoles);

} // namespace sp

#endif // SP_PASSES_ROLES_H
