//===- MemoryReport.cpp - Activation memory and FLOPs of a program --------===//
#include "reports/MemoryReport.h"
#include "analysis/Cost.h"
#include "lower/MemoryPlan.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>

using namespace llvm;
using json = nlohmann::json;

namespace sp {

Expected<RunStats> runStats(const Program &P) {
  RunStats S;
  if (!P.compact()) {
    S.Instructions = P.Instrs.size();
    S.Buffers = P.Buffers.size();
    S.PeakLiveTempBytes = peakLiveTempBytes(P);
    S.StoredPeakBytes = analyzeActivations(P).StoredPeakBytes;
    return S;
  }
  // Each temporary instance's live range (prepareCompactRun, as in the
  // written-out program), and whether it is stored, as analyzeActivations
  // finds it there: the template instruction that first touches it, and
  // its readers.
  auto Run = prepareCompactRun(P, /*CheckPlaces=*/false);
  if (!Run)
    return Run.takeError();
  S.Instructions = Run->positions();
  S.Buffers = Run->Instances.size();
  std::vector<int> DefInstr(S.Buffers, -1), InstanceOf = Run->WholeInstance;
  std::vector<bool> IsStored(S.Buffers, false);
  for (size_t K = 0; K < P.Steps.size(); ++K) {
    for (int U = Run->UseBegin[K]; U < Run->UseBegin[K + 1]; ++U)
      InstanceOf[Run->Uses[U].first] = Run->Uses[U].second;
    const ProgramTemplate &T = P.Templates[P.Steps[K].Template];
    for (int I = T.Begin; I < T.End; ++I) {
      const Instruction &In = P.Instrs[I];
      for (const auto *Ids : {&In.In, &In.Out})
        for (int Id : *Ids) {
          int N = InstanceOf[Id];
          if (P.Buffers[Id].K != ProgramBuffer::Temp)
            continue;
          if (DefInstr[N] < 0)
            DefInstr[N] = I;
          if (Ids == &In.In && !IsStored[N])
            IsStored[N] = storedBy(P.Instrs[DefInstr[N]], In);
        }
    }
  }
  std::vector<int64_t> All(S.Instructions + 2, 0), Stored(S.Instructions + 2);
  for (size_t N = 0; N < Run->Instances.size(); ++N) {
    const CompactRun::Instance &R = Run->Instances[N];
    const ProgramBuffer &B = P.Buffers[R.Buffer];
    if (B.K != ProgramBuffer::Temp)
      continue;
    All[R.Def] += B.Bytes;
    All[R.LastUse + 1] -= B.Bytes;
    if (IsStored[N]) {
      Stored[R.Def] += B.Bytes;
      Stored[R.LastUse + 1] -= B.Bytes;
    }
  }
  auto Peak = [](const std::vector<int64_t> &Delta) {
    int64_t Cur = 0, Max = 0;
    for (int64_t D : Delta)
      Max = std::max(Max, Cur += D);
    return Max;
  };
  S.PeakLiveTempBytes = Peak(All);
  S.StoredPeakBytes = Peak(Stored);
  return S;
}

json memoryReportToJson(const ActivationReport &R, const Program &P,
                        StageMemory SM) {
  if (SM.FirstStageStored < 0)
    SM.FirstStageStored = R.StoredPeakBytes;
  if (SM.PeakBytes < 0)
    SM.PeakBytes = P.ArenaBytes;
  int Mid = R.middleLayer();
  json ByRole = json::object(), ByGroup = json::object();
  if (auto It = R.Stored.find(Mid); It != R.Stored.end())
    for (auto &[Name, Bytes] : It->second) {
      ByRole[Name] = Bytes;
      std::string Group = roleGroupName(roleGroup(*parseRole(Name))).str();
      ByGroup[Group] = ByGroup.value(Group, int64_t(0)) + Bytes;
    }
  json Layers = json::array();
  for (auto &[Layer, Roles] : R.Stored)
    Layers.push_back({{"layer", Layer}, {"bytes", R.layerBytes(Layer)}});
  ModelState MS = modelState(P);
  return {
      {"activation_bytes_per_layer", R.layerBytes(Mid)},
      {"activation_layer", Mid},
      {"activation_bytes_per_layer_by_role", ByRole},
      {"activation_bytes_per_layer_by_group", ByGroup},
      {"stored_bytes_by_layer", Layers},
      {"stored_activation_bytes", R.StoredBytes},
      {"stored_activation_peak_bytes", R.StoredPeakBytes},
      {"recompute_transient_bytes", R.RecomputeTransientBytes},
      {"layer_recompute", R.LayerRecompute},
      {"microbatches_in_flight", SM.InFlight},
      {"first_stage_activation_bytes", SM.FirstStageStored},
      {"parameter_bytes", MS.ParameterBytes},
      {"optimizer_state_bytes", MS.OptimizerBytes},
      {"gradient_bytes", MS.GradientBytes},
      {"model_state",
       {{"parameters", MS.Parameters},
        {"zero", MS.DataChunks ? 1 : 0},
        {"dp_chunks", MS.DataChunks},
        {"formula", MS.Formula},
        {"formula_parameter_bytes", MS.FormulaParameterBytes},
        {"formula_gradient_bytes", MS.FormulaGradientBytes},
        {"formula_optimizer_state_bytes", MS.FormulaOptimizerBytes},
        {"compute_copy_bytes", MS.CopyBytes},
        {"formula_compute_copy_bytes", MS.FormulaCopyBytes}}},
      {"peak_bytes_per_rank", SM.PeakBytes},
      {"stage_activation_bytes",
       SM.StageStored.empty() ? std::vector<int64_t>{SM.FirstStageStored}
                              : SM.StageStored},
      {"stage_arena_bytes",
       SM.StageArena.empty() ? std::vector<int64_t>{SM.PeakBytes}
                             : SM.StageArena},
  };
}

ModelState modelState(const Program &P) {
  ModelState M;
  for (const ProgramBuffer &B : P.Buffers) {
    if (B.K == ProgramBuffer::Param) {
      M.ParameterBytes += B.Bytes;
      M.Parameters += B.Type.numElements();
    }
    if (B.K == ProgramBuffer::State) {
      M.OptimizerBytes += B.Bytes;
      M.DataChunks = std::max(M.DataChunks, B.Shard.DataChunks);
    }
  }
  for (auto &[Name, Id] : P.Outputs)
    if (StringRef(Name).startswith("grad:"))
      M.GradientBytes += P.Buffers[Id].Bytes;
  int64_t CopyElements = 0;
  for (const Instruction &I : P.Instrs)
    if (I.Op == OpKind::Cast) {
      M.CopyBytes += P.Buffers[I.Out[0]].Bytes;
      CopyElements += P.Buffers[I.Out[0]].Type.numElements();
    }
  double Psi = double(M.Parameters);
  double E = Psi > 0 ? double(M.ParameterBytes) / Psi : 4;
  double D = M.DataChunks ? M.DataChunks : 1;
  std::string Bytes = std::to_string(int(E));
  M.FormulaParameterBytes = E * Psi;
  M.FormulaGradientBytes = E * Psi / D;
  M.FormulaOptimizerBytes = 8 * Psi / D;
  std::string Copies;
  if (CopyElements) {
    double C = double(M.CopyBytes) / double(CopyElements);
    M.FormulaCopyBytes = C * Psi;
    Copies = " + " + std::to_string(int(C)) + "Psi (16-bit compute copies)";
  }
  M.Formula = M.DataChunks
                  ? Bytes + "Psi (parameters) + " + Bytes +
                        "Psi/d (this rank's gradient chunks) + 8Psi/d "
                        "(AdamW m, v chunks), d = " +
                        std::to_string(M.DataChunks)
                  : Bytes + "Psi (parameters) + " + Bytes +
                        "Psi (gradients) + 8Psi (AdamW m, v)";
  M.Formula += Copies;
  return M;
}

json flopReportToJson(const ActivationReport &R, int Ranks,
                      const FlopFacts &F, int Microbatches) {
  double Model = (R.ForwardFlops + R.BackwardFlops) * Ranks * Microbatches;
  double Recompute = R.RecomputeFlops * Ranks * Microbatches;
  double Hardware = Model + Recompute;
  double B = F.Batch, L = F.Layers, S = F.Seq, H = F.Hidden, V = F.Vocab;
  double Paper = 72 * B * L * S * H * H * (1 + S / (6 * H) + V / (12 * H * L));
  return {
      {"counted", "GEMM FLOPs (2mnk per matrix product) of the forward, "
                  "backward and recompute instructions, times the "
                  "tensor-parallel (and context-parallel) ranks"},
      {"model_flops_per_iteration", Model},
      {"hardware_flops_per_iteration", Hardware},
      {"recompute_flops_per_iteration", Recompute},
      {"recompute_overhead", Model > 0 ? Hardware / Model - 1 : 0.0},
      {"paper_model_flops_per_iteration", Paper},
      {"model_vs_paper", Paper > 0 ? Model / Paper - 1 : 0.0},
      {"paper_selective_overhead", S / (6 * H)},
  };
}

ArrayRef<PaperConfig> paperConfigs() {
  static const PaperConfig Configs[] = {
      {"no parallelism", "none", false, false, RecomputeMode::None},
      {"tensor parallel (baseline)", "TP", true, false, RecomputeMode::None},
      {"tensor + sequence parallel", "TP+SP", true, true, RecomputeMode::None},
      {"tensor parallel + selective recompute", "TP+selective", true, false,
       RecomputeMode::Selective},
      {"tensor + sequence parallel + selective recompute", "TP+SP+selective",
       true, true, RecomputeMode::Selective},
      {"full recompute", "full recompute", true, false, RecomputeMode::Full},
      {"tensor parallel + fused attention", "TP+fused", true, false,
       RecomputeMode::None, /*FusedAttention=*/true},
      {"tensor + sequence parallel + fused attention", "TP+SP+fused", true,
       true, RecomputeMode::None, /*FusedAttention=*/true},
      {"tensor + sequence + context (c 2) + fused attention", "TP+SP+CP2+fused",
       true, true, RecomputeMode::None,
       /*FusedAttention=*/true, /*Context=*/2},
  };
  return Configs;
}

LayerFormula layerFormula(const ModelInfo &M, int T, bool SP,
                          RecomputeMode R, double E) {
  // Per token (s b of them), the values each layer stores, as the paper
  // counts them: the two norm inputs, the attention and MLP inputs (read
  // by the first linears; a parallel block's norms share their input, and
  // with one norm its output is both blocks' input), q and k (and v) for the
  // attention products, the projection input, the MLP's inner activations,
  // 1-byte dropout masks, the rotary tables when looked up per layer; per head
  // and query pair (a s^2 b), the attention core: the softmax output, and with
  // dropout its mask and output. Tensor parallelism splits what lies between f
  // and f-bar; sequence parallelism also the rest, except the rotary tables
  // (the attention sees whole sequences).
  double H = M.Hidden, F = M.Ffn ? M.Ffn : 4 * M.Hidden, A = M.Heads,
         S = M.Seq, SB = S * M.Batch, D = M.Heads ? H / A : H,
         G = M.KvHeads ? M.KvHeads : A;
  const FamilyDef &Fam = *M.Family;
  bool Selective = R == RecomputeMode::Selective;
  bool Repeat = Fam.GroupedKv && G != A;
  double Masks = M.BlockDropouts * H;
  double Rope = M.RopeLookup ? 2 * E * D : 0;
  // Norm inputs, attention and mlp inputs, masks, and the norms' f32
  // statistics (mean and 1/std per row; 1/rms for RMSNorm), which the paper
  // leaves out.
  double Stats = layerNorms(Fam) * Fam.NormStatsBytes;
  int Inputs = layerNormAndBlockInputs(Fam);
  double Replicated = E * Inputs * H + Masks + Stats;
  // q, k, v at the query heads (a GQA repeat is stored by the products),
  // or, when selective recomputation recomputes the repeat, at kv heads.
  // A fused core (fuse-attention) reads k, v at the kv heads, and stores
  // its output and a float32 log-sum-exp per head and query instead of the
  // a s^2 b core.
  bool Fused = M.FusedAttention;
  double KV = 2 * E * H * ((Selective || Fused) && Repeat ? G / A : 1);
  // (Unless merged, the output is stored twice: as the backward reads it
  // and merged as the projection's input.)
  double FusedStore = Fused ? (M.FusedMerged ? 0 : E * H) + 4 * A : 0;
  double Sharded = E * H + KV + E * H + Fam.MlpStored * E * F + FusedStore;
  double Core = Selective || Fused ? 0 : (M.Dropout ? 2 * E + 1 : E);
  LayerFormula L;
  std::string Div = T > 1 ? "/t" : "";
  std::string Act = StringRef(M.Activation).take_until(
      [](char C) { return C == ' '; }).str(); // "gelu erf" -> "gelu"
  std::string InnerTerm = formatv("{0}eF ({1} {2})", Fam.MlpStored, Act,
                                  Fam.MlpStoredText);
  std::string KVTerm = (Selective || Fused) && Repeat
                           ? "2eh g/a (k, v at kv heads)"
                           : "2eh (k, v)";
  const char *InputsText =
      Fam.Residual == ResidualKind::Sequential
          ? "(norm, attention and mlp inputs)"
      : Fam.Residual == ResidualKind::ParallelTwoNorms
          ? "(the norms' shared input, attention and mlp inputs)"
          : "(the norm's input, its output: the attention and mlp input)";
  std::string Rep =
      formatv("{0}eh {1}", Inputs, InputsText).str() +
      (M.BlockDropouts
           ? formatv(" + {0}h (dropout masks)", M.BlockDropouts).str()
           : "") +
      formatv(" + {0} (norm statistics)", int(Stats)).str();
  std::string Shd = "eh (q) + " + KVTerm + " + eh (proj input) + " + InnerTerm +
                    (!Fused           ? ""
                     : M.FusedMerged ? " + 4a (log-sum-exp)"
                                     : " + eh (attention output) + 4a (log-sum-exp)");
  std::string CoreText =
      Core == 0 ? "" : M.Dropout ? " + (2e + 1) a s^2 b" : " + e a s^2 b";
  std::string RopeText = M.RopeLookup ? " + 2e sb h/a (rotary tables)" : "";
  if (R == RecomputeMode::Full) {
    // A post-norm layer ends in a norm whose output is the next checkpoint:
    // it is not recomputed, so its statistics stay stored.
    L.Bytes = SB * (E * H + (M.PostNorm ? 8 : 0)) / (SP ? T : 1);
    L.Text = std::string("sb[eh (the layer input)") +
             (M.PostNorm ? " + 8 (its last norm's statistics)" : "") + "]" +
             (SP && T > 1 ? "/t" : "");
    return L;
  }
  if (SP) {
    L.Bytes = SB * (Replicated + Sharded) / T + Core * A * S * SB / T +
              SB * Rope;
    L.Text = "sb[" + Rep + " + " + Shd + "]" + Div + CoreText +
             (Core ? Div : "") + RopeText;
  } else {
    L.Bytes = SB * Replicated + SB * Sharded / T + Core * A * S * SB / T +
              SB * Rope;
    L.Text = "sb[" + Rep + "] + sb[" + Shd + "]" + Div + CoreText +
             (Core ? Div : "") + RopeText;
  }
  return L;
}

double table2Bytes(const PaperConfig &C, double A, double S, double B,
                   double H, double T) {
  // Context parallelism: every term is a rank's s / c positions' (the
  // fused core stores no s^2 term).
  S /= C.Context;
  double SBH = S * B * H, Attn = 5 * A * S / H;
  if (C.Recompute == RecomputeMode::Full)
    return SBH * 2;
  if (!C.TensorParallel)
    return SBH * (34 + Attn);
  if (C.Recompute == RecomputeMode::Selective)
    Attn = 0;
  // A fused core stores no a s^2 b term, but a float32 log-sum-exp per head
  // and query: 4 a s b bytes, split by t with the heads.
  if (C.FusedAttention)
    Attn = 4 * A / H;
  if (C.SequenceParallel)
    return SBH * (34 / T + Attn / T);
  return SBH * (10 + 24 / T + Attn / T);
}

} // namespace sp
