//===- KernelShapes.h - What both dispatchers read off an op ----*- C++ -*-===//
//
// The sizes and settings that the CPU dispatcher (runtime/cpu/CpuBackend.cpp)
// and the CUDA one (runtime/cuda/Dispatch.cpp) both read off an
// instruction's operand types and attributes before calling their kernels,
// read here once so that the two backends cannot read them differently.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_KERNELSHAPES_H
#define SP_RUNTIME_KERNELSHAPES_H

#include "ir/OpDef.h"
#include "runtime/Backend.h"
#include "support/Diagnostics.h"
#include <cstdint>

namespace sp {

/// batch_matmul as Batch GEMMs: C [.., M, N] = op(A) [.., M, K] op(B)
/// [.., K, N], op transposing when TransA or TransB.
struct BatchMatMulShape {
  bool TransA, TransB;
  int64_t Batch, M, N, K;
};

/// C's batch_matmul shape, or the error (naming the Backend, "CPU" or
/// "CUDA") that its operands' batch dimensions are broadcast.
inline llvm::Expected<BatchMatMulShape>
batchMatMulShape(const KernelCall &C, llvm::StringRef Backend) {
  const Instruction &I = C.I;
  const TensorType &A = C.inType(0), &B = C.inType(1), &Out = C.outType(0);
  BatchMatMulShape G;
  G.TransA = attrInt(I.Op, I.Attrs, "trans_a");
  G.TransB = attrInt(I.Op, I.Attrs, "trans_b");
  G.M = Out.dim(-2);
  G.N = Out.dim(-1);
  G.K = G.TransA ? A.dim(-2) : A.dim(-1);
  G.Batch = Out.numElements() / (G.M * G.N);
  if (A.numElements() != G.Batch * G.M * G.K ||
      B.numElements() != G.Batch * G.K * G.N)
    return makeError("batch_matmul with broadcast batch dimensions is not "
                     "supported by the " +
                     Backend + " backend");
  return G;
}

/// cross_entropy or cross_entropy_grad (Grad) over N rows of V logits
/// (operand 0) and their targets (operand 1): the columns from Valid on are
/// padding (valid_vocab; 0, the default, is V), the rows whose target is
/// Ignore (ignore_index) are not counted, and with VocabParallel each rank
/// holds a slice of the vocabulary.
struct CrossEntropyShape {
  bool Grad, VocabParallel;
  int64_t N, V, Valid, Ignore;
};

inline CrossEntropyShape crossEntropyShape(const KernelCall &C) {
  const Instruction &I = C.I;
  CrossEntropyShape X;
  X.Grad = I.Op == OpKind::CrossEntropyGrad;
  X.VocabParallel = attrInt(I.Op, I.Attrs, "vocab_parallel");
  X.N = C.inType(1).numElements();
  X.V = C.inType(0).dim(-1);
  X.Valid = attrInt(I.Op, I.Attrs, "valid_vocab");
  if (!X.Valid)
    X.Valid = X.V; // every column
  X.Ignore = attrInt(I.Op, I.Attrs, "ignore_index");
  return X;
}

} // namespace sp

#endif // SP_RUNTIME_KERNELSHAPES_H
