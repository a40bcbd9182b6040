//===- ModelInfo.h - What detection found, read back from the tags -*- C++ -*-===//
//
// The facts about a detected Transformer (layers, hidden, heads, ...) are not
// stored beside the graph: they are recomputed from the layer and role tags
// that detect-transformer writes, so they are also available to a pass or a
// tool that starts from textual IR.
//
//===----------------------------------------------------------------------===//
#ifndef SP_ANALYSIS_MODELINFO_H
#define SP_ANALYSIS_MODELINFO_H

#include "ir/Family.h"
#include "ir/IR.h"
#include "llvm/Support/Error.h"
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sp {

struct ModelInfo {
  int64_t Layers = 0, Hidden = 0, Heads = 0, Seq = 0, Vocab = 0, Batch = 0;
  /// Key/value heads (fewer than Heads under grouped-query attention).
  int64_t KvHeads = 0;
  /// The family whose layer template the roles detection gave fit
  /// (ir/Family.h: GPT, Llama, BERT).
  const FamilyDef *Family = &families()[0];
  /// Post-norm layers (the norm after each residual add).
  bool PostNorm = false;
  /// The scores are causally masked / masked by an attention-mask input.
  bool Causal = false, PaddingMask = false;
  /// The MLP's inner width (fc1's, or gate's and up's).
  int64_t Ffn = 0;
  /// The layers have dropout; the rotary tables are looked up per layer by
  /// position ids (activations, not constants).
  bool Dropout = false, RopeLookup = false;
  /// Dropouts at a layer's block ends (attn_dropout, mlp_dropout): 2, or 0
  /// (none, or a parallel block's ratio-0 ones that tensor parallelism
  /// drops).
  int BlockDropouts = 0;
  /// The attention cores are fused (fuse-attention: attention ops).
  bool FusedAttention = false;
  /// ... writing its output merged (the projection's input, stored once).
  bool FusedMerged = false;
  /// BERT's token-type embedding, embedding norm and head transform.
  bool TokenTypes = false, EmbedNorm = false, HeadTransform = false;
  /// Trainable parameter elements; a tied weight counts once, buffers never.
  int64_t Params = 0;
  bool Tied = false;
  bool PositionEmbedding = false;
  bool FinalNorm = false;
  std::string Gelu; // "none" (erf) or "tanh"; empty without a gelu
  /// The MLP's activation as the summary writes it: "gelu erf", "gelu tanh",
  /// "silu", "relu".
  std::string Activation;
  /// The head transform's activation (BERT's: gelu).
  std::string HeadActivation;
  /// Roles of each layer's nodes, in program order.
  std::vector<std::vector<Role>> LayerRoles;
};

/// Reads the facts from a graph tagged by detect-transformer.
llvm::Expected<ModelInfo> summarizeModel(const Graph &G);

/// The report's "model" and "structure" objects.
nlohmann::json modelInfoToJson(const ModelInfo &M);

/// A human-readable summary for sp-compile.
void printModelSummary(const ModelInfo &M, const Graph &G,
                       llvm::raw_ostream &OS);

} // namespace sp

#endif // SP_ANALYSIS_MODELINFO_H
