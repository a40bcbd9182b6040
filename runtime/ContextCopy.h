//===- ContextCopy.h - What cp_slice and cp_pad copy ------------*- C++ -*-===//
//
// cp_slice and cp_pad (ir/ops/ParallelOps.cpp; passes/ContextParallel.cpp)
// copy a context-parallel rank's positions of a tensor along one axis, as
// bytes whatever the type: cp_slice takes them out of the whole tensor,
// cp_pad puts them back into zeros. contextCopyCall checks an instruction
// against its group and its layout and says where each side is; each
// backend then copies the runs (TensorLayout.h's contextCopy on the CPU,
// strided device copies on the GPU).
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CONTEXTCOPY_H
#define SP_RUNTIME_CONTEXTCOPY_H

#include "ir/IR.h"
#include "ir/OpDef.h"
#include "runtime/Backend.h"
#include "runtime/TensorLayout.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"

namespace sp {

struct ContextCopyCall {
  /// The whole tensor and this rank's positions of it.
  char *Whole = nullptr, *Local = nullptr;
  TensorType WholeType;
  int Dim = 0;
  ContextLayout Layout;
  int Rank = 0;
  /// cp_slice (Whole to Local), or cp_pad (Local into a zeroed Whole).
  bool Slice = true;
};

/// C's cp_slice or cp_pad: an error when the cp group is not its parts or
/// the axis does not divide into the layout's chunks.
inline llvm::Expected<ContextCopyCall> contextCopyCall(const KernelCall &C) {
  const Instruction &I = C.I;
  const int Parts = int(attrInt(I.Op, I.Attrs, "parts"));
  Communicator *G = C.group("cp");
  if (Parts > 1 && (!G || G->size() != Parts))
    return makeError(llvm::formatv("{0} of {1} parts needs a "
                                   "context-parallel group of that size",
                                   opName(I.Op), Parts));
  ContextCopyCall X;
  X.Slice = I.Op == OpKind::CpSlice;
  X.WholeType = X.Slice ? C.inType(0) : C.outType(0);
  X.Dim = int(attrInt(I.Op, I.Attrs, "dim"));
  X.Layout = ContextLayout{Parts, attrInt(I.Op, I.Attrs, "zigzag") != 0,
                           X.WholeType.Shape[X.Dim]};
  if (!X.Layout.divides())
    return makeError(llvm::formatv("{0}: axis {1} of {2} does not divide "
                                   "into the context-parallel chunks",
                                   opName(I.Op), X.Dim, X.WholeType.str()));
  X.Whole = C.buffer(X.Slice ? I.In[0] : I.Out[0]);
  X.Local = C.buffer(X.Slice ? I.Out[0] : I.In[0]);
  X.Rank = G ? G->rank() : 0;
  return X;
}

} // namespace sp

#endif // SP_RUNTIME_CONTEXTCOPY_H
