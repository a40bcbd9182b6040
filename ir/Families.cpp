//===- Families.cpp - The family records and their templates -------------===//
//
// One FamilyDef per family (ir/Family.h says what each field means). To add
// a family made of known blocks, write its required roles and its record
// here; detect-transformer and every report pick it up.
//
//===----------------------------------------------------------------------===//
#include "ir/Family.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/ErrorHandling.h"

using namespace llvm;

namespace sp {

namespace {
using R = Role;

const Role GptRequired[] = {R::Ln1,        R::Qk,   R::Softmax,   R::Av,
                            R::MergeHeads, R::Proj, R::Residual1, R::Ln2,
                            R::Fc1,        R::Act,  R::Fc2,       R::Residual2};
const Role LlamaRequired[] = {
    R::Ln1, R::Qk,   R::Softmax, R::Av,  R::MergeHeads, R::Proj, R::Residual1,
    R::Ln2, R::Gate, R::Up,      R::Act, R::Glu,        R::Fc2,  R::Residual2};
const Role BertRequired[] = {R::Qk,   R::Softmax,   R::Av,        R::MergeHeads,
                             R::Proj, R::Residual1, R::Ln1,       R::Fc1,
                             R::Act,  R::Fc2,       R::Residual2, R::Ln2};
// Parallel blocks: x + attn + mlp in two adds (residual1, then
// parallel_residual), with a second norm (ln2 of x) or without.
const Role NeoxRequired[] = {
    R::Ln1, R::Qk,  R::Softmax, R::Av,  R::MergeHeads, R::Proj,
    R::Ln2, R::Fc1, R::Act,     R::Fc2, R::Residual1,  R::ParallelResidual};
const Role GptjRequired[] = {
    R::Ln1, R::Qk,  R::Softmax, R::Av,        R::MergeHeads,      R::Proj,
    R::Fc1, R::Act, R::Fc2,     R::Residual1, R::ParallelResidual};
const Role FusedQkv[] = {R::Qkv, R::SplitHeads};
const Role SeparateQkv[] = {R::Q, R::K, R::V, R::QHeads, R::KHeads, R::VHeads};
const Role Optional[] = {
    R::Scale, R::Mask, R::PadMask, R::AttnCoreDropout, R::AttnDropout,
    R::MlpDropout, R::RopeCos, R::RopeSin, R::QRope, R::KRope, R::KRepeat,
    R::VRepeat, R::Attention,
    // What tensor parallelism inserts (f, f-bar, row-parallel bias adds),
    // and context parallelism's cut of the rotary tables' positions.
    R::AttnF, R::MlpF, R::AttnFBar, R::MlpFBar, R::ProjBias, R::Fc2Bias,
    R::RopeCpSlice};

const FamilyDef Families[] = {
    {.Name = "gpt",
     .Style = "GPT-style",
     .Description = "pre-norm LayerNorm decoder, fused qkv, GELU MLP",
     .Required = GptRequired,
     .Qkv = QkvKind::Fused,
     .Norm = NormKind::LayerNorm,
     .PostNorm = false,
     .Residual = ResidualKind::Sequential,
     .Mlp = MlpKind::Plain,
     .GroupedKv = false,
     .EncoderOrDecoder = false,
     .NormStatsBytes = 8,
     .MlpStored = 2,
     .MlpStoredText = "input, fc2 input"},
    {.Name = "llama",
     .Style = "Llama-style",
     .Description = "pre-norm RMSNorm decoder, q/k/v with rotary and "
                    "grouped-query attention, SwiGLU MLP",
     .Required = LlamaRequired,
     .Qkv = QkvKind::Separate,
     .Norm = NormKind::RmsNorm,
     .PostNorm = false,
     .Residual = ResidualKind::Sequential,
     .Mlp = MlpKind::Gated,
     .GroupedKv = true,
     .EncoderOrDecoder = false,
     .NormStatsBytes = 4,
     .MlpStored = 4,
     .MlpStoredText = "input, its output, up, down input"},
    {.Name = "bert",
     .Style = "BERT-style post-norm",
     .Description = "post-norm LayerNorm encoder (a norm after each "
                    "residual), q/k/v, GELU MLP",
     .Required = BertRequired,
     .Qkv = QkvKind::Separate,
     .Norm = NormKind::LayerNorm,
     .PostNorm = true,
     .Residual = ResidualKind::Sequential,
     .Mlp = MlpKind::Plain,
     .GroupedKv = false,
     .EncoderOrDecoder = true,
     .NormStatsBytes = 8,
     .MlpStored = 2,
     .MlpStoredText = "input, fc2 input"},
    {.Name = "gpt-neox",
     .Style = "GPT-NeoX-style parallel",
     .Description = "pre-norm LayerNorm decoder, attention and MLP in "
                    "parallel off two norms of the layer input "
                    "(GPT-NeoX, Pythia), GELU MLP",
     .Required = NeoxRequired,
     .Qkv = QkvKind::Either,
     .Norm = NormKind::LayerNorm,
     .PostNorm = false,
     .Residual = ResidualKind::ParallelTwoNorms,
     .Mlp = MlpKind::Plain,
     .GroupedKv = true,
     .EncoderOrDecoder = false,
     .NormStatsBytes = 8,
     .MlpStored = 2,
     .MlpStoredText = "input, fc2 input"},
    {.Name = "gpt-j",
     .Style = "GPT-J-style parallel",
     .Description = "pre-norm LayerNorm decoder, attention and MLP in "
                    "parallel off one norm of the layer input (GPT-J, "
                    "Falcon, Phi), GELU MLP",
     .Required = GptjRequired,
     .Qkv = QkvKind::Either,
     .Norm = NormKind::LayerNorm,
     .PostNorm = false,
     .Residual = ResidualKind::ParallelOneNorm,
     .Mlp = MlpKind::Plain,
     .GroupedKv = true,
     .EncoderOrDecoder = false,
     .NormStatsBytes = 8,
     .MlpStored = 2,
     .MlpStoredText = "input, fc2 input"},
};

/// What a layer lacks of F's required roles, and the roles F has no place
/// for (each once); both empty when the layer fits F.
std::pair<std::string, std::string> misfit(const FamilyDef &F,
                                           ArrayRef<Role> LayerRoles) {
  std::string Lacks, Extra;
  // A fused attention core stands for qk, softmax, av and merge_heads, and
  // a packed one for split_heads too.
  bool Fused = is_contained(LayerRoles, Role::Attention);
  auto StoodForByFused = [](Role X) {
    return X == Role::Qk || X == Role::Softmax || X == Role::Av ||
           X == Role::MergeHeads || X == Role::SplitHeads;
  };
  // The projections: the family's kind, or for Either the kind the layer
  // has (fused when it has a qkv linear).
  bool FusedProjections =
      F.Qkv == QkvKind::Fused ||
      (F.Qkv == QkvKind::Either && is_contained(LayerRoles, Role::Qkv));
  ArrayRef<Role> Projections =
      FusedProjections ? ArrayRef<Role>(FusedQkv) : ArrayRef<Role>(SeparateQkv);
  auto Required = [&](Role X) {
    return is_contained(F.Required, X) || is_contained(Projections, X);
  };
  for (ArrayRef<Role> List : {F.Required, Projections})
    for (Role X : List)
      if (!is_contained(LayerRoles, X) && !(Fused && StoodForByFused(X)))
        Lacks += (Lacks.empty() ? "" : " ") + roleName(X).str();
  SmallVector<Role, 4> Seen;
  for (Role X : LayerRoles)
    if (!Required(X) && !is_contained(Optional, X) && !is_contained(Seen, X)) {
      Seen.push_back(X);
      Extra += (Extra.empty() ? "" : " ") + roleName(X).str();
    }
  return {Lacks, Extra};
}
} // namespace

ArrayRef<FamilyDef> families() { return Families; }

int layerNorms(const FamilyDef &F) {
  return F.Residual == ResidualKind::ParallelOneNorm ? 1 : 2;
}

int layerNormAndBlockInputs(const FamilyDef &F) {
  switch (F.Residual) {
  case ResidualKind::Sequential:
    return 4;
  case ResidualKind::ParallelTwoNorms:
    return 3;
  case ResidualKind::ParallelOneNorm:
    return 2;
  }
  llvm_unreachable("unknown residual kind");
}

const FamilyDef *findFamily(StringRef Name) {
  for (const FamilyDef &F : Families)
    if (Name == F.Name)
      return &F;
  return nullptr;
}

ArrayRef<Role> optionalLayerRoles() { return Optional; }

FamilyFit fitFamily(ArrayRef<std::vector<Role>> LayerRoles) {
  FamilyFit Fit;
  for (size_t L = 0; L < LayerRoles.size(); ++L) {
    const FamilyDef *Match = nullptr;
    std::string Why;
    for (const FamilyDef &F : Families) {
      auto [Lacks, Extra] = misfit(F, LayerRoles[L]);
      if (Lacks.empty() && Extra.empty()) {
        Match = &F;
        break;
      }
      Why += (Why.empty() ? "" : "; ") + std::string(F.Name) +
             (Lacks.empty() ? "" : " would need " + Lacks) +
             (Lacks.empty() || Extra.empty() ? "" : " and") +
             (Extra.empty() ? "" : " has no place for " + Extra);
    }
    if (!Match)
      return {nullptr, int(L), "its blocks form no supported family: " + Why};
    if (L == 0)
      Fit.Family = Match;
    else if (Match != Fit.Family)
      return {nullptr, int(L),
              std::string("it is a ") + Match->Name + " layer but layer 0 is " +
                  Fit.Family->Name};
  }
  return Fit;
}

} // namespace sp
