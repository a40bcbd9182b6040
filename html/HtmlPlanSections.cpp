//===- HtmlPlanSections.cpp - The plan's sections of the page ---------------===//
//
// The options the plan was compiled with, the recognised model and the
// memory report (the chart, stored activations by layer and by role,
// against the family's formula).
//
//===----------------------------------------------------------------------===//
#include "html/HtmlParts.h"
#include "plan/AtomicFile.h"
#include "support/Format.h"
#include "support/Xml.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include <algorithm>
#include <cmath>

using namespace llvm;
using json = nlohmann::json;

namespace sp {
namespace html {

Section optionsSection(const ReportPage &P) {
  const json &F = P.Facts;
  const json *Par = get(&F, "parallel");
  Facts T;
  auto Int = [&](StringRef Key) {
    auto V = integer(get(Par, Key));
    if (!V)
      V = integer(get(&F, Key)); // a manifest's top-level copy
    return V ? std::to_string(*V) : std::string();
  };
  T.addText("tensor parallel t", Int("tp"));
  std::optional<bool> SP = flag(get(Par, "sp"));
  if (!SP)
    SP = flag(get(&F, "sp"));
  T.addText("sequence parallel", yesNo(SP));
  T.addText("pipeline stages p", Int("pp"));
  T.addText("model chunks per rank", Int("interleave"));
  T.addText("microbatches per step", Int("microbatches"));
  std::string Schedule = str(get(&F, "bubble", "schedule"));
  if (Schedule.empty())
    Schedule = str(get(&F, "schedule"));
  if (pipelined(F))
    T.addText("schedule", Schedule);
  T.addText("data-parallel replicas d", Int("dp"));
  if (auto Z = integer(get(Par, "zero")))
    T.addText("ZeRO stage", std::to_string(*Z));
  T.addText("recomputation", recomputeSummary(F));
  std::string Dtype = str(get(&F, "plan", "dtype"));
  T.addText("activation dtype", Dtype.empty() ? str(get(&F, "dtype")) : Dtype);
  if (const json *LS = get(&F, "loss_scale"))
    T.addText("initial loss scale", optCount(get(LS, "initial")));
  T.addText("source model", str(get(&F, "source")));
  std::string Run;
  if (!P.RunSettings.empty()) {
    Facts R;
    for (auto &[K, V] : P.RunSettings)
      R.addText(K, V);
    Run = "<h3>The run</h3>" + R.grid();
  }
  std::string H = (Run.empty() ? "" : "<h3>The plan</h3>") + T.grid() + Run;
  if (!P.CommandLine.empty())
    H += "<p>Command:</p><pre class=\"cmd\">" + esc(P.CommandLine) + "</pre>\n";
  return {"options", "Options", H};
}

/// Consecutive layers with the same roles, as "layers 0-11".
std::string layerStructure(const json *Layers) {
  if (!array(Layers))
    return "";
  std::vector<std::vector<std::string>> Roles;
  for (const json &L : *Layers) {
    Roles.emplace_back();
    if (const json *R = array(get(&L, "roles")))
      for (const json &Role : *R)
        Roles.back().push_back(Role.is_string() ? Role.get<std::string>()
                                                : "?");
  }
  Table T({"layers", "roles in program order"});
  for (size_t First = 0, Last; First < Roles.size(); First = Last + 1) {
    Last = First;
    while (Last + 1 < Roles.size() && Roles[Last + 1] == Roles[First])
      ++Last;
    T.row({text(First == Last ? formatv("layer {0}", First).str()
                              : formatv("layers {0}-{1}", First, Last).str()),
           text(join(Roles[First], " "))});
  }
  return T.str();
}

Section modelSection(const ReportPage &P) {
  const json *M = get(&P.Facts, "model"), *St = get(&P.Facts, "structure");
  Facts T;
  std::string Family = str(get(M, "family"));
  static const std::map<std::string, std::string> Families = {
      {"gpt", "GPT-style decoder (pre-norm LayerNorm, fused QKV)"},
      {"llama", "Llama-style decoder (RMSNorm, rotary, gated MLP)"},
      {"bert", "BERT-style post-norm encoder"}};
  auto It = Families.find(Family);
  T.addText("family", It != Families.end() ? It->second : Family);
  T.add("layers", optCount(get(M, "layers")));
  T.add("hidden size h", optCount(get(M, "hidden")));
  auto Heads = integer(get(M, "heads")), Kv = integer(get(M, "kv_heads")),
       Hidden = integer(get(M, "hidden"));
  if (Heads)
    T.add("attention heads a", esc(thousands(*Heads)),
          Hidden && *Heads > 0
              ? formatv("head size {0}", *Hidden / *Heads).str()
              : "");
  if (Kv)
    T.add("key/value heads", esc(thousands(*Kv)),
          Heads && *Kv != *Heads ? "grouped-query attention" : "");
  T.add("MLP width", optCount(get(M, "ffn")));
  T.add("sequence s", optCount(get(M, "seq")));
  T.add("vocabulary v", optCount(get(M, "vocab")));
  T.add("batch b (per microbatch)", optCount(get(M, "batch")));
  if (auto Params = num(get(M, "params")))
    T.add("parameters", esc(thousands(int64_t(*Params))),
          siText(*Params, "") + (flag(get(M, "tied")).value_or(false)
                                     ? "; input and output embeddings tied"
                                     : ""));
  T.addText("MLP activation", str(get(M, "activation")));
  std::string Attn;
  if (flag(get(M, "causal")).value_or(false))
    Attn = "causal";
  if (flag(get(M, "padding_mask")).value_or(false))
    Attn += std::string(Attn.empty() ? "" : ", ") + "padding mask";
  T.addText("attention", Attn);
  if (auto PN = flag(get(M, "post_norm")))
    T.addText("norm placement", *PN ? "post-norm" : "pre-norm");
  std::string H = T.grid();
  if (St) {
    Facts S;
    std::string Embed = "token";
    if (flag(get(St, "position_embedding")).value_or(false))
      Embed += " + position";
    if (flag(get(St, "token_type_embedding")).value_or(false))
      Embed += " + token type";
    if (flag(get(St, "embedding_norm")).value_or(false))
      Embed += ", then a norm";
    S.addText("embedding", Embed);
    S.addText("final norm", yesNo(flag(get(St, "final_norm"))));
    S.addText("head transform", yesNo(flag(get(St, "head_transform"))));
    S.addText("LM head", flag(get(M, "tied")).value_or(false)
                             ? "tied to the token embedding"
                             : "its own weight");
    H += "<h3>Recognised structure</h3>" + S.grid() +
         layerStructure(get(St, "layers"));
  }
  return {"model", "Model", H};
}

/// Each layer's stored bytes against the formula (for the layers recomputed
/// as the formula's layer is) and, for a run, what the rank measured.
std::string storedByLayer(const ReportPage &P, const json *Mem) {
  auto Layer = integer(get(Mem, "activation_layer"));
  auto FB = num(get(Mem, "formula", "bytes_per_layer"));
  const json *ByLayer = array(get(Mem, "stored_bytes_by_layer"));
  const json *Kinds = array(get(Mem, "layer_recompute"));
  std::string MidKind;
  if (Kinds && Layer && *Layer >= 0 && size_t(*Layer) < Kinds->size() &&
      (*Kinds)[*Layer].is_string())
    MidKind = (*Kinds)[*Layer].get<std::string>();
  if (!ByLayer)
    return "";
  std::vector<std::string> Cols = {
      "layer", "recompute", "stored (plan)", "formula", "plan vs formula", ""};
  if (P.Measured)
    Cols.insert(Cols.begin() + 3, "measured");
  double Max = 0;
  for (const json &L : *ByLayer)
    Max = std::max(Max, num(get(&L, "bytes")).value_or(0));
  if (FB)
    Max = std::max(Max, *FB);
  if (P.Measured)
    for (auto &[L, B] : P.Measured->StoredBytesByLayer)
      Max = std::max(Max, double(B));
  Table T(Cols, /*Sortable=*/true);
  for (const json &L : *ByLayer) {
    auto Index = integer(get(&L, "layer"));
    auto B = num(get(&L, "bytes"));
    if (!Index || !B)
      continue;
    std::string Kind;
    if (Kinds && *Index >= 0 && size_t(*Index) < Kinds->size() &&
        (*Kinds)[*Index].is_string())
      Kind = (*Kinds)[*Index].get<std::string>();
    bool Comparable = FB && *Index >= 0 && !MidKind.empty() && Kind == MidKind;
    std::vector<Cell> Row = {
        label(double(*Index), *Index < 0
                                  ? "outside the layers <span class=\"note\">"
                                    "(embedding, head, loss)</span>"
                                  : "layer " + std::to_string(*Index)),
        Kind.empty() ? none() : text(Kind),
        bytes(*B),
        Comparable ? bytes(*FB) : noNumber(),
        Comparable && *FB > 0
            ? number(100 * (*B - *FB) / *FB, diffText(100 * (*B - *FB) / *FB))
            : noNumber(),
        html(bar(
            *B, Max, Comparable ? FB : std::nullopt, PlanColour,
            formatv("layer {0}: {1} stored", *Index, bytesText(*B)).str()))};
    if (P.Measured) {
      auto It = P.Measured->StoredBytesByLayer.find(int(*Index));
      Row.insert(Row.begin() + 3,
                 It == P.Measured->StoredBytesByLayer.end()
                     ? Cell{"<span class=\"note\">another rank's</span>",
                            std::nullopt, true}
                     : bytes(double(It->second)));
    }
    T.row(std::move(Row));
  }
  return "<h3>Stored activations by layer</h3>" + T.str() +
         "<p class=\"note\">Bytes of one microbatch; the tick on a bar is "
         "the formula's bytes for a layer recomputed as layer " +
         (Layer ? std::to_string(*Layer) : std::string("?")) + " is." +
         (P.Measured ? " Measured: what " + esc(P.Measured->Rank) +
                           " stored in its last step, for the layers it "
                           "holds."
                     : std::string()) +
         " Click a column to sort.</p>\n";
}

/// The middle layer's stored bytes by the role of their first reader.
std::string storedByRole(const json *Mem) {
  auto Layer = integer(get(Mem, "activation_layer"));
  const json *Roles = get(Mem, "activation_bytes_per_layer_by_role");
  if (!Roles || !Roles->is_object() || Roles->empty())
    return "";
  double Max = 0;
  for (auto &[Role, B] : Roles->items())
    Max = std::max(Max, num(&B).value_or(0));
  Table T({"reader role", "stored", ""}, /*Sortable=*/true);
  for (auto &[Role, B] : Roles->items())
    if (auto V = num(&B))
      T.row({text(Role), bytes(*V),
             html(bar(*V, Max, std::nullopt, PlanColour,
                      Role + ": " + bytesText(*V)))});
  return "<h3>Layer " + (Layer ? std::to_string(*Layer) : std::string("?")) +
         " by the role of its first backward reader</h3>" + T.str();
}

Section memorySection(const ReportPage &P) {
  const json &F = P.Facts;
  const json *Mem = get(&F, "memory"), *Plan = get(&F, "plan");
  std::string H;
  if (!P.Memory.empty())
    H += figure(P.Memory, "chart-memory", "memory chart");

  Facts A;
  A.add("instructions", optCount(get(Plan, "instructions")));
  A.add("buffers", optCount(get(Plan, "buffers")));
  auto Arena = num(get(Plan, "arena_bytes")),
       Persistent = num(get(Plan, "persistent_bytes"));
  A.add("arena (rank 0)", optBytes(get(Plan, "arena_bytes")),
        "what the runtime allocates: the planned peak");
  A.add("persistent", optBytes(get(Plan, "persistent_bytes")),
        "parameters, optimizer state, inputs");
  if (Arena && Persistent)
    A.add("temporaries", esc(bytesText(*Arena - *Persistent)));
  A.add("peak live temporaries", optBytes(get(Plan, "peak_live_temp_bytes")));
  A.add("largest arena of any rank", optBytes(get(Mem, "peak_bytes_per_rank")));
  std::string PlanBlock = A.str().empty() ? "" : "<h3>The plan</h3>" + A.str();

  std::string StateBlock, StateNote;
  const json *MS = get(Mem, "model_state");
  if (MS) {
    Table T({"model state (rank 0)", "plan", "formula"});
    auto Row = [&](StringRef Label, const json *Plan, const json *Formula) {
      auto V = num(Plan);
      if (!V)
        return;
      auto Fm = num(Formula);
      T.row({text(Label), bytes(*V), Fm ? bytes(*Fm) : none()});
    };
    Row("parameters", get(Mem, "parameter_bytes"),
        get(MS, "formula_parameter_bytes"));
    Row("gradients", get(Mem, "gradient_bytes"),
        get(MS, "formula_gradient_bytes"));
    Row("AdamW moments", get(Mem, "optimizer_state_bytes"),
        get(MS, "formula_optimizer_state_bytes"));
    if (num(get(MS, "compute_copy_bytes")).value_or(0) > 0)
      Row("16-bit compute copies", get(MS, "compute_copy_bytes"),
          get(MS, "formula_compute_copy_bytes"));
    StateBlock = "<h3>Model state</h3>" + T.str();
    std::string Formula = str(get(MS, "formula"));
    if (!Formula.empty())
      StateNote = "<p class=\"note\">Psi = " + optCount(get(MS, "parameters")) +
                  " parameter elements on this rank: " + esc(Formula) +
                  ".</p>\n";
  }
  H += side({PlanBlock, StateBlock}) + StateNote;

  if (Mem) {
    Facts T;
    auto Layer = integer(get(Mem, "activation_layer"));
    T.add("stored per layer", optBytes(get(Mem, "activation_bytes_per_layer")),
          Layer ? formatv("layer {0}, one microbatch", *Layer).str() : "");
    const json *Fm = get(Mem, "formula");
    auto FB = num(get(Fm, "bytes_per_layer")),
         Got = num(get(Mem, "activation_bytes_per_layer"));
    if (FB)
      T.add("the " + str(get(Fm, "family")) + " formula", esc(bytesText(*FB)),
            Got && *FB > 0 ? "the plan is " +
                                 diffText(100 * (*Got - *FB) / *FB) + " from it"
                           : "");
    T.add("stored in all", optBytes(get(Mem, "stored_activation_bytes")),
          "one microbatch through every layer");
    T.add("first stage, whole step",
          optBytes(get(Mem, "first_stage_activation_bytes")),
          integer(get(Mem, "microbatches_in_flight"))
              ? formatv("{0} microbatch-chunks in flight",
                        *integer(get(Mem, "microbatches_in_flight")))
                    .str()
              : "");
    T.add("transient recomputation",
          optBytes(get(Mem, "recompute_transient_bytes")));
    T.addText("recomputation", recomputeSummary(F));
    H += "<h3>Stored activations</h3>" + T.str();
    std::string FText = str(get(Fm, "text"));
    if (!FText.empty())
      H += "<p class=\"note\">Formula (e bytes per element, masks 1 byte): "
           "<code>" +
           esc(FText) + "</code></p>\n";

    H += storedByLayer(P, Mem) + storedByRole(Mem);
  }
  if (H.empty())
    H = "<p class=\"note\">The facts hold no memory report.</p>\n";
  return {"memory", "Memory", H};
}


} // namespace html
} // namespace sp
