//===- Canonicalize.cpp - Exporter patterns to core ops -------------------===//
//
// Rewrites what ONNX exporters write into the core ops that later passes
// reason about. Patterns run in phases, each to a fixed point, because some
// match inside others (the Div by sqrt(2) in an erf GELU is not a scaling):
//
//  1. composites   LayerNormalization or its decomposition
//                  (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add)
//                  -> layer_norm; RMSNorm (Pow or Mul/ReduceMean/Add/Sqrt,
//                  then Div(1, .), Reciprocal or Div(x, .), Mul weight)
//                  -> rms_norm; x * Sigmoid(x) -> silu; erf GELU (Div/Erf/Add/Mul/Mul) and tanh
//                  GELU (Pow/Mul/Add/Mul/Tanh/Add/Mul/Mul) -> gelu;
//                  Identity and no-op Casts disappear.
//  2. layers       MatMul by a parameter (or its Transpose) plus a bias Add,
//                  and Gemm -> linear (2-D Gemm inputs reshaped from 3-D
//                  activations are folded back); Split + Reshape + Transpose
//                  -> split_heads; Transpose + Reshape -> merge_heads;
//                  MatMul of activations -> batch_matmul (trans_b absorbs a
//                  Transpose of the last two axes); Gather from a parameter
//                  table -> embedding.
//  3. pointwise    Div/Mul by a scalar constant -> scale; Where or Add with a
//                  constant causal mask -> causal_mask; Add of
//                  (1 - attention_mask) * fill -> padding_mask; Softmax -> softmax;
//                  Dropout -> dropout (or nothing, in inference mode);
//                  Add -> add.
//
// Each phase sweeps the node list until nothing changes. Patterns only create
// nodes and redirect uses; nodes left without users are erased between
// sweeps, so a pattern never sees a dead node.
//
// Causal masks are recognised from their values when the mask is a constant
// the compiler can evaluate (folded Trilu/Where subgraphs, or a tril buffer
// with data). Two forms are recognised on structure alone: a weight-free
// graph cannot read its mask buffer, so the torch/GPT-2 form
// `Where(Equal(Slice(buffer), 0), fill, scores)` (or with Not/Cast instead of
// Equal) on a [.., S, S] buffer is accepted, assuming the buffer is the
// lower-triangular tril that GPT-2 and nanoGPT register; and a mask built at
// run time too large to fold, `Not(Trilu(ConstantOfShape(true), 0, upper=0))`,
// is causal by construction.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/canonicalize/Rewriter.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {
namespace {
using namespace canonicalize;

//===----------------------------------------------------------------------===//
// Driver
//===----------------------------------------------------------------------===//

/// Applies the patterns until none matches; returns the number of rewrites.
unsigned runPhase(Graph &G, ArrayRef<Pattern> Patterns) {
  Rewriter R(G);
  unsigned Total = 0;
  for (bool Changed = true; Changed;) {
    Changed = false;
    R.forgetComputed();
    G.eraseDeadNodes();
    for (auto It = G.nodes().begin(); It != G.nodes().end();) {
      Node &N = *It++;
      if (N.isDead())
        continue;
      for (const Pattern &P : Patterns)
        if (P(R, N)) {
          Changed = true;
          ++Total;
          break;
        }
    }
  }
  G.eraseDeadNodes();
  G.removeUnusedConstants();
  return Total;
}

class CanonicalizePass : public Pass {
public:
  StringRef name() const override { return "canonicalize"; }

  Error run(Graph &G, PassContext &Ctx) override {
    // No-op Casts and Reshapes go first: composites look through them
    // (HF's RMSNorm casts to f32 and back around its weight).
    unsigned N0 = runPhase(G, {foldIdentity});
    unsigned N1 = runPhase(G, compositePatterns());
    unsigned N2 = runPhase(G, layerPatterns());
    unsigned N3 = runPhase(G, pointwisePatterns());
    Ctx.remarks() << formatv("canonicalize: {0} composite, {1} layer and {2} "
                            "pointwise rewrites\n",
                            N0 + N1, N2, N3);
    return Error::success();
  }
};

} // namespace

std::unique_ptr<Pass> createCanonicalizePass() {
  return std::make_unique<CanonicalizePass>();
}

} // namespace sp

