//===- Fold.h - Constant evaluation of ops ---------------------*- C++ -*-===//
//
// A small reference evaluator over constant operands, used by the importer
// (to fold the shape subgraphs exporters write: Shape, Gather, Unsqueeze,
// Concat, ConstantOfShape, Cast, Range, Expand, ...) and by the
// constant-folding pass. It folds only small tensors (MaxFoldElements) whose
// operands are constants with data at hand; anything else is left alone.
//
//===----------------------------------------------------------------------===//
#ifndef SP_IR_FOLD_H
#define SP_IR_FOLD_H

#include "ir/IR.h"
#include "llvm/Support/Error.h"
#include <optional>

namespace sp {

constexpr int64_t MaxFoldElements = 1 << 20;

/// True if Op can be evaluated by foldOp.
bool isFoldable(OpKind Op);

/// Evaluates Op on constant Operands with the given result types. Returns
/// std::nullopt when it cannot fold (an operand is not a constant, its data is
/// not available, or a result is larger than MaxFoldElements); an Error only
/// for operands that are constant but invalid (e.g. an out-of-range index).
llvm::Expected<std::optional<std::vector<std::shared_ptr<TensorData>>>>
foldOp(OpKind Op, llvm::ArrayRef<Value *> Operands, const AttrList &Attrs,
       llvm::ArrayRef<TensorType> ResultTypes);

} // namespace sp

#endif // SP_IR_FOLD_H
