//===- Pass.h - The pass interface -----------------------------*- C++ -*-===//
//
// A pass transforms a Graph in place. Passes are stateless objects created by
// a factory listed in Passes.def; anything a pass learns that later passes
// need is written into the IR itself (tags, attributes), so that every pass
// can also run alone on textual IR through sp-opt.
//
//===----------------------------------------------------------------------===//
#ifndef SP_PASSES_PASS_H
#define SP_PASSES_PASS_H

#include "ir/IR.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sp {

/// Hyper-parameters of the optimizer pass (AdamW), set by the tools.
struct OptimizerOptions {
  double Beta1 = 0.9, Beta2 = 0.95, Eps = 1e-8;
  double WeightDecay = 0.1; // matrices and embeddings only
  double MaxGradNorm = 1.0; // global-norm clipping; 0 disables it
};

/// What the recompute pass drops from the forward and recomputes in the
/// backward.
enum class RecomputeMode {
  None,      // keep every saved value
  Selective, // the attention core (Section 5 of the paper)
  Full,      // keep only the input of every K layers
  Auto,      // the least extra FLOPs that fit MemoryBudget
};

/// "none", "selective", "full" or "auto" (as --recompute spells them).
inline llvm::StringRef recomputeModeName(RecomputeMode M) {
  switch (M) {
  case RecomputeMode::None:
    return "none";
  case RecomputeMode::Selective:
    return "selective";
  case RecomputeMode::Full:
    return "full";
  case RecomputeMode::Auto:
    return "auto";
  }
  return "?";
}

struct RecomputeOptions {
  RecomputeMode Mode = RecomputeMode::None;
  /// Full: keep the input of every group of K consecutive layers.
  int Layers = 1;
  /// Auto: the planned peak bytes per rank must not exceed this.
  int64_t MemoryBudget = 0;
  /// When not empty: each layer's mode (None, Selective or Full; one entry
  /// per layer), instead of Mode. The planner gives each pipeline rank's
  /// layers that rank's mode: more recomputation on the first ranks, which
  /// hold the most microbatches (stage-aware recomputation).
  std::vector<RecomputeMode> LayerModes;
  /// With LayerModes, when not empty: each layer's K (one entry per layer,
  /// at least 1). Consecutive full layers of the same K are recomputed K at
  /// a time from each group's first input, as Layers does for uniform full
  /// recomputation; other layers ignore theirs.
  std::vector<int> LayerGroups;
};

/// The recomputation group of each of the L layers under O, numbered from
/// 0 in layer order. A group's layers are recomputed together from its
/// first layer's input, so a pipeline stage holds whole groups. Without
/// grouping (no full recomputation of groups: Layers 1 and no LayerGroups
/// above 1) every layer is its own group. Uniform full recomputation with
/// Layers = K groups layers K at a time from layer 0 (the last group may be
/// shorter); with LayerModes, each run of consecutive full layers of the
/// same K is cut K at a time from its first layer.
std::vector<int> recomputeGroups(const RecomputeOptions &O, int L);

/// How a training step is pipelined (pipeline pass, and the unrolling of
/// the schedule into per-stage programs).
enum class PipelineSchedule { GPipe, OneFOneB, Interleaved, ZeroBubbleH1 };
struct PipelineOptions {
  int Stages = 1;       // --pp P: pipeline ranks
  int Interleave = 1;   // --interleave M: model chunks (virtual stages) per rank
  int Microbatches = 1; // --microbatches N per step (gradients accumulate)
  PipelineSchedule Schedule = PipelineSchedule::OneFOneB;
  bool Uniform = false; // --pp-partition uniform: equal layer counts
  bool enabled() const { return Stages > 1 || Microbatches > 1; }
};

/// What passes may read besides the graph: user options and a stream for
/// remarks. Options are plain values set by the tools.
struct PassContext {
  /// Where remarks go (--remarks: stderr); null: nowhere.
  llvm::raw_ostream *Remarks = nullptr;
  /// The remark stream, or, without one, a null stream of the calling
  /// thread's own (one shared null stream, written by passes that compile
  /// concurrently, is a data race on its buffer).
  llvm::raw_ostream &remarks() const {
    if (Remarks)
      return *Remarks;
    thread_local llvm::raw_null_ostream Nowhere;
    return Nowhere;
  }
  OptimizerOptions Optimizer;
  /// Tensor-parallel group size (tensor-parallel pass) and whether the
  /// LayerNorm/dropout regions are sharded along the sequence
  /// (sequence-parallel pass).
  int TensorParallel = 1;
  bool SequenceParallel = false;
  /// Context parallelism (context-parallel pass): every activation holds
  /// this rank's 1/C of the sequence, and attention gets the other ranks'
  /// keys and values over the cp group, by ContextComm ("ring", "a2a" or
  /// "a2a+ring": the all-to-all inside groups of ContextAllToAll
  /// consecutive cp ranks, the ring across them).
  int ContextParallel = 1;
  std::string ContextComm = "ring";
  int ContextAllToAll = 1;
  /// --tp-comm-overlap: the collective-matmul pass cuts each forward
  /// all-gather that feeds a linear into a ring of chunk shifts and chunk
  /// GEMMs (passes/CollectiveMatmul.cpp).
  bool TpCommOverlap = false;
  /// Data-parallel replicas (data-parallel pass): each trains on its own
  /// rows of the step's batch, and gradients are summed over them.
  int DataParallel = 1;
  /// The largest data-parallel gradient bucket, in bytes: the gradient sums
  /// are grouped into all-reduces of at most this size (one gradient larger
  /// than it is a bucket of its own), each issued as soon as the backward has
  /// made its last gradient (lower/GradientBuckets.h). 25 MiB, as PyTorch
  /// DDP's default.
  int64_t DataParallelBucketBytes = int64_t(25) << 20;
  /// ZeRO stage (--zero): 1 shards the AdamW moments over the replicas
  /// (gradients reduce-scattered, each rank updating its chunk of every
  /// parameter, the chunks all-gathered); 0 keeps them whole on every rank.
  int Zero = 0;
  /// --attention fused: the fuse-attention pass replaces each layer's
  /// attention core by one attention op (runtime/cpu/Attention.h). sp-compile
  /// sets it by default; a PassContext made in code keeps the paper's ops
  /// unless it asks (the unit tests' layouts, the CUDA backend's tests).
  bool FusedAttention = false;
  RecomputeOptions Recompute;
  PipelineOptions Pipeline;
  /// The activation dtype the program will be planned with (passes that
  /// plan memory, such as recompute auto, size buffers with it).
  DType ActivationDtype = DType::F32;
  /// fp16's dynamic loss scaling (runtime/Executor.h LossScaling): the
  /// initial scale (a power of two) and the clean steps between doublings.
  double LossScale = 65536;
  int64_t LossScaleWindow = 2000;
  /// --input NAME=ROLE: what an input is, where the structure cannot tell
  /// (bind-inputs).
  std::vector<std::pair<std::string, InputRole>> InputBindings;
};

class Pass {
public:
  virtual ~Pass() = default;
  /// The registered kebab-case name.
  virtual llvm::StringRef name() const = 0;
  /// Runs on G. An error leaves G in an unspecified but valid state; the
  /// message names the node and the cause.
  virtual llvm::Error run(Graph &G, PassContext &Ctx) = 0;
};

/// A registered pass: the one table (Passes.def) lists them all.
struct PassInfo {
  const char *Name;
  const char *Summary;
  std::unique_ptr<Pass> (*Create)();
};
llvm::ArrayRef<PassInfo> registeredPasses();
const PassInfo *lookupPass(llvm::StringRef Name);

} // namespace sp

#endif // SP_PASSES_PASS_H
