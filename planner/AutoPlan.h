//===- AutoPlan.h - sp-compile --auto: the fastest plan that fits -*- C++
//-*-===//
//
// The auto-parallel planner (issue 16), first version. From a model, a GPU
// count, a memory size and a global batch it searches the layouts:
//
//   t    a divisor of the heads (and key/value heads), at most the GPUs of a
//        node, dividing the GPU count
//   SP   on or off (t > 1)
//   p    a divisor of N / t, at most the layers; m chunks per rank (up to 4,
//        p m at most the layers; interleaved needs the microbatches to be a
//        multiple of p)
//   c    context parallelism, for long sequences (s >= ContextMinSeq): a
//        divisor of N / (t p) with s / c positions per rank cut into two
//        zigzag chunks (s divisible by 2c; by 2c t with SP), the fused
//        core only
//   d    N / (t p c); the microbatches B / (d b), b the model's batch
//   the recomputation: none or full with the fused attention core (with
//        --attention unfused, the unfused core the CUDA backend runs), or
//        the paper's selective (unfused core)
//   ZeRO-1 when d > 1
//
// A layout whose parameters and optimizer state alone exceed the memory on
// every rank (a lower bound: the ranks share them at best evenly) is
// rejected without compiling, with that reason. Within a family of the same
// t, p, m, d and ZeRO, the member that stores the least (SP, full
// recomputation) is compiled first, and when it does not fit the others are
// not compiled (the brute-force test checks that this loses no layout that
// fits). Every other layout is compiled as
// sp-compile would compile it, so its memory is the planned peak (the
// largest rank's arena), exact, and its step time is the cost model's
// (planner/CostModel.h) on the compiled programs. The fastest that fits is
// the answer. A family whose smallest member does not fit tries full
// recomputation of groups of 2, 4 and 8 layers (a stage holds whole groups),
// the fewest that fits. A pipelined family whose plain member (no
// recomputation) does not fit, but whose member with full (or, with the unfused
// core, selective) recomputation does, also gets stage-aware members: that
// recomputation on its first k ranks only, the rest storing everything,
// the fewest k that fit (k = 1 first: when that member is no faster than
// the fastest uniform fit, no k is, and the pair stops there; then
// bisection), likewise between selective and full; and the member where
// each rank takes the cheapest level whose uniform member fits on that
// rank. Where only groups of K layers fit a pipelined family, full
// recomputation in groups of K is its top level (its uniform members
// storing more are then compiled too, as the lower levels). The fastest fit's
// compilation is kept, and only its reports are made at the end. Not yet:
// screening by compiling one layer per combination instead of whole plans.
//
//===----------------------------------------------------------------------===//
#ifndef SP_PLANNER_AUTOPLAN_H
#define SP_PLANNER_AUTOPLAN_H

#include "ir/IR.h"
#include "driver/Compile.h"
#include "planner/CostModel.h"
#include "passes/Pass.h"
#include "llvm/Support/raw_ostream.h"
#include <nlohmann/json.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sp {

/// The shortest sequence --auto tries context parallelism on: below it the
/// activations of one rank's whole sequence are small beside the layer's
/// weights, and the ring's transfers would outweigh its attention.
constexpr int64_t ContextMinSeq = 8192;

struct AutoOptions {
  int Gpus = 0;
  /// The most any rank's planned arena may take, in bytes.
  double GpuMemory = 0;
  /// Sequences per step over all replicas; 0: one per GPU times the
  /// model's batch.
  int64_t GlobalBatch = 0;
  ClusterSpec Cluster;
  /// Rows of the ranked table printed.
  int Top = 10;
  /// The model file (the plan's "source").
  std::string Source;
};

/// One layout tried.
struct AutoCandidate {
  int T = 1, P = 1, M = 1, D = 1, Microbatches = 1, Zero = 0;
  /// Context-parallel ranks per replica (--cp).
  int Cp = 1;
  bool SP = false;
  /// "none", "selective" (the unfused core's scores and probabilities) or
  /// "full"; none and full with the fused attention core unless the search
  /// was told --attention unfused.
  std::string Recompute = "none";
  /// Full recomputation of groups of FullEvery layers: only each group's
  /// first input is stored (--recompute-layers).
  int FullEvery = 1;
  /// Stage-aware: each pipeline rank's recomputation (empty: every rank's
  /// is Recompute; else the last rank's is), and from it each layer's; with
  /// the group size K of a rank's (layer's) full recomputation (empty: 1
  /// on every rank).
  std::vector<RecomputeMode> RankModes, LayerModes;
  std::vector<int> RankGroups, LayerGroups;
  bool staged() const { return !RankModes.empty(); }
  /// Rank R's level as printed: "none", "selective", "full" or "full every
  /// K".
  std::string rankLevel(int R) const;
  /// Once compiled: each pipeline rank's planned arena, the largest
  /// persistent region (parameters, gradients, optimizer state, inputs),
  /// and, when pipelined, each layer's pipeline rank.
  std::vector<int64_t> RankBytes;
  int64_t PersistentBytes = 0;
  std::vector<int> LayerRanks;
  /// Compiled: the largest rank's arena and the cost model's step.
  int64_t PeakBytes = 0;
  StepEstimate Step;
  std::string describe() const;
};

struct AutoResult {
  /// Every compiled layout that fits, fastest first; and every one that
  /// does not (in the order of the search's rounds).
  std::vector<AutoCandidate> Fits, TooBig;
  /// Why the others were not taken, one line per family (or layout).
  std::vector<std::string> Rejected;
  /// The fastest that fits, compiled (its plan is what -o writes), and its
  /// graph after the passes.
  std::optional<Compilation> Best;
  std::unique_ptr<Graph> BestGraph;
  /// Layouts compiled, and layouts not compiled because the smallest of
  /// their family (SP and full recomputation) did not fit.
  int Compiled = 0, Skipped = 0;
  double Seconds = 0;
  /// The attention core of the layouts without selective recomputation
  /// (the options' --attention).
  bool FusedAttention = true;
};

/// Base's options with C's parallelism and recomputation: what --auto
/// compiles C with.
PassContext layoutContext(const PassContext &Base, const AutoCandidate &C);

/// Searches the layouts of the imported graph G (Base holds the options
/// that are not searched: dtype, optimizer, ...). Errors when no layout
/// fits, naming the smallest memory that would have taken one.
llvm::Expected<AutoResult> searchLayouts(const Graph &G,
                                         const PassContext &Base,
                                         const AutoOptions &O);

/// The ranked table and the rejections, as sp-compile prints them.
void printSearch(const AutoResult &R, const AutoOptions &O,
                 llvm::raw_ostream &OS);

/// The search as JSON (--report's "auto").
nlohmann::json searchToJson(const AutoResult &R, const AutoOptions &O);

} // namespace sp

#endif // SP_PLANNER_AUTOPLAN_H
