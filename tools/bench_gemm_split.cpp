//===- bench_gemm_split.cpp - How the CPU backend cuts its GEMMs ----------===//
//
// Why cpu::gemm cuts a large product into tiles fixed by its shape
// (cpu::gemmTiles), each a single-threaded OpenBLAS call, and not into one
// slab per thread:
//
//  1. Speed, on the products of the gpt2s benchmark model (bench_train.py:
//     h 768, rows b s = 1024, v 8192; medium's with h 256 v 512): GFLOP/s
//     of cpu::gemm<float> as the backend calls it (fixed tiles), of the
//     128-row strips it cut before them, of one contiguous slab of
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
//   build/bin/sp-bench-gemm-split [threads, default 2] [h 768] [v 8192]
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

/// The cut cpu::gemm used before its tiles: strips of 128 rows of C (or
/// columns, when C is short and wide) for products of at least 4 strips.
template <typename T>
void strips(bool TA, bool TB, int M, int N, int K, const T *A, int Lda,
            const T *B, int Ldb, T *C, int Ldc) {
  bool ByRows = M >= 4 * Unit, ByColumns = !ByRows && N >= 4 * Unit;
  if (!ByRows && !ByColumns) {
    blas(TA, TB, M, N, K, A, Lda, B, Ldb, 0.0f, C, Ldc);
    return;
  }
  int Extent = ByRows ? M : N;
  cpu::parallelFor((Extent + Unit - 1) / Unit, 1, [&](int64_t B0, int64_t B1) {
    for (int64_t Blk = B0; Blk < B1; ++Blk) {
      int X0 = int(Blk) * Unit, Size = std::min(Unit, Extent - X0);
      if (ByRows)
        blas(TA, TB, Size, N, K, TA ? A + X0 : A + size_t(X0) * Lda, Lda, B,
             Ldb, 0.0f, C + size_t(X0) * Ldc, Ldc);
      else
        blas(TA, TB, M, Size, K, A, Lda, TB ? B + size_t(X0) * Ldb : B + X0,
             Ldb, 0.0f, C + X0, Ldc);
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
  int H = Argc > 2 ? std::atoi(Argv[2]) : 768, V = Argc > 3 ? std::atoi(Argv[3]) : 8192;
  if (Threads < 1 || H < 1 || V < 1) {
    std::fprintf(stderr, "usage: sp-bench-gemm-split [threads >= 1] [h] [v]\n");
    return 1;
  }
  cpu::setKernelThreads(Threads);
  std::printf("OpenBLAS kernel: %s, %d threads, h %d, v %d, 1024 rows\n",
              openblas_get_corename(), Threads, H, V);

  const int T = 1024, F = 4 * H;
  struct Shape {
    const char *What;
    int M, N, K;
    bool TA, TB;
  } Shapes[] = {
      {"qkv   X W", T, 3 * H, H, false, false},
      {"proj  X W", T, H, H, false, false},
      {"fc1   X W", T, F, H, false, false},
      {"fc2   X W", T, H, F, false, false},
      {"head  X E^T", T, V, H, false, true},
      {"qkv   DY W^T", T, H, 3 * H, false, true},
      {"proj  DY W^T", T, H, H, false, true},
      {"fc1   DY W^T", T, H, F, false, true},
      {"fc2   DY W^T", T, F, H, false, true},
      {"head  DY E", T, H, V, false, false},
      {"qkv   X^T DY", H, 3 * H, T, true, false},
      {"proj  X^T DY", H, H, T, true, false},
      {"fc1   X^T DY", H, F, T, true, false},
      {"fc2   X^T DY", F, H, T, true, false},
      {"head  DY^T X", V, H, T, true, false},
  };
  std::printf("\n%-13s %5s %5s %5s %13s %13s %13s %13s\n", "gemm", "m", "n",
              "k", "sgemm GF/s", "fixed tiles", "row strips", "slab/thread");
  double Flop = 0, Time[4] = {};
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
    double Strips = gflops(Flops, [&] {
      strips(S.TA, S.TB, S.M, S.N, S.K, A.data(), Lda, B.data(), Ldb,
             C.data(), S.N);
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
    std::printf("%-13s %5d %5d %5d %13.1f %8.1f (%3.0f%%) %8.1f (%3.0f%%) "
                "%8.1f (%3.0f%%)\n",
                S.What, S.M, S.N, S.K, Threaded, Fixed, 100 * Fixed / Threaded,
                Strips, 100 * Strips / Threaded, Slab, 100 * Slab / Threaded);
    Flop += Flops;
    double Rates[4] = {Threaded, Fixed, Strips, Slab};
    for (int K = 0; K < 4; ++K)
      Time[K] += Flops / Rates[K];
  }
  std::printf("%-13s %17s %13.1f %8.1f (%3.0f%%) %8.1f (%3.0f%%) %8.1f "
              "(%3.0f%%)\n",
              "all, by time", "", Flop / Time[0], Flop / Time[1],
              100 * Time[0] / Time[1], Flop / Time[2], 100 * Time[0] / Time[2],
              Flop / Time[3], 100 * Time[0] / Time[3]);

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
