//===- MemoryReport.h - The memory and FLOP reports of a plan ---*- C++ -*-===//
//
// The "memory" and "flops" objects of the compile report, from the stored
// activations of a program (analysis/Activations.h); a program's run
// statistics; the model state as ZeRO counts it; and the paper's per-layer
// formulas (Table 2, and each family's formula from its FamilyDef record)
// that the report compares with the plan.
//
//===----------------------------------------------------------------------===//
#ifndef SP_REPORTS_MEMORYREPORT_H
#define SP_REPORTS_MEMORYREPORT_H

#include "analysis/Activations.h"
#include "analysis/ModelInfo.h"
#include "passes/Pass.h"
#include "plan/Program.h"
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sp {


/// A program as it runs, one training step: its instructions and buffers
/// written out, the largest sum of temporaries live at one instruction, and
/// the largest sum of stored activations (ActivationReport::StoredPeakBytes).
/// A compact program is walked step by step (prepareCompactRun), not written
/// out, and gives the numbers of expandProgram's flat program.
struct RunStats {
  int64_t Instructions = 0, Buffers = 0;
  int64_t PeakLiveTempBytes = 0, StoredPeakBytes = 0;
};
llvm::Expected<RunStats> runStats(const Program &P);

/// Roles of the attention core (QK^T, scale, mask, softmax, its dropout,
/// attention over V): what selective recomputation drops.
// (isAttentionCoreRole: ir/Role.h.)

/// What the first pipeline stage's program stores over a whole step
/// (every microbatch it keeps in flight), and the largest planned arena of
/// any stage. Without stages: the one program's stored peak and arena.
struct StageMemory {
  int64_t FirstStageStored = -1;
  int InFlight = 1;
  int64_t PeakBytes = -1;
  /// Every pipeline rank's stored activations and planned arena.
  std::vector<int64_t> StageStored, StageArena;
};

/// The "memory" object of the JSON report: R is one microbatch through the
/// whole model (the per-layer numbers), P the first stage's program.
nlohmann::json memoryReportToJson(const ActivationReport &R, const Program &P,
                                  StageMemory SM = {});

/// The model's state on one rank of program P, as ZeRO counts it
/// (Rajbhandari et al., 2020): Psi parameter elements of e bytes, their
/// gradients kept for the optimizer (e bytes each; with --zero 1 this
/// rank's chunk, e Psi / d) and AdamW's two fp32 moments (8 Psi; with
/// --zero 1, 8 Psi / d). The plan's bytes beside the formula's; they
/// differ only by the zero padding of chunks.
struct ModelState {
  int64_t Parameters = 0; // Psi, on this rank
  int DataChunks = 0;     // d with --zero 1, else 0
  int64_t ParameterBytes = 0, GradientBytes = 0, OptimizerBytes = 0;
  /// Mixed precision: the parameters' bf16 / fp16 copies that the forward
  /// and backward read (temporaries of the step, live through it).
  int64_t CopyBytes = 0;
  double FormulaParameterBytes = 0, FormulaGradientBytes = 0,
         FormulaOptimizerBytes = 0, FormulaCopyBytes = 0;
  std::string Formula;
};
ModelState modelState(const Program &P);

/// The "flops" object: per rank and per iteration (times Ranks, the
/// tensor-parallel group), model FLOPs (forward and backward) and hardware
/// FLOPs (recomputation included), beside the paper's
/// 72 B L s h^2 (1 + s/6h + v/12hL).
struct FlopFacts {
  int64_t Batch, Layers, Seq, Hidden, Vocab;
};
nlohmann::json flopReportToJson(const ActivationReport &R, int Ranks,
                                const FlopFacts &F, int Microbatches = 1);

/// The activation bytes of one layer by the family's formula: the paper's
/// Section 4 count (Eq. 1-4) extended to GQA, SwiGLU, RMSNorm, rotary
/// tables and models without dropout. E is the activation element size
/// (masks are 1 byte; norm statistics are ignored, as in the paper). Text
/// is the formula with the model's sizes left symbolic.
struct LayerFormula {
  std::string Text;
  double Bytes = 0;
};
LayerFormula layerFormula(const ModelInfo &M, int T, bool SP,
                          RecomputeMode R, double E);

/// The six configurations of the paper's Table 2 and two with a fused
/// attention core (fuse-attention), and the formula for the activation bytes
/// of one layer (fp16 activations, 1-byte masks, LayerNorm statistics
/// ignored): Table 2's, and for a fused core Table 2's without the 5as/h
/// term plus the float32 log-sum-exp, 4 a s b / t bytes.
struct PaperConfig {
  const char *Name;
  const char *Short; // for charts
  bool TensorParallel, SequenceParallel;
  RecomputeMode Recompute;
  bool FusedAttention = false;
  /// Context-parallel ranks (--cp): each stores its s / c positions'.
  int Context = 1;
};
llvm::ArrayRef<PaperConfig> paperConfigs();
double table2Bytes(const PaperConfig &C, double A, double S, double B,
                   double H, double T);

} // namespace sp

#endif // SP_REPORTS_MEMORYREPORT_H
