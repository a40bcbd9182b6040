//===- Autodiff.h - What each gradient rule keeps from the forward -*- C++ -*-===//
//
// The saved-value declarations of the gradient rules are the single source of
// the activation-memory accounting: a forward value is stored from its
// forward until its backward exactly when a rule lists it here.
//
//===----------------------------------------------------------------------===//
#ifndef SP_PASSES_AUTODIFF_H
#define SP_PASSES_AUTODIFF_H

#include "ir/IR.h"

namespace sp {

/// The forward values (operands or results of N) that N's gradient rule
/// reads. Parameters appear too (a linear reads its weight); the memory
/// report counts only activations.
llvm::SmallVector<Value *, 4> savedForBackward(const Node &N);

/// For a column-parallel linear under sequence parallelism: the g
/// (sp_gather with regather) producing its input, whose input shard is saved
/// and all-gathered again in the backward. Null otherwise.
const Node *regatheredInput(const Node &N);

} // namespace sp

#endif // SP_PASSES_AUTODIFF_H
