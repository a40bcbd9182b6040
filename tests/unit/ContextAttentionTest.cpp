//===- ContextAttentionTest.cpp - Ring attention against one device -----===//
//
// cpu::ringAttentionForward and ringAttentionBackward on C = 1, 2 and 4
// thread ranks against attentionForward and attentionBackward on the whole
// sequence: global Q, K, V, dO [B = 2, A, S = 16 C, D = 8], split into each
// rank's positions by ContextLayout (contiguous and zigzag), causal or not,
// grouped-query heads or not, merged O, dO, Lse or not, dropout 0 or 0.1
// (drawn at the one-device run's global indices), and a padding bias on the
// last keys of each batch row or none. The ranks' O, Lse, dQ, dK, dV are
// gathered back to global order and compared by TrainHarness.h's rule:
//
//   scale = max(relErr(reference float, reference double), 2^-24)
//   relErr(ring float, reference float)   <= 8 scale
//   relErr(ring double, reference double) <= 8 scale 2^-29
//
// (SP_TOLERANCE_REPORT=1 prints the largest ratio relErr / bound.) The
// all-to-all (--cp-comm a2a) is one device's bits; the hierarchical
// all-to-all + ring (a2a+ring: groups of K consecutive ranks, the ring
// across them) at C = 4, K = 2 and C = 8, K = 2 and 4 is held to the
// ring's bound (it is the ring over C / K ranks on A / K heads). Also:
// the comparison catches a wrong layout mapping, the results are the same
// bits whatever the kernel thread count, and Packed is refused.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/ContextAttention.h"
#include "TestSupport.h"
#include "TrainHarness.h"
#include "runtime/comm/ProcessGrid.h"
#include "runtime/cpu/Parallel.h"
#include "gtest/gtest.h"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace sp;
using namespace sp::cpu;
using namespace llvm;

namespace {

struct RingCase {
  int Parts;
  bool Zigzag, Causal, Gqa, Merged, Padding;
  double Dropout;
  double Fill = -10000; // the causal fill
  std::string name() const {
    return "C " + std::to_string(Parts) + (Zigzag ? " zigzag" : " contiguous") +
           (Causal ? " causal" : "") + (Gqa ? " gqa" : "") +
           (Merged ? " merged" : "") + (Padding ? " padding" : "") +
           " dropout " + std::to_string(Dropout) + " fill " +
           std::to_string(Fill);
  }
  AttentionShape shape() const { // the global one
    return {2, 4, Gqa ? 2 : 4, 16 * int64_t(Parts), 16 * int64_t(Parts), 8};
  }
};

/// O, Lse, dQ, dK, dV in global order, widened to double.
struct RingResult {
  std::vector<double> O, Lse, DQ, DK, DV;
};

/// The global inputs of a case (the same values in float and double: drawn
/// in double and rounded to float first).
template <typename T> struct RingInputs { std::vector<T> Q, K, V, DO, Bias; };
template <typename T> RingInputs<T> ringInputs(const RingCase &RC) {
  const AttentionShape S = RC.shape();
  const int64_t NQ = S.Batch * S.Heads * S.Sq * S.D,
                NK = S.Batch * S.KvHeads * S.Sk * S.D;
  auto Draw = [](size_t N, uint32_t Seed) {
    std::vector<float> F = test::normalVector<float>(N, Seed);
    return std::vector<T>(F.begin(), F.end());
  };
  RingInputs<T> X{Draw(NQ, 21), Draw(NK, 22), Draw(NK, 23), Draw(NQ, 24), {}};
  if (RC.Padding) {
    X.Bias.assign(S.Batch * S.Sk, T(0));
    for (int64_t B = 0; B < S.Batch; ++B)
      for (int64_t J = S.Sk - 3 - 5 * B; J < S.Sk; ++J)
        X.Bias[B * S.Sk + J] = T(-10000);
  }
  return X;
}

AttentionCore ringCore(const RingCase &RC) {
  const AttentionShape S = RC.shape();
  AttentionCore C;
  C.Scale = 1 / std::sqrt(double(S.D));
  C.Causal = RC.Causal;
  C.Fill = RC.Fill;
  C.Merged = RC.Merged;
  C.Dropout = RC.Dropout;
  C.Key = DropoutKey{0x5eed'1234'abcdULL, 3, 2, 7};
  const int64_t P4[] = {S.Batch, S.Heads, S.Sq, S.Sk};
  C.Probs = GlobalIndex::whole(Shape(P4, 4));
  return C;
}

template <typename T> std::vector<double> ringWiden(const std::vector<T> &V) {
  return std::vector<double>(V.begin(), V.end());
}

/// A tensor viewed as [Outer, Seq, Inner]: rank R's positions of it (Local)
/// from the global one, or back (ToGlobal).
template <typename T>
void ringMove(std::vector<T> &Global, std::vector<T> &Local, int64_t Outer,
              int64_t Inner, const ContextLayout &L, int R, bool ToGlobal) {
  const int64_t Sl = L.local();
  if (!ToGlobal)
    Local.assign(Outer * Sl * Inner, T(0));
  for (int64_t O = 0; O < Outer; ++O)
    for (int64_t P = 0; P < Sl; ++P) {
      T *G = Global.data() + (O * L.Seq + L.position(R, P)) * Inner;
      T *Lo = Local.data() + (O * Sl + P) * Inner;
      if (ToGlobal)
        std::copy_n(Lo, Inner, G);
      else
        std::copy_n(G, Inner, Lo);
    }
}

/// The one-device run.
template <typename T> RingResult ringReference(const RingCase &RC) {
  const AttentionShape S = RC.shape();
  RingInputs<T> X = ringInputs<T>(RC);
  const AttentionCore C = ringCore(RC);
  std::vector<T> O(X.Q.size()), Lse(S.Batch * S.Heads * S.Sq), DQ(X.Q.size()),
      DK(X.K.size()), DV(X.K.size());
  const T *Bias = RC.Padding ? X.Bias.data() : nullptr;
  EXPECT_TRUE(attentionForward(O.data(), Lse.data(), X.Q.data(), X.K.data(),
                               X.V.data(), Bias, S, C)
                  .ok());
  EXPECT_TRUE(attentionBackward(DQ.data(), DK.data(), DV.data(), X.DO.data(),
                                X.Q.data(), X.K.data(), X.V.data(), O.data(),
                                Lse.data(), Bias, S, C)
                  .ok());
  return {ringWiden(O), ringWiden(Lse), ringWiden(DQ), ringWiden(DK),
          ringWiden(DV)};
}

/// How the cp group talks: the ring (AllToAll 1), the all-to-all
/// (AllToAll = Parts), or all-to-all groups of AllToAll ranks and the ring
/// across them.
Expected<ContextGroups> ringGroups(Communicator &Cp, int AllToAll,
                                   ContextGroupSplit &Own) {
  if (AllToAll == 1)
    return ContextGroups{nullptr, &Cp};
  if (AllToAll == Cp.size())
    return ContextGroups{&Cp, nullptr};
  auto Split = splitContext(Cp, AllToAll);
  if (!Split)
    return Split.takeError();
  Own = std::move(*Split);
  return ContextGroups{Own.Inner.get(), Own.Outer.get()};
}

/// The core on RC.Parts thread ranks; the inputs are split by Split and the
/// ring runs with Ring (the same layout, except to test a wrong mapping),
/// over the groups of ringGroups(AllToAll).
template <typename T>
RingResult ringRun(const RingCase &RC, const ContextLayout &Split,
                   const ContextLayout &Ring, int AllToAll = 1) {
  const AttentionShape G = RC.shape();
  AttentionShape S = G;
  S.Sq = S.Sk = Split.local();
  RingInputs<T> X = ringInputs<T>(RC);
  const AttentionCore C = ringCore(RC);
  const int Parts = RC.Parts;
  // [Outer, Seq, Inner] views of the tensors.
  const int64_t QOuter = G.Batch * G.Heads, KOuter = G.Batch * G.KvHeads;
  const int64_t OOuter = RC.Merged ? G.Batch : QOuter,
                OInner = RC.Merged ? G.Heads * G.D : G.D,
                LInner = RC.Merged ? G.Heads : 1;
  struct Local {
    std::vector<T> Q, K, V, DO, O, Lse, DQ, DK, DV;
  };
  std::vector<Local> Ranks(Parts);
  for (int R = 0; R < Parts; ++R) {
    Local &Lr = Ranks[R];
    ringMove(X.Q, Lr.Q, QOuter, G.D, Split, R, false);
    ringMove(X.K, Lr.K, KOuter, G.D, Split, R, false);
    ringMove(X.V, Lr.V, KOuter, G.D, Split, R, false);
    ringMove(X.DO, Lr.DO, OOuter, OInner, Split, R, false);
    Lr.O.assign(Lr.Q.size(), T(-7));
    Lr.Lse.assign(G.Batch * G.Heads * S.Sq, T(-7));
    Lr.DQ.assign(Lr.Q.size(), T(-7));
    Lr.DK.assign(Lr.K.size(), T(-7));
    Lr.DV.assign(Lr.K.size(), T(-7));
  }
  const T *Bias = RC.Padding ? X.Bias.data() : nullptr;
  Error E = runOnThreadRanks(Parts, [&](Communicator &Cp) -> Error {
    Local &Lr = Ranks[Cp.rank()];
    ContextGroupSplit Own;
    auto Groups = ringGroups(Cp, AllToAll, Own);
    if (!Groups)
      return Groups.takeError();
    if (Error E = contextAttentionForward(Lr.O.data(), Lr.Lse.data(),
                                          Lr.Q.data(), Lr.K.data(), Lr.V.data(),
                                          Bias, S, C, *Groups, Ring))
      return E;
    return contextAttentionBackward(Lr.DQ.data(), Lr.DK.data(), Lr.DV.data(),
                                    Lr.DO.data(), Lr.Q.data(), Lr.K.data(),
                                    Lr.V.data(), Lr.O.data(), Lr.Lse.data(),
                                    Bias, S, C, *Groups, Ring);
  });
  EXPECT_FALSE(bool(E)) << toString(std::move(E));
  std::vector<T> O(X.Q.size()), Lse(G.Batch * G.Heads * G.Sq), DQ(X.Q.size()),
      DK(X.K.size()), DV(X.K.size());
  for (int R = 0; R < Parts; ++R) {
    Local &Lr = Ranks[R];
    ringMove(O, Lr.O, OOuter, OInner, Split, R, true);
    ringMove(Lse, Lr.Lse, OOuter, LInner, Split, R, true);
    ringMove(DQ, Lr.DQ, QOuter, G.D, Split, R, true);
    ringMove(DK, Lr.DK, KOuter, G.D, Split, R, true);
    ringMove(DV, Lr.DV, KOuter, G.D, Split, R, true);
  }
  return {ringWiden(O), ringWiden(Lse), ringWiden(DQ), ringWiden(DK),
          ringWiden(DV)};
}

using RingField = std::vector<double> RingResult::*;
const std::pair<RingField, const char *> RingFields[] = {
    {&RingResult::O, "O"},
    {&RingResult::Lse, "Lse"},
    {&RingResult::DQ, "DQ"},
    {&RingResult::DK, "DK"},
    {&RingResult::DV, "DV"}};

/// Every combination of the layouts and options (one rank too: the ring
/// without messages), and causal fills whose
/// masked probabilities are not 0 (-12: no pair above the diagonal may be
/// skipped) or exactly 0 (-inf).
std::vector<RingCase> ringCases() {
  std::vector<RingCase> Out;
  for (int Parts : {1, 2, 4})
    for (int Bits = 0; Bits < 64; ++Bits)
      Out.push_back({Parts, bool(Bits & 1), bool(Bits & 2), bool(Bits & 4),
                     bool(Bits & 8), bool(Bits & 16), Bits & 32 ? 0.1 : 0.0});
  for (int Parts : {2, 4})
    for (bool Zigzag : {false, true})
      for (double Fill : {-12.0, -std::numeric_limits<double>::infinity()})
        Out.push_back({Parts, Zigzag, true, true, true, true, 0.1, Fill});
  return Out;
}

/// Runs Cases (over all-to-all groups of AllToAll(case) ranks) against
/// the one-device kernel by the file comment's rule.
template <typename AllToAllFn>
void expectRingBound(const std::vector<RingCase> &Cases, AllToAllFn AllToAll,
                     const char *What) {
  const double U = std::ldexp(1.0, -24), F64 = std::ldexp(1.0, -29);
  const double K = test::ToleranceFactor;
  // The largest relErr / scale of each field, float and double (/ 2^-29).
  double Worst[5][2] = {};
  for (const RingCase &RC : Cases) {
    SCOPED_TRACE(RC.name() + " all-to-all " + std::to_string(AllToAll(RC)));
    const ContextLayout L{RC.Parts, RC.Zigzag, RC.shape().Sq};
    RingResult R32 = ringReference<float>(RC), R64 = ringReference<double>(RC),
               G32 = ringRun<float>(RC, L, L, AllToAll(RC)),
               G64 = ringRun<double>(RC, L, L, AllToAll(RC));
    if (::testing::Test::HasFailure())
      return;
    for (int F = 0; F < 5; ++F) {
      auto [X, Name] = RingFields[F];
      const double Scale = std::max(test::relErr(R32.*X, R64.*X), U);
      const double E32 = test::relErr(G32.*X, R32.*X),
                   E64 = test::relErr(G64.*X, R64.*X);
      EXPECT_LE(E32, K * Scale) << Name;
      EXPECT_LE(E64, K * Scale * F64) << Name;
      Worst[F][0] = std::max(Worst[F][0], E32 / Scale);
      Worst[F][1] = std::max(Worst[F][1], E64 / (Scale * F64));
    }
  }
  if (std::getenv("SP_TOLERANCE_REPORT"))
    for (int F = 0; F < 5; ++F)
      std::printf("%s %s: largest relErr / scale: float %.3g, "
                  "double %.3g (bound %g)\n",
                  What, RingFields[F].second, Worst[F][0], Worst[F][1], K);
}

TEST(ContextAttention, RingMatchesTheOneDeviceKernel) {
  expectRingBound(
      ringCases(), [](const RingCase &) { return 1; }, "ring attention");
}

/// All-to-all groups of K consecutive ranks, the ring across them: C = 4,
/// K = 2 on every layout and option (GQA: 2 key/value heads, one a rank),
/// and C = 8 with K = 2 and 4 on the hardest cases (causal, GQA, merged,
/// padding, dropout; both layouts; fills -10000, -12 and -inf).
TEST(ContextAttention, HierarchicalMatchesTheOneDeviceKernel) {
  std::vector<RingCase> Four, Eight;
  for (const RingCase &RC : ringCases())
    if (RC.Parts == 4)
      Four.push_back(RC);
  expectRingBound(
      Four, [](const RingCase &) { return 2; }, "a2a+ring c 4 k 2");
  for (bool Zigzag : {false, true})
    for (double Fill :
         {-10000.0, -12.0, -std::numeric_limits<double>::infinity()})
      for (bool Gqa : {false, true})
        Eight.push_back({8, Zigzag, true, Gqa, true, true, 0.1, Fill});
  expectRingBound(
      Eight, [](const RingCase &RC) { return RC.Gqa ? 2 : 4; }, "a2a+ring c 8");
}

/// The all-to-all (DeepSpeed-Ulysses) runs each head on the whole sequence
/// as one device does: the same bits, on every layout and option (C
/// dividing the heads and key/value heads).
TEST(ContextAttention, AllToAllIsTheOneDeviceKernelBitForBit) {
  int Cases = 0;
  for (const RingCase &RC : ringCases()) {
    if (RC.shape().KvHeads % RC.Parts)
      continue;
    SCOPED_TRACE(RC.name());
    const ContextLayout L{RC.Parts, RC.Zigzag, RC.shape().Sq};
    RingResult R32 = ringReference<float>(RC),
               G32 = ringRun<float>(RC, L, L, /*AllToAll=*/RC.Parts);
    if (::testing::Test::HasFailure())
      return;
    for (auto [X, Name] : RingFields)
      EXPECT_EQ(G32.*X, R32.*X) << Name;
    ++Cases;
  }
  EXPECT_GT(Cases, 100);
}

/// C must divide a rank's heads and key/value heads.
TEST(ContextAttention, AllToAllRefusesHeadsItCannotSplit) {
  std::vector<float> X(4096);
  ContextLayout L{4, true, 32};
  AttentionShape S{1, 4, 2, 8, 8, 8}; // 2 key/value heads over 4 ranks
  Error E = runOnThreadRanks(4, [&](Communicator &Cp) -> Error {
    return contextAttentionForward(X.data(), X.data(), X.data(), X.data(),
                                   X.data(), (const float *)nullptr, S,
                                   AttentionCore(), ContextGroups{&Cp, nullptr},
                                   L);
  });
  EXPECT_NE(toString(std::move(E))
                .find("a group of 4 does not divide the 4 heads and 2 "
                      "key/value heads"),
            std::string::npos);
  // All-to-all groups of 4 of a cp group of 8: the same rule.
  const ContextLayout L8{8, true, 64};
  E = runOnThreadRanks(8, [&](Communicator &Cp) -> Error {
    ContextGroupSplit Own;
    auto G = ringGroups(Cp, 4, Own);
    if (!G)
      return G.takeError();
    return contextAttentionForward(X.data(), X.data(), X.data(), X.data(),
                                   X.data(), (const float *)nullptr, S,
                                   AttentionCore(), *G, L8);
  });
  EXPECT_NE(toString(std::move(E))
                .find("a group of 4 does not divide the 4 heads and 2 "
                      "key/value heads"),
            std::string::npos);
}

/// Groups whose sizes do not multiply to the layout's ranks are refused,
/// and so is a split of the cp group that does not divide it.
TEST(ContextAttention, HierarchicalRefusesGroupsNotTheLayouts) {
  std::vector<float> X(4096);
  const AttentionShape S{1, 4, 4, 8, 8, 8};
  Error E = runOnThreadRanks(4, [&](Communicator &Cp) -> Error {
    ContextGroupSplit Own;
    auto G = ringGroups(Cp, 2, Own);
    if (!G)
      return G.takeError();
    return contextAttentionForward(X.data(), X.data(), X.data(), X.data(),
                                   X.data(), (const float *)nullptr, S,
                                   AttentionCore(), *G,
                                   ContextLayout{8, true, 64});
  });
  EXPECT_NE(toString(std::move(E))
                .find("an all-to-all group of 2 ranks and a ring of 2 for a "
                      "layout over 8"),
            std::string::npos);
  E = runOnThreadRanks(4, [&](Communicator &Cp) -> Error {
    return splitContext(Cp, 3).takeError();
  });
  EXPECT_NE(toString(std::move(E)).find("does not divide the cp group of 4"),
            std::string::npos);
}

/// The same rule fails a ring whose layout is not the inputs' (zigzag
/// positions run as contiguous ones): the check can fail.
TEST(ContextAttention, AWrongLayoutFailsTheComparison) {
  const RingCase RC{4, true, true, false, false, false, 0.0};
  const ContextLayout Zig{4, true, RC.shape().Sq},
      Contiguous{4, false, RC.shape().Sq};
  RingResult R32 = ringReference<float>(RC), R64 = ringReference<double>(RC),
             G32 = ringRun<float>(RC, Zig, Contiguous);
  for (auto [X, Name] : {RingFields[0], RingFields[2]}) {
    const double Scale =
        std::max(test::relErr(R32.*X, R64.*X), std::ldexp(1.0, -24));
    const double E = test::relErr(G32.*X, R32.*X);
    EXPECT_GT(E, 1000 * Scale) << Name;
    if (std::getenv("SP_TOLERANCE_REPORT"))
      std::printf("ring attention, wrong layout, %s: relErr / scale %.3g\n",
                  Name, E / Scale);
  }
}

/// The same inputs give the same bits with 1 and 3 kernel threads.
TEST(ContextAttention, ThreadCountChangesNoBit) {
  const RingCase RC{4, true, true, true, true, true, 0.1};
  const ContextLayout L{4, true, RC.shape().Sq};
  const int Before = kernelThreads();
  setKernelThreads(1);
  RingResult A = ringRun<float>(RC, L, L);
  setKernelThreads(3);
  RingResult B = ringRun<float>(RC, L, L);
  RingResult H3 = ringRun<float>(RC, L, L, /*AllToAll=*/2);
  setKernelThreads(1);
  RingResult H1 = ringRun<float>(RC, L, L, /*AllToAll=*/2);
  setKernelThreads(Before);
  for (auto [X, Name] : RingFields) {
    EXPECT_EQ(A.*X, B.*X) << Name;
    EXPECT_EQ(H1.*X, H3.*X) << Name << " (a2a+ring)";
  }
}

TEST(ContextAttention, RefusesPackedAndAWrongGroup) {
  std::vector<float> X(4096);
  const AttentionShape S{1, 2, 2, 8, 8, 4};
  const ContextLayout L{1, false, 8};
  AttentionCore C;
  C.Packed = true;
  auto One = createSingleRankCommunicator();
  Error E =
      ringAttentionForward(X.data(), X.data(), X.data(), X.data(), X.data(),
                           (const float *)nullptr, S, C, One.get(), L);
  ASSERT_TRUE(bool(E));
  EXPECT_NE(toString(std::move(E)).find("packed"), std::string::npos);
  C.Packed = false;
  E = ringAttentionBackward(X.data(), X.data(), X.data(), X.data(), X.data(),
                            X.data(), X.data(), X.data(), X.data(),
                            (const float *)nullptr, S, C, One.get(),
                            ContextLayout{2, false, 16});
  ASSERT_TRUE(bool(E));
  EXPECT_NE(toString(std::move(E)).find("cp group of 1"), std::string::npos);
  // One rank: the ring is the kernel.
  EXPECT_FALSE(bool(ringAttentionForward(X.data(), X.data(), X.data(), X.data(),
                                         X.data(), (const float *)nullptr, S, C,
                                         One.get(), L)));
}

} // namespace
