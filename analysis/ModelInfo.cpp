//===- ModelInfo.cpp ------------------------------------------------------===//
#include "analysis/ModelInfo.h"
#include "ir/Family.h"
#include "ir/OpDef.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"
#include <array>
#include <set>

using namespace llvm;

namespace sp {

Expected<ModelInfo> summarizeModel(const Graph &G) {
  ModelInfo M;
  // The first node of every role, in one sweep.
  std::array<const Node *, NumRoles> First{};
  for (const Node &N : G.nodes())
    if (!First[size_t(N.tags().Role)])
      First[size_t(N.tags().Role)] = &N;
  auto findRole = [&](Role R) { return First[size_t(R)]; };
  const Node *Embed = findRole(Role::Embed);
  const Node *Head = findRole(Role::LmHead);
  if (!Embed || !Head)
    return makeError("the graph has no detected Transformer structure; run "
                     "detect-transformer first");
  // Facts of the whole model: a parameter's data is the unsharded source.
  auto Global = [](const Value *P) -> const TensorType & {
    return P->data() ? P->data()->type() : P->type();
  };
  const TensorType &Table = Global(Embed->operand(0));
  const TensorType &Ids = Embed->operand(1)->type();
  M.Vocab = Table.Shape[0];
  M.Hidden = Table.Shape[1];
  if (Ids.rank() != 2)
    return makeError("token ids must have shape [batch, seq], got " +
                     Ids.str());
  M.Batch = Ids.Shape[0];
  M.Seq = Ids.Shape[1];
  M.PositionEmbedding = findRole(Role::PosEmbed) != nullptr;
  M.FinalNorm = findRole(Role::FinalNorm) != nullptr;
  M.TokenTypes = findRole(Role::TypeEmbed) != nullptr;
  M.EmbedNorm = findRole(Role::EmbedNorm) != nullptr;
  M.HeadTransform = findRole(Role::HeadDense) != nullptr;
  if (const Node *Act = findRole(Role::HeadAct))
    M.HeadActivation = opName(Act->op()).str();
  M.Causal = findRole(Role::Mask) != nullptr;
  M.PaddingMask = findRole(Role::PadMask) != nullptr;
  if (const Node *LN1 = findRole(Role::Ln1))
    if (const Node *In = LN1->operand(0)->producer())
      M.PostNorm = In->tags().Role == Role::Residual1;
  // A pipeline stage's copy of a weight is named "<weight>@<stage>".
  auto Original = [](const Value *V) {
    return StringRef(V->name()).split('@').first;
  };
  M.Tied = Head->operand(1) == Embed->operand(0) ||
           (Head->operand(1)->isParam() && Embed->operand(0)->isParam() &&
            Original(Head->operand(1)) == Original(Embed->operand(0)));
  // A ring of collective-matmul lists as its first shift and first chunk's
  // linear (one role each, as the all-gather and linear it replaces).
  auto FromShift = [](const Value *V) {
    return V->producer() && V->producer()->op() == OpKind::RingShift;
  };
  int BlockDropouts = 0, DropoutLayer = -1;
  for (const Node &N : G.nodes()) {
    int L = N.tags().Layer;
    if (L < 0 || N.tags().Ph != Phase::Forward)
      continue;
    if (N.op() == OpKind::RingConcat ||
        ((N.op() == OpKind::RingShift || N.op() == OpKind::Linear) &&
         FromShift(N.operand(0))))
      continue;
    if (size_t(L) >= M.LayerRoles.size())
      M.LayerRoles.resize(L + 1);
    M.LayerRoles[L].push_back(N.tags().Role);
    // Head counts of the whole model: a split input holds 1/Parts of them.
    auto Whole = [](const Node &H) {
      const Sharding &S = H.operand(0)->sharding();
      return attrInt(H.op(), H.attrs(), "heads") *
             (S.K == Sharding::Split ? S.Parts : 1);
    };
    if ((N.op() == OpKind::SplitHeads ||
         (N.op() == OpKind::Attention && attrInt(N.op(), N.attrs(), "packed"))) &&
        !M.Heads)
      M.Heads = M.KvHeads = Whole(N);
    if (N.op() == OpKind::ToHeads && N.tags().Role == Role::QHeads && !M.Heads)
      M.Heads = Whole(N);
    if (N.op() == OpKind::ToHeads && N.tags().Role == Role::KHeads && !M.KvHeads)
      M.KvHeads = Whole(N);
    Role R = N.tags().Role;
    if ((R == Role::Fc1 || R == Role::Gate) && !M.Ffn) {
      const TensorType &W = Global(N.operand(1));
      M.Ffn = attrInt(N.op(), N.attrs(), "trans_w") ? W.Shape[0] : W.Shape[1];
    }
    M.Dropout |= N.op() == OpKind::Dropout ||
                 (N.op() == OpKind::Attention &&
                  attrInt(N.op(), N.attrs(), "dropout"));
    if (N.op() == OpKind::Dropout &&
        (R == Role::AttnDropout || R == Role::MlpDropout)) {
      // The count in the last layer that has any (all layers alike).
      BlockDropouts = L == DropoutLayer ? BlockDropouts + 1 : 1;
      DropoutLayer = L;
    }
    M.RopeLookup |= R == Role::RopeCos;
    if (N.op() == OpKind::Attention) {
      // The masks the fused core absorbed.
      M.FusedAttention = true;
      M.FusedMerged = attrInt(N.op(), N.attrs(), "merged");
      M.Causal |= attrInt(N.op(), N.attrs(), "causal") != 0;
      M.PaddingMask |= N.numOperands() > attentionInputs(N);
    }
    if (N.op() == OpKind::Gelu && M.Gelu.empty())
      M.Gelu = attrString(N.op(), N.attrs(), "approximate");
    if (R == Role::Act && M.Activation.empty())
      M.Activation =
          N.op() == OpKind::Gelu
              ? attrString(N.op(), N.attrs(), "approximate") == "tanh"
                    ? "gelu tanh"
                    : "gelu erf"
              : opName(N.op()).str();
  }
  M.Layers = M.LayerRoles.size();
  M.BlockDropouts = BlockDropouts;
  // The family is the template every layer fits (ir/Family.h).
  FamilyFit Fit = fitFamily(M.LayerRoles);
  if (!Fit.Family)
    return makeError(formatv("layer {0}: {1}", Fit.Layer, Fit.Why));
  M.Family = Fit.Family;
  for (const auto &P : G.params())
    if (!StringRef(P->name()).contains('@'))
      M.Params += Global(P.get()).numElements();
  return M;
}

nlohmann::json modelInfoToJson(const ModelInfo &M) {
  nlohmann::json Layers = nlohmann::json::array();
  for (size_t L = 0; L < M.LayerRoles.size(); ++L)
  {
    std::vector<std::string> Roles;
    for (Role R : M.LayerRoles[L])
      Roles.push_back(roleName(R).str());
    Layers.push_back({{"index", L}, {"roles", Roles}});
  }
  return {
      {"model",
       {{"layers", M.Layers},
        {"hidden", M.Hidden},
        {"heads", M.Heads},
        {"kv_heads", M.KvHeads},
        {"ffn", M.Ffn},
        {"family", M.Family->Name},
        {"seq", M.Seq},
        {"vocab", M.Vocab},
        {"batch", M.Batch},
        {"params", M.Params},
        {"tied", M.Tied},
        {"gelu", M.Gelu},
        {"activation", M.Activation},
        {"post_norm", M.PostNorm},
        {"causal", M.Causal},
        {"padding_mask", M.PaddingMask}}},
      {"structure",
       {{"embedding", true},
        {"position_embedding", M.PositionEmbedding},
        {"token_type_embedding", M.TokenTypes},
        {"embedding_norm", M.EmbedNorm},
        {"final_norm", M.FinalNorm},
        {"head_transform", M.HeadTransform},
        {"lm_head", true},
        {"layers", Layers}}},
  };
}

void printModelSummary(const ModelInfo &M, const Graph &G, raw_ostream &OS) {
  // The family's words: "Llama-style decoder, 2 layers, RMSNorm, SwiGLU,
  // 2 kv heads".
  const FamilyDef &F = *M.Family;
  std::string Mlp = F.Mlp == MlpKind::Plain ? M.Activation
                    : M.Activation == "silu"
                        ? std::string("SwiGLU")
                        : "gated MLP (" + M.Activation + ")";
  OS << formatv("model '{0}': {1} {2}, {3} layers, {4}{5}{6}\n", G.name(),
                F.Style,
                F.EncoderOrDecoder && !M.Causal ? "encoder" : "decoder",
                M.Layers, F.Norm == NormKind::RmsNorm ? "RMSNorm, " : "", Mlp,
                F.GroupedKv && M.KvHeads && M.KvHeads != M.Heads
                    ? formatv(", {0} kv heads", M.KvHeads).str()
                    : std::string());
  OS << formatv("  hidden {0}, heads {1} (head size {2}), seq {3}, vocab {4}, "
                "batch {5}\n",
                M.Hidden, M.Heads, M.Heads ? M.Hidden / M.Heads : 0, M.Seq,
                M.Vocab, M.Batch);
  OS << formatv("  parameters {0} ({1:F2} M){2}\n", M.Params, M.Params / 1e6,
                M.Tied ? ", input and output embeddings tied" : "");
  OS << "structure:\n";
  OS << "  embedding       token" << (M.PositionEmbedding ? " + position" : "")
     << (M.TokenTypes ? " + token type" : "")
     << (M.EmbedNorm ? ", layer_norm" : "") << "\n";
  OS << "  attention       " << (M.Causal ? "causal" : "bidirectional")
     << (M.PaddingMask ? ", padding mask from an input" : "") << "\n";
  // Print each distinct role sequence once with the layer range it covers.
  size_t L = 0;
  while (L < M.LayerRoles.size()) {
    size_t End = L;
    while (End + 1 < M.LayerRoles.size() &&
           M.LayerRoles[End + 1] == M.LayerRoles[L])
      ++End;
    std::string Range = L == End ? formatv("layer {0}", L).str()
                                 : formatv("layers {0}-{1}", L, End).str();
    OS << formatv("  {0,-15} ", Range);
    std::string Line;
    for (Role R : M.LayerRoles[L])
      Line += (Line.empty() ? "" : " ") + roleName(R).str();
    OS << Line << "\n";
    L = End + 1;
  }
  if (M.FinalNorm)
    OS << "  final norm\n";
  if (M.HeadTransform)
    OS << "  head transform  linear, " << M.HeadActivation << ", layer_norm\n";
  OS << "  lm head         "
     << (M.Tied ? "tied to the token embedding" : "own weight") << "\n";
}

} // namespace sp
