//===- FuseSoftmax.h - One softmax for the attention core -------*- C++ -*-===//
//
// The program pass fuse-softmax (lower/ProgramPasses.def; the first rewrite
// finalizeProgram runs, before the memory plan): a peephole fusion on a
// lowered program of the unfused attention core (--attention unfused; not to
// be confused with the graph pass fuse-attention, which replaces the whole
// core by one attention op before autodiff). The core lowers to
//
//   forward (and recompute):  s = scale {alpha} (x); m = causal_mask {fill} (s);
//                             y = softmax (m)
//   backward:                 d = softmax_grad (y, dy); e = causal_mask {fill}
//                             (d); dx = scale {alpha} (e)
//
// and each chain becomes one instruction carrying the scale and the mask as
// attributes (ir/ops/ModelOps.cpp):
//
//   y  = softmax {alpha, causal = 1, fill} (x)
//   dx = softmax_grad {alpha, causal = 1, fill} (y, dy)
//
// which mean exactly the unfused sequence, in that order (the CPU backend
// runs the three kernels in place into the result; the CUDA backend's fused
// kernels make the same roundings), so results are bitwise unchanged. A
// chain without the mask (scale, softmax) or without the scale (causal_mask,
// softmax) fuses too. A chain fuses only when every intermediate is a
// temporary read by the next instruction alone (not a program output), the
// instructions share their phase, and nothing else sits in the pattern (a
// padding_mask between the scale and the softmax stops it).
//
// The intermediates' instructions and buffers are removed and the program
// compacted: buffers renumbered (a result named "%N" is renamed after its new
// number), instruction indices, live ranges and outputs remapped, so the
// memory plan never sees the removed tensors.
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_FUSESOFTMAX_H
#define SP_LOWER_FUSESOFTMAX_H

#include "plan/Program.h"

namespace sp {

/// Fuses every attention-core chain of P (see above); returns how many
/// instructions were removed. P must not be memory-planned yet (offsets are
/// left as they are).
int fuseAttentionSoftmax(Program &P);

} // namespace sp

#endif // SP_LOWER_FUSESOFTMAX_H
