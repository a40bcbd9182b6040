//===- Parallel.h - A parallel-for for the kernels --------------*- C++ -*-===//
//
// The kernels (GEMM blocks, GELU, dropout, softmax, LayerNorm, AdamW, ...)
// split their index range over a small persistent pool; OpenBLAS runs one
// thread. Each element, row or block is computed by exactly one thread with
// the same code, and no kernel's split changes what is summed in which
// order, so results do not depend on the thread count. Idle workers spin for
// a short while (Parallel.cpp, SpinTime) before sleeping, so that the next
// kernel starts without a futex wake-up.
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
