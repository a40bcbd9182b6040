//===- Cost.h - FLOPs of a node or an instruction --------------*- C++ -*-===//
//
// The FLOP count the reports, the recompute pass and the pipeline cost model
// share. Like the paper (its appendix, and Table 5's model FLOPs), only the
// matrix multiplications count: 2 m n k per GEMM of an [m, k] by [k, n]
// product. Elementwise ops, softmax, LayerNorm and the collectives count
// zero; they are memory-bound and the paper ignores them too.
//
//===----------------------------------------------------------------------===//
#ifndef SP_ANALYSIS_COST_H
#define SP_ANALYSIS_COST_H

#include "ir/IR.h"
#include "plan/Program.h"

namespace sp {

/// The GEMM FLOPs of one execution on one rank: linear (forward and input
/// gradient), linear_grad_w, batch_matmul and the fused attention's
/// products; zero for every other op.
double gemmFlops(OpKind Op, const AttrList &Attrs, const TensorType &In0,
                 const TensorType &Out0);
double gemmFlops(const Node &N);
double gemmFlops(const Program &P, const Instruction &I);

/// The part of a backward instruction's gemmFlops that recomputes forward
/// products: the q k^T that the fused attention's backward computes again
/// from q, k and the log-sum-exp. The reports count it as recomputation.
double recomputeGemmFlops(const Program &P, const Instruction &I);

} // namespace sp

#endif // SP_ANALYSIS_COST_H
