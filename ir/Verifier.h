//===- Verifier.h - IR invariants ------------------------------*- C++ -*-===//
#ifndef SP_IR_VERIFIER_H
#define SP_IR_VERIFIER_H

#include "ir/IR.h"
#include "llvm/Support/Error.h"

namespace sp {

/// Checks the graph's invariants: operands are defined before use (the node
/// list is topologically ordered), use lists match operands, result types
/// equal what shape inference computes, parameters and constants carry data
/// of the right type, names are unique, and outputs are defined. Returns the
/// first violation, naming the node.
llvm::Error verifyGraph(const Graph &G);

} // namespace sp

#endif // SP_IR_VERIFIER_H
