//===- CausalProducts.h - Causal structure of attention GEMMs -*- C++ -*-===//
//
// The program pass causal-products (lower/ProgramPasses.def; finalizeProgram
// runs it after the fusions, before the memory plan): a peephole pass on a
// lowered program. In a causal attention core half of
// every [s, s] matrix is known: the scores above the diagonal are masked,
// so the probabilities there are 0 and so are their gradients. The batched
// products around the core need not compute or read that half:
//
//   forward (and recompute):  S  = batch_matmul (q, k^T)   -> causal
//                             P  = softmax {causal} (S); D = dropout (P)
//                             O  = batch_matmul (D, v)     -> causal_a
//   backward:                 dD = batch_matmul (dO, v^T)  -> causal
//                             dV = batch_matmul (D^T, dO)  -> causal_a
//                             dS = softmax_grad {causal} (P, dropout_grad (dD))
//                             dQ = batch_matmul (dS, k)    -> causal_a
//                             dK = batch_matmul (dS^T, q)  -> causal_a
//
// - causal_a (the first operand is zero above its diagonal) is set when that
//   operand is made, in the program and not overwritten before the product,
//   by a causal softmax with fill -inf (its masked probabilities are exactly
//   0), a causal softmax_grad or causal_mask with fill 0, or a dropout of
//   such a value. The product then skips terms that are exact zeros, so its
//   value is the same up to the order of the float additions.
// - causal (compute only the lower triangle, write 0 above it) is set when
//   the product's result is a temporary whose only reader ignores the upper
//   triangle: a causal softmax (it never reads the masked scores), or a
//   causal softmax_grad as its dy, directly or through a dropout_grad read
//   by nothing else, when the softmax_grad's y is itself zero above the
//   diagonal (then dy's masked half only ever meets y's zeros).
// - A dropout of a value zero above its diagonal is marked causal (its mask
//   is 0 there, not drawn) when nothing reads the mask (a recomputed
//   layer's forward) or only a dropout_grad whose result feeds such a
//   softmax_grad: the masked elements' bits meet only y's zeros. The mask
//   below the diagonal is unchanged, so are the dropout's results.
//
// A compact program's templates are marked each on its own, then once more
// assembled (finalizeCompact), where a pipelined backward sees the
// probabilities and the mask its chunk's forward left in the slots (the
// forward template comes first in the instructions, as its steps run first
// for each microbatch, and nothing else writes a slot value). Only float32
// and float64 products are marked (16-bit plans keep their bf16 GEMM path).
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_CAUSALPRODUCTS_H
#define SP_LOWER_CAUSALPRODUCTS_H

#include "plan/Program.h"

namespace sp {

/// Sets causal and causal_a on the batch_matmul instructions of P whose
/// operands or readers have causal structure, and causal on such dropouts
/// (see above); returns how many attributes it set.
int markCausalProducts(Program &P);

} // namespace sp

#endif // SP_LOWER_CAUSALPRODUCTS_H
