//===- Passes.h - Pass factories -------------------------------*- C++ -*-===//
#ifndef SP_PASSES_PASSES_H
#define SP_PASSES_PASSES_H

#include "passes/Pass.h"

namespace sp {

#define SP_PASS(Name, Factory, Summary) std::unique_ptr<Pass> Factory();
#include "passes/Passes.def"

/// The default pass list of sp-compile, as a --passes value: import clean-up
/// and detection, the parallel passes (no-ops without --tp and --sp), then
/// the training graph, its pipeline stages and data-parallel sums (no-ops
/// without --pp/--microbatches and --dp).
/// DefaultPasses in two parts: the import clean-up, detection and input
/// binding, which no layout option changes, then the passes that shard,
/// differentiate, recompute and place the graph. The planner's search runs
/// the first part once and each layout's second part on a copy.
constexpr const char *LayoutFreePasses =
    "constant-fold,canonicalize,dce,detect-transformer,bind-inputs";
constexpr const char *LayoutPasses =
    "tensor-parallel,sequence-parallel,fuse-attention,context-parallel,"
    "autodiff,lower-collectives,optimizer,recompute,pipeline-stages,"
    "data-parallel,collective-matmul";
constexpr const char *DefaultPasses =
    "constant-fold,canonicalize,dce,detect-transformer,bind-inputs,"
    "tensor-parallel,"
    "sequence-parallel,fuse-attention,context-parallel,autodiff,"
    "lower-collectives,optimizer,recompute,"
    "pipeline-stages,data-parallel,collective-matmul";

} // namespace sp

#endif // SP_PASSES_PASSES_H
