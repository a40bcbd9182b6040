//===- AttentionWindowTest.cpp - The kernel on windows of rows and keys --===//
//
// AttentionCore's window (QBegin, QEnd, KBegin, KEnd) against the whole
// kernel: the forward over a partition of the keys, merged by log-sum-exp,
// is the whole forward; the backward over a partition of the keys and rows
// (each call given the whole forward's O and Lse), summed, is the whole
// backward; and every call leaves the rows and keys outside its window
// untouched. The windows cut the kernel's 64-blocks at odd places, and one
// of them lies wholly above the causal diagonal for some rows (their
// partial softmax is over masked scores only, which the merge weighs by
// exp(Fill - lse), that is 0).
//
// Tolerance (the rule of TrainHarness.h): scale = max(relErr(whole float,
// whole double), 2^-24); the windowed float run is within 8 scale of the
// whole float run, and the windowed double run within 8 scale 2^-29 of the
// whole double run.
//
//===----------------------------------------------------------------------===//
#include "TestSupport.h"
#include "TrainHarness.h"
#include "runtime/cpu/Attention.h"
#include "gtest/gtest.h"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace sp;
using namespace sp::cpu;

namespace {

struct WindowCase {
  AttentionShape S;
  bool Causal, Padding, Merged;
  double Dropout;
  std::vector<int64_t> KeyCuts, RowCuts; // inner cut points of the partitions
};

template <typename T> std::vector<double> windowWiden(const std::vector<T> &V) {
  return std::vector<double>(V.begin(), V.end());
}

/// The results of one way of computing, widened to double.
struct WindowResult {
  std::vector<double> O, Lse, DQ, DK, DV;
};

/// [0, N) cut at Cuts: the windows [Cuts[i-1], Cuts[i]).
std::vector<std::pair<int64_t, int64_t>>
windowParts(const std::vector<int64_t> &Cuts, int64_t N) {
  std::vector<std::pair<int64_t, int64_t>> Out;
  int64_t Begin = 0;
  for (int64_t C : Cuts) {
    Out.push_back({Begin, C});
    Begin = C;
  }
  Out.push_back({Begin, N});
  return Out;
}

/// Runs the whole kernel, or (Windowed) the windows of WC, in T.
template <typename T>
WindowResult runWindowCase(const WindowCase &WC, bool Windowed) {
  const AttentionShape &S = WC.S;
  const int64_t NQ = S.Batch * S.Heads * S.Sq * S.D,
                NK = S.Batch * S.KvHeads * S.Sk * S.D,
                NL = S.Batch * S.Heads * S.Sq;
  std::vector<T> Q = test::normalVector<T>(NQ, 11),
                 K = test::normalVector<T>(NK, 12),
                 V = test::normalVector<T>(NK, 13),
                 DO = test::normalVector<T>(NQ, 14), Bias;
  if (WC.Padding) {
    Bias.assign(S.Batch * S.Sk, T(0));
    for (int64_t B = 0; B < S.Batch; ++B)
      for (int64_t J = S.Sk - 4 - 7 * B; J < S.Sk; ++J)
        Bias[B * S.Sk + J] = T(-10000);
  }
  const T *KB = WC.Padding ? Bias.data() : nullptr;
  AttentionCore C;
  C.Scale = 1 / std::sqrt(double(S.D));
  C.Causal = WC.Causal;
  C.Merged = WC.Merged;
  C.Dropout = WC.Dropout;
  C.Key = DropoutKey{4321, 2, 1, 5};
  const int64_t P4[] = {S.Batch, S.Heads, S.Sq, S.Sk};
  C.Probs = GlobalIndex::whole(Shape(P4, 4));

  WindowResult R;
  std::vector<T> O(NQ, T(-7)), Lse(NL, T(-7));
  EXPECT_TRUE(attentionForward(O.data(), Lse.data(), Q.data(), K.data(),
                               V.data(), KB, S, C)
                  .ok());
  // The backward's O and Lse are always the whole forward's.
  std::vector<T> DQ(NQ, T(-7)), DK(NK, T(-7)), DV(NK, T(-7));
  if (!Windowed) {
    EXPECT_TRUE(attentionBackward(DQ.data(), DK.data(), DV.data(), DO.data(),
                                  Q.data(), K.data(), V.data(), O.data(),
                                  Lse.data(), KB, S, C)
                    .ok());
    return {windowWiden(O), windowWiden(Lse), windowWiden(DQ), windowWiden(DK),
            windowWiden(DV)};
  }
  // Where row (b, a, i) of O and Lse is.
  auto OAt = [&](int64_t B, int64_t A, int64_t I) {
    return WC.Merged ? (B * S.Sq + I) * S.Heads + A
                     : (B * S.Heads + A) * S.Sq + I;
  };
  // Elements outside a call's window that it wrote (none).
  int64_t Written = 0;
  // Forward: every (row window, key window) pair, merged in double; each
  // call writes only its rows.
  R.O.assign(NQ, 0.0);
  R.Lse.assign(NL, -std::numeric_limits<double>::infinity());
  for (auto [I0, I1] : windowParts(WC.RowCuts, S.Sq))
    for (auto [K0, K1] : windowParts(WC.KeyCuts, S.Sk)) {
      AttentionCore W = C;
      W.QBegin = I0, W.QEnd = I1, W.KBegin = K0, W.KEnd = K1;
      std::vector<T> Ow(NQ, T(-7)), Lw(NL, T(-7));
      EXPECT_TRUE(attentionForward(Ow.data(), Lw.data(), Q.data(), K.data(),
                                   V.data(), KB, S, W)
                      .ok());
      for (int64_t B = 0; B < S.Batch; ++B)
        for (int64_t A = 0; A < S.Heads; ++A)
          for (int64_t I = 0; I < S.Sq; ++I) {
            const int64_t L = OAt(B, A, I);
            if (I < I0 || I >= I1) {
              Written += Lw[L] != T(-7);
              for (int64_t X = 0; X < S.D; ++X)
                Written += Ow[L * S.D + X] != T(-7);
              continue;
            }
            const double L1 = R.Lse[L], L2 = double(Lw[L]);
            const double Hi = std::max(L1, L2), Lo = std::min(L1, L2);
            const double New = Hi + std::log1p(std::exp(Lo - Hi));
            const double W1 = std::exp(L1 - New), W2 = std::exp(L2 - New);
            for (int64_t X = 0; X < S.D; ++X)
              R.O[L * S.D + X] = W1 * R.O[L * S.D + X] + W2 * Ow[L * S.D + X];
            R.Lse[L] = New;
          }
    }
  // Backward: every (row window, key window) pair, summed in T; each call
  // writes only its window.
  std::vector<T> SumQ(NQ, T(0)), SumK(NK, T(0)), SumV(NK, T(0));
  for (auto [I0, I1] : windowParts(WC.RowCuts, S.Sq))
    for (auto [K0, K1] : windowParts(WC.KeyCuts, S.Sk)) {
      AttentionCore W = C;
      W.QBegin = I0, W.QEnd = I1, W.KBegin = K0, W.KEnd = K1;
      std::fill(DQ.begin(), DQ.end(), T(-7));
      std::fill(DK.begin(), DK.end(), T(-7));
      std::fill(DV.begin(), DV.end(), T(-7));
      EXPECT_TRUE(attentionBackward(DQ.data(), DK.data(), DV.data(), DO.data(),
                                    Q.data(), K.data(), V.data(), O.data(),
                                    Lse.data(), KB, S, W)
                      .ok());
      for (int64_t E = 0; E < NQ; ++E) {
        const int64_t I = E / S.D % S.Sq;
        if (I >= I0 && I < I1)
          SumQ[E] += DQ[E];
        else
          Written += DQ[E] != T(-7);
      }
      for (int64_t E = 0; E < NK; ++E) {
        const int64_t J = E / S.D % S.Sk;
        if (J >= K0 && J < K1) {
          SumK[E] += DK[E];
          SumV[E] += DV[E];
        } else {
          Written += (DK[E] != T(-7)) + (DV[E] != T(-7));
        }
      }
    }
  R.DQ = windowWiden(SumQ);
  R.DK = windowWiden(SumK);
  R.DV = windowWiden(SumV);
  EXPECT_EQ(Written, 0) << "elements outside the windows written";
  return R;
}

TEST(AttentionWindow, PartitionsSumToTheWholeKernel) {
  const std::vector<WindowCase> Cases = {
      // causal, padding, dropout, GQA: the key window [100, 150) lies wholly
      // above the diagonal of rows [0, 100)
      {{2, 4, 2, 150, 150, 8}, true, true, false, 0.1, {70, 100}, {50}},
      // merged O, DO and Lse
      {{2, 2, 2, 96, 96, 8}, true, false, true, 0.0, {33}, {64, 65}},
      // bidirectional, Sq != Sk
      {{1, 3, 3, 50, 130, 16}, false, true, false, 0.2, {1, 64, 129}, {17}},
  };
  const double U = std::ldexp(1.0, -24), F64 = std::ldexp(1.0, -29);
  for (const WindowCase &WC : Cases) {
    SCOPED_TRACE("Sq " + std::to_string(WC.S.Sq) + " Sk " +
                 std::to_string(WC.S.Sk) + " causal " +
                 std::to_string(WC.Causal) + " merged " +
                 std::to_string(WC.Merged));
    WindowResult W32 = runWindowCase<float>(WC, false),
                 W64 = runWindowCase<double>(WC, false),
                 P32 = runWindowCase<float>(WC, true),
                 P64 = runWindowCase<double>(WC, true);
    if (::testing::Test::HasFatalFailure())
      return;
    auto Check = [&](const std::vector<double> WindowResult::*X,
                     const char *Name) {
      const double Scale = std::max(test::relErr(W32.*X, W64.*X), U);
      const double E32 = test::relErr(P32.*X, W32.*X),
                   E64 = test::relErr(P64.*X, W64.*X);
      EXPECT_LE(E32, test::ToleranceFactor * Scale) << Name;
      EXPECT_LE(E64, test::ToleranceFactor * Scale * F64) << Name;
      if (std::getenv("SP_TOLERANCE_REPORT"))
        std::printf("window %s: float %.3g, double %.3g (of scale)\n", Name,
                    E32 / Scale, E64 / (Scale * F64));
    };
    Check(&WindowResult::O, "O");
    Check(&WindowResult::Lse, "Lse");
    Check(&WindowResult::DQ, "DQ");
    Check(&WindowResult::DK, "DK");
    Check(&WindowResult::DV, "DV");
  }
}

TEST(AttentionWindow, RejectsAWindowOutsideTheTensor) {
  std::vector<float> X(1024);
  AttentionShape S{1, 2, 2, 8, 8, 4};
  AttentionCore C;
  C.KBegin = 3, C.KEnd = 9;
  EXPECT_FALSE(attentionForward(X.data(), X.data(), X.data(), X.data(),
                                X.data(), (const float *)nullptr, S, C)
                   .ok());
  C.KEnd = 2;
  EXPECT_FALSE(attentionForward(X.data(), X.data(), X.data(), X.data(),
                                X.data(), (const float *)nullptr, S, C)
                   .ok());
  C.KBegin = 0, C.KEnd = -1, C.QBegin = -1;
  EXPECT_FALSE(attentionBackward(X.data(), X.data(), X.data(), X.data(),
                                 X.data(), X.data(), X.data(), X.data(),
                                 X.data(), (const float *)nullptr, S, C)
                   .ok());
}

} // namespace
