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
#include "runtime/cpu/Philox.h"
#include "runtime/cpu/Simd.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace sp::cpu {
namespace {

using namespace simd;

constexpr int64_t Br = 64, Bc = 64;

/// exp(x) below 2^-149 (the smallest float): scores this far below a row's
/// maximum (or log-sum-exp) have no effect in float.
constexpr double Negligible = -104;

/// The window of a call: query rows [I0, I1) and keys [J0, J1).
struct AttentionWindow {
  int64_t I0, I1, J0, J1;
};
AttentionWindow attentionWindow(const AttentionShape &S,
                                const AttentionCore &C) {
  return {C.QBegin, C.QEnd < 0 ? S.Sq : C.QEnd, C.KBegin,
          C.KEnd < 0 ? S.Sk : C.KEnd};
}

Status checkCore(const AttentionShape &S, const AttentionCore &C) {
  if (S.Batch < 0 || S.Heads <= 0 || S.KvHeads <= 0 || S.Sq < 0 ||
      S.Sk < 0 || S.D <= 0)
    return Status::error("attention: non-positive sizes");
  if (S.Heads % S.KvHeads != 0)
    return Status::error("attention: query heads not a multiple of the "
                         "key/value heads",
                         -1, S.KvHeads);
  if (C.Packed && (S.KvHeads != S.Heads || S.Sk != S.Sq))
    return Status::error("attention: packed q, k, v need as many key/value "
                         "heads as query heads and as many keys as queries");
  const AttentionWindow W = attentionWindow(S, C);
  if (W.I0 < 0 || W.I0 > W.I1 || W.I1 > S.Sq || W.J0 < 0 || W.J0 > W.J1 ||
      W.J1 > S.Sk)
    return Status::error("attention: a window outside the queries or keys");
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

/// Where the causal mask starts in a block row: key J0 + c is masked for
/// query row I iff Key0 + J0 + c > Query0 + I, that is for c >= Base + I - I0
/// with Base = Query0 + I0 - Key0 - J0 + 1 (clamped to [0, Cols]).
///
/// A masked score is at most MaskedTop = Fill + max(KeyBias, 0) (up to the
/// float rounding of the bias's addition). Where that is more than 800
/// below a row's shift (its running maximum, or its log-sum-exp), every
/// masked exp(score - shift) is exactly 0 (expD returns 0 below -708), and
/// so is its probability after dropout, whatever the dropout draws: live()
/// then gives the row's unmasked prefix, and the kernels compute the exps
/// and the dropout of that prefix only and write zeros after it, with the
/// same results (the lane sums gain +0 for each masked score).
struct CausalCut {
  bool Causal;
  int64_t Base;
  double MaskedTop;
  int64_t first(int64_t R, int64_t Cols) const {
    return Causal ? std::clamp<int64_t>(Base + R, 0, Cols) : Cols;
  }
  int64_t live(int64_t R, int64_t Cols, double Shift) const {
    bool Zero = MaskedTop == -std::numeric_limits<double>::infinity() ||
                MaskedTop - Shift < -800 - 1e-6 * std::fabs(MaskedTop);
    return Zero ? first(R, Cols) : Cols;
  }
};
CausalCut causalCut(const AttentionCore &C, int64_t I0, int64_t J0,
                    double MaxBias = 0) {
  return {C.Causal, C.Query0 + I0 - C.Key0 - J0 + 1, C.Fill + MaxBias};
}

/// Sc[r, c] = Scale * Sc[r, c], then the padding bias and the causal fill
/// in the unfused ops' order (Bias points at key J0's, or is null).
template <typename T>
SP_SIMD void scaleMask(T *Sc, int64_t Rows, int64_t Cols, T Scale,
                       const T *Bias, bool PadFirst, T Fill, CausalCut Cut) {
  for (int64_t R = 0; R < Rows; ++R) {
    T *Row = Sc + R * Bc;
    if (Bias && PadFirst)
      for (int64_t Cc = 0; Cc < Cols; ++Cc)
        Row[Cc] = Scale * Row[Cc] + Bias[Cc];
    else
      for (int64_t Cc = 0; Cc < Cols; ++Cc)
        Row[Cc] = Scale * Row[Cc];
    for (int64_t Cc = Cut.first(R, Cols); Cc < Cols; ++Cc)
      Row[Cc] = Fill;
    if (Bias && !PadFirst)
      for (int64_t Cc = 0; Cc < Cols; ++Cc)
        Row[Cc] = Row[Cc] + Bias[Cc];
  }
}

/// The scores of one block, op for op as the unfused ops compute them:
/// Sc[r, c] for query rows I0 + r < I0 + Rows, keys J0 + c (row i of the
/// head's q at Q + i QR, row j of its k at K + j KR).
template <typename T>
void scores(T *Sc, const T *Q, int64_t QR, const T *K, int64_t KR,
            const T *Bias, int64_t I0, int64_t Rows, int64_t J0, int64_t Cols,
            int64_t D, const AttentionCore &C) {
  gemm<T>(false, true, Rows, Cols, D, T(1), Q + I0 * QR, QR, K + J0 * KR, KR,
          T(0), Sc, Bc);
  // (Scale * s + b: the product rounded, then the sum, as the ops do.)
  scaleMask(Sc, Rows, Cols, T(C.Scale), Bias ? Bias + J0 : nullptr,
            C.PadFirst, T(C.Fill), causalCut(C, I0, J0));
}

/// The dropout of one block's probabilities: row r's keys J0 + c are global
/// elements Row0 + r RowStride + c of the [B, A, Sq, Sk] probabilities.
struct BlockDropout {
  double Ratio;
  DropoutKey Key;
  uint64_t Row0, RowStride;
};

/// One key block of the forward's online softmax, row by row: the running
/// maximum M and sum L, the accumulator Acc rescaled when M grows, and the
/// block's probabilities (dropped out when Drop.Ratio > 0) left in Sc for
/// the product with V.
template <typename T>
SP_SIMD void onlineSoftmax(T *Sc, int64_t Rows, int64_t Cols, T *M, double *L,
                           T *Acc, int64_t D, const BlockDropout &Drop,
                           uint8_t *Keep, T KeepScale, CausalCut Cut) {
  for (int64_t R = 0; R < Rows; ++R) {
    T *Row = Sc + R * Bc;
    const T RowMax = rowMax(Row, Cols);
    const T New = M[R] < RowMax ? RowMax : M[R];
    if (New == -std::numeric_limits<T>::infinity()) {
      for (int64_t Cc = 0; Cc < Cols; ++Cc) // nothing seen yet
        Row[Cc] = T(0);
      continue;
    }
    const T Corr = std::exp(M[R] - New); // 0 on the first block
    const int64_t Live = Cut.live(R, Cols, double(New));
    const double Sum = expShiftedSum(Row, Row, Live, New);
    for (int64_t Cc = Live; Cc < Cols; ++Cc)
      Row[Cc] = T(0);
    L[R] = L[R] * double(Corr) + Sum;
    M[R] = New;
    if (Corr != T(1))
      for (int64_t X = 0; X < D; ++X)
        Acc[R * D + X] *= Corr;
    if (Drop.Ratio > 0) {
      dropoutKeep(Keep, Drop.Row0 + uint64_t(R) * Drop.RowStride, Live,
                  Drop.Key, Drop.Ratio);
      for (int64_t Cc = 0; Cc < Live; ++Cc)
        Row[Cc] = Keep[Cc] ? Row[Cc] * KeepScale : T(0);
    }
  }
}

/// The backward's probabilities of one block from its scores in P and the
/// rows' log-sum-exp (Lse[r LS]): P = exp(s - lse) in place, Keep the
/// block's dropout, and PD = the dropped-out P.
template <typename T>
SP_SIMD void blockProbs(T *P, T *PD, uint8_t *Keep, int64_t Rows, int64_t Cols,
                        const T *Lse, int64_t LS, const BlockDropout &Drop,
                        T KeepScale, CausalCut Cut) {
  for (int64_t R = 0; R < Rows; ++R) {
    T *Row = P + R * Bc, *Out = PD + R * Bc;
    const T Lr = Lse[R * LS];
    int64_t Live = 0;
    if (Lr != -std::numeric_limits<T>::infinity()) {
      Live = Cut.live(R, Cols, double(Lr));
      expShiftedSum(Row, Row, Live, Lr);
    }
    for (int64_t Cc = Live; Cc < Cols; ++Cc)
      Row[Cc] = T(0);
    if (Drop.Ratio > 0) {
      uint8_t *KeepR = Keep + R * Bc;
      dropoutKeep(KeepR, Drop.Row0 + uint64_t(R) * Drop.RowStride, Live,
                  Drop.Key, Drop.Ratio);
      for (int64_t Cc = 0; Cc < Live; ++Cc)
        Out[Cc] = KeepR[Cc] ? Row[Cc] * KeepScale : T(0);
    } else {
      for (int64_t Cc = 0; Cc < Live; ++Cc)
        Out[Cc] = Row[Cc];
    }
    for (int64_t Cc = Live; Cc < Cols; ++Cc)
      Out[Cc] = T(0);
  }
}

/// DS = Scale * P (DP' - Delta), DP' the dropout's gradient of DP, zero
/// where the causal mask replaced the score; written over P.
template <typename T>
SP_SIMD void blockScoreGrad(T *P, const T *DP, const uint8_t *Keep,
                            int64_t Rows, int64_t Cols, const T *Delta,
                            bool Dropped, T KeepScale, T Scale, CausalCut Cut) {
  for (int64_t R = 0; R < Rows; ++R) {
    T *Row = P + R * Bc;
    const T *DpR = DP + R * Bc;
    const uint8_t *KeepR = Keep + R * Bc;
    const T Dr = Delta[R];
    const int64_t First = Cut.first(R, Cols);
    if (Dropped)
      for (int64_t Cc = 0; Cc < First; ++Cc)
        Row[Cc] = Scale * (Row[Cc] * ((KeepR[Cc] ? DpR[Cc] * KeepScale
                                                 : T(0)) -
                                      Dr));
    else
      for (int64_t Cc = 0; Cc < First; ++Cc)
        Row[Cc] = Scale * (Row[Cc] * (DpR[Cc] - Dr));
    for (int64_t Cc = First; Cc < Cols; ++Cc)
      Row[Cc] = T(0);
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

/// Where head (b, a) of Q, K or V (and of DQ, DK, DV) starts, and the
/// distance from its row i to row i + 1: [B, A, S, D] each, or with
/// Packed the column blocks of one [B, S, 3, A, D] tensor.
struct InLayout {
  int64_t Batch, Head, Row;
  InLayout(int64_t Heads, int64_t S, int64_t D, bool Packed)
      : Batch(Packed ? S * 3 * Heads * D : Heads * S * D),
        Head(Packed ? D : S * D), Row(Packed ? 3 * Heads * D : D) {}
  int64_t head(int64_t B, int64_t A) const { return B * Batch + A * Head; }
};

/// The largest of 0 and the bias of keys [J0, J1).
template <typename T> T maxBias(const T *Bias, int64_t J0, int64_t J1) {
  T M = T(0);
  if (Bias)
    for (int64_t J = J0; J < J1; ++J)
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
  const AttentionWindow W = attentionWindow(S, C);
  const int64_t QBlocks = (W.I1 - W.I0 + Br - 1) / Br;
  const OutLayout OL{S.Heads, S.Sq, D, C.Merged};
  const InLayout QL(S.Heads, S.Sq, D, C.Packed),
      KL(S.KvHeads, S.Sk, D, C.Packed);
  const int64_t OS = OL.rowStride(), LS = OL.lseStride(), KR = KL.Row;
  const T KeepScale = T(philox::dropoutScale(C.Dropout));
  parallelFor(S.Batch * S.Heads * QBlocks, 1, [&](int64_t T0, int64_t T1) {
    std::vector<T> Sc(Br * Bc), Acc(Br * D), M(Br);
    std::vector<double> L(Br);
    std::vector<uint8_t> Keep(Bc);
    for (int64_t Task = T0; Task < T1; ++Task) {
      const int64_t B = Task / (S.Heads * QBlocks),
                    A = Task / QBlocks % S.Heads,
                    I0 = W.I0 + Task % QBlocks * Br;
      const int64_t Rows = std::min(Br, W.I1 - I0);
      const T *Qh = Q + QL.head(B, A);
      const int64_t Kv = KL.head(B, A / Group);
      const T *Bias = KeyBias ? KeyBias + B * S.Sk : nullptr;
      const T MaxBias = maxBias(Bias, W.J0, W.J1);
      const T Skip = T(C.Fill) + MaxBias - T(Negligible);
      std::fill(M.begin(), M.end(), -std::numeric_limits<T>::infinity());
      std::fill(L.begin(), L.end(), 0.0);
      std::fill(Acc.begin(), Acc.end(), T(0));
      for (int64_t J0 = W.J0; J0 < W.J1; J0 += Bc) {
        const int64_t Cols = std::min(Bc, W.J1 - J0);
        // Past the diagonal every later block is masked too: stop once the
        // masked scores are negligible in every row.
        if (aboveDiagonal(C, I0, Rows, J0) &&
            std::all_of(M.begin(), M.begin() + Rows,
                        [&](T Mr) { return Mr > Skip; }))
          break;
        scores(Sc.data(), Qh, QL.Row, K + Kv, KR, Bias, I0, Rows, J0, Cols, D,
               C);
        const BlockDropout Drop{C.Dropout, C.Key,
                                rowIndex(C.Probs, B, A, I0) + uint64_t(J0),
                                uint64_t(C.Probs.Global[3])};
        onlineSoftmax(Sc.data(), Rows, Cols, M.data(), L.data(), Acc.data(), D,
                      Drop, Keep.data(), KeepScale,
                      causalCut(C, I0, J0, MaxBias));
        gemm<T>(false, false, Rows, D, Cols, T(1), Sc.data(), Bc,
                V + Kv + J0 * KR, KR, T(1), Acc.data(), D);
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
  const AttentionWindow W = attentionWindow(S, C);
  const T KeepScale = T(philox::dropoutScale(C.Dropout));
  const T Scale = T(C.Scale);
  const OutLayout OL{S.Heads, S.Sq, D, C.Merged};
  const InLayout QL(S.Heads, S.Sq, D, C.Packed),
      KL(S.KvHeads, S.Sk, D, C.Packed);
  const int64_t OS = OL.rowStride(), LS = OL.lseStride(), QR = QL.Row,
                KR = KL.Row;
  // Zeroes rows [R0, R1) of one head (row stride R) of a gradient.
  auto ZeroHead = [D](T *X, int64_t R0, int64_t R1, int64_t R) {
    for (int64_t I = R0; I < R1; ++I)
      std::fill(X + I * R, X + I * R + D, T(0));
  };
  parallelFor(S.Batch * S.KvHeads, 1, [&](int64_t T0, int64_t T1) {
    std::vector<T> P(Br * Bc), DP(Br * Bc), Delta(S.Sq);
    std::vector<uint8_t> Keep(Br * Bc);
    for (int64_t Task = T0; Task < T1; ++Task) {
      const int64_t B = Task / S.KvHeads, G = Task % S.KvHeads;
      const int64_t Kv = KL.head(B, G);
      const T *Bias = KeyBias ? KeyBias + B * S.Sk : nullptr;
      const T MaxBias = maxBias(Bias, W.J0, W.J1);
      const T Skip = T(C.Fill) + MaxBias - T(Negligible);
      ZeroHead(DK + Kv, W.J0, W.J1, KR);
      ZeroHead(DV + Kv, W.J0, W.J1, KR);
      for (int64_t A = G * Group; A < (G + 1) * Group; ++A) {
        const int64_t Qo = QL.head(B, A);
        const T *LseH = Lse + OL.lse(B, A, 0); // row i at LseH[i LS]
        const int64_t Oo = OL.row(B, A, 0);     // row i at Oo + i OS
        // Delta_i = sum_j p_ij dp_ij = do_i . o_i (dropout included).
        for (int64_t I = W.I0; I < W.I1; ++I) {
          double Dot = 0;
          for (int64_t X = 0; X < D; ++X)
            Dot += double(DO[Oo + I * OS + X]) * double(O[Oo + I * OS + X]);
          Delta[I] = T(Dot);
        }
        ZeroHead(DQ + Qo, W.I0, W.I1, QR);
        for (int64_t I0 = W.I0; I0 < W.I1; I0 += Br) {
          const int64_t Rows = std::min(Br, W.I1 - I0);
          for (int64_t J0 = W.J0; J0 < W.J1; J0 += Bc) {
            const int64_t Cols = std::min(Bc, W.J1 - J0);
            if (aboveDiagonal(C, I0, Rows, J0)) {
              bool Negligible = true;
              for (int64_t R = 0; R < Rows; ++R)
                Negligible &= LseH[(I0 + R) * LS] > Skip;
              if (Negligible)
                break;
            }
            scores(P.data(), Q + Qo, QR, K + Kv, KR, Bias, I0, Rows, J0, Cols,
                   D, C);
            // DV += dropout(P)^T DO; DP = DO V^T.
            const BlockDropout Drop{C.Dropout, C.Key,
                                    rowIndex(C.Probs, B, A, I0) + uint64_t(J0),
                                    uint64_t(C.Probs.Global[3])};
            T *PD = DP.data(); // the dropped P, then DP
            blockProbs(P.data(), PD, Keep.data(), Rows, Cols, LseH + I0 * LS,
                       LS, Drop, KeepScale, causalCut(C, I0, J0, MaxBias));
            gemm<T>(true, false, Cols, D, Rows, T(1), PD, Bc,
                    DO + Oo + I0 * OS, OS, T(1), DV + Kv + J0 * KR, KR);
            gemm<T>(false, true, Rows, Cols, D, T(1), DO + Oo + I0 * OS, OS,
                    V + Kv + J0 * KR, KR, T(0), DP.data(), Bc);
            // DS = P (DP - Delta), zero where the causal mask replaced the
            // score, times the scale; kept in P.
            blockScoreGrad(P.data(), DP.data(), Keep.data(), Rows, Cols,
                           Delta.data() + I0, C.Dropout > 0, KeepScale, Scale,
                           causalCut(C, I0, J0));
            gemm<T>(false, false, Rows, D, Cols, T(1), P.data(), Bc,
                    K + Kv + J0 * KR, KR, T(1), DQ + Qo + I0 * QR, QR);
            gemm<T>(true, false, Cols, D, Rows, T(1), P.data(), Bc,
                    Q + Qo + I0 * QR, QR, T(1), DK + Kv + J0 * KR, KR);
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
