//===- Roles.cpp - The role table and the family templates ----------------===//
#include "passes/Roles.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include <string>

using namespace llvm;

namespace sp {

namespace {
using Tp = RoleProps::Tp;

RoleProps column(const char *F, int Blocks = 1) {
  return {.Parallel = Tp::Column, .Blocks = Blocks, .F = F};
}
RoleProps row(const char *FBar, const char *Bias) {
  return {.Parallel = Tp::Row, .F = FBar, .Bias = Bias};
}
const RoleProps Core{.AttentionCore = true};
// Norm scales and biases, row-parallel biases, BERT's head transform.
const RoleProps SeqSharded{.SeqShardedParams = true};
const RoleProps SplitBySequence{.SplitBySequence = true};

const StringMap<RoleProps> &table() {
  static const StringMap<RoleProps> T = {
      // Embeddings (layer -1).
      {"embed", {.Parallel = Tp::VocabEmbedding}},
      {"pos_embed", SplitBySequence},
      {"type_embed", SplitBySequence},
      {"embed_norm", SeqSharded},
      // Attention.
      {"ln1", SeqSharded},
      {"qkv", column("attn_f", 3)},
      {"q", column("attn_f")},
      {"k", column("attn_f")},
      {"v", column("attn_f")},
      {"split_heads", {.Parallel = Tp::Heads}},
      {"q_heads", {.Parallel = Tp::Heads}},
      {"k_heads", {.Parallel = Tp::Heads}},
      {"v_heads", {.Parallel = Tp::Heads}},
      // The kv-head repeat of grouped-query attention is a copy feeding qk
      // and av: recomputing it stores the kv heads instead of their repeats.
      {"k_repeat", Core},
      {"v_repeat", Core},
      {"qk", Core},
      {"scale", Core},
      {"mask", Core},
      {"pad_mask", Core},
      {"softmax", Core},
      {"attn_core_dropout", Core},
      {"av", Core},
      // The fused core (fuse-attention): stores only its q, k, v, output and
      // log-sum-exp, so selective recomputation has nothing to drop there.
      {"attention", {}},
      {"proj", row("attn_fbar", "proj_bias")},
      {"proj_bias", SeqSharded},
      // MLP.
      {"ln2", SeqSharded},
      {"fc1", column("mlp_f")},
      {"gate", column("mlp_f")},
      {"up", column("mlp_f")},
      {"fc2", row("mlp_fbar", "fc2_bias")},
      {"fc2_bias", SeqSharded},
      // Head.
      {"final_norm", SeqSharded},
      {"head_dense", SeqSharded},
      {"head_norm", SeqSharded},
      {"lm_head", {.Parallel = Tp::VocabHead}},
  };
  return T;
}

// Layer templates. Required roles first, then the optional ones.
const char *const GptRequired[] = {"ln1", "qkv", "split_heads", "qk",
                                   "softmax", "av", "merge_heads", "proj",
                                   "residual1", "ln2", "fc1", "act", "fc2",
                                   "residual2"};
const char *const LlamaRequired[] = {
    "ln1",     "q",   "k",           "v",    "q_heads", "k_heads",
    "v_heads", "qk",  "softmax",     "av",   "merge_heads", "proj",
    "residual1", "ln2", "gate", "up", "act", "glu", "fc2", "residual2"};
const char *const BertRequired[] = {
    "q",           "k",    "v",         "q_heads", "k_heads", "v_heads",
    "qk",          "softmax", "av",     "merge_heads", "proj", "residual1",
    "ln1",         "fc1",  "act",       "fc2",     "residual2", "ln2"};
const char *const Optional[] = {
    "scale",    "mask",     "pad_mask", "attn_core_dropout", "attn_dropout",
    "mlp_dropout", "rope_cos", "rope_sin", "q_rope", "k_rope", "k_repeat",
    "v_repeat", "attention",
    // What tensor parallelism inserts (f, f-bar, row-parallel bias adds).
    "attn_f", "mlp_f", "attn_fbar", "mlp_fbar", "proj_bias", "fc2_bias"};

/// A family's layer template: the roles of one layer, required and
/// optional.
struct FamilyTemplate {
  const char *Family;
  ArrayRef<const char *> Required, Optional;
};

// GPT: pre-norm LayerNorm, fused qkv, GELU MLP. Llama: pre-norm RMSNorm,
// q/k/v with rotary and grouped-query attention, SwiGLU MLP. BERT: post-norm
// (LayerNorm after each residual), q/k/v, GELU MLP.
const FamilyTemplate Templates[] = {
    {"gpt", GptRequired, Optional},
    {"llama", LlamaRequired, Optional},
    {"bert", BertRequired, Optional},
};
} // namespace

const RoleProps &roleProps(StringRef Role) {
  static const RoleProps None;
  auto It = table().find(Role);
  return It == table().end() ? None : It->second;
}

/// What a layer lacks of T's required roles, and the roles T has no place
/// for (each once); both empty when the layer fits T.
static std::pair<std::string, std::string>
misfit(const FamilyTemplate &T, ArrayRef<std::string> LayerRoles) {
  std::string Lacks, Extra;
  // A fused attention core stands for qk, softmax, av and merge_heads, and
  // a packed one for split_heads too.
  bool Fused = is_contained(LayerRoles, "attention");
  for (const char *R : T.Required)
    if (!is_contained(LayerRoles, R) &&
        !(Fused && (StringRef(R) == "qk" || StringRef(R) == "softmax" ||
                    StringRef(R) == "av" || StringRef(R) == "merge_heads" ||
                    StringRef(R) == "split_heads")))
      Lacks += (Lacks.empty() ? "" : " ") + std::string(R);
  SmallVector<StringRef, 4> Seen;
  for (const std::string &R : LayerRoles)
    if (!is_contained(T.Required, R) && !is_contained(T.Optional, R) &&
        !is_contained(Seen, R)) {
      Seen.push_back(R);
      Extra += (Extra.empty() ? "" : " ") + R;
    }
  return {Lacks, Extra};
}

FamilyFit fitFamily(ArrayRef<std::vector<std::string>> LayerRoles) {
  FamilyFit Fit;
  for (size_t L = 0; L < LayerRoles.size(); ++L) {
    const FamilyTemplate *Match = nullptr;
    std::string Why;
    for (const FamilyTemplate &T : Templates) {
      auto [Lacks, Extra] = misfit(T, LayerRoles[L]);
      if (Lacks.empty() && Extra.empty()) {
        Match = &T;
        break;
      }
      Why += (Why.empty() ? "" : "; ") + std::string(T.Family) +
             (Lacks.empty() ? "" : " would need " + Lacks) +
             (Lacks.empty() || Extra.empty() ? "" : " and") +
             (Extra.empty() ? "" : " has no place for " + Extra);
    }
    if (!Match)
      return {nullptr, int(L), "its blocks form no supported family: " + Why};
    if (L == 0)
      Fit.Family = Match->Family;
    else if (StringRef(Match->Family) != Fit.Family)
      return {nullptr, int(L),
              std::string("it is a ") + Match->Family + " layer but layer 0 is " +
                  Fit.Family};
  }
  return Fit;
}

} // namespace sp
