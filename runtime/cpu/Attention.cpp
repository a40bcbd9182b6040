//===- Attention.cpp - The fused attention core (blockwise, online softmax) ===//
//
// Blocks of Br query rows by Bc keys; the two products of a block are GEMMs
// (cpu::gemm, OpenBLAS), the rest loops over the block. The forward runs
// the (batch, head, query block) triples over the kernel threads, the
// backward the (batch, key/value head) pairs, so that each gradient element
// has one writer and one summation order whatever the thread count.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/Attention.h"
#include "runtime/cpu/Parallel.h"
#include "runtime/cpu/Simd.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace sp::cpu {
namespace {

using namespace simd;

constexpr int64_t Br = 64, Bc = 64;

/// Row[j] = exp(Row[j] - Shift) in place, with the row's sum (Simd.h's
/// expShiftedSum, as softmax computes it; an infinite or NaN score gives 0
/// or NaN as exp), in the AVX2 clone where the CPU has it.
SP_SIMD double expShifted(float *Row, int64_t N, float Shift) {
  return expShiftedSum(Row, Row, N, Shift);
}
SP_SIMD double expShifted(double *Row, int64_t N, double Shift) {
  return expShiftedSum(Row, Row, N, Shift);
}

/// exp(x) below 2^-149 (the smallest float): scores this far below a row's
/// maximum (or log-sum-exp) have no effect in float.
constexpr double Negligible = -104;

Status checkCore(const AttentionShape &S, const AttentionCore &C) {
  if (S.Batch < 0 || S.Heads <= 0 || S.KvHeads <= 0 || S.Sq < 0 ||
      S.Sk < 0 || S.D <= 0)
    return Status::error("attention: non-positive sizes");
  if (S.Heads % S.KvHeads != 0)
    return Status::error("attention: query heads not a multiple of the "
                         "key/value heads",
                         -1, S.KvHeads);
  if (!(C.Dropout >= 0 && C.Dropout <= 1))
    return Status::error("dropout ratio outside [0, 1]");
  if (C.Key.Layer > 0xFFFFu || C.Key.Site > 0xFFFFu)
    return Status::error("dropout key: layer or site above 2^16 - 1");
  if (C.Dropout > 0) {
    const GlobalIndex &G = C.Probs;
    if (Status St = G.check(); !St.ok())
      return St;
    if (G.Rank != 4 || G.Local[0] != S.Batch || G.Local[1] != S.Heads ||
        G.Local[2] != S.Sq || G.Local[3] != S.Sk)
      return Status::error("attention: the probabilities' global index is "
                           "not a [batch, heads, queries, keys] block");
  }
  return Status::success();
}

/// The global index of probability (b, a, i, 0) of this block.
uint64_t rowIndex(const GlobalIndex &G, int64_t B, int64_t A, int64_t I) {
  return uint64_t(((B + G.Offset[0]) * G.Global[1] + A + G.Offset[1]) *
                      G.Global[2] +
                  I + G.Offset[2]) *
             uint64_t(G.Global[3]) +
         uint64_t(G.Offset[3]);
}

/// The scores of one block, op for op as the unfused ops compute them:
/// Sc[r, c] for query rows I0 + r < I0 + Rows, keys J0 + c.
template <typename T>
void scores(T *Sc, const T *Q, const T *K, const T *Bias, int64_t I0,
            int64_t Rows, int64_t J0, int64_t Cols, int64_t D,
            const AttentionCore &C) {
  gemm<T>(false, true, Rows, Cols, D, T(1), Q + I0 * D, D, K + J0 * D, D,
          T(0), Sc, Bc);
  const T Scale = T(C.Scale), Fill = T(C.Fill);
  for (int64_t R = 0; R < Rows; ++R) {
    T *Row = Sc + R * Bc;
    for (int64_t Cc = 0; Cc < Cols; ++Cc)
      Row[Cc] = Scale * Row[Cc];
    if (Bias && C.PadFirst)
      for (int64_t Cc = 0; Cc < Cols; ++Cc)
        Row[Cc] = Row[Cc] + Bias[J0 + Cc];
    if (C.Causal)
      for (int64_t Cc = 0; Cc < Cols; ++Cc)
        if (C.Key0 + J0 + Cc > C.Query0 + I0 + R)
          Row[Cc] = Fill;
    if (Bias && !C.PadFirst)
      for (int64_t Cc = 0; Cc < Cols; ++Cc)
        Row[Cc] = Row[Cc] + Bias[J0 + Cc];
  }
}

/// Whether the key block at J0 lies wholly above the causal diagonal of the
/// query rows [I0, I0 + Rows).
bool aboveDiagonal(const AttentionCore &C, int64_t I0, int64_t Rows,
                   int64_t J0) {
  return C.Causal && C.Key0 + J0 > C.Query0 + I0 + Rows - 1;
}

/// Where row (b, a, i) of O (and DO) and of Lse is, and the distance from
/// row i to row i + 1 of one head.
struct OutLayout {
  int64_t Heads, Sq, D;
  bool Merged;
  int64_t row(int64_t B, int64_t A, int64_t I) const {
    return (Merged ? (B * Sq + I) * Heads + A : (B * Heads + A) * Sq + I) * D;
  }
  int64_t rowStride() const { return Merged ? Heads * D : D; }
  int64_t lse(int64_t B, int64_t A, int64_t I) const {
    return Merged ? (B * Sq + I) * Heads + A : (B * Heads + A) * Sq + I;
  }
  int64_t lseStride() const { return Merged ? Heads : 1; }
};

template <typename T> T maxBias(const T *Bias, int64_t Sk) {
  T M = T(0);
  if (Bias)
    for (int64_t J = 0; J < Sk; ++J)
      M = std::max(M, Bias[J]);
  return M;
}

} // namespace

template <typename T>
Status attentionForward(T *O, T *Lse, const T *Q, const T *K, const T *V,
                        const T *KeyBias, const AttentionShape &S,
                        const AttentionCore &C) {
  if (Status St = checkCore(S, C); !St.ok())
    return St;
  const int64_t D = S.D, Group = S.Heads / S.KvHeads;
  const int64_t QBlocks = (S.Sq + Br - 1) / Br;
  const OutLayout OL{S.Heads, S.Sq, D, C.Merged};
  const int64_t OS = OL.rowStride(), LS = OL.lseStride();
  const T KeepScale = C.Dropout >= 1 ? T(0) : T(1.0 / (1.0 - C.Dropout));
  parallelFor(S.Batch * S.Heads * QBlocks, 1, [&](int64_t T0, int64_t T1) {
    std::vector<T> Sc(Br * Bc), Acc(Br * D), M(Br);
    std::vector<double> L(Br);
    std::vector<uint8_t> Keep(Bc);
    for (int64_t Task = T0; Task < T1; ++Task) {
      const int64_t B = Task / (S.Heads * QBlocks),
                    A = Task / QBlocks % S.Heads, I0 = Task % QBlocks * Br;
      const int64_t Rows = std::min(Br, S.Sq - I0);
      const T *Qh = Q + (B * S.Heads + A) * S.Sq * D;
      const int64_t Kv = (B * S.KvHeads + A / Group) * S.Sk * D;
      const T *Bias = KeyBias ? KeyBias + B * S.Sk : nullptr;
      const T Skip = T(C.Fill) + maxBias(Bias, S.Sk) - T(Negligible);
      std::fill(M.begin(), M.end(), -std::numeric_limits<T>::infinity());
      std::fill(L.begin(), L.end(), 0.0);
      std::fill(Acc.begin(), Acc.end(), T(0));
      for (int64_t J0 = 0; J0 < S.Sk; J0 += Bc) {
        const int64_t Cols = std::min(Bc, S.Sk - J0);
        // Past the diagonal every later block is masked too: stop once the
        // masked scores are negligible in every row.
        if (aboveDiagonal(C, I0, Rows, J0) &&
            std::all_of(M.begin(), M.begin() + Rows,
                        [&](T Mr) { return Mr > Skip; }))
          break;
        scores(Sc.data(), Qh, K + Kv, Bias, I0, Rows, J0, Cols, D, C);
        for (int64_t R = 0; R < Rows; ++R) {
          T *Row = Sc.data() + R * Bc;
          const T RowMax = rowMax(Row, Cols);
          const T New = M[R] < RowMax ? RowMax : M[R];
          if (New == -std::numeric_limits<T>::infinity()) {
            std::fill(Row, Row + Cols, T(0)); // nothing seen yet
            continue;
          }
          const T Corr = std::exp(M[R] - New); // 0 on the first block
          const double Sum = expShifted(Row, Cols, New);
          L[R] = L[R] * double(Corr) + Sum;
          M[R] = New;
          if (Corr != T(1))
            for (int64_t X = 0; X < D; ++X)
              Acc[R * D + X] *= Corr;
          if (C.Dropout > 0) {
            dropoutKeep(Keep.data(), rowIndex(C.Probs, B, A, I0 + R) + J0,
                        Cols, C.Key, C.Dropout);
            for (int64_t Cc = 0; Cc < Cols; ++Cc)
              Row[Cc] = Keep[Cc] ? Row[Cc] * KeepScale : T(0);
          }
        }
        gemm<T>(false, false, Rows, D, Cols, T(1), Sc.data(), Bc,
                V + Kv + J0 * D, D, T(1), Acc.data(), D);
      }
      T *Oh = O + OL.row(B, A, I0);
      T *LseH = Lse + OL.lse(B, A, I0);
      for (int64_t R = 0; R < Rows; ++R) {
        // A row with every score -inf gives zeros, as softmax does.
        const T Inv = L[R] > 0 ? T(1.0 / L[R]) : T(0);
        for (int64_t X = 0; X < D; ++X)
          Oh[R * OS + X] = Acc[R * D + X] * Inv;
        LseH[R * LS] = L[R] > 0 ? T(double(M[R]) + std::log(L[R]))
                           : -std::numeric_limits<T>::infinity();
      }
    }
  });
  return Status::success();
}

template <typename T>
Status attentionBackward(T *DQ, T *DK, T *DV, const T *DO, const T *Q,
                         const T *K, const T *V, const T *O, const T *Lse,
                         const T *KeyBias, const AttentionShape &S,
                         const AttentionCore &C) {
  if (Status St = checkCore(S, C); !St.ok())
    return St;
  const int64_t D = S.D, Group = S.Heads / S.KvHeads;
  const T KeepScale = C.Dropout >= 1 ? T(0) : T(1.0 / (1.0 - C.Dropout));
  const T Scale = T(C.Scale);
  const OutLayout OL{S.Heads, S.Sq, D, C.Merged};
  const int64_t OS = OL.rowStride(), LS = OL.lseStride();
  parallelFor(S.Batch * S.KvHeads, 1, [&](int64_t T0, int64_t T1) {
    std::vector<T> P(Br * Bc), DP(Br * Bc), Delta(S.Sq);
    std::vector<uint8_t> Keep(Br * Bc);
    for (int64_t Task = T0; Task < T1; ++Task) {
      const int64_t B = Task / S.KvHeads, G = Task % S.KvHeads;
      const int64_t Kv = (B * S.KvHeads + G) * S.Sk * D;
      const T *Bias = KeyBias ? KeyBias + B * S.Sk : nullptr;
      const T Skip = T(C.Fill) + maxBias(Bias, S.Sk) - T(Negligible);
      std::fill(DK + Kv, DK + Kv + S.Sk * D, T(0));
      std::fill(DV + Kv, DV + Kv + S.Sk * D, T(0));
      for (int64_t A = G * Group; A < (G + 1) * Group; ++A) {
        const int64_t Qo = (B * S.Heads + A) * S.Sq * D;
        const T *LseH = Lse + OL.lse(B, A, 0); // row i at LseH[i LS]
        const int64_t Oo = OL.row(B, A, 0);     // row i at Oo + i OS
        // Delta_i = sum_j p_ij dp_ij = do_i . o_i (dropout included).
        for (int64_t I = 0; I < S.Sq; ++I) {
          double Dot = 0;
          for (int64_t X = 0; X < D; ++X)
            Dot += double(DO[Oo + I * OS + X]) * double(O[Oo + I * OS + X]);
          Delta[I] = T(Dot);
        }
        std::fill(DQ + Qo, DQ + Qo + S.Sq * D, T(0));
        for (int64_t I0 = 0; I0 < S.Sq; I0 += Br) {
          const int64_t Rows = std::min(Br, S.Sq - I0);
          for (int64_t J0 = 0; J0 < S.Sk; J0 += Bc) {
            const int64_t Cols = std::min(Bc, S.Sk - J0);
            if (aboveDiagonal(C, I0, Rows, J0)) {
              bool Negligible = true;
              for (int64_t R = 0; R < Rows; ++R)
                Negligible &= LseH[(I0 + R) * LS] > Skip;
              if (Negligible)
                break;
            }
            scores(P.data(), Q + Qo, K + Kv, Bias, I0, Rows, J0, Cols, D, C);
            for (int64_t R = 0; R < Rows; ++R) {
              T *Row = P.data() + R * Bc;
              const T Lr = LseH[(I0 + R) * LS];
              if (Lr == -std::numeric_limits<T>::infinity())
                std::fill(Row, Row + Cols, T(0));
              else
                expShifted(Row, Cols, Lr);
              if (C.Dropout > 0)
                dropoutKeep(Keep.data() + R * Bc,
                            rowIndex(C.Probs, B, A, I0 + R) + J0, Cols, C.Key,
                            C.Dropout);
            }
            // DV += dropout(P)^T DO; DP = DO V^T.
            T *PD = DP.data(); // the dropped P, then DP
            for (int64_t R = 0; R < Rows; ++R)
              for (int64_t Cc = 0; Cc < Cols; ++Cc)
                PD[R * Bc + Cc] =
                    C.Dropout > 0
                        ? (Keep[R * Bc + Cc] ? P[R * Bc + Cc] * KeepScale
                                             : T(0))
                        : P[R * Bc + Cc];
            gemm<T>(true, false, Cols, D, Rows, T(1), PD, Bc,
                    DO + Oo + I0 * OS, OS, T(1), DV + Kv + J0 * D, D);
            gemm<T>(false, true, Rows, Cols, D, T(1), DO + Oo + I0 * OS, OS,
                    V + Kv + J0 * D, D, T(0), DP.data(), Bc);
            // DS = P (DP - Delta), zero where the causal mask replaced the
            // score, times the scale; kept in P.
            for (int64_t R = 0; R < Rows; ++R)
              for (int64_t Cc = 0; Cc < Cols; ++Cc) {
                T Dp = DP[R * Bc + Cc];
                if (C.Dropout > 0)
                  Dp = Keep[R * Bc + Cc] ? Dp * KeepScale : T(0);
                T Ds = P[R * Bc + Cc] * (Dp - Delta[I0 + R]);
                if (C.Causal && C.Key0 + J0 + Cc > C.Query0 + I0 + R)
                  Ds = T(0);
                P[R * Bc + Cc] = Scale * Ds;
              }
            gemm<T>(false, false, Rows, D, Cols, T(1), P.data(), Bc,
                    K + Kv + J0 * D, D, T(1), DQ + Qo + I0 * D, D);
            gemm<T>(true, false, Cols, D, Rows, T(1), P.data(), Bc,
                    Q + Qo + I0 * D, D, T(1), DK + Kv + J0 * D, D);
          }
        }
      }
    }
  });
  return Status::success();
}

#define SP_INSTANTIATE(T)                                                      \
  template Status attentionForward<T>(T *, T *, const T *, const T *,          \
                                      const T *, const T *,                    \
                                      const AttentionShape &,                  \
                                      const AttentionCore &);                  \
  template Status attentionBackward<T>(                                        \
      T *, T *, T *, const T *, const T *, const T *, const T *, const T *,    \
      const T *, const T *, const AttentionShape &, const AttentionCore &);
SP_INSTANTIATE(float)
SP_INSTANTIATE(double)
#undef SP_INSTANTIATE

} // namespace sp::cpu
