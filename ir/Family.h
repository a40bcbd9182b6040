//===- Family.h - Model families as records ---------------------*- C++ -*-===//
//
// A family (GPT, Llama, BERT, GPT-NeoX, GPT-J) is one FamilyDef record in
// ir/Families.cpp: its layer template (the roles every layer has; the roles a
// layer may have are shared), the blocks it is made of (norm, pre- or
// post-norm, sequential or parallel residual, MLP, grouped-query attention),
// the terms of its activation-memory formula and the words its summary uses.
// detect-transformer's walk recognises blocks and tags roles; a model is
// accepted when every layer fits one family's template (fitFamily), and every
// later consumer (the memory formula, the model summary, the reports) reads the
// record instead of the family's name. Adding a family made of known blocks is
// one record; a new block is a detector rule plus the roles it tags
// (ir/Roles.def).
//
//===----------------------------------------------------------------------===//
#ifndef SP_IR_FAMILY_H
#define SP_IR_FAMILY_H

#include "ir/Role.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include <string>
#include <vector>

namespace sp {

enum class NormKind : uint8_t { LayerNorm, RmsNorm };
/// Plain: fc1, act, fc2. Gated: gate and up, act(gate) * up, fc2.
enum class MlpKind : uint8_t { Plain, Gated };
/// The attention's projections: one fused qkv linear split into heads
/// (qkv, split_heads), separate q, k and v linears (q, k, v and their
/// heads), or either.
enum class QkvKind : uint8_t { Fused, Separate, Either };
/// How a layer's blocks meet the residual stream: one after the other,
/// x + attn(ln1(x)) then h + mlp(ln2(h)); or both off the layer's input,
/// x + attn(ln1(x)) + mlp(ln2(x)) with two norms (GPT-NeoX, Pythia) or
/// x + attn(ln(x)) + mlp(ln(x)) with one (GPT-J, Falcon, Phi).
enum class ResidualKind : uint8_t {
  Sequential,
  ParallelTwoNorms,
  ParallelOneNorm
};

struct FamilyDef {
  /// The name the plan, the reports and --help use: "gpt".
  const char *Name;
  /// The summary's first words: "GPT-style".
  const char *Style;
  /// One line for reports and docs.
  const char *Description;
  /// The roles every layer of the family has, beside its projections'.
  llvm::ArrayRef<Role> Required;
  QkvKind Qkv;
  NormKind Norm;
  /// A norm after each residual add (BERT) instead of before each block.
  bool PostNorm;
  ResidualKind Residual;
  MlpKind Mlp;
  /// Fewer key/value heads than query heads may occur (grouped-query
  /// attention): the k and v a layer stores are counted at kv heads where
  /// the repeat is recomputed or fused.
  bool GroupedKv;
  /// The summary says "decoder" or "encoder" from the causal mask (BERT);
  /// otherwise the family is a decoder.
  bool EncoderOrDecoder;

  // The activation-memory formula's family terms (reports/MemoryReport):
  /// Float32 statistics a norm stores per row: mean and 1/std (8 bytes) or
  /// 1/rms (4).
  int NormStatsBytes;
  /// e F-sized values the MLP stores per token: 2 (the activation's input,
  /// fc2's input) or 4 (the activation's input, its output, up, fc2's input).
  int MlpStored;
  /// What those are, after the activation's name.
  const char *MlpStoredText;
};

/// The norms a layer of F has (1 for a parallel block with one norm), and
/// the distinct values the norms and the blocks read that its formula
/// counts: 4 (two norm inputs, two block inputs), 3 (parallel, two norms:
/// one shared norm input) or 2 (parallel, one norm).
int layerNorms(const FamilyDef &F);
int layerNormAndBlockInputs(const FamilyDef &F);

/// Every family, in the order detection tries them.
llvm::ArrayRef<FamilyDef> families();
/// The family named Name, or null.
const FamilyDef *findFamily(llvm::StringRef Name);
/// The roles any layer may have beside its family's required ones.
llvm::ArrayRef<Role> optionalLayerRoles();

/// The family whose template every layer's roles fit (every required role
/// present, no role outside the template): Family, or the first Layer that
/// fits none or another family than layer 0, and Why.
struct FamilyFit {
  const FamilyDef *Family = nullptr;
  int Layer = -1;
  std::string Why;
};
FamilyFit fitFamily(llvm::ArrayRef<std::vector<Role>> LayerRoles);

} // namespace sp

#endif // SP_IR_FAMILY_H
