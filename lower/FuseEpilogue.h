//===- FuseEpilogue.h - GELU in the GEMM's epilogue --------------*- C++ -*-===//
//
// A peephole fusion on a lowered program (finalizeProgram runs it after
// fuseAttentionSoftmax, before the memory plan). An MLP's first linear and
// its GELU, and in the backward the second linear's input gradient and the
// GELU's gradient, lower to
//
//   forward (and recompute):  z = linear {trans_w} (x, w, b?)
//                             y = gelu {approximate} (z)
//   backward:                 d = linear {trans_w} (dy, w)
//                             dz = gelu_grad {approximate} (z, d)
//
// and each pair becomes one instruction (ir/Ops.def):
//
//   z, y = linear_gelu {trans_w, approximate} (x, w, b?)
//   dz   = linear_gelu_grad {trans_w, approximate} (dy, w, z)
//
// whose backends run the GEMM and then the GELU on its result (the
// gradient in place, runtime/cpu: cpu::linearGeluBackward), so the
// backward's d needs no buffer of its own: one [b, s, 4h/t] temporary
// fewer per layer. The results are bitwise the pair's: the GELU is
// elementwise and reads the same float32 GEMM result.
//
// The forward keeps z (gelu_grad reads it) and drops no buffer; the fused
// instruction takes the linear's place, since y's readers all come after it.
// The backward drops d, a temporary read by the gelu_grad alone; the fused
// instruction takes the gelu_grad's place, when nothing in between writes
// the linear's operands. Both need the two in one phase, a plain linear
// (not a vocabulary-parallel head's), and float32 or float64 buffers: in a
// bf16 or fp16 plan z is rounded to 16 bits before the GELU reads it, which
// a tile epilogue of the float32 sums would skip, so those are left alone.
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_FUSEEPILOGUE_H
#define SP_LOWER_FUSEEPILOGUE_H

#include "plan/Program.h"

namespace sp {

/// Fuses every linear + gelu and linear + gelu_grad pair of P (see above);
/// returns how many instructions were removed.
int fuseGeluEpilogues(Program &P);

} // namespace sp

#endif // SP_LOWER_FUSEEPILOGUE_H
