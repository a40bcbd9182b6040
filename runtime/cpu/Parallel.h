//===- Parallel.h - A parallel-for for the elementwise kernels -*- C++ -*-===//
//
// GEMMs get their threads from OpenBLAS; the elementwise and row-wise kernels
// (GELU, dropout, softmax, LayerNorm, AdamW) split their index range over a
// small persistent pool. Each element or row is computed by exactly one
// thread with the same code, so results do not depend on the thread count.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CPU_PARALLEL_H
#define SP_RUNTIME_CPU_PARALLEL_H

#include "llvm/ADT/STLFunctionalExtras.h"
#include <cstdint>

namespace sp::cpu {

/// Threads the kernels may use (default 1: everything on the caller). Call it
/// at start-up, not while kernels run.
void setKernelThreads(int N);
int kernelThreads();

/// Runs Body(Begin, End) over a split of [0, N) into at most kernelThreads()
/// ranges of at least Grain items; the caller runs the first range. A call
/// made while the pool is busy (another tensor-parallel rank's thread) runs
/// serially on its caller.
void parallelFor(int64_t N, int64_t Grain,
                 llvm::function_ref<void(int64_t, int64_t)> Body);

} // namespace sp::cpu

#endif // SP_RUNTIME_CPU_PARALLEL_H
