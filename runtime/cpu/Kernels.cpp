//===- Kernels.cpp - CPU kernels of every op, forward and backward --------===//
//
// Plain loops, one op after the other, its backward right below it. The math
// of each kernel is stated in Kernels.h; comments here only explain the how.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Philox.h"

#include "runtime/cpu/Parallel.h"
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>

/// A check on the caller's use of a kernel (a bug, not bad data): prints
/// file:line, the condition and a hint, then aborts.
#define SP_CPU_CHECK(Cond, Hint)                                               \
  do {                                                                         \
    if (!(Cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: sp::cpu check failed: %s (%s)\n", __FILE__, \
                   __LINE__, #Cond, Hint);                                     \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

namespace sp::cpu {

namespace {

/// Accumulator type of every reduction.
using Acc = double;

void checkSizes(std::initializer_list<int64_t> Sizes) {
  for (int64_t S : Sizes)
    SP_CPU_CHECK(S >= 0, "sizes must be non-negative");
}

//===----------------------------------------------------------------------===//
// Shape helpers
//===----------------------------------------------------------------------===//

/// Calls Fn(Idx) for every multi-index of Dims[0..R) in row-major order (once
/// with no index when R == 0, never when a dimension is 0).
template <typename F> void forEachIndex(int R, const int64_t *Dims, F &&Fn) {
  for (int D = 0; D < R; ++D)
    if (Dims[D] == 0)
      return;
  int64_t Idx[MaxRank] = {};
  while (true) {
    Fn(static_cast<const int64_t *>(Idx));
    int D = R - 1;
    while (D >= 0 && ++Idx[D] == Dims[D])
      Idx[D--] = 0;
    if (D < 0)
      return;
  }
}

int64_t dot(int R, const int64_t *Idx, const int64_t *Strides) {
  int64_t Off = 0;
  for (int D = 0; D < R; ++D)
    Off += Idx[D] * Strides[D];
  return Off;
}

/// Row-major strides of Dims[0..R).
void rowMajorStrides(int R, const int64_t *Dims, int64_t *Strides) {
  int64_t S = 1;
  for (int D = R - 1; D >= 0; --D) {
    Strides[D] = S;
    S *= Dims[D];
  }
}

/// The strides with which an input of shape In is read at the multi-indices
/// of Out under numpy broadcasting (0 along broadcast dimensions).
Status broadcastStrides(Shape In, Shape Out, int64_t *Strides) {
  int R = int(Out.size());
  if (R > MaxRank)
    return Status::error("broadcast: rank above MaxRank");
  if (In.size() > Out.size())
    return Status::error("broadcast: input rank above output rank");
  int64_t InStrides[MaxRank];
  rowMajorStrides(int(In.size()), In.data(), InStrides);
  int Lead = R - int(In.size());
  for (int D = 0; D < R; ++D) {
    if (Out[D] < 0)
      return Status::error("broadcast: negative dimension", D, Out[D]);
    int DI = D - Lead;
    if (DI < 0)
      Strides[D] = 0;
    else if (In[DI] == Out[D])
      Strides[D] = InStrides[DI];
    else if (In[DI] == 1)
      Strides[D] = 0;
    else
      return Status::error("broadcast: shapes do not broadcast", D, In[DI]);
  }
  return Status::success();
}

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

template <typename T>
void gemm(bool TransA, bool TransB, int64_t M, int64_t N, int64_t K, T Alpha,
          const T *A, int64_t Lda, const T *B, int64_t Ldb, T Beta, T *C,
          int64_t Ldc) {
  checkSizes({M, N, K});
  if (M == 0 || N == 0)
    return;
  SP_CPU_CHECK(Ldc >= N, "ldc must be at least n");
  if (K == 0) { // no product: C = Beta * C, as BLAS would do
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
  // Large products run as blocks of Block rows (or, when C is short and
  // wide, columns) of C over the kernel threads, each a single-threaded BLAS
  // call, so OpenBLAS keeps no worker threads of its own spinning between
  // GEMMs against the elementwise kernels. The blocks do not depend on the
  // thread count, so neither do the results; products smaller than 4 blocks
  // stay whole.
  constexpr int64_t Block = 128, MinWork = int64_t(1) << 18;
  bool ByRows = M >= 4 * Block, ByColumns = !ByRows && N >= 4 * Block;
  if ((ByRows || ByColumns) && M * N * K >= MinWork) {
    int64_t Extent = ByRows ? M : N;
    parallelFor((Extent + Block - 1) / Block, 1, [&](int64_t B0, int64_t B1) {
      for (int64_t Blk = B0; Blk < B1; ++Blk) {
        int64_t X0 = Blk * Block, Size = std::min(Block, Extent - X0);
        if (ByRows)
          blasGemm(TransA, TransB, int(Size), int(N), int(K), Alpha,
                   TransA ? A + X0 : A + X0 * Lda, int(Lda), B, int(Ldb),
                   Beta, C + X0 * Ldc, int(Ldc));
        else
          blasGemm(TransA, TransB, int(M), int(Size), int(K), Alpha, A,
                   int(Lda), TransB ? B + X0 * Ldb : B + X0, int(Ldb), Beta,
                   C + X0, int(Ldc));
      }
    });
    return;
  }
  blasGemm(TransA, TransB, int(M), int(N), int(K), Alpha, A, int(Lda), B,
           int(Ldb), Beta, C, int(Ldc));
}

//===----------------------------------------------------------------------===//
// 1. Embedding
//===----------------------------------------------------------------------===//

namespace {
Status checkIds(const int64_t *Ids, int64_t N, int64_t V) {
  for (int64_t I = 0; I < N; ++I)
    if (Ids[I] < 0 || Ids[I] >= V)
      return Status::error("embedding id out of range", I, Ids[I]);
  return Status::success();
}
} // namespace

template <typename T>
Status embedding(T *Y, const T *Table, const int64_t *Ids, int64_t N, int64_t V,
                 int64_t H) {
  checkSizes({N, V, H});
  if (Status S = checkIds(Ids, N, V); !S.ok())
    return S;
  for (int64_t I = 0; I < N; ++I)
    std::memcpy(Y + I * H, Table + Ids[I] * H, sizeof(T) * H);
  return Status::success();
}

template <typename T>
Status embeddingBackward(T *DTable, const T *DY, const int64_t *Ids, int64_t N,
                         int64_t V, int64_t H) {
  checkSizes({N, V, H});
  if (Status S = checkIds(Ids, N, V); !S.ok())
    return S;
  for (int64_t I = 0; I < N; ++I) {
    T *Row = DTable + Ids[I] * H;
    const T *G = DY + I * H;
    for (int64_t J = 0; J < H; ++J)
      Row[J] += G[J];
  }
  return Status::success();
}

//===----------------------------------------------------------------------===//
// 2. Add and its broadcast reduction
//===----------------------------------------------------------------------===//

template <typename T> void add(T *Y, const T *A, const T *B, int64_t N) {
  checkSizes({N});
  for (int64_t I = 0; I < N; ++I)
    Y[I] = A[I] + B[I];
}

template <typename T>
Status addBroadcast(T *Y, Shape YShape, const T *A, Shape AShape, const T *B,
                    Shape BShape) {
  int64_t SA[MaxRank], SB[MaxRank], SY[MaxRank];
  if (Status S = broadcastStrides(AShape, YShape, SA); !S.ok())
    return S;
  if (Status S = broadcastStrides(BShape, YShape, SB); !S.ok())
    return S;
  int R = int(YShape.size());
  rowMajorStrides(R, YShape.data(), SY);
  forEachIndex(R, YShape.data(), [&](const int64_t *Idx) {
    Y[dot(R, Idx, SY)] = A[dot(R, Idx, SA)] + B[dot(R, Idx, SB)];
  });
  return Status::success();
}

template <typename T>
Status reduceToShape(T *DX, Shape XShape, const T *DY, Shape YShape) {
  int64_t SX[MaxRank], SY[MaxRank];
  if (Status S = broadcastStrides(XShape, YShape, SX); !S.ok())
    return S;
  int R = int(YShape.size());
  rowMajorStrides(R, YShape.data(), SY);
  // Split Y's dimensions into the kept ones (one DX element per index) and
  // the reduced ones (summed into it), and sum each DX element in double.
  int RK = 0, RR = 0;
  int64_t KeptDims[MaxRank], KeptSX[MaxRank], KeptSY[MaxRank];
  int64_t RedDims[MaxRank], RedSY[MaxRank];
  for (int D = 0; D < R; ++D) {
    if (SX[D] == 0 && YShape[D] != 1) {
      RedDims[RR] = YShape[D];
      RedSY[RR++] = SY[D];
    } else {
      KeptDims[RK] = YShape[D];
      KeptSX[RK] = SX[D];
      KeptSY[RK++] = SY[D];
    }
  }
  int64_t NX = 1;
  for (int64_t D : XShape)
    NX *= D;
  std::fill(DX, DX + NX, T(0)); // covers a reduction over an empty dimension
  forEachIndex(RK, KeptDims, [&](const int64_t *KIdx) {
    const T *Base = DY + dot(RK, KIdx, KeptSY);
    Acc Sum = 0;
    forEachIndex(RR, RedDims, [&](const int64_t *RIdx) {
      Sum += Base[dot(RR, RIdx, RedSY)];
    });
    DX[dot(RK, KIdx, KeptSX)] = T(Sum);
  });
  return Status::success();
}

//===----------------------------------------------------------------------===//
// 3. LayerNorm
//===----------------------------------------------------------------------===//

template <typename T>
void layerNorm(T *Y, T *Mean, T *Rstd, const T *X, const T *Gamma,
               const T *Beta, int64_t Rows, int64_t H, double Eps) {
  checkSizes({Rows, H});
  SP_CPU_CHECK(H > 0, "layer norm over an empty axis");
  parallelFor(Rows, std::max<int64_t>(1, (1 << 14) / H), [&](int64_t RBegin, int64_t REnd) {
for (int64_t R = RBegin; R < REnd; ++R) {
    const T *XR = X + R * H;
    Acc Sum = 0;
    for (int64_t J = 0; J < H; ++J)
      Sum += XR[J];
    Acc Mu = Sum / Acc(H);
    Acc Var = 0; // two passes: no cancellation
    for (int64_t J = 0; J < H; ++J)
      Var += (XR[J] - Mu) * (XR[J] - Mu);
    Var /= Acc(H);
    Acc S = 1.0 / std::sqrt(Var + Eps);
    T *YR = Y + R * H;
    for (int64_t J = 0; J < H; ++J) {
      Acc V = (XR[J] - Mu) * S;
      if (Gamma)
        V *= Gamma[J];
      if (Beta)
        V += Beta[J];
      YR[J] = T(V);
    }
    if (Mean)
      Mean[R] = T(Mu);
    if (Rstd)
      Rstd[R] = T(S);
  }
  });
}

template <typename T>
void layerNormBackward(T *DX, T *DGamma, T *DBeta, const T *DY, const T *X,
                       const T *Gamma, const T *Mean, const T *Rstd,
                       int64_t Rows, int64_t H) {
  checkSizes({Rows, H});
  for (int64_t R = 0; R < Rows; ++R) {
    const T *XR = X + R * H, *DYR = DY + R * H;
    Acc Mu = Mean[R], S = Rstd[R];
    Acc SumG = 0, SumGX = 0; // sum of g and of g * xhat
    for (int64_t J = 0; J < H; ++J) {
      Acc XHat = (XR[J] - Mu) * S;
      Acc G = Gamma ? Acc(DYR[J]) * Gamma[J] : Acc(DYR[J]);
      SumG += G;
      SumGX += G * XHat;
      if (DGamma)
        DGamma[J] += T(DYR[J] * XHat);
      if (DBeta)
        DBeta[J] += DYR[J];
    }
    if (!DX)
      continue;
    Acc MeanG = SumG / Acc(H), MeanGX = SumGX / Acc(H);
    T *DXR = DX + R * H;
    for (int64_t J = 0; J < H; ++J) {
      Acc XHat = (XR[J] - Mu) * S;
      Acc G = Gamma ? Acc(DYR[J]) * Gamma[J] : Acc(DYR[J]);
      DXR[J] = T(S * (G - MeanG - XHat * MeanGX));
    }
  }
}

//===----------------------------------------------------------------------===//
// 4. Linear
//===----------------------------------------------------------------------===//

template <typename T>
void linear(T *Y, const T *X, const T *W, const T *Bias, int64_t Rows,
            int64_t In, int64_t Out, bool TransW) {
  checkSizes({Rows, In, Out});
  // With a bias, Y starts as the bias broadcast over rows and the GEMM adds.
  if (Bias)
    for (int64_t R = 0; R < Rows; ++R)
      std::memcpy(Y + R * Out, Bias, sizeof(T) * Out);
  gemm<T>(false, TransW, Rows, Out, In, T(1), X, In, W, TransW ? In : Out,
          Bias ? T(1) : T(0), Y, Out);
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
  for (int64_t R = 0; R < Rows; ++R)
    for (int64_t J = 0; J < Out; ++J)
      DBias[J] += DY[R * Out + J];
}

//===----------------------------------------------------------------------===//
// 5. GELU
//===----------------------------------------------------------------------===//

namespace {
constexpr double InvSqrt2 = 0.70710678118654752440;
constexpr double InvSqrt2Pi = 0.39894228040143267794; // 1 / sqrt(2 pi)
constexpr double Sqrt2OverPi = 0.79788456080286535588;
constexpr double GeluCoef = 0.044715;
} // namespace

template <typename T>
void gelu(T *Y, const T *X, int64_t N, GeluApprox Approx) {
  checkSizes({N});
  const T Half = T(0.5), One = T(1);
  if (Approx == GeluApprox::None) {
    parallelFor(N, 1 << 14, [&](int64_t IBegin, int64_t IEnd) {
for (int64_t I = IBegin; I < IEnd; ++I) {
      T X0 = X[I];
      Y[I] = Half * X0 * (One + std::erf(X0 * T(InvSqrt2)));
    }
  });
  } else {
    parallelFor(N, 1 << 14, [&](int64_t IBegin, int64_t IEnd) {
for (int64_t I = IBegin; I < IEnd; ++I) {
      T X0 = X[I];
      T U = T(Sqrt2OverPi) * (X0 + T(GeluCoef) * X0 * X0 * X0);
      Y[I] = Half * X0 * (One + std::tanh(U));
    }
  });
  }
}

template <typename T>
void geluBackward(T *DX, const T *X, const T *DY, int64_t N,
                  GeluApprox Approx) {
  checkSizes({N});
  const T Half = T(0.5), One = T(1);
  if (Approx == GeluApprox::None) {
    parallelFor(N, 1 << 14, [&](int64_t IBegin, int64_t IEnd) {
for (int64_t I = IBegin; I < IEnd; ++I) {
      T X0 = X[I];
      T Cdf = Half * (One + std::erf(X0 * T(InvSqrt2)));
      T Pdf = T(InvSqrt2Pi) * std::exp(-Half * X0 * X0);
      DX[I] = DY[I] * (Cdf + X0 * Pdf);
    }
  });
  } else {
    parallelFor(N, 1 << 14, [&](int64_t IBegin, int64_t IEnd) {
for (int64_t I = IBegin; I < IEnd; ++I) {
      T X0 = X[I];
      T U = T(Sqrt2OverPi) * (X0 + T(GeluCoef) * X0 * X0 * X0);
      T Th = std::tanh(U);
      T DU = T(Sqrt2OverPi) * (One + T(3 * GeluCoef) * X0 * X0);
      DX[I] = DY[I] * (Half * (One + Th) + Half * X0 * (One - Th * Th) * DU);
    }
  });
  }
}

//===----------------------------------------------------------------------===//
// 6. Head layouts
//===----------------------------------------------------------------------===//

template <typename T>
void splitHeads(T *Q, T *K, T *V, const T *QKV, int64_t B, int64_t S,
                int64_t Heads, int64_t D) {
  checkSizes({B, S, Heads, D});
  int64_t H = Heads * D;
  T *Dst[3] = {Q, K, V};
  for (int64_t Bi = 0; Bi < B; ++Bi)
    for (int64_t Si = 0; Si < S; ++Si) {
      const T *Row = QKV + (Bi * S + Si) * 3 * H;
      for (int P = 0; P < 3; ++P)
        for (int64_t A = 0; A < Heads; ++A)
          std::memcpy(Dst[P] + ((Bi * Heads + A) * S + Si) * D,
                      Row + P * H + A * D, sizeof(T) * D);
    }
}

template <typename T>
void splitHeadsBackward(T *DQKV, const T *DQ, const T *DK, const T *DV,
                        int64_t B, int64_t S, int64_t Heads, int64_t D) {
  checkSizes({B, S, Heads, D});
  int64_t H = Heads * D;
  const T *Src[3] = {DQ, DK, DV};
  for (int64_t Bi = 0; Bi < B; ++Bi)
    for (int64_t Si = 0; Si < S; ++Si) {
      T *Row = DQKV + (Bi * S + Si) * 3 * H;
      for (int P = 0; P < 3; ++P)
        for (int64_t A = 0; A < Heads; ++A)
          std::memcpy(Row + P * H + A * D,
                      Src[P] + ((Bi * Heads + A) * S + Si) * D, sizeof(T) * D);
    }
}

template <typename T>
void mergeHeads(T *Y, const T *X, int64_t B, int64_t S, int64_t Heads,
                int64_t D) {
  checkSizes({B, S, Heads, D});
  for (int64_t Bi = 0; Bi < B; ++Bi)
    for (int64_t Si = 0; Si < S; ++Si)
      for (int64_t A = 0; A < Heads; ++A)
        std::memcpy(Y + ((Bi * S + Si) * Heads + A) * D,
                    X + ((Bi * Heads + A) * S + Si) * D, sizeof(T) * D);
}

template <typename T>
void mergeHeadsBackward(T *DX, const T *DY, int64_t B, int64_t S, int64_t Heads,
                        int64_t D) {
  checkSizes({B, S, Heads, D});
  for (int64_t Bi = 0; Bi < B; ++Bi)
    for (int64_t Si = 0; Si < S; ++Si)
      for (int64_t A = 0; A < Heads; ++A)
        std::memcpy(DX + ((Bi * Heads + A) * S + Si) * D,
                    DY + ((Bi * S + Si) * Heads + A) * D, sizeof(T) * D);
}

//===----------------------------------------------------------------------===//
// 7. Batched matrix product
//===----------------------------------------------------------------------===//

template <typename T>
void batchMatMul(T *C, const T *A, const T *B, int64_t Batch, int64_t M,
                 int64_t N, int64_t K, bool TransA, bool TransB) {
  checkSizes({Batch, M, N, K});
  // The batch (heads) over the kernel threads; each product whole.
  parallelFor(Batch, 1, [&](int64_t P0, int64_t P1) {
    for (int64_t P = P0; P < P1; ++P)
      gemm<T>(TransA, TransB, M, N, K, T(1), A + P * M * K, TransA ? M : K,
              B + P * K * N, TransB ? K : N, T(0), C + P * M * N, N);
  });
}

//===----------------------------------------------------------------------===//
// 8. Scale
//===----------------------------------------------------------------------===//

template <typename T> void scale(T *Y, const T *X, int64_t N, double Alpha) {
  checkSizes({N});
  const T A = T(Alpha);
  parallelFor(N, 1 << 14, [&](int64_t I0, int64_t I1) {
    for (int64_t I = I0; I < I1; ++I)
      Y[I] = A * X[I];
  });
}

//===----------------------------------------------------------------------===//
// 9. Causal mask
//===----------------------------------------------------------------------===//

template <typename T>
void causalMask(T *Y, const T *X, int64_t Batch, int64_t Sq, int64_t Sk,
                double Fill, int64_t Q0, int64_t K0) {
  checkSizes({Batch, Sq, Sk});
  const T F = T(Fill);
  for (int64_t P = 0; P < Batch; ++P)
    for (int64_t I = 0; I < Sq; ++I) {
      int64_t Row = (P * Sq + I) * Sk;
      for (int64_t J = 0; J < Sk; ++J)
        Y[Row + J] = K0 + J > Q0 + I ? F : X[Row + J];
    }
}

//===----------------------------------------------------------------------===//
// 10. Softmax
//===----------------------------------------------------------------------===//

template <typename T> void softmax(T *Y, const T *X, int64_t Rows, int64_t N) {
  checkSizes({Rows, N});
  parallelFor(Rows, std::max<int64_t>(1, (1 << 14) / N), [&](int64_t RBegin, int64_t REnd) {
for (int64_t R = RBegin; R < REnd; ++R) {
    const T *XR = X + R * N;
    T *YR = Y + R * N;
    T Max = -std::numeric_limits<T>::infinity();
    for (int64_t J = 0; J < N; ++J)
      Max = std::max(Max, XR[J]);
    if (Max == -std::numeric_limits<T>::infinity()) { // all masked
      std::fill(YR, YR + N, T(0));
      continue;
    }
    Acc Sum = 0;
    for (int64_t J = 0; J < N; ++J) {
      Acc E = std::exp(Acc(XR[J]) - Acc(Max));
      YR[J] = T(E);
      Sum += E;
    }
    Acc Inv = 1.0 / Sum; // X is no longer read: Y may alias it
    for (int64_t J = 0; J < N; ++J)
      YR[J] = T(Acc(YR[J]) * Inv);
  }
  });
}

template <typename T>
void softmaxBackward(T *DX, const T *Y, const T *DY, int64_t Rows, int64_t N) {
  checkSizes({Rows, N});
  parallelFor(Rows, std::max<int64_t>(1, (1 << 14) / N), [&](int64_t RBegin, int64_t REnd) {
for (int64_t R = RBegin; R < REnd; ++R) {
    const T *YR = Y + R * N, *DYR = DY + R * N;
    Acc Dot = 0;
    for (int64_t J = 0; J < N; ++J)
      Dot += Acc(DYR[J]) * YR[J];
    T *DXR = DX + R * N;
    for (int64_t J = 0; J < N; ++J)
      DXR[J] = T(YR[J] * (DYR[J] - Dot));
  }
  });
}

//===----------------------------------------------------------------------===//
// 11. Dropout
//===----------------------------------------------------------------------===//

GlobalIndex GlobalIndex::whole(Shape S) {
  GlobalIndex G = block(S, S, {});
  return G;
}

GlobalIndex GlobalIndex::block(Shape GlobalShape, Shape LocalShape, Shape Off) {
  GlobalIndex G;
  G.Rank = int(GlobalShape.size());
  // An over-long shape is left for check() to reject.
  int R = std::min(G.Rank, MaxRank);
  for (int D = 0; D < R; ++D) {
    G.Global[D] = GlobalShape[D];
    G.Local[D] = D < int(LocalShape.size()) ? LocalShape[D] : -1;
    G.Offset[D] = D < int(Off.size()) ? Off[D] : 0;
  }
  if (LocalShape.size() != GlobalShape.size() ||
      (!Off.empty() && Off.size() != GlobalShape.size()))
    G.Local[0] = -1; // ranks disagree: make check() fail
  return G;
}

int64_t GlobalIndex::numLocal() const {
  int64_t N = 1;
  for (int D = 0; D < Rank && D < MaxRank; ++D)
    N *= Local[D];
  return N;
}

Status GlobalIndex::check() const {
  if (Rank < 0 || Rank > MaxRank)
    return Status::error("global index: rank above MaxRank", -1, Rank);
  for (int D = 0; D < Rank; ++D)
    if (Global[D] < 0 || Local[D] < 0 || Offset[D] < 0 ||
        Offset[D] + Local[D] > Global[D])
      return Status::error("global index: block outside the global shape "
                           "(or ranks disagree)",
                           D, Local[D]);
  return Status::success();
}

namespace {

/// Calls Fn(LocalIndex, GlobalIndex) for every element of the block, in local
/// row-major order.
template <typename F> void forEachGlobal(const GlobalIndex &G, F &&Fn) {
  int R = G.Rank;
  if (R == 0) {
    Fn(int64_t(0), uint64_t(0));
    return;
  }
  int64_t GS[MaxRank];
  rowMajorStrides(R, G.Global, GS);
  int64_t Inner = G.Local[R - 1];
  int64_t Local = 0;
  // Rows of the block along the last axis are contiguous in the global
  // tensor too: one base index per row.
  forEachIndex(R - 1, G.Local, [&](const int64_t *Idx) {
    int64_t Base = G.Offset[R - 1];
    for (int D = 0; D < R - 1; ++D)
      Base += (G.Offset[D] + Idx[D]) * GS[D];
    for (int64_t J = 0; J < Inner; ++J)
      Fn(Local++, uint64_t(Base + J));
  });
}

Status checkDropout(double Ratio, const DropoutKey &K, const GlobalIndex &G) {
  if (!(Ratio >= 0.0 && Ratio <= 1.0))
    return Status::error("dropout ratio outside [0, 1]");
  if (K.Layer > 0xFFFFu)
    return Status::error("dropout key layer above 65535", -1, K.Layer);
  if (K.Site > 0xFFFFu)
    return Status::error("dropout key site above 65535", -1, K.Site);
  return G.check();
}

/// Calls Fn(LocalIndex, Keep) for every element of the block, Keep being
/// whether dropout keeps it. One Philox call serves a block of four global
/// elements; consecutive elements of a row share it.
template <typename F>
void forEachKeep(double Ratio, const DropoutKey &K, const GlobalIndex &G,
                 F &&Fn) {
  const uint64_t Threshold = philox::dropoutThreshold(Ratio);
  uint64_t CachedBlock = ~uint64_t(0);
  philox::Words4 Words{};
  forEachGlobal(G, [&](int64_t L, uint64_t Index) {
    uint64_t Block = Index >> 2;
    if (Block != CachedBlock) {
      Words = philox::philox4x32_10(
          philox::dropoutCounter(K.Layer, K.Site, K.Stream, Index),
          uint32_t(K.Seed), uint32_t(K.Seed >> 32));
      CachedBlock = Block;
    }
    Fn(L, Words.V[Index & 3] >= Threshold);
  });
}

} // namespace

Status dropoutMask(uint8_t *Mask, double Ratio, const DropoutKey &K,
                   const GlobalIndex &G) {
  if (Status S = checkDropout(Ratio, K, G); !S.ok())
    return S;
  forEachKeep(Ratio, K, G, [&](int64_t L, bool Keep) { Mask[L] = Keep; });
  return Status::success();
}

/// Whether the block is the whole tensor: local and global indices agree.
static bool isWhole(const GlobalIndex &G) {
  for (int D = 0; D < G.Rank; ++D)
    if (G.Offset[D] != 0 || G.Local[D] != G.Global[D])
      return false;
  return true;
}

template <typename T>
Status dropout(T *Y, uint8_t *Mask, const T *X, double Ratio,
               const DropoutKey &K, const GlobalIndex &G) {
  if (Status S = checkDropout(Ratio, K, G); !S.ok())
    return S;
  const T Scale = Ratio >= 1.0 ? T(0) : T(1.0 / (1.0 - Ratio));
  if (isWhole(G)) {
    // Element i's mask comes from the Philox block i / 4: split the range
    // into whole blocks over the kernel threads.
    const uint64_t Threshold = philox::dropoutThreshold(Ratio);
    int64_t N = G.numLocal(), Blocks = (N + 3) / 4;
    parallelFor(Blocks, 1 << 12, [&](int64_t BBegin, int64_t BEnd) {
      for (int64_t B = BBegin; B < BEnd; ++B) {
        uint64_t Index = uint64_t(B) * 4;
        philox::Words4 Words = philox::philox4x32_10(
            philox::dropoutCounter(K.Layer, K.Site, K.Stream, Index),
            uint32_t(K.Seed), uint32_t(K.Seed >> 32));
        for (int64_t L = B * 4, E = std::min(N, L + 4); L < E; ++L) {
          bool Keep = Words.V[L & 3] >= Threshold;
          if (Mask)
            Mask[L] = Keep;
          Y[L] = Keep ? X[L] * Scale : T(0);
        }
      }
    });
    return Status::success();
  }
  forEachKeep(Ratio, K, G, [&](int64_t L, bool Keep) {
    if (Mask)
      Mask[L] = Keep;
    Y[L] = Keep ? X[L] * Scale : T(0);
  });
  return Status::success();
}

template <typename T>
void dropoutBackward(T *DX, const T *DY, const uint8_t *Mask, int64_t N,
                     double Ratio) {
  checkSizes({N});
  const T Scale = Ratio >= 1.0 ? T(0) : T(1.0 / (1.0 - Ratio));
  for (int64_t I = 0; I < N; ++I)
    DX[I] = Mask[I] ? DY[I] * Scale : T(0);
}

//===----------------------------------------------------------------------===//
// 12. Cross entropy
//===----------------------------------------------------------------------===//

namespace {

Status checkCrossEntropy(const int64_t *Targets, int64_t N, int64_t V,
                         int64_t ValidV) {
  if (N <= 0)
    return Status::error("cross entropy over no rows", -1, N);
  if (ValidV < 1 || ValidV > V)
    return Status::error("cross entropy valid vocabulary not in [1, V]", -1,
                         ValidV);
  for (int64_t I = 0; I < N; ++I)
    if (Targets[I] < 0 || Targets[I] >= ValidV)
      return Status::error("cross entropy target out of range", I, Targets[I]);
  return Status::success();
}

/// The row's max and log-sum-exp over its first ValidV entries.
template <typename T>
void rowLogSumExp(const T *Row, int64_t ValidV, Acc &Max, Acc &Lse) {
  Max = -std::numeric_limits<Acc>::infinity();
  for (int64_t J = 0; J < ValidV; ++J)
    Max = std::max(Max, Acc(Row[J]));
  Acc Sum = 0;
  for (int64_t J = 0; J < ValidV; ++J)
    Sum += std::exp(Acc(Row[J]) - Max);
  Lse = Max + std::log(Sum);
}

} // namespace

template <typename T>
Status crossEntropy(T *Loss, const T *Logits, const int64_t *Targets, int64_t N,
                    int64_t V, int64_t ValidV) {
  if (Status S = checkCrossEntropy(Targets, N, V, ValidV); !S.ok())
    return S;
  Acc Total = 0;
  for (int64_t R = 0; R < N; ++R) {
    const T *Row = Logits + R * V;
    Acc Max, Lse;
    rowLogSumExp(Row, ValidV, Max, Lse);
    Total += Lse - Acc(Row[Targets[R]]);
  }
  *Loss = T(Total / Acc(N));
  return Status::success();
}

template <typename T>
Status crossEntropyBackward(T *DLogits, const T *Logits, const int64_t *Targets,
                            double DLoss, int64_t N, int64_t V,
                            int64_t ValidV) {
  if (Status S = checkCrossEntropy(Targets, N, V, ValidV); !S.ok())
    return S;
  const Acc Factor = DLoss / Acc(N);
  for (int64_t R = 0; R < N; ++R) {
    const T *Row = Logits + R * V;
    T *DRow = DLogits + R * V;
    Acc Max, Lse;
    rowLogSumExp(Row, ValidV, Max, Lse);
    for (int64_t J = 0; J < ValidV; ++J) {
      Acc P = std::exp(Acc(Row[J]) - Lse);
      DRow[J] = T(Factor * (P - (J == Targets[R] ? 1.0 : 0.0)));
    }
    std::fill(DRow + ValidV, DRow + V, T(0));
  }
  return Status::success();
}

//===----------------------------------------------------------------------===//
// 13. Optimizer
//===----------------------------------------------------------------------===//

template <typename T> double sumSquares(const T *G, int64_t N) {
  checkSizes({N});
  Acc Sum = 0;
  for (int64_t I = 0; I < N; ++I)
    Sum += Acc(G[I]) * G[I];
  return Sum;
}

template <typename T> T clipCoefficient(T TotalNorm, T MaxNorm) {
  // torch: clip_coef = max_norm / (total_norm + 1e-6), i.e.
  // (total_norm + 1e-6).reciprocal() * max_norm, then clamp(max = 1).
  T Coef = (T(1) / (TotalNorm + T(1e-6))) * MaxNorm;
  return Coef < T(1) ? Coef : T(1);
}

template <typename T>
void adamw(T *P, const T *G, T *M, T *V, int64_t N, double Lr, double Beta1,
           double Beta2, double Eps, double WeightDecay, double GradScale,
           int64_t Step) {
  checkSizes({N});
  SP_CPU_CHECK(Step >= 1, "adam steps count from 1");
  // The scalars, in double, as torch computes them in Python.
  const T Decay = T(1.0 - Lr * WeightDecay);
  const T B1 = T(Beta1), OneMinusB1 = T(1.0 - Beta1);
  const T B2 = T(Beta2), OneMinusB2 = T(1.0 - Beta2);
  const double Bc1 = 1.0 - std::pow(Beta1, double(Step));
  const double Bc2 = 1.0 - std::pow(Beta2, double(Step));
  const T StepSize = T(Lr / Bc1);
  const T Bc2Sqrt = T(std::sqrt(Bc2));
  const T E = T(Eps), Scale = T(GradScale);
  parallelFor(N, 1 << 14, [&](int64_t IBegin, int64_t IEnd) {
for (int64_t I = IBegin; I < IEnd; ++I) {
    T Grad = G[I] * Scale;
    P[I] *= Decay;
    M[I] = B1 * M[I] + OneMinusB1 * Grad;
    V[I] = B2 * V[I] + OneMinusB2 * Grad * Grad;
    T Denom = std::sqrt(V[I]) / Bc2Sqrt + E;
    P[I] -= StepSize * (M[I] / Denom);
  }
  });
}

//===----------------------------------------------------------------------===//
// Instantiations
//===----------------------------------------------------------------------===//

#define SP_INSTANTIATE(T)                                                      \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T *,   \
                        int64_t, const T *, int64_t, T, T *, int64_t);         \
  template Status embedding<T>(T *, const T *, const int64_t *, int64_t,       \
                               int64_t, int64_t);                              \
  template Status embeddingBackward<T>(T *, const T *, const int64_t *,        \
                                       int64_t, int64_t, int64_t);             \
  template void add<T>(T *, const T *, const T *, int64_t);                    \
  template Status addBroadcast<T>(T *, Shape, const T *, Shape, const T *,     \
                                  Shape);                                      \
  template Status reduceToShape<T>(T *, Shape, const T *, Shape);              \
  template void layerNorm<T>(T *, T *, T *, const T *, const T *, const T *,   \
                             int64_t, int64_t, double);                        \
  template void layerNormBackward<T>(T *, T *, T *, const T *, const T *,      \
                                     const T *, const T *, const T *, int64_t, \
                                     int64_t);                                 \
  template void linear<T>(T *, const T *, const T *, const T *, int64_t,       \
                          int64_t, int64_t, bool);                             \
  template void linearBackwardInput<T>(T *, const T *, const T *, int64_t,     \
                                       int64_t, int64_t, bool);                \
  template void linearBackwardWeight<T>(T *, const T *, const T *, int64_t,    \
                                        int64_t, int64_t, bool);               \
  template void biasBackward<T>(T *, const T *, int64_t, int64_t);             \
  template void gelu<T>(T *, const T *, int64_t, GeluApprox);                  \
  template void geluBackward<T>(T *, const T *, const T *, int64_t,            \
                                GeluApprox);                                   \
  template void splitHeads<T>(T *, T *, T *, const T *, int64_t, int64_t,      \
                              int64_t, int64_t);                               \
  template void splitHeadsBackward<T>(T *, const T *, const T *, const T *,    \
                                      int64_t, int64_t, int64_t, int64_t);     \
  template void mergeHeads<T>(T *, const T *, int64_t, int64_t, int64_t,       \
                              int64_t);                                        \
  template void mergeHeadsBackward<T>(T *, const T *, int64_t, int64_t,        \
                                      int64_t, int64_t);                       \
  template void batchMatMul<T>(T *, const T *, const T *, int64_t, int64_t,    \
                               int64_t, int64_t, bool, bool);                  \
  template void scale<T>(T *, const T *, int64_t, double);                     \
  template void causalMask<T>(T *, const T *, int64_t, int64_t, int64_t,       \
                              double, int64_t, int64_t);                       \
  template void softmax<T>(T *, const T *, int64_t, int64_t);                  \
  template void softmaxBackward<T>(T *, const T *, const T *, int64_t,         \
                                   int64_t);                                   \
  template Status dropout<T>(T *, uint8_t *, const T *, double,                \
                             const DropoutKey &, const GlobalIndex &);         \
  template void dropoutBackward<T>(T *, const T *, const uint8_t *, int64_t,   \
                                   double);                                    \
  template Status crossEntropy<T>(T *, const T *, const int64_t *, int64_t,    \
                                  int64_t, int64_t);                           \
  template Status crossEntropyBackward<T>(T *, const T *, const int64_t *,     \
                                          double, int64_t, int64_t, int64_t);  \
  template double sumSquares<T>(const T *, int64_t);                           \
  template T clipCoefficient<T>(T, T);                                         \
  template void adamw<T>(T *, const T *, T *, T *, int64_t, double, double,    \
                         double, double, double, double, int64_t);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
