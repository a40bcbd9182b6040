//===- OpTable.h - Building the op definitions ------------------*- C++ -*-===//
//
// Private to ir/: the table the op files fill (one function per file, called
// once by opDef) and the pieces the definitions share.
//
//===----------------------------------------------------------------------===//
#ifndef SP_IR_OPS_OPTABLE_H
#define SP_IR_OPS_OPTABLE_H

#include "ir/OpDef.h"

namespace sp {

/// The definitions, indexed by OpKind.
using OpTable = std::vector<OpDef>;

void addModelOps(OpTable &T);    // ir/ops/ModelOps.cpp
void addTrainingOps(OpTable &T); // ir/ops/TrainingOps.cpp
void addParallelOps(OpTable &T); // ir/ops/ParallelOps.cpp

namespace ops {

/// Fails unless operand I has at least MinRank dimensions.
llvm::Error expectRank(const ShapeArgs &A, unsigned I, unsigned MinRank);

/// One result typed like operand 0.
llvm::Expected<TypeList> sameAsOperand0(const ShapeArgs &A);

/// The layout of an elementwise result computed from a value laid out as S:
/// S, without what only a parameter has (blocks, padding, summed grads).
Sharding elementwiseLayout(Sharding S);

/// Elementwise and row-wise ops: operand 0's layout (the default rule).
Sharding keepLayout(const Node &N);

/// An elementwise activation f(x) whose gradient is f_grad(x, dy) =
/// dy f'(x), with the node's attributes passed on; f_grad is its pair in
/// ir/OpDef.cpp's UnaryOps (the SP_UNARY_OP lines, and gelu).
OpDef unaryOp(std::vector<OpAttrDecl> Attrs = {});
/// Its gradient op: (x, dy) -> dx.
OpDef unaryGradOp(std::vector<OpAttrDecl> Attrs = {});

} // namespace ops
} // namespace sp

#endif // SP_IR_OPS_OPTABLE_H
