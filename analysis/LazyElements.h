//===- LazyElements.h - Elements of a constant subgraph, one at a time -*- C++ -*-===//
//
// A causal mask that a model builds at run time from constants (HF Llama's
// _make_causal_mask: a full [s, s] matrix of the dtype's minimum, zeroed
// where arange(s) < arange(s) + 1 along the other axis, cast, unsqueezed
// and expanded over the batch) has s^2 elements: 4M at s = 2048, past what
// the constant folder materialises (ir/Fold.h, 2^20 elements). To check
// such a mask by value without folding it, this evaluates one element at a
// time, recursively through the ops that computed it, in double with each
// float32 result rounded to float32 (a single +, -, *, / of floats
// computed in double and rounded is the float operation's result), from
// constants whose data is at hand. Nothing is materialised, so a pass can
// check all s^2 elements of a mask in about s^2 times the subgraph's depth.
//
// Supported: readable constants, Identity, Reshape, Unsqueeze, Squeeze,
// Cast, Not, Neg, Add, Sub, Mul, Div, Less, Greater, Equal, And, Where,
// Expand, ConstantOfShape, Range, Trilu, Transpose, and Slice with constant
// starts and positive steps. Anything else (an input, a parameter, another
// op) makes a value not computable.
//
//===----------------------------------------------------------------------===//
#ifndef SP_ANALYSIS_LAZYELEMENTS_H
#define SP_ANALYSIS_LAZYELEMENTS_H

#include "ir/IR.h"
#include "llvm/ADT/DenseMap.h"
#include <cstdint>
#include <vector>

namespace sp {

class LazyElements {
public:
  /// Whether every element of V can be evaluated (memoised).
  bool computable(Value *V);
  /// Element Flat (row-major) of V. Precondition: computable(V).
  double at(Value *V, int64_t Flat);

private:
  /// What at() needs of a node, read once by computable().
  struct NodeInfo {
    std::vector<int64_t> Ints;    // Transpose's perm; Slice's starts per axis,
    std::vector<int64_t> Steps;   // and steps per axis
    double A = 0, B = 0;          // Range's start and delta, Trilu's k,
                                  // ConstantOfShape's value
  };
  bool check(Value *V);
  llvm::DenseMap<Value *, bool> Ok;
  llvm::DenseMap<Node *, NodeInfo> Info;
};

} // namespace sp

#endif // SP_ANALYSIS_LAZYELEMENTS_H
