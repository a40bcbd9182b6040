//===- CpuBackend.h - The CPU backend ----------------------------*- C++ -*-===//
//
// Host memory and the kernels of runtime/cpu/Kernels.h (OpenBLAS GEMMs, the
// kernel thread pool): every call runs to completion before run() returns.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CPU_CPUBACKEND_H
#define SP_RUNTIME_CPU_CPUBACKEND_H

#include "runtime/Backend.h"

namespace sp {

class CpuBackend : public Backend {
public:
  /// The kernel threads of this process (shared by the ranks it runs):
  /// they run everything, GEMMs included (split by rows of C, each block a
  /// one-thread BLAS call), so OpenBLAS's own workers are turned off; they
  /// would spin between GEMMs against the elementwise kernels.
  static void setThreads(int Threads);

  llvm::StringRef name() const override { return "cpu"; }
  llvm::Expected<char *> allocate(size_t Bytes) override;
  void release(char *Arena) override;
  llvm::Error copyToBackend(char *Dst, const void *Src, size_t Bytes) override;
  llvm::Error copyToHost(void *Dst, const char *Src, size_t Bytes) override;
  bool hostMemory() const override { return true; }
  bool runsMixedPrecision() const override { return true; }
  llvm::Error run(const KernelCall &C) override;
  llvm::Error synchronize() override { return llvm::Error::success(); }
  /// Measured, once per process: the best of a few float32 GEMMs (OpenBLAS
  /// sgemm through cpu::gemm, [256 t, 512] x [512, 512] for t kernel
  /// threads) on the kernel threads, whatever Dtype (16-bit plans compute
  /// in float32 on this backend, or in AVX-512 BF16 GEMMs of about the same
  /// rate). The process's ranks share these threads: it is the whole
  /// process's peak, not each rank's.
  double peakFlops(llvm::StringRef Dtype) const override;
};

} // namespace sp

#endif // SP_RUNTIME_CPU_CPUBACKEND_H
