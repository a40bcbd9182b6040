//===- ContextLayoutTest.cpp - A cp rank's positions and its dropout ------===//
//
// ir/ContextLayout.h: every position of the sequence belongs to exactly one
// rank, runs() agrees with position() (for a tensor-parallel rank's slice of
// a rank's positions too), and the zigzag ranks hold equal causal work. The
// dropout of a rank's block (runtime/TensorLayout.h withContext, the
// kernels' GlobalIndex Seam and Jump) is the whole tensor's mask at the
// global positions, for every rank and slice, with the seam on an inner or
// the last axis; a seam that leaves the tensor is refused.
//
//===----------------------------------------------------------------------===//
#include "ir/ContextLayout.h"
#include "runtime/TensorLayout.h"
#include "runtime/cpu/Kernels.h"
#include "gtest/gtest.h"
#include <algorithm>
#include <utility>
#include <vector>

using namespace sp;

namespace {

TEST(ContextLayout, EveryPositionOnceAndRunsAgreeWithPosition) {
  for (bool Zigzag : {false, true})
    for (int C : {1, 2, 3, 4}) {
      const ContextLayout L{C, Zigzag, 24 * int64_t(C)};
      ASSERT_TRUE(L.divides());
      std::vector<int> Owner(L.Seq, -1);
      for (int R = 0; R < C; ++R)
        for (int64_t P = 0; P < L.local(); ++P) {
          int64_t G = L.position(R, P);
          ASSERT_GE(G, 0);
          ASSERT_LT(G, L.Seq);
          EXPECT_EQ(Owner[G], -1) << "position " << G << " twice";
          Owner[G] = R;
        }
      for (int64_t G = 0; G < L.Seq; ++G)
        EXPECT_GE(Owner[G], 0) << "position " << G << " nowhere";
      // Every slice [Begin, Begin + Len): its runs cover it in local order,
      // each run contiguous globally.
      for (int R = 0; R < C; ++R)
        for (int64_t Begin = 0; Begin < L.local(); Begin += 5)
          for (int64_t Len : {int64_t(1), int64_t(7), L.local() - Begin}) {
            Len = std::min(Len, L.local() - Begin);
            int64_t Next = Begin;
            for (const ContextLayout::Run &Run : L.runs(R, Begin, Len)) {
              EXPECT_EQ(Run.Local, Next);
              for (int64_t K = 0; K < Run.Length; ++K)
                EXPECT_EQ(Run.Global + K, L.position(R, Run.Local + K));
              Next += Run.Length;
            }
            EXPECT_EQ(Next, Begin + Len);
          }
    }
  // Zigzag: under a causal mask every rank sees as many (query, key) pairs.
  const ContextLayout Z{4, true, 64};
  std::vector<int64_t> Pairs;
  for (int R = 0; R < 4; ++R) {
    int64_t N = 0;
    for (int64_t P = 0; P < Z.local(); ++P)
      N += Z.position(R, P) + 1;
    Pairs.push_back(N);
  }
  EXPECT_EQ(Pairs, std::vector<int64_t>(4, Pairs[0]));
  EXPECT_FALSE((ContextLayout{4, true, 12}).divides());
}

std::vector<uint8_t> cpMask(const GlobalBlock &B, llvm::ArrayRef<int64_t> Local,
                            const cpu::DropoutKey &K) {
  cpu::GlobalIndex G =
      cpu::GlobalIndex::block(cpu::Shape(B.Full.data(), B.Full.size()),
                              cpu::Shape(Local.data(), Local.size()),
                              cpu::Shape(B.Offset.data(), B.Offset.size()));
  for (size_t D = 0; D < B.Seam.size(); ++D) {
    G.Seam[D] = B.Seam[D];
    G.Jump[D] = B.Jump[D];
  }
  std::vector<uint8_t> M(G.numLocal());
  cpu::Status S = cpu::dropoutMask(M.data(), 0.5, K, G);
  EXPECT_TRUE(S.ok()) << S.Message;
  return M;
}

/// [B, S, H] activations (the sequence an inner axis) and [B, H, S] (the
/// sequence the last axis: one-element runs), for C = 2 and 3 zigzag ranks,
/// each rank's positions whole or cut over 2 tensor ranks (across the seam).
TEST(ContextLayout, DropoutOfARanksPositionsIsTheWholeMask) {
  const cpu::DropoutKey K{99, 3, 1, 7};
  const int64_t B = 2, H = 5;
  for (int C : {2, 3})
    for (int SeqDim : {1, 2})
      for (int T : {1, 2}) {
        SCOPED_TRACE("C " + std::to_string(C) + " axis " +
                     std::to_string(SeqDim) + " t " + std::to_string(T));
        const ContextLayout L{C, true, 12 * int64_t(C)};
        std::vector<int64_t> Whole = {B, SeqDim == 1 ? L.Seq : H,
                                      SeqDim == 1 ? H : L.Seq};
        std::vector<uint8_t> Full(B * L.Seq * H);
        cpu::GlobalIndex WholeIdx =
            cpu::GlobalIndex::whole(cpu::Shape(Whole.data(), Whole.size()));
        ASSERT_TRUE(cpu::dropoutMask(Full.data(), 0.5, K, WholeIdx).ok());
        for (int R = 0; R < C; ++R)
          for (int Tr = 0; Tr < T; ++Tr) {
            // The tensor rank's slice of the rank's positions.
            std::vector<int64_t> Local = Whole;
            Local[SeqDim] = L.local() / T;
            GlobalBlock G = globalBlock(
                Local, T > 1 ? Sharding::split(SeqDim, T) : Sharding(), Tr, 0,
                1, 0, 1);
            ASSERT_EQ(withContext(G, Local, SeqDim, R, C, true), "");
            std::vector<uint8_t> M = cpMask(G, Local, K);
            int64_t E = 0;
            for (int64_t I0 = 0; I0 < Local[0]; ++I0)
              for (int64_t I1 = 0; I1 < Local[1]; ++I1)
                for (int64_t I2 = 0; I2 < Local[2]; ++I2) {
                  int64_t I[3] = {I0, I1, I2};
                  I[SeqDim] = L.position(R, Tr * Local[SeqDim] + I[SeqDim]);
                  ASSERT_EQ(M[E++],
                            Full[(I[0] * Whole[1] + I[1]) * Whole[2] + I[2]]);
                }
          }
      }
}

TEST(ContextLayout, ASeamOutsideTheTensorIsRefused) {
  std::vector<int64_t> Whole = {1, 8, 2}, Local = {1, 4, 2}, Off = {0, 0, 0};
  cpu::GlobalIndex G = cpu::GlobalIndex::block(cpu::Shape(Whole.data(), 3),
                                               cpu::Shape(Local.data(), 3),
                                               cpu::Shape(Off.data(), 3));
  G.Seam[1] = 2;
  G.Jump[1] = 4; // positions 0, 1 then 6, 7: fits
  EXPECT_TRUE(G.check().ok());
  G.Jump[1] = 5; // 7, 8: past the end
  EXPECT_FALSE(G.check().ok());
  G.Jump[1] = 1;
  G.Seam[1] = 5; // beyond the block
  EXPECT_FALSE(G.check().ok());
}

/// Hierarchical cp: the union of K consecutive ranks' positions is the
/// grouped layout's rank, in global order, and every rank's run lies in one
/// run of its group's (localOf maps it there).
TEST(ContextLayout, GroupsOfConsecutiveRanksAreALayoutOfFewerRanks) {
  for (bool Zigzag : {false, true})
    for (auto [C, K] : std::vector<std::pair<int, int>>{
             {4, 2}, {8, 2}, {8, 4}, {4, 4}, {4, 1}}) {
      const ContextLayout L{C, Zigzag, 16 * int64_t(C)}, G = L.grouped(K);
      ASSERT_EQ(G.Parts, C / K);
      ASSERT_EQ(G.local(), K * L.local());
      for (int R = 0; R < C; ++R) {
        const int Group = R / K;
        for (int64_t P = 0; P < L.local(); ++P)
          EXPECT_EQ(L.localOf(R, L.position(R, P)), P);
        for (const ContextLayout::Run &Run : L.runs(R)) {
          const int64_t At = G.localOf(Group, Run.Global);
          for (int64_t X = 0; X < Run.Length; ++X)
            EXPECT_EQ(G.position(Group, At + X), Run.Global + X)
                << "C " << C << " K " << K << " rank " << R;
        }
      }
      // The groups' positions in global order: local order is global order.
      for (int Group = 0; Group < C / K; ++Group) {
        std::vector<int64_t> Mine;
        for (int R = Group * K; R < (Group + 1) * K; ++R)
          for (int64_t P = 0; P < L.local(); ++P)
            Mine.push_back(L.position(R, P));
        std::sort(Mine.begin(), Mine.end());
        for (int64_t P = 0; P < G.local(); ++P)
          EXPECT_EQ(G.position(Group, P), Mine[P]);
      }
    }
}

} // namespace
