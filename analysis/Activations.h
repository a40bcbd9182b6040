//===- Activations.h - What a program stores for its backward -*- C++ -*-===//
//
// What a plan stores between its forward and its backward, read off the
// lowered program rather than any formula: a stored activation is a
// temporary that a forward instruction defines and a backward or recompute
// instruction reads. Which forward values those are is exactly what the
// gradient rules declare (savedForBackward) after the recompute pass has
// redirected the backward to its clones; their sizes are the planned buffer
// sizes (the plan's activation dtype, 1-byte masks, f32 LayerNorm
// statistics and logits).
//
// A stored value belongs to the layer whose backward (or recomputation)
// reads it first, and is filed under that reader's role: a layer's input
// belongs to the layer (its ln1 saves it), as Table 2 counts it. The
// recompute pass's budgeted mode and the memory report read it.
//
//===----------------------------------------------------------------------===//
#ifndef SP_ANALYSIS_ACTIVATIONS_H
#define SP_ANALYSIS_ACTIVATIONS_H

#include "plan/Program.h"
#include <map>
#include <string>
#include <vector>

namespace sp {

struct ActivationReport {
  /// Stored bytes by layer (-1: outside the layers: embedding, final norm,
  /// head, loss), then by the role of the first reader.
  std::map<int, std::map<std::string, int64_t>> Stored;
  /// Every stored activation of one microbatch, and the largest sum of them
  /// live at one instruction (equal unless the backward frees some before
  /// the forward ends).
  int64_t StoredBytes = 0, StoredPeakBytes = 0;
  /// The largest sum of live temporaries that recompute instructions define
  /// (the transient recomputation buffers, not counted as stored).
  int64_t RecomputeTransientBytes = 0;
  /// GEMM FLOPs of this rank's program, by phase.
  double ForwardFlops = 0, BackwardFlops = 0, RecomputeFlops = 0;
  int Layers = 0;
  /// What each layer recomputes: "none", "selective" (the attention core
  /// only) or "full".
  std::vector<std::string> LayerRecompute;

  int64_t layerBytes(int Layer) const;
  /// The layer Table 2 describes: one in the middle.
  int middleLayer() const { return Layers / 2; }
};

ActivationReport analyzeActivations(const Program &P);

/// Whether a backward-side instruction reading a temporary that Def
/// defined makes it a stored activation (a parameter's 16-bit copy is model
/// state, not an activation).
bool storedBy(const Instruction &Def, const Instruction &Reader);

} // namespace sp

#endif // SP_ANALYSIS_ACTIVATIONS_H
