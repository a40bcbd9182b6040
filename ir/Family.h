//===- Family.h - Model families as records ---------------------*- C++ -*-===//
//
// A family (GPT, Llama, BERT) is one FamilyDef record in ir/Families.cpp:
// its layer template (the roles every layer has; the roles a layer may have
// are shared), the blocks it is made of (norm, pre- or post-norm, MLP,
// grouped-query attention), the terms of its activation-memory formula and
// the words its summary uses. detect-transformer's walk recognises blocks
// and tags roles; a model is accepted when every layer fits one family's
// template (fitFamily), and every later consumer (the memory formula, the
// model summary, the reports) reads the record instead of the family's name.
// Adding a family made of known blocks is one record; a new block is a
// detector rule plus the roles it tags (ir/Roles.def).
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

struct FamilyDef {
  /// The name the plan, the reports and --help use: "gpt".
  const char *Name;
  /// The summary's first words: "GPT-style".
  const char *Style;
  /// One line for reports and docs.
  const char *Description;
  /// The roles every layer of the family has.
  llvm::ArrayRef<Role> Required;
  NormKind Norm;
  /// A norm after each residual add (BERT) instead of before each block.
  bool PostNorm;
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
