//===- Kernels.cpp - CPU kernels of every op, forward and backward --------===//
//
// Plain loops, one op after the other, its backward right below it. The math
// of each kernel is stated in Kernels.h; comments here only explain the how.
// The hot loops are written to vectorise (see "Vectorisable building
// blocks"): exp, erf and Philox are computed inline rather than by libm
// calls, and the loops run over the kernel thread pool (Parallel.h).
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Simd.h"
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
#include <type_traits>

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

using namespace simd;

namespace {

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

/// Idx = the multi-index of row-major position Flat in Dims (R dimensions).
void unflatten(int64_t Flat, int R, const int64_t *Dims, int64_t *Idx) {
  for (int D = R - 1; D >= 0; --D) {
    Idx[D] = Flat % Dims[D];
    Flat /= Dims[D];
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

/// The standard normal CDF Phi(x) = 0.5 erfc(-x / sqrt 2) in double, within
/// about 1e-11 relative (also in the lower tail, unlike 0.5 (1 + erf)).
/// Gauss is set to exp(-x^2 / 2), which the GELU's derivative needs too.
/// With a = |x| / sqrt 2 and t = 1 / (1 + 0.3 a): erfc(a) = t Q(t) exp(-a^2),
/// Q a degree-12 polynomial fitted (weighted least squares, relative error)
/// on a in [0, 10]; a is clamped to 10, where erfc is far below float's
/// range.
SP_INLINE double normalCdf(double X, double &Gauss) {
  constexpr double InvSqrt2D = 0.70710678118654752440;
  double Z = X * InvSqrt2D;
  double A = Z < 0.0 ? -Z : Z;
  A = A > 10.0 ? 10.0 : A;
  double T = 1.0 / (1.0 + 0.3 * A);
  double Q = -0.024791171375631214;
  Q = Q * T + 0.18965657743677838;
  Q = Q * T - 0.5979185471623412;
  Q = Q * T + 1.0080039024326917;
  Q = Q * T - 1.077466910704484;
  Q = Q * T + 0.8853258797015948;
  Q = Q * T - 0.39418524669208055;
  Q = Q * T + 0.2845972437538755;
  Q = Q * T + 0.07058738544308457;
  Q = Q * T + 0.15741777629678796;
  Q = Q * T + 0.16014172331997442;
  Q = Q * T + 0.16937901772487515;
  Q = Q * T + 0.16925236982847486;
  Gauss = expD(-(Z * Z));
  double HalfErfc = 0.5 * (T * Q * Gauss); // 0.5 erfc(|z|)
  return Z < 0.0 ? HalfErfc : 1.0 - HalfErfc;
}

/// 1 + tanh(U) in double from E = exp(-2 |U|), branch-free: 2 / (1 + E) for
/// U >= 0 and 2 E / (1 + E) for U < 0, so that it stays accurate relatively
/// where it is small (the tanh GELU's lower tail).
SP_INLINE double onePlusTanh(double U) {
  double A = U < 0.0 ? -U : U;
  double E = expD(-2.0 * A);
  double Inv = 2.0 / (1.0 + E);
  return U < 0.0 ? E * Inv : Inv;
}

/// Columns per block of the column sums (layerNormBackward, biasBackward,
/// rmsNormBackward): a block's double accumulators stay in L1.
constexpr int64_t ColumnBlock = 256;

/// The column sums' order (Kernels.h, ColumnRows): for each column, the
/// rows in blocks of ColumnRows, each block summed in order from 0 in
/// double, the blocks' sums added in order. AddRow(R, Part) adds row R's N
/// terms of the block's columns to Part[k][j - JB]; Sums[k] gets the
/// totals. The CUDA kernels sum the blocks in parallel in this order.
template <int N, typename F>
void columnBlockSums(int64_t Rows, int64_t Width, Acc (&Sums)[N][ColumnBlock],
                     F &&AddRow) {
  for (int64_t R0 = 0; R0 < Rows; R0 += ColumnRows) {
    Acc Part[N][ColumnBlock] = {};
    for (int64_t R = R0, RE = std::min(Rows, R0 + ColumnRows); R < RE; ++R)
      AddRow(R, Part);
    for (int K = 0; K < N; ++K)
      for (int64_t J = 0; J < Width; ++J)
        Sums[K][J] += Part[K][J];
  }
}

} // namespace

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
  parallelFor(N, 1 << 14, [&](int64_t I0, int64_t I1) {
    for (int64_t I = I0; I < I1; ++I)
      Y[I] = A[I] + B[I];
  });
}

namespace {
/// Y[YShape] = Fn(A[AShape], B[BShape]) under numpy broadcasting: the shared
/// body of addBroadcast and mulBroadcast.
template <typename T, typename F>
Status broadcastBinary(T *Y, Shape YShape, const T *A, Shape AShape,
                       const T *B, Shape BShape, F &&Fn) {
  int64_t SA[MaxRank], SB[MaxRank], SY[MaxRank];
  if (Status S = broadcastStrides(AShape, YShape, SA); !S.ok())
    return S;
  if (Status S = broadcastStrides(BShape, YShape, SB); !S.ok())
    return S;
  int R = int(YShape.size());
  if (R == 0) {
    Y[0] = Fn(A[0], B[0]);
    return Status::success();
  }
  rowMajorStrides(R, YShape.data(), SY);
  // Rows of Y's last dimension (each operand's stride along it is 1 or 0,
  // broadcast) over the kernel threads; a row's offsets in A and B from
  // its index over the other dimensions.
  const int64_t Inner = YShape[R - 1], IA = SA[R - 1], IB = SB[R - 1];
  int64_t Rows = 1;
  for (int D = 0; D + 1 < R; ++D)
    Rows *= YShape[D];
  if (Inner == 0 || Rows == 0)
    return Status::success();
  parallelFor(Rows, std::max<int64_t>(1, (1 << 13) / Inner),
              [&](int64_t R0, int64_t R1) {
                int64_t Idx[MaxRank];
                for (int64_t Row = R0; Row < R1; ++Row) {
                  unflatten(Row, R - 1, YShape.data(), Idx);
                  int64_t OffA = dot(R - 1, Idx, SA), OffB = dot(R - 1, Idx, SB);
                  T *YR = Y + Row * Inner;
                  for (int64_t J = 0; J < Inner; ++J)
                    YR[J] = Fn(A[OffA + J * IA], B[OffB + J * IB]);
                }
              });
  return Status::success();
}
} // namespace

template <typename T>
Status addBroadcast(T *Y, Shape YShape, const T *A, Shape AShape, const T *B,
                    Shape BShape) {
  return broadcastBinary(Y, YShape, A, AShape, B, BShape,
                         [](T X0, T X1) { return X0 + X1; });
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
  int64_t NK = 1, NR = 1;
  for (int D = 0; D < RK; ++D)
    NK *= KeptDims[D];
  for (int D = 0; D < RR; ++D)
    NR *= RedDims[D];
  if (NK == 0 || NR == 0)
    return Status::success();
  // The DX elements over the kernel threads, each summed by one thread in
  // the reduced dimensions' row-major order.
  parallelFor(NK, std::max<int64_t>(1, (1 << 13) / NR), [&](int64_t K0,
                                                           int64_t K1) {
    int64_t KIdx[MaxRank];
    for (int64_t K = K0; K < K1; ++K) {
      unflatten(K, RK, KeptDims, KIdx);
      const T *Base = DY + dot(RK, KIdx, KeptSY);
      Acc Sum = 0;
      forEachIndex(RR, RedDims, [&](const int64_t *RIdx) {
        Sum += Base[dot(RR, RIdx, RedSY)];
      });
      DX[dot(RK, KIdx, KeptSX)] = T(Sum);
    }
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
  parallelFor(Rows, std::max<int64_t>(1, (1 << 13) / H), [&](int64_t R0,
                                                             int64_t R1) {
    for (int64_t R = R0; R < R1; ++R) {
      const T *XR = X + R * H;
      Acc Mu = laneSum(H, [&](int64_t J) { return Acc(XR[J]); }) / Acc(H);
      // Two passes: no cancellation.
      Acc Var = laneSum(H, [&](int64_t J) {
                  Acc D = XR[J] - Mu;
                  return D * D;
                }) /
                Acc(H);
      Acc S = 1.0 / std::sqrt(Var + Eps);
      T *YR = Y + R * H;
      if (Gamma && Beta)
        for (int64_t J = 0; J < H; ++J)
          YR[J] = T((XR[J] - Mu) * S * Gamma[J] + Beta[J]);
      else
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
  // DX: rows over the threads, each row's sums in double.
  if (DX)
    parallelFor(Rows, std::max<int64_t>(1, (1 << 13) / std::max<int64_t>(H, 1)),
                [&](int64_t R0, int64_t R1) {
      for (int64_t R = R0; R < R1; ++R) {
        const T *XR = X + R * H, *DYR = DY + R * H;
        Acc Mu = Mean[R], S = Rstd[R];
        auto G = [&](int64_t J) {
          return Gamma ? Acc(DYR[J]) * Gamma[J] : Acc(DYR[J]);
        };
        Acc MeanG = laneSum(H, G) / Acc(H);
        Acc MeanGX = laneSum(H, [&](int64_t J) {
                       return G(J) * ((XR[J] - Mu) * S);
                     }) /
                     Acc(H);
        T *DXR = DX + R * H;
        for (int64_t J = 0; J < H; ++J) {
          Acc XHat = (XR[J] - Mu) * S;
          DXR[J] = T(S * (G(J) - MeanG - XHat * MeanGX));
        }
      }
    });
  if (!DGamma && !DBeta)
    return;
  // DGamma, DBeta: columns over the threads, each column summed over the
  // rows in double in the column sums' order and added once.
  parallelFor(H, 64, [&](int64_t J0, int64_t J1) {
    for (int64_t JB = J0; JB < J1; JB += ColumnBlock) {
      int64_t JE = std::min(J1, JB + ColumnBlock);
      Acc Sums[2][ColumnBlock] = {};
      columnBlockSums(Rows, JE - JB, Sums, [&](int64_t R, auto &Part) {
        const T *XR = X + R * H, *DYR = DY + R * H;
        Acc Mu = Mean[R], S = Rstd[R];
        for (int64_t J = JB; J < JE; ++J) {
          Part[0][J - JB] += DYR[J] * ((XR[J] - Mu) * S);
          Part[1][J - JB] += DYR[J];
        }
      });
      for (int64_t J = JB; J < JE; ++J) {
        if (DGamma)
          DGamma[J] += T(Sums[0][J - JB]);
        if (DBeta)
          DBeta[J] += T(Sums[1][J - JB]);
      }
    }
  });
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
  parallelFor(Out, 64, [&](int64_t J0, int64_t J1) {
    for (int64_t JB = J0; JB < J1; JB += ColumnBlock) {
      int64_t JE = std::min(J1, JB + ColumnBlock);
      Acc Sum[1][ColumnBlock] = {};
      columnBlockSums(Rows, JE - JB, Sum, [&](int64_t R, auto &Part) {
        for (int64_t J = JB; J < JE; ++J)
          Part[0][J - JB] += DY[R * Out + J];
      });
      for (int64_t J = JB; J < JE; ++J)
        DBias[J] += T(Sum[0][J - JB]);
    }
  });
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

namespace {

// float GELUs: computed in double from normalCdf / onePlusTanh and rounded
// once.
// double (the finite-difference tests) keeps libm's erf and tanh below.

SP_INLINE double geluErfD(double X) {
  double Gauss;
  return X * normalCdf(X, Gauss);
}

SP_INLINE double geluErfGradD(double X) {
  double Gauss;
  double Cdf = normalCdf(X, Gauss);
  return Cdf + X * (InvSqrt2Pi * Gauss);
}

SP_INLINE double geluTanhD(double X) {
  double U = Sqrt2OverPi * (X + GeluCoef * X * X * X);
  return 0.5 * X * onePlusTanh(U);
}

SP_INLINE double geluTanhGradD(double X) {
  double U = Sqrt2OverPi * (X + GeluCoef * X * X * X);
  double P = onePlusTanh(U);                 // 1 + tanh u
  double Sech2 = P * (2.0 - P);              // 1 - tanh^2 u
  double DU = Sqrt2OverPi * (1.0 + 3 * GeluCoef * X * X);
  return 0.5 * P + 0.5 * X * Sech2 * DU;
}

SP_SIMD void geluErfF(float *Y, const float *X, int64_t N) {
  for (int64_t I = 0; I < N; ++I)
    Y[I] = float(geluErfD(X[I]));
}

SP_SIMD void geluTanhF(float *Y, const float *X, int64_t N) {
  for (int64_t I = 0; I < N; ++I)
    Y[I] = float(geluTanhD(X[I]));
}

SP_SIMD void geluErfBackwardF(float *DX, const float *X, const float *DY,
                              int64_t N) {
  for (int64_t I = 0; I < N; ++I)
    DX[I] = float(double(DY[I]) * geluErfGradD(X[I]));
}

SP_SIMD void geluTanhBackwardF(float *DX, const float *X, const float *DY,
                               int64_t N) {
  for (int64_t I = 0; I < N; ++I)
    DX[I] = float(double(DY[I]) * geluTanhGradD(X[I]));
}

} // namespace

template <typename T>
void gelu(T *Y, const T *X, int64_t N, GeluApprox Approx) {
  checkSizes({N});
  const T Half = T(0.5), One = T(1);
  parallelFor(N, 1 << 13, [&](int64_t I0, int64_t I1) {
    if constexpr (std::is_same_v<T, float>) {
      if (Approx == GeluApprox::None)
        geluErfF(Y + I0, X + I0, I1 - I0);
      else
        geluTanhF(Y + I0, X + I0, I1 - I0);
    } else if (Approx == GeluApprox::None) {
      for (int64_t I = I0; I < I1; ++I) {
        T X0 = X[I];
        Y[I] = Half * X0 * (One + std::erf(X0 * T(InvSqrt2)));
      }
    } else {
      for (int64_t I = I0; I < I1; ++I) {
        T X0 = X[I];
        T U = T(Sqrt2OverPi) * (X0 + T(GeluCoef) * X0 * X0 * X0);
        Y[I] = Half * X0 * (One + std::tanh(U));
      }
    }
  });
}

template <typename T>
void geluBackward(T *DX, const T *X, const T *DY, int64_t N,
                  GeluApprox Approx) {
  checkSizes({N});
  const T Half = T(0.5), One = T(1);
  parallelFor(N, 1 << 13, [&](int64_t I0, int64_t I1) {
    if constexpr (std::is_same_v<T, float>) {
      if (Approx == GeluApprox::None)
        geluErfBackwardF(DX + I0, X + I0, DY + I0, I1 - I0);
      else
        geluTanhBackwardF(DX + I0, X + I0, DY + I0, I1 - I0);
    } else if (Approx == GeluApprox::None) {
      for (int64_t I = I0; I < I1; ++I) {
        T X0 = X[I];
        T Cdf = Half * (One + std::erf(X0 * T(InvSqrt2)));
        T Pdf = T(InvSqrt2Pi) * std::exp(-Half * X0 * X0);
        DX[I] = DY[I] * (Cdf + X0 * Pdf);
      }
    } else {
      for (int64_t I = I0; I < I1; ++I) {
        T X0 = X[I];
        T U = T(Sqrt2OverPi) * (X0 + T(GeluCoef) * X0 * X0 * X0);
        T Th = std::tanh(U);
        T DU = T(Sqrt2OverPi) * (One + T(3 * GeluCoef) * X0 * X0);
        DX[I] = DY[I] * (Half * (One + Th) + Half * X0 * (One - Th * Th) * DU);
      }
    }
  });
}

template <typename T>
void linearGelu(T *Z, T *Y, const T *X, const T *W, const T *Bias,
                int64_t Rows, int64_t In, int64_t Out, bool TransW,
                GeluApprox Approx) {
  linear(Z, X, W, Bias, Rows, In, Out, TransW);
  gelu(Y, Z, Rows * Out, Approx);
}

template <typename T>
void linearGeluBackward(T *DX, const T *DY, const T *W, const T *Z,
                        int64_t Rows, int64_t In, int64_t Out, bool TransW,
                        GeluApprox Approx) {
  // The linear input gradient into DX, then the GELU's gradient of it in
  // place.
  linear(DX, DY, W, static_cast<const T *>(nullptr), Rows, In, Out, TransW);
  geluBackward(DX, Z, DX, Rows * Out, Approx);
}

//===----------------------------------------------------------------------===//
// 6. Head layouts
//===----------------------------------------------------------------------===//

namespace {
/// Runs Body(b, s) for every token (b, s) of a [B, S] batch, the tokens
/// split over the kernel threads in runs of about 8K elements (a token
/// moves Elems of them). The head layouts are copies: each element is
/// written once, so the split changes nothing.
template <typename F>
void forTokens(int64_t B, int64_t S, int64_t Elems, F &&Body) {
  parallelFor(B * S, std::max<int64_t>(1, (1 << 13) / std::max<int64_t>(Elems, 1)),
              [&](int64_t T0, int64_t T1) {
                for (int64_t T = T0; T < T1; ++T)
                  Body(T / S, T % S);
              });
}
} // namespace

template <typename T>
void splitHeads(T *Q, T *K, T *V, const T *QKV, int64_t B, int64_t S,
                int64_t Heads, int64_t D) {
  checkSizes({B, S, Heads, D});
  int64_t H = Heads * D;
  T *Dst[3] = {Q, K, V};
  forTokens(B, S, 3 * H, [&](int64_t Bi, int64_t Si) {
    const T *Row = QKV + (Bi * S + Si) * 3 * H;
    for (int P = 0; P < 3; ++P)
      for (int64_t A = 0; A < Heads; ++A)
        std::memcpy(Dst[P] + ((Bi * Heads + A) * S + Si) * D,
                    Row + P * H + A * D, sizeof(T) * D);
  });
}

template <typename T>
void splitHeadsBackward(T *DQKV, const T *DQ, const T *DK, const T *DV,
                        int64_t B, int64_t S, int64_t Heads, int64_t D) {
  checkSizes({B, S, Heads, D});
  int64_t H = Heads * D;
  const T *Src[3] = {DQ, DK, DV};
  forTokens(B, S, 3 * H, [&](int64_t Bi, int64_t Si) {
    T *Row = DQKV + (Bi * S + Si) * 3 * H;
    for (int P = 0; P < 3; ++P)
      for (int64_t A = 0; A < Heads; ++A)
        std::memcpy(Row + P * H + A * D,
                    Src[P] + ((Bi * Heads + A) * S + Si) * D, sizeof(T) * D);
  });
}

template <typename T>
void mergeHeads(T *Y, const T *X, int64_t B, int64_t S, int64_t Heads,
                int64_t D) {
  checkSizes({B, S, Heads, D});
  forTokens(B, S, Heads * D, [&](int64_t Bi, int64_t Si) {
    for (int64_t A = 0; A < Heads; ++A)
      std::memcpy(Y + ((Bi * S + Si) * Heads + A) * D,
                  X + ((Bi * Heads + A) * S + Si) * D, sizeof(T) * D);
  });
}

template <typename T>
void mergeHeadsBackward(T *DX, const T *DY, int64_t B, int64_t S, int64_t Heads,
                        int64_t D) {
  checkSizes({B, S, Heads, D});
  forTokens(B, S, Heads * D, [&](int64_t Bi, int64_t Si) {
    for (int64_t A = 0; A < Heads; ++A)
      std::memcpy(DX + ((Bi * Heads + A) * S + Si) * D,
                  DY + ((Bi * S + Si) * Heads + A) * D, sizeof(T) * D);
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

namespace {
/// How many of its Sk keys the causal mask keeps for query row I (global
/// query Q0 + I, key j global K0 + j): those with K0 + j <= Q0 + I.
SP_INLINE int64_t causalKeep(int64_t I, int64_t Sk, int64_t Q0 = 0,
                             int64_t K0 = 0) {
  return std::clamp<int64_t>(Q0 + I - K0 + 1, 0, Sk);
}
} // namespace

template <typename T>
void causalMask(T *Y, const T *X, int64_t Batch, int64_t Sq, int64_t Sk,
                double Fill, int64_t Q0, int64_t K0) {
  checkSizes({Batch, Sq, Sk});
  const T F = T(Fill);
  // Row i keeps its columns j <= Q0 + i - K0 and fills the rest.
  parallelFor(Batch * Sq, std::max<int64_t>(1, (1 << 13) / std::max<int64_t>(Sk, 1)),
              [&](int64_t R0, int64_t R1) {
    for (int64_t R = R0; R < R1; ++R) {
      int64_t I = R % std::max<int64_t>(Sq, 1);
      int64_t Keep = causalKeep(I, Sk, Q0, K0);
      T *YR = Y + R * Sk;
      if (YR != X + R * Sk)
        std::copy(X + R * Sk, X + R * Sk + Keep, YR);
      std::fill(YR + Keep, YR + Sk, F);
    }
  });
}

template <typename T>
void addKeyBias(T *Y, const T *X, const T *Bias, int64_t Batch, int64_t Inner,
                int64_t K) {
  checkSizes({Batch, Inner, K});
  parallelFor(Batch * Inner, std::max<int64_t>(1, (1 << 13) / std::max<int64_t>(K, 1)),
              [&](int64_t R0, int64_t R1) {
    for (int64_t R = R0; R < R1; ++R) {
      const T *B = Bias + (R / std::max<int64_t>(Inner, 1)) * K;
      const T *XR = X + R * K;
      T *YR = Y + R * K;
      for (int64_t J = 0; J < K; ++J)
        YR[J] = XR[J] + B[J];
    }
  });
}

//===----------------------------------------------------------------------===//
// 10. Softmax
//===----------------------------------------------------------------------===//

namespace {

template <typename T> SP_INLINE void softmaxRowBody(T *YR, const T *XR, int64_t N) {
  T Max = rowMax(XR, N);
  if (Max == -std::numeric_limits<T>::infinity()) { // all masked
    std::fill(YR, YR + N, T(0));
    return;
  }
  Acc Sum = expShiftedSum(YR, XR, N, Max);
  Acc Inv = 1.0 / Sum; // X is no longer read: Y may alias it
  for (int64_t J = 0; J < N; ++J)
    YR[J] = T(Acc(YR[J]) * Inv);
}
SP_SIMD void softmaxRows(float *Y, const float *X, int64_t Rows, int64_t N) {
  for (int64_t R = 0; R < Rows; ++R)
    softmaxRowBody(Y + R * N, X + R * N, N);
}
SP_SIMD void softmaxRows(double *Y, const double *X, int64_t Rows, int64_t N) {
  for (int64_t R = 0; R < Rows; ++R)
    softmaxRowBody(Y + R * N, X + R * N, N);
}

/// One row of scaledCausalSoftmax, Keep of its N columns unmasked: the
/// operations of scale, causalMask and softmaxRowBody on each element, in
/// their order.
template <typename T>
SP_INLINE void scaledCausalRowBody(T *YR, const T *XR, int64_t N, int64_t Keep,
                                   T Alpha, bool Scaled, T Fill) {
  if (Scaled)
    for (int64_t J = 0; J < Keep; ++J)
      YR[J] = Alpha * XR[J];
  else if (YR != XR)
    std::copy(XR, XR + Keep, YR);
  T Max = rowMax(YR, Keep); // the maximum is exact in any order
  if (Keep < N && Max < Fill)
    Max = Fill;
  if (Max == -std::numeric_limits<T>::infinity()) { // all masked
    std::fill(YR, YR + N, T(0));
    return;
  }
  // A masked score's exp is exactly +0 when expD's argument is below -708;
  // the lane sums then gain +0 for it, and its probability is 0 * Inv.
  int64_t Live = double(Fill) - double(Max) < -708.0 ? Keep : N;
  std::fill(YR + Keep, YR + Live, Fill);
  Acc Sum = expShiftedSum(YR, YR, Live, Max);
  Acc Inv = 1.0 / Sum;
  for (int64_t J = 0; J < Live; ++J)
    YR[J] = T(Acc(YR[J]) * Inv);
  std::fill(YR + Live, YR + N, T(Acc(0) * Inv));
}
SP_SIMD void scaledCausalRows(float *Y, const float *X, int64_t R0, int64_t R1,
                              int64_t Sq, int64_t N, float Alpha, bool Scaled,
                              bool Causal, float Fill) {
  for (int64_t R = R0; R < R1; ++R) {
    int64_t Keep = Causal ? causalKeep(R % Sq, N) : N;
    scaledCausalRowBody(Y + R * N, X + R * N, N, Keep, Alpha, Scaled, Fill);
  }
}
SP_SIMD void scaledCausalRows(double *Y, const double *X, int64_t R0,
                              int64_t R1, int64_t Sq, int64_t N, double Alpha,
                              bool Scaled, bool Causal, double Fill) {
  for (int64_t R = R0; R < R1; ++R) {
    int64_t Keep = Causal ? causalKeep(R % Sq, N) : N;
    scaledCausalRowBody(Y + R * N, X + R * N, N, Keep, Alpha, Scaled, Fill);
  }
}

/// One row of scaledCausalSoftmaxBackward: the operations of
/// softmaxBackward, causalMask and scale on each element, in their order.
template <typename T>
SP_INLINE void scaledCausalGradRowBody(T *DXR, const T *YR, const T *DYR,
                                       int64_t N, int64_t Keep, T Alpha,
                                       bool Scaled, T Fill) {
  Acc Dot = laneSum(N, [&](int64_t J) { return Acc(DYR[J]) * YR[J]; });
  for (int64_t J = 0; J < Keep; ++J) {
    T G = T(YR[J] * (DYR[J] - Dot));
    DXR[J] = Scaled ? Alpha * G : G;
  }
  const T Masked = Scaled ? Alpha * Fill : Fill;
  std::fill(DXR + Keep, DXR + N, Masked);
}
SP_SIMD void scaledCausalGradRows(float *DX, const float *Y, const float *DY,
                                  int64_t R0, int64_t R1, int64_t Sq, int64_t N,
                                  float Alpha, bool Scaled, bool Causal,
                                  float Fill) {
  for (int64_t R = R0; R < R1; ++R) {
    int64_t Keep = Causal ? causalKeep(R % Sq, N) : N;
    scaledCausalGradRowBody(DX + R * N, Y + R * N, DY + R * N, N, Keep, Alpha,
                            Scaled, Fill);
  }
}
SP_SIMD void scaledCausalGradRows(double *DX, const double *Y,
                                  const double *DY, int64_t R0, int64_t R1,
                                  int64_t Sq, int64_t N, double Alpha,
                                  bool Scaled, bool Causal, double Fill) {
  for (int64_t R = R0; R < R1; ++R) {
    int64_t Keep = Causal ? causalKeep(R % Sq, N) : N;
    scaledCausalGradRowBody(DX + R * N, Y + R * N, DY + R * N, N, Keep, Alpha,
                            Scaled, Fill);
  }
}

} // namespace

template <typename T> void softmax(T *Y, const T *X, int64_t Rows, int64_t N) {
  checkSizes({Rows, N});
  parallelFor(Rows, std::max<int64_t>(1, (1 << 12) / std::max<int64_t>(N, 1)),
              [&](int64_t R0, int64_t R1) {
    softmaxRows(Y + R0 * N, X + R0 * N, R1 - R0, N);
  });
}

template <typename T>
void scaledCausalSoftmax(T *Y, const T *X, int64_t Batch, int64_t Sq,
                         int64_t Sk, double Alpha, bool Causal, double Fill) {
  checkSizes({Batch, Sq, Sk});
  if (Sq == 0 || Sk == 0)
    return;
  parallelFor(Batch * Sq,
              std::max<int64_t>(1, (1 << 12) / std::max<int64_t>(Sk, 1)),
              [&](int64_t R0, int64_t R1) {
    scaledCausalRows(Y, X, R0, R1, Sq, Sk, T(Alpha), Alpha != 1.0, Causal,
                     T(Fill));
  });
}

template <typename T>
void scaledCausalSoftmaxBackward(T *DX, const T *Y, const T *DY, int64_t Batch,
                                 int64_t Sq, int64_t Sk, double Alpha,
                                 bool Causal, double Fill) {
  checkSizes({Batch, Sq, Sk});
  if (Sq == 0 || Sk == 0)
    return;
  parallelFor(Batch * Sq,
              std::max<int64_t>(1, (1 << 13) / std::max<int64_t>(Sk, 1)),
              [&](int64_t R0, int64_t R1) {
    scaledCausalGradRows(DX, Y, DY, R0, R1, Sq, Sk, T(Alpha), Alpha != 1.0,
                         Causal, T(Fill));
  });
}

template <typename T>
void softmaxBackward(T *DX, const T *Y, const T *DY, int64_t Rows, int64_t N) {
  checkSizes({Rows, N});
  parallelFor(Rows, std::max<int64_t>(1, (1 << 13) / std::max<int64_t>(N, 1)),
              [&](int64_t R0, int64_t R1) {
    for (int64_t R = R0; R < R1; ++R) {
      const T *YR = Y + R * N, *DYR = DY + R * N;
      Acc Dot = laneSum(N, [&](int64_t J) { return Acc(DYR[J]) * YR[J]; });
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

Status checkDropout(double Ratio, const DropoutKey &K, const GlobalIndex &G) {
  if (!(Ratio >= 0.0 && Ratio <= 1.0))
    return Status::error("dropout ratio outside [0, 1]");
  if (K.Layer > 0xFFFFu)
    return Status::error("dropout key layer above 65535", -1, K.Layer);
  if (K.Site > 0xFFFFu)
    return Status::error("dropout key site above 65535", -1, K.Site);
  return G.check();
}

/// Philox blocks generated per call of philoxBlocks (4 words each).
constexpr int64_t PhiloxBatch = 64;

/// Words[4 i + k] = word k of Philox4x32_10 of the dropout counter of block
/// First + i (Philox.h), i < Count <= PhiloxBatch: the same function as
/// philox::philox4x32_10, computed for Count blocks side by side so that the
/// rounds vectorise (integer arithmetic: exact on every clone).
SP_SIMD void philoxBlocks(uint32_t *__restrict Words, uint64_t First,
                          int64_t Count, uint32_t C2, uint32_t C3,
                          uint32_t K0, uint32_t K1) {
  uint32_t A[PhiloxBatch], B[PhiloxBatch], C[PhiloxBatch], D[PhiloxBatch];
  for (int64_t I = 0; I < Count; ++I) {
    uint64_t Block = First + uint64_t(I);
    A[I] = uint32_t(Block);
    B[I] = uint32_t(Block >> 32);
    C[I] = C2;
    D[I] = C3;
  }
  for (int R = 0; R < 10; ++R) {
    if (R) {
      K0 += philox::W0;
      K1 += philox::W1;
    }
    for (int64_t I = 0; I < Count; ++I) {
      uint64_t P0 = uint64_t(philox::M0) * A[I];
      uint64_t P1 = uint64_t(philox::M1) * C[I];
      uint32_t NA = uint32_t(P1 >> 32) ^ B[I] ^ K0;
      uint32_t NC = uint32_t(P0 >> 32) ^ D[I] ^ K1;
      B[I] = uint32_t(P1);
      D[I] = uint32_t(P0);
      A[I] = NA;
      C[I] = NC;
    }
  }
  for (int64_t I = 0; I < Count; ++I) {
    Words[4 * I] = A[I];
    Words[4 * I + 1] = B[I];
    Words[4 * I + 2] = C[I];
    Words[4 * I + 3] = D[I];
  }
}

SP_SIMD void wordsToKeep(uint8_t *__restrict Keep,
                         const uint32_t *__restrict Words, int64_t N,
                         uint32_t Threshold) {
  for (int64_t I = 0; I < N; ++I)
    Keep[I] = Words[I] >= Threshold;
}

/// Keep[j] = whether dropout keeps global element G0 + j, j < Len.
void keepRun(uint8_t *Keep, uint64_t G0, int64_t Len, const DropoutKey &K,
             uint64_t Threshold) {
  if (Threshold > 0xFFFFFFFFu) { // ratio 1: nothing is kept
    std::memset(Keep, 0, size_t(Len));
    return;
  }
  const uint32_t C2 = (K.Layer & 0xFFFFu) | (K.Site << 16);
  uint32_t Words[4 * PhiloxBatch];
  uint64_t Block = G0 >> 2;
  int64_t Skip = int64_t(G0 & 3);
  for (int64_t J = 0; J < Len;) {
    int64_t N = std::min(4 * PhiloxBatch - Skip, Len - J);
    philoxBlocks(Words, Block, (Skip + N + 3) / 4, C2, K.Stream,
                 uint32_t(K.Seed), uint32_t(K.Seed >> 32));
    wordsToKeep(Keep + J, Words + Skip, N, uint32_t(Threshold));
    J += N;
    Block += PhiloxBatch;
    Skip = 0;
  }
}

/// Y = Keep ? X * Scale : 0 (Y may alias X).
template <typename T>
SP_INLINE void applyKeepBody(T *Y, const T *X, const uint8_t *__restrict Keep,
                             int64_t N, T Scale) {
  for (int64_t I = 0; I < N; ++I)
    Y[I] = Keep[I] ? X[I] * Scale : T(0);
}
SP_SIMD void applyKeep(float *Y, const float *X, const uint8_t *Keep,
                       int64_t N, float Scale) {
  applyKeepBody(Y, X, Keep, N, Scale);
}
SP_SIMD void applyKeep(double *Y, const double *X, const uint8_t *Keep,
                       int64_t N, double Scale) {
  applyKeepBody(Y, X, Keep, N, Scale);
}

/// Y = (Keep ? X * Scale : 0) + R, rounded as applyKeep and then an add
/// (Y may alias X or R).
template <typename T>
SP_INLINE void applyKeepAddBody(T *Y, const T *X, const T *R,
                                const uint8_t *__restrict Keep, int64_t N,
                                T Scale) {
  for (int64_t I = 0; I < N; ++I)
    Y[I] = (Keep[I] ? X[I] * Scale : T(0)) + R[I];
}
SP_SIMD void applyKeepAdd(float *Y, const float *X, const float *R,
                          const uint8_t *Keep, int64_t N, float Scale) {
  applyKeepAddBody(Y, X, R, Keep, N, Scale);
}
SP_SIMD void applyKeepAdd(double *Y, const double *X, const double *R,
                          const uint8_t *Keep, int64_t N, double Scale) {
  applyKeepAddBody(Y, X, R, Keep, N, Scale);
}

/// Elements per piece of work of the dropout kernels.
constexpr int64_t DropoutPiece = 1024;

/// Calls Fn(Local0, Global0, Len) over pieces of the block that are
/// contiguous both locally and globally (local elements [Local0, Local0 +
/// Len) are global elements [Global0, Global0 + Len)), in parallel. Trailing
/// dimensions the block spans whole merge into one run, so the unsharded
/// tensor is a single run.
template <typename F> void forEachRun(const GlobalIndex &G, F &&Fn) {
  int R = G.Rank;
  int64_t N = G.numLocal();
  if (N == 0)
    return;
  if (R == 0) {
    Fn(int64_t(0), uint64_t(0), int64_t(1));
    return;
  }
  int64_t GS[MaxRank];
  rowMajorStrides(R, G.Global, GS);
  // Dimensions [D, R) form one contiguous run.
  int D = R - 1;
  while (D > 0 && G.Local[D] == G.Global[D])
    --D;
  int64_t Run = 1;
  for (int E = D; E < R; ++E)
    Run *= G.Local[E];
  int64_t Runs = N / Run, PerRun = (Run + DropoutPiece - 1) / DropoutPiece;
  parallelFor(Runs * PerRun, 8, [&](int64_t P0, int64_t P1) {
    for (int64_t P = P0; P < P1; ++P) {
      int64_t RunIdx = P / PerRun, Piece = P % PerRun;
      // The global index of the run's first element: outer dims [0, D)
      // from RunIdx (row-major over Local), dim D at its offset.
      int64_t Base = G.Offset[D] * GS[D];
      for (int64_t E = D - 1, Rest = RunIdx; E >= 0; --E) {
        Base += (G.Offset[E] + Rest % G.Local[E]) * GS[E];
        Rest /= G.Local[E];
      }
      int64_t Off = Piece * DropoutPiece;
      Fn(RunIdx * Run + Off, uint64_t(Base + Off),
         std::min(DropoutPiece, Run - Off));
    }
  });
}

} // namespace

void dropoutKeep(uint8_t *Keep, uint64_t Global0, int64_t Len,
                 const DropoutKey &K, double Ratio) {
  checkSizes({Len});
  keepRun(Keep, Global0, Len, K, philox::dropoutThreshold(Ratio));
}

Status dropoutMask(uint8_t *Mask, double Ratio, const DropoutKey &K,
                   const GlobalIndex &G) {
  if (Status S = checkDropout(Ratio, K, G); !S.ok())
    return S;
  const uint64_t Threshold = philox::dropoutThreshold(Ratio);
  forEachRun(G, [&](int64_t L0, uint64_t G0, int64_t Len) {
    keepRun(Mask + L0, G0, Len, K, Threshold);
  });
  return Status::success();
}

template <typename T>
Status dropout(T *Y, uint8_t *Mask, const T *X, double Ratio,
               const DropoutKey &K, const GlobalIndex &G, const T *Addend,
               bool Causal) {
  if (Status S = checkDropout(Ratio, K, G); !S.ok())
    return S;
  if (Causal && G.Rank < 2)
    return Status::error("causal dropout of a tensor of rank < 2", -1,
                         G.Rank);
  const T Scale = Ratio >= 1.0 ? T(0) : T(1.0 / (1.0 - Ratio));
  const uint64_t Threshold = philox::dropoutThreshold(Ratio);
  // The global [Sq, Sk] of the causal mask (Causal).
  const uint64_t Sq = Causal ? uint64_t(G.Global[G.Rank - 2]) : 1,
                 Sk = Causal ? uint64_t(G.Global[G.Rank - 1]) : 1;
  forEachRun(G, [&](int64_t L0, uint64_t G0, int64_t Len) {
    uint8_t Local[DropoutPiece];
    uint8_t *Keep = Mask ? Mask + L0 : Local;
    if (!Causal) {
      keepRun(Keep, G0, Len, K, Threshold);
    } else {
      // Row by row: keys j <= i are drawn, the rest dropped.
      for (int64_t J = 0; J < Len;) {
        uint64_t Gj = G0 + uint64_t(J), Col = Gj % Sk,
                 Row = Gj / Sk % Sq;
        int64_t InRow = std::min<int64_t>(Len - J, int64_t(Sk - Col));
        int64_t Drawn =
            Col <= Row ? std::min<int64_t>(InRow, int64_t(Row - Col + 1)) : 0;
        keepRun(Keep + J, Gj, Drawn, K, Threshold);
        std::memset(Keep + J + Drawn, 0, size_t(InRow - Drawn));
        J += InRow;
      }
    }
    if (Addend)
      applyKeepAdd(Y + L0, X + L0, Addend + L0, Keep, Len, Scale);
    else
      applyKeep(Y + L0, X + L0, Keep, Len, Scale);
  });
  return Status::success();
}

template <typename T>
void dropoutBackward(T *DX, const T *DY, const uint8_t *Mask, int64_t N,
                     double Ratio) {
  checkSizes({N});
  const T Scale = Ratio >= 1.0 ? T(0) : T(1.0 / (1.0 - Ratio));
  parallelFor(N, 1 << 13, [&](int64_t I0, int64_t I1) {
    applyKeep(DX + I0, DY + I0, Mask + I0, I1 - I0, Scale);
  });
}

//===----------------------------------------------------------------------===//
// 12. Cross entropy
//===----------------------------------------------------------------------===//

namespace {

/// Checks the sizes and targets; Counted is set to the number of rows whose
/// target is not IgnoreIndex.
Status checkCrossEntropy(const int64_t *Targets, int64_t N, int64_t V,
                         int64_t ValidV, std::optional<int64_t> IgnoreIndex,
                         int64_t &Counted) {
  if (N <= 0)
    return Status::error("cross entropy over no rows", -1, N);
  if (ValidV < 1 || ValidV > V)
    return Status::error("cross entropy valid vocabulary not in [1, V]", -1,
                         ValidV);
  Counted = 0;
  for (int64_t I = 0; I < N; ++I) {
    if (IgnoreIndex && Targets[I] == *IgnoreIndex)
      continue;
    if (Targets[I] < 0 || Targets[I] >= ValidV)
      return Status::error("cross entropy target out of range", I, Targets[I]);
    ++Counted;
  }
  return Status::success();
}

/// The row's max and log-sum-exp over its first ValidV entries.
template <typename T>
SP_INLINE void rowLogSumExpBody(const T *Row, int64_t ValidV, Acc &Max,
                                Acc &Lse) {
  Max = Acc(rowMax(Row, ValidV));
  Acc Sum = laneSumBuffered(ValidV,
                            [&](int64_t J) { return expD(Acc(Row[J]) - Max); });
  Lse = Max + std::log(Sum);
}
SP_SIMD void rowLogSumExp(const float *Row, int64_t ValidV, Acc &Max,
                          Acc &Lse) {
  rowLogSumExpBody(Row, ValidV, Max, Lse);
}
SP_SIMD void rowLogSumExp(const double *Row, int64_t ValidV, Acc &Max,
                          Acc &Lse) {
  rowLogSumExpBody(Row, ValidV, Max, Lse);
}

/// DRow[j] = Factor * exp(Row[j] - Lse), j < ValidV.
template <typename T>
SP_INLINE void softmaxScaledBody(T *DRow, const T *Row, int64_t ValidV,
                                 Acc Lse, Acc Factor) {
  for (int64_t J = 0; J < ValidV; ++J)
    DRow[J] = T(Factor * expD(Acc(Row[J]) - Lse));
}
SP_SIMD void softmaxScaled(float *DRow, const float *Row, int64_t ValidV,
                           Acc Lse, Acc Factor) {
  softmaxScaledBody(DRow, Row, ValidV, Lse, Factor);
}
SP_SIMD void softmaxScaled(double *DRow, const double *Row, int64_t ValidV,
                           Acc Lse, Acc Factor) {
  softmaxScaledBody(DRow, Row, ValidV, Lse, Factor);
}

} // namespace

template <typename T>
Status crossEntropy(T *Loss, const T *Logits, const int64_t *Targets, int64_t N,
                    int64_t V, int64_t ValidV,
                    std::optional<int64_t> IgnoreIndex) {
  int64_t Counted;
  if (Status S = checkCrossEntropy(Targets, N, V, ValidV, IgnoreIndex, Counted);
      !S.ok())
    return S;
  Acc Total = 0;
  for (int64_t R = 0; R < N; ++R) {
    if (IgnoreIndex && Targets[R] == *IgnoreIndex)
      continue;
    const T *Row = Logits + R * V;
    Acc Max, Lse;
    rowLogSumExp(Row, ValidV, Max, Lse);
    Total += Lse - Acc(Row[Targets[R]]);
  }
  // No counted target: 0 rather than torch's NaN (0 / 0).
  *Loss = Counted ? T(Total / Acc(Counted)) : T(0);
  return Status::success();
}

template <typename T>
Status crossEntropyBackward(T *DLogits, const T *Logits, const int64_t *Targets,
                            double DLoss, int64_t N, int64_t V, int64_t ValidV,
                            std::optional<int64_t> IgnoreIndex) {
  int64_t Counted;
  if (Status S = checkCrossEntropy(Targets, N, V, ValidV, IgnoreIndex, Counted);
      !S.ok())
    return S;
  const Acc Factor = Counted ? DLoss / Acc(Counted) : 0.0;
  parallelFor(N, std::max<int64_t>(1, (1 << 12) / V), [&](int64_t R0,
                                                          int64_t R1) {
    for (int64_t R = R0; R < R1; ++R) {
      const T *Row = Logits + R * V;
      T *DRow = DLogits + R * V;
      if (IgnoreIndex && Targets[R] == *IgnoreIndex) {
        std::fill(DRow, DRow + V, T(0));
        continue;
      }
      Acc Max, Lse;
      rowLogSumExp(Row, ValidV, Max, Lse);
      softmaxScaled(DRow, Row, ValidV, Lse, Factor);
      int64_t Tgt = Targets[R];
      DRow[Tgt] = T(Factor * (expD(Acc(Row[Tgt]) - Lse) - 1.0));
      std::fill(DRow + ValidV, DRow + V, T(0));
    }
  });
  return Status::success();
}

//===----------------------------------------------------------------------===//
// 13. Optimizer
//===----------------------------------------------------------------------===//

template <typename T> double sumSquares(const T *G, int64_t N) {
  checkSizes({N});
  // Chunks of SquaresChunk elements, each a laneSum, their sums added in
  // order: the chunks are fixed by N, so the threads (up to Group chunks a
  // call) do not change the result.
  constexpr int64_t Group = 64;
  auto Chunk = [&](int64_t C) {
    int64_t I0 = C * SquaresChunk, Len = std::min(SquaresChunk, N - I0);
    return laneSum(Len, [&](int64_t I) { return Acc(G[I0 + I]) * G[I0 + I]; });
  };
  int64_t Chunks = (N + SquaresChunk - 1) / SquaresChunk;
  if (Chunks <= 1)
    return Chunks ? Chunk(0) : 0.0;
  Acc Sum = 0;
  for (int64_t C0 = 0; C0 < Chunks; C0 += Group) {
    Acc Part[Group];
    int64_t Count = std::min(Group, Chunks - C0);
    parallelFor(Count, 1, [&](int64_t K0, int64_t K1) {
      for (int64_t K = K0; K < K1; ++K)
        Part[K] = Chunk(C0 + K);
    });
    for (int64_t K = 0; K < Count; ++K)
      Sum += Part[K];
  }
  return Sum;
}

template <typename T> T clipCoefficient(T TotalNorm, T MaxNorm) {
  // torch: clip_coef = max_norm / (total_norm + 1e-6), i.e.
  // (total_norm + 1e-6).reciprocal() * max_norm, then clamp(max = 1).
  T Coef = (T(1) / (TotalNorm + T(1e-6))) * MaxNorm;
  return Coef < T(1) ? Coef : T(1);
}

namespace {

/// The scalars of one AdamW step, in T (computed in double, as torch does).
template <typename T> struct AdamScalars {
  T Decay, B1, OneMinusB1, B2, OneMinusB2, StepSize, Bc2Sqrt, E, Scale;
};

template <typename T>
SP_INLINE void adamwBody(T *__restrict P, const T *__restrict G,
                         T *__restrict M, T *__restrict V, int64_t N,
                         const AdamScalars<T> &C) {
  for (int64_t I = 0; I < N; ++I) {
    T Grad = G[I] * C.Scale;
    T PI = P[I] * C.Decay;
    T MI = C.B1 * M[I] + C.OneMinusB1 * Grad;
    T VI = C.B2 * V[I] + C.OneMinusB2 * Grad * Grad;
    T Denom = std::sqrt(VI) / C.Bc2Sqrt + C.E;
    P[I] = PI - C.StepSize * (MI / Denom);
    M[I] = MI;
    V[I] = VI;
  }
}
SP_SIMD void adamwRange(float *P, const float *G, float *M, float *V,
                        int64_t N, const AdamScalars<float> &C) {
  adamwBody(P, G, M, V, N, C);
}
SP_SIMD void adamwRange(double *P, const double *G, double *M, double *V,
                        int64_t N, const AdamScalars<double> &C) {
  adamwBody(P, G, M, V, N, C);
}

} // namespace

template <typename T>
void adamw(T *P, const T *G, T *M, T *V, int64_t N, double Lr, double Beta1,
           double Beta2, double Eps, double WeightDecay, double GradScale,
           int64_t Step) {
  checkSizes({N});
  SP_CPU_CHECK(Step >= 1, "adam steps count from 1");
  // The scalars, in double, as torch computes them in Python.
  const double Bc1 = 1.0 - std::pow(Beta1, double(Step));
  const double Bc2 = 1.0 - std::pow(Beta2, double(Step));
  const AdamScalars<T> C{T(1.0 - Lr * WeightDecay), T(Beta1),
                         T(1.0 - Beta1),            T(Beta2),
                         T(1.0 - Beta2),            T(Lr / Bc1),
                         T(std::sqrt(Bc2)),         T(Eps),
                         T(GradScale)};
  parallelFor(N, 1 << 13, [&](int64_t I0, int64_t I1) {
    adamwRange(P + I0, G + I0, M + I0, V + I0, I1 - I0, C);
  });
}

//===----------------------------------------------------------------------===//
// 14. RMSNorm
//===----------------------------------------------------------------------===//

template <typename T>
void rmsNorm(T *Y, T *Rstd, const T *X, const T *Gamma, int64_t Rows,
             int64_t H, double Eps) {
  checkSizes({Rows, H});
  SP_CPU_CHECK(H > 0, "rms norm over an empty axis");
  // Rows over the threads, as layerNorm.
  parallelFor(Rows, std::max<int64_t>(1, (1 << 13) / H), [&](int64_t R0,
                                                             int64_t R1) {
    for (int64_t R = R0; R < R1; ++R) {
      const T *XR = X + R * H;
      Acc MeanSq = laneSum(H, [&](int64_t J) { return Acc(XR[J]) * XR[J]; }) /
                   Acc(H);
      Acc S = 1.0 / std::sqrt(MeanSq + Eps);
      T *YR = Y + R * H;
      for (int64_t J = 0; J < H; ++J)
        YR[J] = T(XR[J] * S * Gamma[J]);
      if (Rstd)
        Rstd[R] = T(S);
    }
  });
}

template <typename T>
void rmsNormBackward(T *DX, T *DGamma, const T *DY, const T *X, const T *Gamma,
                     const T *Rstd, int64_t Rows, int64_t H) {
  checkSizes({Rows, H});
  // DX: rows over the threads, each row's sum in double.
  if (DX)
    parallelFor(Rows, std::max<int64_t>(1, (1 << 13) / std::max<int64_t>(H, 1)),
                [&](int64_t R0, int64_t R1) {
      for (int64_t R = R0; R < R1; ++R) {
        const T *XR = X + R * H, *DYR = DY + R * H;
        Acc S = Rstd[R];
        Acc MeanGX = laneSum(H, [&](int64_t J) {
                       return (Acc(DYR[J]) * Gamma[J]) * (XR[J] * S);
                     }) /
                     Acc(H);
        T *DXR = DX + R * H;
        for (int64_t J = 0; J < H; ++J)
          DXR[J] = T(S * (Acc(DYR[J]) * Gamma[J] - (XR[J] * S) * MeanGX));
      }
    });
  if (!DGamma)
    return;
  // DGamma: columns over the threads, each summed over the rows in double
  // in the column sums' order and added once (as layerNormBackward).
  parallelFor(H, 64, [&](int64_t J0, int64_t J1) {
    for (int64_t JB = J0; JB < J1; JB += ColumnBlock) {
      int64_t JE = std::min(J1, JB + ColumnBlock);
      Acc SG[1][ColumnBlock] = {};
      columnBlockSums(Rows, JE - JB, SG, [&](int64_t R, auto &Part) {
        const T *XR = X + R * H, *DYR = DY + R * H;
        Acc S = Rstd[R];
        for (int64_t J = JB; J < JE; ++J)
          Part[0][J - JB] += DYR[J] * (XR[J] * S);
      });
      for (int64_t J = JB; J < JE; ++J)
        DGamma[J] += T(SG[0][J - JB]);
    }
  });
}

//===----------------------------------------------------------------------===//
// 15. Activations
//===----------------------------------------------------------------------===//
//
// One struct per SP_UNARY_OP of ir/Ops.def, named as its enumerator: value
// and grad (the derivative) of one element, in double. The loops, the
// threading and the AVX2 clones are shared (activationRange below).

namespace {

/// sigmoid(X) and 1 - sigmoid(X) in double, branch-free and without
/// cancellation: with E = exp(-|X|) (never overflows), they are 1 / (1 + E)
/// and E / (1 + E), swapped for X < 0.
SP_INLINE void sigmoidPair(double X, double &Sig, double &OneMinusSig) {
  double E = expD(X < 0.0 ? X : -X);
  double Inv = 1.0 / (1.0 + E);
  double Big = Inv, Small = E * Inv;
  Sig = X < 0.0 ? Small : Big;
  OneMinusSig = X < 0.0 ? Big : Small;
}

/// silu(x) = x sigmoid(x); silu'(x) = s (1 + x (1 - s)).
struct Silu {
  SP_INLINE static double value(double X) {
    double Sig, OneMinus;
    sigmoidPair(X, Sig, OneMinus);
    return X * Sig;
  }
  SP_INLINE static double grad(double X) {
    double Sig, OneMinus;
    sigmoidPair(X, Sig, OneMinus);
    return Sig * (1.0 + X * OneMinus);
  }
};

/// relu(x) = max(x, 0); relu'(x) = 1 for x > 0, else 0 (torch's choice at 0).
struct Relu {
  SP_INLINE static double value(double X) { return X > 0.0 ? X : 0.0; }
  SP_INLINE static double grad(double X) { return X > 0.0 ? 1.0 : 0.0; }
};

// Both instantiations compute in double and round once.
template <typename F, typename T>
SP_SIMD void activationRange(T *Y, const T *X, int64_t N) {
  for (int64_t I = 0; I < N; ++I)
    Y[I] = T(F::value(X[I]));
}

template <typename F, typename T>
SP_SIMD void activationBackwardRange(T *DX, const T *X, const T *DY,
                                     int64_t N) {
  for (int64_t I = 0; I < N; ++I)
    DX[I] = T(double(DY[I]) * F::grad(X[I]));
}

} // namespace

template <typename T>
void activation(Activation F, T *Y, const T *X, int64_t N) {
  checkSizes({N});
  parallelFor(N, 1 << 13, [&](int64_t I0, int64_t I1) {
    switch (F) {
#define SP_OP(Enum, Name)
#define SP_UNARY_OP(Enum, Name, OnnxName)                                      \
  case Activation::Enum:                                                       \
    return activationRange<Enum>(Y + I0, X + I0, I1 - I0);
#include "ir/Ops.def"
    }
  });
}

template <typename T>
void activationBackward(Activation F, T *DX, const T *X, const T *DY,
                        int64_t N) {
  checkSizes({N});
  parallelFor(N, 1 << 13, [&](int64_t I0, int64_t I1) {
    switch (F) {
#define SP_OP(Enum, Name)
#define SP_UNARY_OP(Enum, Name, OnnxName)                                      \
  case Activation::Enum:                                                       \
    return activationBackwardRange<Enum>(DX + I0, X + I0, DY + I0, I1 - I0);
#include "ir/Ops.def"
    }
  });
}

//===----------------------------------------------------------------------===//
// 16. Elementwise product
//===----------------------------------------------------------------------===//

template <typename T> void mul(T *Y, const T *A, const T *B, int64_t N) {
  checkSizes({N});
  parallelFor(N, 1 << 14, [&](int64_t I0, int64_t I1) {
    for (int64_t I = I0; I < I1; ++I)
      Y[I] = A[I] * B[I];
  });
}

template <typename T>
Status mulBroadcast(T *Y, Shape YShape, const T *A, Shape AShape, const T *B,
                    Shape BShape) {
  return broadcastBinary(Y, YShape, A, AShape, B, BShape,
                         [](T X0, T X1) { return X0 * X1; });
}

//===----------------------------------------------------------------------===//
// 17. Rotary position embedding
//===----------------------------------------------------------------------===//

namespace {

void checkRope(int64_t B, int64_t A, int64_t S, int64_t D, int64_t CB) {
  checkSizes({B, A, S, D, CB});
  SP_CPU_CHECK(D % 2 == 0, "rope needs an even head dimension");
  SP_CPU_CHECK(CB == 1 || CB == B,
               "rope tables must have batch dimension 1 or B");
}

/// Calls Fn(Out, In, C, N) for every (b, a, s) row of [B, A, S, D], rows over
/// the threads, with the row's Cos and Sin rows.
template <typename T, typename F>
void forEachRopeRow(T *Out, const T *In, const T *Cos, const T *Sin, int64_t B,
                    int64_t A, int64_t S, int64_t D, int64_t CB, F &&Fn) {
  const int64_t Grain =
      std::max<int64_t>(1, (1 << 13) / std::max<int64_t>(D, 1));
  parallelFor(B * A * S, Grain, [&](int64_t R0, int64_t R1) {
    for (int64_t R = R0; R < R1; ++R) {
      int64_t Si = R % S, Bi = R / (A * S);
      int64_t Table = ((CB == 1 ? 0 : Bi) * S + Si) * D;
      Fn(Out + R * D, In + R * D, Cos + Table, Sin + Table);
    }
  });
}

} // namespace

template <typename T>
void rope(T *Y, const T *X, const T *Cos, const T *Sin, int64_t B, int64_t A,
          int64_t S, int64_t D, int64_t CB, bool Interleaved) {
  checkRope(B, A, S, D, CB);
  const int64_t Half = D / 2;
  forEachRopeRow(Y, X, Cos, Sin, B, A, S, D, CB,
                 [&](T *YR, const T *XR, const T *C, const T *N) {
    if (Interleaved)
      for (int64_t J = 0; J < D; J += 2) {
        YR[J] = XR[J] * C[J] - XR[J + 1] * N[J];
        YR[J + 1] = XR[J + 1] * C[J + 1] + XR[J] * N[J + 1];
      }
    else
      for (int64_t I = 0; I < Half; ++I) {
        YR[I] = XR[I] * C[I] - XR[I + Half] * N[I];
        YR[I + Half] = XR[I + Half] * C[I + Half] + XR[I] * N[I + Half];
      }
  });
}

template <typename T>
void ropeBackward(T *DX, const T *DY, const T *Cos, const T *Sin, int64_t B,
                  int64_t A, int64_t S, int64_t D, int64_t CB,
                  bool Interleaved) {
  checkRope(B, A, S, D, CB);
  const int64_t Half = D / 2;
  forEachRopeRow(DX, DY, Cos, Sin, B, A, S, D, CB,
                 [&](T *DXR, const T *DYR, const T *C, const T *N) {
    if (Interleaved)
      for (int64_t J = 0; J < D; J += 2) {
        DXR[J] = DYR[J] * C[J] + DYR[J + 1] * N[J + 1];
        DXR[J + 1] = DYR[J + 1] * C[J + 1] - DYR[J] * N[J];
      }
    else
      for (int64_t I = 0; I < Half; ++I) {
        DXR[I] = DYR[I] * C[I] + DYR[I + Half] * N[I + Half];
        DXR[I + Half] = DYR[I + Half] * C[I + Half] - DYR[I] * N[I];
      }
  });
}

//===----------------------------------------------------------------------===//
// 18. Grouped-query attention's head repeat
//===----------------------------------------------------------------------===//

template <typename T>
void repeatHeads(T *Y, const T *X, int64_t B, int64_t G, int64_t R, int64_t S,
                 int64_t D) {
  checkSizes({B, G, R, S, D});
  // Each [S, D] head block copied R times, as mergeHeads copies.
  const int64_t Block = S * D;
  for (int64_t P = 0; P < B * G; ++P)
    for (int64_t Ri = 0; Ri < R; ++Ri)
      std::memcpy(Y + (P * R + Ri) * Block, X + P * Block, sizeof(T) * Block);
}

template <typename T>
void repeatHeadsBackward(T *DX, const T *DY, int64_t B, int64_t G, int64_t R,
                         int64_t S, int64_t D) {
  checkSizes({B, G, R, S, D});
  const int64_t Block = S * D;
  for (int64_t P = 0; P < B * G; ++P) {
    const T *Src = DY + P * R * Block;
    T *Dst = DX + P * Block;
    for (int64_t E = 0; E < Block; ++E) {
      Acc Sum = 0;
      for (int64_t Ri = 0; Ri < R; ++Ri)
        Sum += Src[Ri * Block + E];
      Dst[E] = T(Sum);
    }
  }
}

//===----------------------------------------------------------------------===//
// Instantiations
//===----------------------------------------------------------------------===//

//===----------------------------------------------------------------------===//
// 19. 16-bit storage
//===----------------------------------------------------------------------===//

// ir/Float16.h's conversions without branches, so that they vectorise: each
// case is computed and selected.

namespace {

SP_SIMD void widenRange(float *Y, const uint16_t *X, int64_t N, bool Bf16) {
  if (Bf16) {
    for (int64_t I = 0; I < N; ++I)
      Y[I] = bitCast<float>(uint32_t(X[I]) << 16);
    return;
  }
  for (int64_t I = 0; I < N; ++I) {
    uint32_t H = X[I], Sign = (H & 0x8000u) << 16, Exp = (H >> 10) & 0x1fu,
             Man = H & 0x3ffu;
    uint32_t Normal = Sign | (Exp + 127 - 15) << 23 | Man << 13;
    uint32_t Special = Sign | 0x7f800000u | Man << 13; // inf, nan
    // A subnormal (or zero) is Man 2^-24, exactly.
    uint32_t Sub = Sign | bitCast<uint32_t>(float(int32_t(Man)) * 0x1p-24f);
    Y[I] = bitCast<float>(Exp == 0 ? Sub : Exp == 31 ? Special : Normal);
  }
}

SP_SIMD void narrowRange(uint16_t *Y, const float *X, int64_t N, bool Bf16) {
  if (Bf16) {
    for (int64_t I = 0; I < N; ++I) {
      uint32_t B = bitCast<uint32_t>(X[I]);
      uint32_t Rounded = (B + 0x7fffu + ((B >> 16) & 1)) >> 16;
      Y[I] = uint16_t((B & 0x7fffffffu) > 0x7f800000u ? (B >> 16) | 0x40u
                                                       : Rounded);
    }
    return;
  }
  for (int64_t I = 0; I < N; ++I) {
    uint32_t B = bitCast<uint32_t>(X[I]);
    uint32_t Sign = (B >> 16) & 0x8000u, Abs = B & 0x7fffffffu;
    uint32_t Normal = (Abs + 0xc8000fffu + ((Abs >> 13) & 1)) >> 13;
    // Adding 0.5 aligns a subnormal half's bits with the float's mantissa
    // and rounds to nearest even.
    uint32_t Sub = bitCast<uint32_t>(bitCast<float>(Abs) + 0.5f) - 0x3f000000u;
    uint32_t R = Abs < 0x38800000u ? Sub : Normal;
    R = Abs >= 0x477ff000u ? 0x7c00u : R;
    R = Abs >= 0x7f800000u ? (Abs > 0x7f800000u ? 0x7e00u : 0x7c00u) : R;
    Y[I] = uint16_t(Sign | R);
  }
}

} // namespace

void widen16(float *Y, const uint16_t *X, int64_t N, bool Bf16) {
  checkSizes({N});
  parallelFor(N, 1 << 15, [&](int64_t I0, int64_t I1) {
    widenRange(Y + I0, X + I0, I1 - I0, Bf16);
  });
}

void narrow16(uint16_t *Y, const float *X, int64_t N, bool Bf16) {
  checkSizes({N});
  parallelFor(N, 1 << 15, [&](int64_t I0, int64_t I1) {
    narrowRange(Y + I0, X + I0, I1 - I0, Bf16);
  });
}

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
  template void linearGelu<T>(T *, T *, const T *, const T *, const T *,       \
                              int64_t, int64_t, int64_t, bool, GeluApprox);    \
  template void linearGeluBackward<T>(T *, const T *, const T *, const T *,    \
                                      int64_t, int64_t, int64_t, bool,         \
                                      GeluApprox);                             \
  template void splitHeads<T>(T *, T *, T *, const T *, int64_t, int64_t,      \
                              int64_t, int64_t);                               \
  template void splitHeadsBackward<T>(T *, const T *, const T *, const T *,    \
                                      int64_t, int64_t, int64_t, int64_t);     \
  template void mergeHeads<T>(T *, const T *, int64_t, int64_t, int64_t,       \
                              int64_t);                                        \
  template void mergeHeadsBackward<T>(T *, const T *, int64_t, int64_t,        \
                                      int64_t, int64_t);                       \
  template void batchMatMul<T>(T *, const T *, const T *, int64_t, int64_t,    \
                               int64_t, int64_t, bool, bool, bool, bool);      \
  template void scale<T>(T *, const T *, int64_t, double);                     \
  template void scaledCausalSoftmax<T>(T *, const T *, int64_t, int64_t,      \
                                       int64_t, double, bool, double);         \
  template void scaledCausalSoftmaxBackward<T>(                                \
      T *, const T *, const T *, int64_t, int64_t, int64_t, double, bool,      \
      double);                                                                 \
  template void causalMask<T>(T *, const T *, int64_t, int64_t, int64_t,       \
                              double, int64_t, int64_t);                       \
  template void addKeyBias<T>(T *, const T *, const T *, int64_t, int64_t,     \
                              int64_t);                                        \
  template void softmax<T>(T *, const T *, int64_t, int64_t);                  \
  template void softmaxBackward<T>(T *, const T *, const T *, int64_t,         \
                                   int64_t);                                   \
  template Status dropout<T>(T *, uint8_t *, const T *, double,                \
                             const DropoutKey &, const GlobalIndex &,          \
                             const T *, bool);                                 \
  template void dropoutBackward<T>(T *, const T *, const uint8_t *, int64_t,   \
                                   double);                                    \
  template Status crossEntropy<T>(T *, const T *, const int64_t *, int64_t,    \
                                  int64_t, int64_t, std::optional<int64_t>);   \
  template Status crossEntropyBackward<T>(T *, const T *, const int64_t *,     \
                                          double, int64_t, int64_t, int64_t,   \
                                          std::optional<int64_t>);             \
  template double sumSquares<T>(const T *, int64_t);                           \
  template T clipCoefficient<T>(T, T);                                         \
  template void adamw<T>(T *, const T *, T *, T *, int64_t, double, double,    \
                         double, double, double, double, int64_t);             \
  template void rmsNorm<T>(T *, T *, const T *, const T *, int64_t, int64_t,   \
                           double);                                            \
  template void rmsNormBackward<T>(T *, T *, const T *, const T *, const T *,  \
                                   const T *, int64_t, int64_t);               \
  template void activation<T>(Activation, T *, const T *, int64_t);           \
  template void activationBackward<T>(Activation, T *, const T *, const T *,   \
                                      int64_t);                                \
  template void mul<T>(T *, const T *, const T *, int64_t);                    \
  template Status mulBroadcast<T>(T *, Shape, const T *, Shape, const T *,     \
                                  Shape);                                      \
  template void rope<T>(T *, const T *, const T *, const T *, int64_t,         \
                        int64_t, int64_t, int64_t, int64_t, bool);             \
  template void ropeBackward<T>(T *, const T *, const T *, const T *, int64_t, \
                                int64_t, int64_t, int64_t, int64_t, bool);     \
  template void repeatHeads<T>(T *, const T *, int64_t, int64_t, int64_t,      \
                               int64_t, int64_t);                              \
  template void repeatHeadsBackward<T>(T *, const T *, int64_t, int64_t,       \
                                       int64_t, int64_t, int64_t);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
