//===- bench_gemm.cpp - The bf16 GEMM against OpenBLAS sgemm --------------===//
//
// GFLOP/s of cpu::gemmBf16 (VDPBF16PS, and AMX's TDPBF16PS where the CPU
// has it) and of cpu::gemm<float> (OpenBLAS sgemm, as the CPU backend calls
// it) on the GEMM shapes of the medium
// benchmark model (L 4, h 256, s 128, b 8: rows = 1024), measured in the
// same run on the same data: the linear layers forward (X W), the backward
// input (DY W^T) and weight (X^T DY) products, and the attention's batched
// per-head products. A benchmark: it checks nothing.
//
//   build/bin/sp-bench-gemm [threads]
//
//===----------------------------------------------------------------------===//
#include "ir/Float16.h"
#include "runtime/cpu/Bf16Gemm.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Parallel.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

using namespace sp;

int main(int Argc, char **Argv) {
  int Threads = Argc > 1 ? std::atoi(Argv[1]) : 1;
  if (Threads < 1) {
    std::fprintf(stderr, "usage: sp-bench-gemm [threads >= 1]\n");
    return 1;
  }
  if (!cpu::hasBf16Dot()) {
    std::fprintf(stderr, "sp-bench-gemm: this CPU has no AVX-512 BF16 "
                         "(VDPBF16PS); bf16 GEMMs run as sgemm on widened "
                         "copies here\n");
    return 1;
  }
  cpu::setKernelThreads(Threads);
  struct Shape {
    const char *What;
    int64_t M, N, K;
    bool TA, TB;
  } Shapes[] = {
      {"qkv  X W", 1024, 768, 256, false, false},
      {"fc1  X W", 1024, 1024, 256, false, false},
      {"fc2  X W", 1024, 256, 1024, false, false},
      {"head X E^T", 1024, 512, 256, false, true},
      {"fc2  DY W^T", 1024, 1024, 256, false, true},
      {"qkv  X^T DY", 256, 768, 1024, true, false},
      {"attn Q K^T", 128, 128, 32, false, true},
      {"attn P V", 128, 32, 128, false, false},
  };
  const bool Amx = cpu::hasAmxBf16();
  std::printf("%-12s %5s %5s %5s %12s %12s %12s %7s  (%d thread%s)\n", "gemm",
              "m", "n", "k", "dpbf16 GF/s", Amx ? "amx GF/s" : "", "sgemm GF/s",
              "ratio", Threads, Threads > 1 ? "s" : "");
  std::mt19937 Rng(1);
  std::uniform_real_distribution<float> U(-1, 1);
  for (const Shape &S : Shapes) {
    std::vector<float> Af(S.M * S.K), Bf(S.K * S.N), C(S.M * S.N);
    std::vector<uint16_t> A(Af.size()), B(Bf.size());
    for (size_t I = 0; I < Af.size(); ++I)
      A[I] = floatToBFloat16(Af[I] = U(Rng));
    for (size_t I = 0; I < Bf.size(); ++I)
      B[I] = floatToBFloat16(Bf[I] = U(Rng));
    int64_t Lda = S.TA ? S.M : S.K, Ldb = S.TB ? S.K : S.N;
    // Seconds per call: the best of 5 rounds of at least 0.2 s each.
    auto Time = [](auto F) {
      F();
      double Best = 1e30;
      for (int R = 0; R < 5; ++R) {
        auto T0 = std::chrono::steady_clock::now();
        int N = 0;
        double El;
        do {
          F();
          ++N;
          El = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             T0)
                   .count();
        } while (El < 0.2);
        Best = std::min(Best, El / N);
      }
      return Best;
    };
    double Tb = Time([&] {
      cpu::gemmBf16(S.TA, S.TB, S.M, S.N, S.K, A.data(), Lda, B.data(), Ldb,
                    0, C.data(), S.N, cpu::Bf16Kernel::Native);
    });
    double Ta = !Amx ? 0 : Time([&] {
      cpu::gemmBf16(S.TA, S.TB, S.M, S.N, S.K, A.data(), Lda, B.data(), Ldb,
                    0, C.data(), S.N, cpu::Bf16Kernel::Amx);
    });
    double Tf = Time([&] {
      cpu::gemm<float>(S.TA, S.TB, S.M, S.N, S.K, 1.0f, Af.data(), Lda,
                       Bf.data(), Ldb, 0.0f, C.data(), S.N);
    });
    double Flops = 2.0 * double(S.M) * double(S.N) * double(S.K);
    // The ratio: sgemm's time over the kernel bf16 plans use (Best).
    char AmxRate[32] = "";
    if (Amx)
      std::snprintf(AmxRate, sizeof(AmxRate), "%12.1f", Flops / Ta * 1e-9);
    std::printf("%-12s %5lld %5lld %5lld %12.1f %12s %12.1f %6.2fx\n",
                S.What, (long long)S.M, (long long)S.N, (long long)S.K,
                Flops / Tb * 1e-9, AmxRate, Flops / Tf * 1e-9,
                Tf / (cpu::amxEnabled() ? Ta : Tb));
  }
  return 0;
}
