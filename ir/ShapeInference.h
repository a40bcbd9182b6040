//===- ShapeInference.h - Result types of every op -------------*- C++ -*-===//
//
// Given an op, its operands and attributes, computes the result types. The
// importer uses it to type what it maps (checked against ONNX's own shape
// inference), passes use it to build nodes, and the verifier re-runs it on
// every node. Ops whose result shape depends on operand *values* (Reshape,
// Slice, Expand, ...) read them from constant operands and fail otherwise.
//
//===----------------------------------------------------------------------===//
#ifndef SP_IR_SHAPEINFERENCE_H
#define SP_IR_SHAPEINFERENCE_H

#include "ir/IR.h"
#include "llvm/Support/Error.h"
#include <optional>

namespace sp {

using TypeList = llvm::SmallVector<TensorType, 2>;

/// Result types of Op applied to Operands. Errors describe the cause only
/// (e.g. "operand 1 has rank 2, expected 3"); callers add the node name.
llvm::Expected<TypeList> inferTypes(OpKind Op, llvm::ArrayRef<Value *> Operands,
                                    const AttrList &Attrs);

/// Same, for the onnx.* ops (ir/OnnxShapes.cpp).
llvm::Expected<TypeList> inferOnnxTypes(OpKind Op,
                                        llvm::ArrayRef<Value *> Operands,
                                        const AttrList &Attrs);

/// Numpy-style broadcast of two shapes; fails if they are incompatible.
llvm::Expected<llvm::SmallVector<int64_t, 4>>
broadcastShapes(llvm::ArrayRef<int64_t> A, llvm::ArrayRef<int64_t> B);

/// Reads a constant operand as a list of integers (shape and axes operands).
/// Fails if V is not a loaded constant.
llvm::Expected<std::vector<int64_t>> constInts(const Value *V);

/// The same, or nothing when V is not a loaded constant: for the rewrites
/// and evaluators that only look for a form and leave what they cannot read.
std::optional<std::vector<int64_t>> knownConstInts(const Value *V);

/// Creates a node before InsertPt with inferred result types. MaxResults
/// drops optional trailing results (layer_norm statistics, dropout mask).
llvm::Expected<Node *> buildNode(Graph &G, Graph::iterator InsertPt, OpKind Op,
                                 llvm::ArrayRef<Value *> Operands,
                                 AttrList Attrs, std::string Name = "",
                                 unsigned MaxResults = ~0u);

} // namespace sp

#endif // SP_IR_SHAPEINFERENCE_H
