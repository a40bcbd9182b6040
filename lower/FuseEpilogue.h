//===- FuseEpilogue.h - GELU and residual adds fused ------------*- C++ -*-===//
//
// The program pass fuse-epilogue (lower/ProgramPasses.def; finalizeProgram
// runs it after fuse-softmax, before the memory plan): peephole fusions on a
// lowered program. An MLP's first linear and
// its GELU, in the backward the second linear's input gradient and the
// GELU's gradient, and a dropout and the residual add after it lower to
//
//   forward (and recompute):  z = linear {trans_w} (x, w, b?)
//                             y = gelu {approximate} (z)
//                             d, mask = dropout {ratio, key, ..} (p)
//                             h = add (d, r)        (or add (r, d))
//   backward:                 d = linear {trans_w} (dy, w)
//                             dz = gelu_grad {approximate} (z, d)
//
// and each pair becomes one instruction (ir/Ops.def):
//
//   z, y    = linear_gelu {trans_w, approximate} (x, w, b?)
//   h, mask = dropout_add {ratio, key, ..} (p, r)
//   dz      = linear_gelu_grad {trans_w, approximate} (dy, w, z)
//
// Their backends run the GEMM and then the GELU on its result (the gradient
// in place), and the dropout with the residual added as each piece is
// written, so the backward's d and the forward's dropped-out d need no
// buffer of their own: per layer one [b, s, 4h/t] temporary fewer in the
// backward and two [b, s, h] ones (the attention's and the MLP's residual
// branches) in the forward. The results are bitwise the pairs': every fused
// op is elementwise on the same values, rounded the same way.
//
// linear + gelu drops no buffer (gelu_grad reads z); the fused instruction
// takes the linear's place, since y's readers all come after it. The other
// two drop the intermediate d, a temporary read by the second instruction
// alone, and take the second one's place, when nothing in between writes
// the first one's operands (or, for the dropout, reads its mask). All need
// the two in one phase, a plain linear (not a vocabulary-parallel head's),
// an add of two values of one type (not a broadcast), and float32 or float64
// buffers: in a bf16 or fp16 plan the intermediate is rounded to 16 bits
// before the second op reads it, which the fused op would skip, so those are
// left alone.
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_FUSEEPILOGUE_H
#define SP_LOWER_FUSEEPILOGUE_H

#include "plan/Program.h"

namespace sp {

/// Fuses every linear + gelu, linear + gelu_grad and dropout + add pair of P
/// (see above); returns how many instructions were removed.
int fuseEpilogues(Program &P);

} // namespace sp

#endif // SP_LOWER_FUSEEPILOGUE_H
