//===- Linear.cpp - GEMM, linear layers and batched products --------------===//
//
// The products of the CPU backend, all through OpenBLAS: gemm (tiles of C
// over the kernel threads, each a single-threaded BLAS call), the linear
// layer and its gradients (Kernels.h, "4. Linear"), the bias gradient (a
// column sum in the order the CUDA kernels reproduce) and the batched,
// optionally causal, products of attention ("7. Batched matrix product").
// The CUDA backend runs these through cuBLAS (runtime/cuda/CublasLt.h), its
// bias gradient in runtime/cuda/kernels/LayerNorm.cuh.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/kernels/Common.h"

#include <cblas.h>

#include <climits>
#include <cstring>

namespace sp::cpu {

using namespace detail;

namespace {

//===----------------------------------------------------------------------===//
// BLAS
//===----------------------------------------------------------------------===//

CBLAS_TRANSPOSE blasTrans(bool T) { return T ? CblasTrans : CblasNoTrans; }

void blasGemm(bool TA, bool TB, int M, int N, int K, float Alpha,
              const float *A, int Lda, const float *B, int Ldb, float Beta,
              float *C, int Ldc) {
  cblas_sgemm(CblasRowMajor, blasTrans(TA), blasTrans(TB), M, N, K, Alpha, A,
              Lda, B, Ldb, Beta, C, Ldc);
}

void blasGemm(bool TA, bool TB, int M, int N, int K, double Alpha,
              const double *A, int Lda, const double *B, int Ldb, double Beta,
              double *C, int Ldc) {
  cblas_dgemm(CblasRowMajor, blasTrans(TA), blasTrans(TB), M, N, K, Alpha, A,
              Lda, B, Ldb, Beta, C, Ldc);
}

bool fitsInt(int64_t V) { return V >= 0 && V <= INT_MAX; }

} // namespace

//===----------------------------------------------------------------------===//
// GEMM
//===----------------------------------------------------------------------===//

GemmTiles gemmTiles(int64_t M, int64_t N, int64_t K) {
  // A tile's side stays a multiple of Unit; C is cut into at least Tiles
  // tiles, and further while a tile would still do BigTile multiply-adds,
  // as long as a tile does MinWork.
  constexpr int64_t Unit = 128, Tiles = 4, MinWork = int64_t(1) << 18,
                    BigTile = int64_t(1) << 28;
  GemmTiles G{M, N, 1, 1};
  auto Half = [](int64_t Side) { return (Side / 2 + Unit - 1) / Unit * Unit; };
  for (;;) {
    // The longer side, or the other one when the longer is one unit.
    bool Rows = G.TM >= G.TN;
    if ((Rows ? G.TM : G.TN) <= Unit)
      Rows = !Rows;
    int64_t Side = Rows ? G.TM : G.TN, Other = Rows ? G.TN : G.TM;
    int64_t New = Half(Side), Work = New * Other * K;
    if (Side <= Unit || New >= Side || Work < MinWork ||
        (G.count() >= Tiles && Work < BigTile))
      break;
    (Rows ? G.TM : G.TN) = New;
    G.Rows = (M + G.TM - 1) / G.TM;
    G.Cols = (N + G.TN - 1) / G.TN;
  }
  return G;
}

namespace {

/// gemm's body. With Bias (a row of N values), each tile of C is first set
/// to the bias broadcast over its rows, by the thread that then computes
/// it (Beta must be 1): the bias rows are written where the GEMM reads
/// them next, in parallel, instead of in a serial pass over all of C.
template <typename T>
void gemmTiled(bool TransA, bool TransB, int64_t M, int64_t N, int64_t K,
               T Alpha, const T *A, int64_t Lda, const T *B, int64_t Ldb,
               T Beta, T *C, int64_t Ldc, const T *Bias) {
  checkSizes({M, N, K});
  SP_CPU_CHECK(!Bias || Beta == T(1), "a bias tile needs beta 1");
  auto SetBias = [&](int64_t I0, int64_t J0, int64_t Rows, int64_t Cols) {
    if (Bias)
      for (int64_t R = I0; R < I0 + Rows; ++R)
        std::memcpy(C + R * Ldc + J0, Bias + J0, sizeof(T) * Cols);
  };
  if (M == 0 || N == 0)
    return;
  SP_CPU_CHECK(Ldc >= N, "ldc must be at least n");
  if (K == 0) { // no product: C = Beta * C, as BLAS would do
    SetBias(0, 0, M, N);
    for (int64_t I = 0; I < M; ++I)
      for (int64_t J = 0; J < N; ++J)
        C[I * Ldc + J] = Beta == T(0) ? T(0) : Beta * C[I * Ldc + J];
    return;
  }
  SP_CPU_CHECK(Lda >= (TransA ? M : K), "lda too small for A's stored shape");
  SP_CPU_CHECK(Ldb >= (TransB ? K : N), "ldb too small for B's stored shape");
  SP_CPU_CHECK(fitsInt(M) && fitsInt(N) && fitsInt(K) && fitsInt(Lda) &&
                   fitsInt(Ldb) && fitsInt(Ldc),
               "gemm dimension above INT_MAX (split the product, or build "
               "against a 64-bit-integer BLAS)");
  // Large products run as tiles of C over the kernel threads, each a
  // single-threaded BLAS call, so OpenBLAS keeps no worker threads of its
  // own spinning between GEMMs against the elementwise kernels. The tiles
  // depend on the shape only, not on the thread count, so neither do the
  // results (gemmTiles). Squarish tiles repack less of the operands they
  // share than strips of rows do (build/bin/sp-bench-gemm-split).
  GemmTiles G = gemmTiles(M, N, K);
  if (G.count() > 1) {
    parallelFor(G.count(), 1, [&](int64_t T0, int64_t T1) {
      for (int64_t Tile = T0; Tile < T1; ++Tile) {
        int64_t I0 = Tile / G.Cols * G.TM, J0 = Tile % G.Cols * G.TN;
        int64_t Rows = std::min(G.TM, M - I0), Cols = std::min(G.TN, N - J0);
        SetBias(I0, J0, Rows, Cols);
        blasGemm(TransA, TransB, int(Rows), int(Cols), int(K), Alpha,
                 TransA ? A + I0 : A + I0 * Lda, int(Lda),
                 TransB ? B + J0 * Ldb : B + J0, int(Ldb), Beta,
                 C + I0 * Ldc + J0, int(Ldc));
      }
    });
    return;
  }
  SetBias(0, 0, M, N);
  blasGemm(TransA, TransB, int(M), int(N), int(K), Alpha, A, int(Lda), B,
           int(Ldb), Beta, C, int(Ldc));
}

} // namespace

template <typename T>
void gemm(bool TransA, bool TransB, int64_t M, int64_t N, int64_t K, T Alpha,
          const T *A, int64_t Lda, const T *B, int64_t Ldb, T Beta, T *C,
          int64_t Ldc) {
  gemmTiled(TransA, TransB, M, N, K, Alpha, A, Lda, B, Ldb, Beta, C, Ldc,
            static_cast<const T *>(nullptr));
}

//===----------------------------------------------------------------------===//
// 4. Linear
//===----------------------------------------------------------------------===//

template <typename T>
void linear(T *Y, const T *X, const T *W, const T *Bias, int64_t Rows,
            int64_t In, int64_t Out, bool TransW) {
  checkSizes({Rows, In, Out});
  // With a bias, each tile of Y starts as the bias broadcast over its rows
  // and the GEMM adds.
  gemmTiled<T>(false, TransW, Rows, Out, In, T(1), X, In, W, TransW ? In : Out,
               Bias ? T(1) : T(0), Y, Out, Bias);
}

template <typename T>
void linearBackwardInput(T *DX, const T *DY, const T *W, int64_t Rows,
                         int64_t In, int64_t Out, bool TransW) {
  checkSizes({Rows, In, Out});
  // W [Out, In] (TransW): DY W;  W [In, Out]: DY W^T.
  gemm<T>(false, !TransW, Rows, In, Out, T(1), DY, Out, W, TransW ? In : Out,
          T(0), DX, In);
}

template <typename T>
void linearBackwardWeight(T *DW, const T *X, const T *DY, int64_t Rows,
                          int64_t In, int64_t Out, bool TransW) {
  checkSizes({Rows, In, Out});
  if (TransW) // DW[Out, In] += DY^T X
    gemm<T>(true, false, Out, In, Rows, T(1), DY, Out, X, In, T(1), DW, In);
  else // DW[In, Out] += X^T DY
    gemm<T>(true, false, In, Out, Rows, T(1), X, In, DY, Out, T(1), DW, Out);
}

template <typename T>
void biasBackward(T *DBias, const T *DY, int64_t Rows, int64_t Out) {
  checkSizes({Rows, Out});
  // Columns over the threads, each summed over the rows in double in the
  // column sums' order.
  columnSums<1>(
      Rows, Out,
      [&](int64_t R, int64_t JB, int64_t JE, auto &Part) {
        for (int64_t J = JB; J < JE; ++J)
          Part[0][J - JB] += DY[R * Out + J];
      },
      [&](int64_t JB, int64_t JE, auto &Sum) {
        for (int64_t J = JB; J < JE; ++J)
          DBias[J] += T(Sum[0][J - JB]);
      });
}

//===----------------------------------------------------------------------===//
// 7. Batched matrix product
//===----------------------------------------------------------------------===//

namespace {
/// Row blocks of a causal product: small enough that the skipped corner is
/// most of the masked half, large enough that each block's GEMM stays
/// efficient.
constexpr int64_t CausalRowBlock = 64;

/// One causal product (batchMatMul's CausalOut / CausalA, one p).
template <typename T>
void causalMatMul(T *C, const T *A, const T *B, int64_t M, int64_t N,
                  int64_t K, bool TransA, bool TransB, bool CausalOut,
                  bool CausalA) {
  const int64_t Lda = TransA ? M : K, Ldb = TransB ? K : N;
  for (int64_t R0 = 0; R0 < M; R0 += CausalRowBlock) {
    int64_t R1 = std::min(M, R0 + CausalRowBlock);
    // Columns: row i keeps j <= i, so the block needs j < R1.
    int64_t Cols = CausalOut ? std::min(N, R1) : N;
    // Contraction range [K0, K1): A[i, k] (op(A)) is nonzero only for
    // k <= i when A is stored [M, K], for k >= i when stored [K, M].
    int64_t K0 = 0, K1 = K;
    if (CausalA) {
      if (TransA)
        K0 = std::min(K, R0);
      else
        K1 = std::min(K, R1);
    }
    T *CR = C + R0 * N;
    if (Cols > 0 && K1 > K0)
      gemm<T>(TransA, TransB, R1 - R0, Cols, K1 - K0, T(1),
              TransA ? A + K0 * Lda + R0 : A + R0 * Lda + K0, Lda,
              TransB ? B + K0 : B + K0 * Ldb, Ldb, T(0), CR, N);
    else
      Cols = 0; // nothing to multiply: the block is zero
    // Zeros: everything right of the causal diagonal (with CausalOut),
    // and whatever the product did not write.
    for (int64_t I = R0; I < R1; ++I) {
      int64_t From = std::min(CausalOut ? I + 1 : N, Cols);
      std::fill(CR + (I - R0) * N + From, CR + (I - R0) * N + N, T(0));
    }
  }
}
} // namespace

template <typename T>
void batchMatMul(T *C, const T *A, const T *B, int64_t Batch, int64_t M,
                 int64_t N, int64_t K, bool TransA, bool TransB,
                 bool CausalOut, bool CausalA) {
  checkSizes({Batch, M, N, K});
  // The batch (heads) over the kernel threads; each product whole.
  parallelFor(Batch, 1, [&](int64_t P0, int64_t P1) {
    for (int64_t P = P0; P < P1; ++P) {
      if (CausalOut || CausalA)
        causalMatMul<T>(C + P * M * N, A + P * M * K, B + P * K * N, M, N, K,
                        TransA, TransB, CausalOut, CausalA);
      else
        gemm<T>(TransA, TransB, M, N, K, T(1), A + P * M * K, TransA ? M : K,
                B + P * K * N, TransB ? K : N, T(0), C + P * M * N, N);
    }
  });
}

#define SP_INSTANTIATE(T)                                                      \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T *,   \
                        int64_t, const T *, int64_t, T, T *, int64_t);         \
  template void linear<T>(T *, const T *, const T *, const T *, int64_t,       \
                          int64_t, int64_t, bool);                             \
  template void linearBackwardInput<T>(T *, const T *, const T *, int64_t,     \
                                       int64_t, int64_t, bool);                \
  template void linearBackwardWeight<T>(T *, const T *, const T *, int64_t,    \
                                        int64_t, int64_t, bool);               \
  template void biasBackward<T>(T *, const T *, int64_t, int64_t);             \
  template void batchMatMul<T>(T *, const T *, const T *, int64_t, int64_t,    \
                               int64_t, int64_t, bool, bool, bool, bool);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
