//===- bench_gemm_split.cpp - How the CPU backend cuts its GEMMs ----------===//
//
// Why cpu::gemm cuts a large product into tiles fixed by its shape
// (cpu::gemmTiles), each a single-threaded OpenBLAS call, and not into one
// slab per thread:
//
//  1. Speed, on the products of the gpt2s benchmark model (bench_train.py:
//     h 768, rows b s = 1024, v 8192): GFLOP/s of cpu::gemm<float> as the
//     backend calls it (fixed tiles), of one contiguous slab of
//     128-multiples per thread, and of threaded OpenBLAS sgemm, on the same
//     data. Threaded OpenBLAS is timed last: its workers spin for a while
//     after each call (2^28 cycles by default) and would slow whatever ran
//     next on the same cores, so the next shape waits half a second.
//  2. Invariance: of the cuts into 2-5 slabs at multiples of 128 (rows or
//     columns; 6 shapes, every transpose, beta 0 and 1, sgemm and dgemm),
//     how many change some element of C against one call. A cut that
//     follows the thread count keeps results independent of it only if
//     this is 0 for every OpenBLAS kernel; run it under each
//     OPENBLAS_CORETYPE (Haswell, Zen, SkylakeX, Cooperlake, ...).
//
// A benchmark and an experiment: it asserts nothing.
//
//   build/bin/sp-bench-gemm-split [threads, default 2]
//   OPENBLAS_CORETYPE=Haswell build/bin/sp-bench-gemm-split
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Parallel.h"
#include <cblas.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

extern "C" void openblas_set_num_threads(int NumThreads);
extern "C" char *openblas_get_corename(void);

using namespace sp;

namespace {

constexpr int Unit = 128;

CBLAS_TRANSPOSE trans(bool T) { return T ? CblasTrans : CblasNoTrans; }

void blas(bool TA, bool TB, int M, int N, int K, const float *A, int Lda,
          const float *B, int Ldb, float Beta, float *C, int Ldc) {
  cblas_sgemm(CblasRowMajor, trans(TA), trans(TB), M, N, K, 0.7f, A, Lda, B,
              Ldb, Beta, C, Ldc);
}
void blas(bool TA, bool TB, int M, int N, int K, const double *A, int Lda,
          const double *B, int Ldb, float Beta, double *C, int Ldc) {
  cblas_dgemm(CblasRowMajor, trans(TA), trans(TB), M, N, K, 0.7, A, Lda, B,
              Ldb, Beta, C, Ldc);
}

/// C (M x N, row-major, ld N) = op(A) op(B) as Parts slabs of whole Units
/// along the rows (ByRows) or the columns, slab P on thread P.
template <typename T>
void slabs(bool TA, bool TB, int M, int N, int K, const T *A, const T *B,
           float Beta, T *C, int Parts, bool ByRows) {
  int Lda = TA ? M : K, Ldb = TB ? K : N;
  int Extent = ByRows ? M : N, Units = (Extent + Unit - 1) / Unit;
  cpu::parallelFor(Parts, 1, [&](int64_t P0, int64_t P1) {
    for (int64_t P = P0; P < P1; ++P) {
      int X0 = std::min<int64_t>(Extent, P * Units / Parts * Unit);
      int X1 = std::min<int64_t>(Extent, (P + 1) * Units / Parts * Unit);
      if (X0 == X1)
        continue;
      if (ByRows)
        blas(TA, TB, X1 - X0, N, K, TA ? A + X0 : A + size_t(X0) * Lda, Lda,
             B, Ldb, Beta, C + size_t(X0) * N, N);
      else
        blas(TA, TB, M, X1 - X0, K, A, Lda, TB ? B + size_t(X0) * Ldb : B + X0,
             Ldb, Beta, C + X0, N);
    }
  });
}

double seconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// GFLOP/s of F, the fastest of 5 runs after one warm-up.
template <typename F> double gflops(double Flops, F &&Run) {
  Run();
  double Best = 1e30;
  for (int R = 0; R < 5; ++R) {
    double T0 = seconds();
    Run();
    Best = std::min(Best, seconds() - T0);
  }
  return Flops / Best / 1e9;
}

/// Cut configurations of one product that change C against one call.
template <typename T>
int changedCuts(int M, int N, int K, bool TA, bool TB, float Beta) {
  std::mt19937 Rng(1);
  std::uniform_real_distribution<float> U(-1, 1);
  std::vector<T> A(size_t(M) * K), B(size_t(K) * N), C0(size_t(M) * N);
  for (T &X : A)
    X = U(Rng);
  for (T &X : B)
    X = U(Rng);
  for (T &X : C0)
    X = U(Rng);
  std::vector<T> Whole = C0;
  blas(TA, TB, M, N, K, A.data(), TA ? M : K, B.data(), TB ? K : N, Beta,
       Whole.data(), N);
  int Changed = 0;
  for (int Parts = 2; Parts <= 5; ++Parts)
    for (bool ByRows : {false, true}) {
      std::vector<T> C = C0;
      slabs(TA, TB, M, N, K, A.data(), B.data(), Beta, C.data(), Parts,
            ByRows);
      if (std::memcmp(C.data(), Whole.data(), C.size() * sizeof(T)) != 0) {
        ++Changed;
        std::printf("  changed: %s m %d n %d k %d%s%s beta %g, %d %s slabs\n",
                    sizeof(T) == 4 ? "sgemm" : "dgemm", M, N, K,
                    TA ? " A^T" : "", TB ? " B^T" : "", Beta, Parts,
                    ByRows ? "row" : "column");
      }
    }
  return Changed;
}

} // namespace

int main(int Argc, char **Argv) {
  int Threads = Argc > 1 ? std::atoi(Argv[1]) : 2;
  if (Threads < 1) {
    std::fprintf(stderr, "usage: sp-bench-gemm-split [threads >= 1]\n");
    return 1;
  }
  cpu::setKernelThreads(Threads);
  std::printf("OpenBLAS kernel: %s, %d threads\n", openblas_get_corename(),
              Threads);

  struct Shape {
    const char *What;
    int M, N, K;
    bool TA, TB;
  } Shapes[] = {
      {"qkv   X W", 1024, 2304, 768, false, false},
      {"fc1   X W", 1024, 3072, 768, false, false},
      {"fc2   X W", 1024, 768, 3072, false, false},
      {"head  X E^T", 1024, 8192, 768, false, true},
      {"qkv   DY W^T", 1024, 768, 2304, false, true},
      {"head  DY E", 1024, 768, 8192, false, false},
      {"fc1   X^T DY", 768, 3072, 1024, true, false},
      {"fc2   X^T DY", 3072, 768, 1024, true, false},
      {"qkv   X^T DY", 768, 2304, 1024, true, false},
      {"proj  X^T DY", 768, 768, 1024, true, false},
  };
  std::printf("\n%-13s %5s %5s %5s %13s %13s %13s\n", "gemm", "m", "n", "k",
              "sgemm GF/s", "fixed tiles", "slab/thread");
  for (const Shape &S : Shapes) {
    std::vector<float> A(size_t(S.M) * S.K, 0.5f), B(size_t(S.K) * S.N, 0.25f),
        C(size_t(S.M) * S.N);
    int Lda = S.TA ? S.M : S.K, Ldb = S.TB ? S.K : S.N;
    double Flops = 2.0 * S.M * S.N * S.K;
    openblas_set_num_threads(1);
    double Fixed = gflops(Flops, [&] {
      cpu::gemm<float>(S.TA, S.TB, S.M, S.N, S.K, 1.0f, A.data(), Lda,
                       B.data(), Ldb, 0.0f, C.data(), S.N);
    });
    double Slab = gflops(Flops, [&] {
      slabs(S.TA, S.TB, S.M, S.N, S.K, A.data(), B.data(), 0.0f, C.data(),
            Threads, S.M >= S.N);
    });
    openblas_set_num_threads(Threads);
    double Threaded = gflops(Flops, [&] {
      blas(S.TA, S.TB, S.M, S.N, S.K, A.data(), Lda, B.data(), Ldb, 0.0f,
           C.data(), S.N);
    });
    openblas_set_num_threads(1);
    // Until OpenBLAS's workers stop spinning (2^28 cycles by default).
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::printf("%-13s %5d %5d %5d %13.1f %8.1f (%2.0f%%) %8.1f (%2.0f%%)\n",
                S.What, S.M, S.N, S.K, Threaded, Fixed, 100 * Fixed / Threaded,
                Slab, 100 * Slab / Threaded);
  }

  std::printf("\ncuts that change C against one call:\n");
  const int Cut[][3] = {{1024, 768, 768}, {1000, 700, 300}, {777, 1300, 257},
                        {3072, 768, 1024}, {640, 4100, 129}, {300, 3000, 5000}};
  int Changed = 0, Tried = 0;
  for (const auto &S : Cut)
    for (bool TA : {false, true})
      for (bool TB : {false, true})
        for (float Beta : {0.0f, 1.0f}) {
          Changed += changedCuts<float>(S[0], S[1], S[2], TA, TB, Beta);
          Changed += changedCuts<double>(S[0], S[1], S[2], TA, TB, Beta);
          Tried += 2 * 4 * 2;
        }
  std::printf("%d of %d cut configurations change C (OpenBLAS kernel %s)\n",
              Changed, Tried, openblas_get_corename());
  return 0;
}
