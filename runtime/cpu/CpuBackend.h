//===- CpuBackend.h - The CPU backend ----------------------------*- C++ -*-===//
//
// Host memory and the kernels of runtime/cpu/Kernels.h (OpenBLAS GEMMs, the
// kernel thread pool): every call runs to completion before run() returns.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CPU_CPUBACKEND_H
#define SP_RUNTIME_CPU_CPUBACKEND_H

#include "runtime/Backend.h"
#include <string>

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
  bool runsContextParallel() const override { return true; }
  bool runsHierarchicalContextParallel() const override { return true; }
  bool runsCompactPrograms() const override { return true; }
  llvm::Error run(const KernelCall &C) override;
  llvm::Error synchronize() override { return llvm::Error::success(); }
  /// Measured, once per process: the best of a few float32 GEMMs (OpenBLAS
  /// sgemm through cpu::gemm, [256 t, 512] x [512, 512] for t kernel
  /// threads) on the kernel threads, whatever Dtype (16-bit plans compute
  /// in float32 on this backend, or in AVX-512 BF16 GEMMs of about the same
  /// rate). The process's ranks share these threads: it is the whole
  /// process's peak, not each rank's.
  double peakFlops(llvm::StringRef Dtype) const override;

  /// OpenBLAS picks its kernels from the CPU's model. A virtual machine that
  /// hides the model makes it fall back to its generic SSE3 ("Prescott")
  /// kernels, several times slower than the CPU's own (3.2x for sgemm on a
  /// 2-core AVX-512 VM). When OpenBLAS chose one of those older cores but
  /// this CPU runs AVX-512 (F, BW, VL, DQ) or AVX2 with FMA: the
  /// OPENBLAS_CORETYPE that selects its kernels ("SkylakeX" or "Haswell"),
  /// with the core OpenBLAS chose in Chosen; else empty.
  static std::string betterBlasCore(std::string *Chosen = nullptr);
  /// The same decision for OpenBLAS's core name Chosen on a CPU with
  /// AVX-512 (F, BW, VL, DQ) or AVX2 with FMA.
  static std::string betterBlasCore(llvm::StringRef Chosen, bool Avx512,
                                    bool Avx2Fma);
};

} // namespace sp

#endif // SP_RUNTIME_CPU_CPUBACKEND_H
