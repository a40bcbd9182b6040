//===- AttentionTest.cpp - The fused attention core against the unfused ops ===//
//
// cpu::attentionForward and attentionBackward against the sequence the
// unfused plan runs, built from the same CPU kernels: batch_matmul, scale,
// causal_mask, the padding bias, softmax, dropout, batch_matmul and their
// backwards (with repeat_heads for grouped-query attention). Dropout is on in
// most cases: both draw it from the probabilities' global index.
//
// Tolerance: the two differ only in the order of additions (the softmax's
// running sums and rescaling, the blocked products), so each element is
// within n u max|reference| with u the unit roundoff of T (2^-53 for double,
// 2^-24 for float) and n = Sk + D + 16, the additions on one element's path
// (a key sum, a dot product, the rescalings) with margin. In double this
// is about 3e-14; in float 2e-5 relative to the tensor's largest element.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/Attention.h"
#include "TestSupport.h"
#include "runtime/cpu/CpuBackend.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Parallel.h"
#include "gtest/gtest.h"
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace sp;
using namespace sp::cpu;
using namespace llvm;

namespace {

struct AttentionCase {
  AttentionShape S;
  bool Causal;
  bool Padding;
  double Dropout;
  double Fill = -10000;
  bool PadFirst = false; // HF Llama: the padding bias, then the causal fill
};

template <typename T> struct Tensors {
  std::vector<T> Q, K, V, DO, Bias;
  std::vector<T> O, Lse, DQ, DK, DV;
};

AttentionCore coreOf(const AttentionCase &C, const GlobalIndex &G) {
  AttentionCore A;
  A.Scale = 1 / std::sqrt(double(C.S.D));
  A.Causal = C.Causal;
  A.Fill = C.Fill;
  A.PadFirst = C.PadFirst;
  A.Dropout = C.Dropout;
  A.Key = DropoutKey{1234, 3, 2, 7};
  A.Probs = G;
  return A;
}

template <typename T> Tensors<T> inputs(const AttentionCase &C) {
  const AttentionShape &S = C.S;
  Tensors<T> X;
  X.Q = test::normalVector<T>(S.Batch * S.Heads * S.Sq * S.D, 1);
  X.K = test::normalVector<T>(S.Batch * S.KvHeads * S.Sk * S.D, 2);
  X.V = test::normalVector<T>(S.Batch * S.KvHeads * S.Sk * S.D, 3);
  X.DO = test::normalVector<T>(S.Batch * S.Heads * S.Sq * S.D, 4);
  if (C.Padding) { // the last keys of each batch row padded, as torch masks
    X.Bias.assign(S.Batch * S.Sk, T(0));
    for (int64_t B = 0; B < S.Batch; ++B)
      for (int64_t J = S.Sk - 3 - 5 * B; J < S.Sk; ++J)
        X.Bias[B * S.Sk + J] = T(C.Fill);
  }
  return X;
}

/// The unfused sequence.
template <typename T>
void unfused(Tensors<T> &X, const AttentionCase &C, const AttentionCore &A) {
  const AttentionShape &S = C.S;
  const int64_t R = S.Heads / S.KvHeads, BA = S.Batch * S.Heads;
  std::vector<T> Kr(BA * S.Sk * S.D), Vr(Kr.size());
  repeatHeads(Kr.data(), X.K.data(), S.Batch, S.KvHeads, R, S.Sk, S.D);
  repeatHeads(Vr.data(), X.V.data(), S.Batch, S.KvHeads, R, S.Sk, S.D);
  const int64_t N = BA * S.Sq * S.Sk;
  std::vector<T> Sc(N), P(N), Pd(N);
  std::vector<uint8_t> Mask(N, 1);
  batchMatMul(Sc.data(), X.Q.data(), Kr.data(), BA, S.Sq, S.Sk, S.D, false,
              true);
  scale(Sc.data(), Sc.data(), N, A.Scale);
  if (C.Padding && C.PadFirst)
    addKeyBias(Sc.data(), Sc.data(), X.Bias.data(), S.Batch,
               S.Heads * S.Sq, S.Sk);
  if (C.Causal)
    causalMask(Sc.data(), Sc.data(), BA, S.Sq, S.Sk, A.Fill);
  if (C.Padding && !C.PadFirst)
    addKeyBias(Sc.data(), Sc.data(), X.Bias.data(), S.Batch,
               S.Heads * S.Sq, S.Sk);
  softmax(P.data(), Sc.data(), BA * S.Sq, S.Sk);
  if (C.Dropout > 0)
    ASSERT_TRUE(dropout(Pd.data(), Mask.data(), P.data(), C.Dropout, A.Key,
                        A.Probs)
                    .ok());
  else
    Pd = P;
  X.O.resize(BA * S.Sq * S.D);
  batchMatMul(X.O.data(), Pd.data(), Vr.data(), BA, S.Sq, S.D, S.Sk, false,
              false);
  // Backward.
  std::vector<T> DPd(N), DP(N), DS(N), DKr(Kr.size()), DVr(Vr.size());
  batchMatMul(DPd.data(), X.DO.data(), Vr.data(), BA, S.Sq, S.Sk, S.D, false,
              true);
  batchMatMul(DVr.data(), Pd.data(), X.DO.data(), BA, S.Sk, S.D, S.Sq, true,
              false);
  if (C.Dropout > 0)
    dropoutBackward(DP.data(), DPd.data(), Mask.data(), N, C.Dropout);
  else
    DP = DPd;
  softmaxBackward(DS.data(), P.data(), DP.data(), BA * S.Sq, S.Sk);
  if (C.Causal)
    causalMask(DS.data(), DS.data(), BA, S.Sq, S.Sk, 0.0);
  scale(DS.data(), DS.data(), N, A.Scale);
  X.DQ.resize(X.Q.size());
  batchMatMul(X.DQ.data(), DS.data(), Kr.data(), BA, S.Sq, S.D, S.Sk, false,
              false);
  batchMatMul(DKr.data(), DS.data(), X.Q.data(), BA, S.Sk, S.D, S.Sq, true,
              false);
  X.DK.resize(X.K.size());
  X.DV.resize(X.V.size());
  repeatHeadsBackward(X.DK.data(), DKr.data(), S.Batch, S.KvHeads, R, S.Sk,
                      S.D);
  repeatHeadsBackward(X.DV.data(), DVr.data(), S.Batch, S.KvHeads, R, S.Sk,
                      S.D);
}

template <typename T>
void fused(Tensors<T> &X, const AttentionCase &C, const AttentionCore &A) {
  const AttentionShape &S = C.S;
  X.O.assign(X.Q.size(), T(-7));
  X.Lse.assign(S.Batch * S.Heads * S.Sq, T(-7));
  X.DQ.assign(X.Q.size(), T(-7));
  X.DK.assign(X.K.size(), T(-7));
  X.DV.assign(X.V.size(), T(-7));
  const T *Bias = C.Padding ? X.Bias.data() : nullptr;
  Status F = attentionForward(X.O.data(), X.Lse.data(), X.Q.data(),
                              X.K.data(), X.V.data(), Bias, S, A);
  ASSERT_TRUE(F.ok()) << F.Message;
  Status B = attentionBackward(X.DQ.data(), X.DK.data(), X.DV.data(),
                               X.DO.data(), X.Q.data(), X.K.data(),
                               X.V.data(), X.O.data(), X.Lse.data(), Bias, S,
                               A);
  ASSERT_TRUE(B.ok()) << B.Message;
}

template <typename T>
void expectClose(const std::vector<T> &Got, const std::vector<T> &Want,
                 double Bound, const char *What) {
  ASSERT_EQ(Got.size(), Want.size()) << What;
  double Max = 0;
  for (T W : Want)
    Max = std::max(Max, std::fabs(double(W)));
  for (size_t I = 0; I < Got.size(); ++I)
    ASSERT_LE(std::fabs(double(Got[I]) - double(Want[I])), Bound * Max)
        << What << "[" << I << "]: fused " << Got[I] << ", unfused "
        << Want[I];
}

std::vector<AttentionCase> attentionCases() {
  return {
      // causal, several blocks (the ones above the diagonal skipped)
      {{2, 4, 4, 150, 150, 16}, true, false, 0.0},
      // causal + padding + dropout + grouped-query heads
      {{2, 4, 2, 70, 70, 16}, true, true, 0.1},
      // bidirectional (an encoder) with padding and dropout, odd sizes
      {{1, 3, 3, 50, 130, 8}, false, true, 0.2},
      // the fill of HF models (finfo.min-like) and -inf
      {{1, 2, 1, 100, 100, 32}, true, false, 0.1, -1e30},
      {{1, 2, 2, 65, 65, 8}, true, false, 0.0,
       -std::numeric_limits<double>::infinity()},
      // a fill whose probabilities are not 0: no block is skipped, and the
      // causal mask still stops their gradient
      {{1, 2, 2, 70, 70, 8}, true, false, 0.1, -12},
      // HF Llama's order: padding bias, then the causal fill (finfo.min)
      {{2, 4, 2, 70, 70, 8}, true, true, 0.1, -3.4028234663852886e+38, true},
  };
}

template <typename T> void checkAgainstUnfused(double U) {
  for (const AttentionCase &C : attentionCases()) {
    SCOPED_TRACE("B " + std::to_string(C.S.Batch) + " A " +
                 std::to_string(C.S.Heads) + " G " +
                 std::to_string(C.S.KvHeads) + " Sq " +
                 std::to_string(C.S.Sq) + " Sk " + std::to_string(C.S.Sk) +
                 " D " + std::to_string(C.S.D) + " causal " +
                 std::to_string(C.Causal) + " padding " +
                 std::to_string(C.Padding) + " dropout " +
                 std::to_string(C.Dropout) + " fill " +
                 std::to_string(C.Fill));
    const int64_t Probs[] = {C.S.Batch, C.S.Heads, C.S.Sq, C.S.Sk};
    AttentionCore A = coreOf(C, GlobalIndex::whole(Shape(Probs, 4)));
    Tensors<T> Ref = inputs<T>(C), Got = inputs<T>(C);
    unfused(Ref, C, A);
    fused(Got, C, A);
    if (::testing::Test::HasFatalFailure())
      return;
    const double Bound = double(C.S.Sk + C.S.D + 16) * U;
    expectClose(Got.O, Ref.O, Bound, "O");
    expectClose(Got.DQ, Ref.DQ, Bound, "DQ");
    expectClose(Got.DK, Ref.DK, Bound, "DK");
    expectClose(Got.DV, Ref.DV, Bound, "DV");
  }
}

TEST(FusedAttention, MatchesTheUnfusedOpsInDouble) {
  checkAgainstUnfused<double>(std::ldexp(1.0, -53));
}

TEST(FusedAttention, MatchesTheUnfusedOpsInFloat) {
  checkAgainstUnfused<float>(std::ldexp(1.0, -24));
}

/// A tensor-parallel rank's heads [2, 4) of 4, with its block of the
/// probabilities' global index, computes exactly those heads of the whole
/// run, dropout included; and the thread count changes nothing.
TEST(FusedAttention, HeadBlockAndThreadsAreBitwiseTheWhole) {
  const AttentionCase Whole{{2, 4, 2, 90, 90, 16}, true, true, 0.15};
  const int64_t All[] = {2, 4, 90, 90};
  Tensors<float> W = inputs<float>(Whole);
  int Before = kernelThreads();
  setKernelThreads(1);
  fused(W, Whole, coreOf(Whole, GlobalIndex::whole(Shape(All, 4))));
  setKernelThreads(3);
  Tensors<float> W3 = inputs<float>(Whole);
  fused(W3, Whole, coreOf(Whole, GlobalIndex::whole(Shape(All, 4))));
  setKernelThreads(Before);
  for (auto [A, B] : {std::pair(&W.O, &W3.O), std::pair(&W.DQ, &W3.DQ),
                      std::pair(&W.DK, &W3.DK), std::pair(&W.DV, &W3.DV)})
    EXPECT_EQ(0, std::memcmp(A->data(), B->data(), A->size() * 4));

  // Rank 1 of t = 2: query heads 2, 3 and key/value head 1.
  AttentionCase Half = Whole;
  Half.S.Heads = 2;
  Half.S.KvHeads = 1;
  const int64_t Local[] = {2, 2, 90, 90}, Off[] = {0, 2, 0, 0};
  Tensors<float> H = inputs<float>(Half);
  const int64_t Q = 90 * 16;
  for (int64_t B = 0; B < 2; ++B) {
    std::copy_n(W.Q.begin() + (B * 4 + 2) * Q, 2 * Q, H.Q.begin() + B * 2 * Q);
    std::copy_n(W.DO.begin() + (B * 4 + 2) * Q, 2 * Q,
                H.DO.begin() + B * 2 * Q);
    std::copy_n(W.K.begin() + (B * 2 + 1) * Q, Q, H.K.begin() + B * Q);
    std::copy_n(W.V.begin() + (B * 2 + 1) * Q, Q, H.V.begin() + B * Q);
  }
  fused(H, Half,
        coreOf(Half, GlobalIndex::block(Shape(All, 4), Shape(Local, 4),
                                        Shape(Off, 4))));
  for (int64_t B = 0; B < 2; ++B) {
    EXPECT_EQ(0, std::memcmp(H.O.data() + B * 2 * Q,
                             W.O.data() + (B * 4 + 2) * Q, 2 * Q * 4));
    EXPECT_EQ(0, std::memcmp(H.DQ.data() + B * 2 * Q,
                             W.DQ.data() + (B * 4 + 2) * Q, 2 * Q * 4));
    EXPECT_EQ(0, std::memcmp(H.DK.data() + B * Q, W.DK.data() + (B * 2 + 1) * Q,
                             Q * 4));
    EXPECT_EQ(0, std::memcmp(H.DV.data() + B * Q, W.DV.data() + (B * 2 + 1) * Q,
                             Q * 4));
  }
}

/// With Merged, O, DO and Lse are [B, Sq, A, D] and [B, Sq, A] (the layout
/// the projection reads): the same values, and the same gradients.
TEST(FusedAttention, MergedOutputIsThePermutedOutput) {
  const AttentionCase C{{2, 4, 2, 70, 70, 8}, true, true, 0.1};
  const int64_t P4[] = {2, 4, 70, 70};
  const AttentionShape &S = C.S;
  AttentionCore A = coreOf(C, GlobalIndex::whole(Shape(P4, 4)));
  Tensors<float> H = inputs<float>(C);
  fused(H, C, A);
  // The merged run: DO permuted in, O and Lse permuted out.
  Tensors<float> M = inputs<float>(C);
  auto At = [&](int64_t B, int64_t Hd, int64_t I, bool Merged) {
    return Merged ? (B * S.Sq + I) * S.Heads + Hd : (B * S.Heads + Hd) * S.Sq + I;
  };
  for (int64_t B = 0; B < S.Batch; ++B)
    for (int64_t Hd = 0; Hd < S.Heads; ++Hd)
      for (int64_t I = 0; I < S.Sq; ++I)
        std::copy_n(H.DO.begin() + At(B, Hd, I, false) * S.D, S.D,
                    M.DO.begin() + At(B, Hd, I, true) * S.D);
  A.Merged = true;
  fused(M, C, A);
  for (int64_t B = 0; B < S.Batch; ++B)
    for (int64_t Hd = 0; Hd < S.Heads; ++Hd)
      for (int64_t I = 0; I < S.Sq; ++I) {
        ASSERT_EQ(0, std::memcmp(M.O.data() + At(B, Hd, I, true) * S.D,
                                 H.O.data() + At(B, Hd, I, false) * S.D,
                                 S.D * 4));
        ASSERT_EQ(M.Lse[At(B, Hd, I, true)], H.Lse[At(B, Hd, I, false)]);
      }
  const double Bound = double(S.Sk + S.D + 16) * std::ldexp(1.0, -24);
  expectClose(M.DQ, H.DQ, Bound, "DQ");
  expectClose(M.DK, H.DK, Bound, "DK");
  expectClose(M.DV, H.DV, Bound, "DV");
}

/// Packed q, k, v (the column blocks of one [b, s, 3, a, d] tensor, as
/// attention {packed} reads the QKV projection's output) give the bits of
/// the same heads in their own tensors: o, lse, and dq, dk, dv written into
/// one [b, s, 3, a, d] tensor as split_heads_grad would lay them out.
TEST(FusedAttention, PackedInputsAreTheSplitHeads) {
  for (const AttentionCase &C :
       {AttentionCase{{2, 3, 3, 70, 70, 8}, true, true, 0.1},
        AttentionCase{{1, 2, 2, 33, 33, 16}, false, false, 0.0}}) {
    const AttentionShape &S = C.S;
    const int64_t P4[] = {S.Batch, S.Heads, S.Sq, S.Sk};
    AttentionCore A = coreOf(C, GlobalIndex::whole(Shape(P4, 4)));
    A.Merged = true;
    Tensors<float> H = inputs<float>(C);
    H.DO = test::normalVector<float>(H.DO.size(), 9); // merged [b, s, a, d]
    fused(H, C, A);
    const int64_t N = S.Batch * S.Sq * 3 * S.Heads * S.D, Hd = S.Heads * S.D;
    std::vector<float> QKV(N);
    splitHeadsBackward(QKV.data(), H.Q.data(), H.K.data(), H.V.data(),
                       S.Batch, S.Sq, S.Heads, S.D);
    A.Packed = true;
    std::vector<float> O(H.O.size(), -7), Lse(H.Lse.size(), -7),
        DQKV(N, -7);
    const float *Bias = C.Padding ? H.Bias.data() : nullptr;
    ASSERT_TRUE(attentionForward(O.data(), Lse.data(), QKV.data(),
                                 QKV.data() + Hd, QKV.data() + 2 * Hd, Bias,
                                 S, A)
                    .ok());
    ASSERT_TRUE(attentionBackward(DQKV.data(), DQKV.data() + Hd,
                                  DQKV.data() + 2 * Hd, H.DO.data(),
                                  QKV.data(), QKV.data() + Hd,
                                  QKV.data() + 2 * Hd, O.data(), Lse.data(),
                                  Bias, S, A)
                    .ok());
    EXPECT_EQ(0, std::memcmp(O.data(), H.O.data(), O.size() * 4));
    EXPECT_EQ(0, std::memcmp(Lse.data(), H.Lse.data(), Lse.size() * 4));
    std::vector<float> Want(N);
    splitHeadsBackward(Want.data(), H.DQ.data(), H.DK.data(), H.DV.data(),
                       S.Batch, S.Sq, S.Heads, S.D);
    EXPECT_EQ(0, std::memcmp(DQKV.data(), Want.data(), N * 4));
  }
  // Packed needs one key/value head per query head and Sk = Sq.
  std::vector<float> X(4096);
  AttentionCore A;
  A.Packed = true;
  EXPECT_FALSE(attentionForward(X.data(), X.data(), X.data(), X.data(),
                                X.data(), (const float *)nullptr,
                                AttentionShape{1, 4, 2, 8, 8, 4}, A)
                   .ok());
}

TEST(FusedAttention, RejectsBadShapesAndKeys) {
  std::vector<float> X(64);
  AttentionShape S{1, 3, 2, 2, 2, 4}; // 3 heads over 2 key/value heads
  AttentionCore C;
  Status St = attentionForward(X.data(), X.data(), X.data(), X.data(),
                               X.data(), (const float *)nullptr, S, C);
  EXPECT_FALSE(St.ok());
  S.Heads = 2;
  C.Dropout = 0.1; // no global index for the probabilities
  St = attentionForward(X.data(), X.data(), X.data(), X.data(), X.data(),
                        (const float *)nullptr, S, C);
  EXPECT_FALSE(St.ok());
  C.Dropout = 1.5;
  St = attentionForward(X.data(), X.data(), X.data(), X.data(), X.data(),
                        (const float *)nullptr, S, C);
  EXPECT_FALSE(St.ok());
}

/// The attention and attention_grad instructions on the CPU backend: their
/// attributes reach the kernel (scale, causal fill, the padding bias from an
/// i64 keep mask, the dropout key with the run's seed and step), and the
/// probabilities' global index holds the microbatch's rows of the batch.
TEST(FusedAttention, InstructionsRunTheKernel) {
  const int64_t B = 2, A = 2, S = 40, D = 8;
  const TensorType QT(DType::F32, {B, A, S, D}), MT(DType::I64, {B, S}),
      LT(DType::F32, {B, A, S});
  Program P;
  auto Add = [&](const TensorType &T) {
    ProgramBuffer PB;
    PB.Name = "b" + std::to_string(P.Buffers.size());
    PB.Type = T;
    PB.Bytes = T.numBytes();
    PB.Offset = P.ArenaBytes;
    P.ArenaBytes += (PB.Bytes + 63) / 64 * 64;
    P.Buffers.push_back(PB);
    return int(P.Buffers.size() - 1);
  };
  // q k v keep o lse do dq dk dv
  int Qb = Add(QT), Kb = Add(QT), Vb = Add(QT), Mb = Add(MT), Ob = Add(QT),
      Lb = Add(LT), DOb = Add(QT), DQb = Add(QT), DKb = Add(QT), DVb = Add(QT);
  AttrList Attrs;
  Attrs.set("scale", 0.35);
  Attrs.set("causal", int64_t(1));
  Attrs.set("fill", -10000.0);
  Attrs.set("pad_fill", -10000.0);
  Attrs.set("dropout", int64_t(1));
  Attrs.set("ratio", 0.2);
  Attrs.set("key", std::vector<int64_t>{3, 1});
  Attrs.set("microbatch", int64_t(1));
  Attrs.set("microbatches", int64_t(2));
  Instruction F, G;
  F.Op = OpKind::Attention;
  F.In = {Qb, Kb, Vb, Mb};
  F.Out = {Ob, Lb};
  F.Attrs = Attrs;
  G.Op = OpKind::AttentionGrad;
  G.In = {DOb, Qb, Kb, Vb, Ob, Lb, Mb};
  G.Out = {DQb, DKb, DVb};
  G.Attrs = Attrs;
  CpuBackend Backend;
  char *Arena = cantFail(Backend.allocate(P.ArenaBytes));
  auto Buf = [&](int Id) {
    return reinterpret_cast<float *>(Arena + P.Buffers[Id].Offset);
  };
  auto Fill = [&](int Id, uint32_t Seed) {
    auto V = test::normalVector<float>(QT.numElements(), Seed);
    std::copy(V.begin(), V.end(), Buf(Id));
  };
  Fill(Qb, 1), Fill(Kb, 2), Fill(Vb, 3), Fill(DOb, 4);
  auto *Keep = reinterpret_cast<int64_t *>(Arena + P.Buffers[Mb].Offset);
  for (int64_t E = 0; E < B * S; ++E)
    Keep[E] = E % S < S - 4 * (E / S + 1);
  auto One = createSingleRankCommunicator();
  const int64_t Step = 5;
  const uint64_t Seed = 99;
  for (const Instruction *I : {&F, &G})
    ASSERT_FALSE(bool(Backend.run(KernelCall{*I, P, Arena, Step, true,
                                             std::nullopt, Seed, *One,
                                             nullptr, nullptr})));
  // The kernel called directly.
  std::vector<float> Bias(B * S);
  for (int64_t E = 0; E < B * S; ++E)
    Bias[E] = (1.0f - float(Keep[E])) * -10000.0f;
  AttentionCore C;
  C.Scale = 0.35;
  C.Causal = true;
  C.Fill = -10000;
  C.Dropout = 0.2;
  C.Key = DropoutKey{Seed, 3, 1, uint32_t(Step)};
  const int64_t Full[] = {2 * B, A, S, S}, Local[] = {B, A, S, S},
                Off[] = {B, 0, 0, 0}; // microbatch 1 of 2
  C.Probs = GlobalIndex::block(Shape(Full, 4), Shape(Local, 4), Shape(Off, 4));
  AttentionShape Sh{B, A, A, S, S, D};
  std::vector<float> O(QT.numElements()), L(LT.numElements()),
      DQ(O.size()), DK(O.size()), DV(O.size());
  ASSERT_TRUE(attentionForward(O.data(), L.data(), Buf(Qb), Buf(Kb), Buf(Vb),
                               Bias.data(), Sh, C)
                  .ok());
  ASSERT_TRUE(attentionBackward(DQ.data(), DK.data(), DV.data(), Buf(DOb),
                                Buf(Qb), Buf(Kb), Buf(Vb), O.data(), L.data(),
                                Bias.data(), Sh, C)
                  .ok());
  for (auto [Id, Want] : {std::pair(Ob, &O), std::pair(Lb, &L),
                          std::pair(DQb, &DQ), std::pair(DKb, &DK),
                          std::pair(DVb, &DV)})
    EXPECT_EQ(0, std::memcmp(Buf(Id), Want->data(), Want->size() * 4))
        << P.Buffers[Id].Name;
  // The whole batch's other microbatch draws other dropout.
  C.Probs = GlobalIndex::block(Shape(Full, 4), Shape(Local, 4),
                               Shape(Local, 0));
  ASSERT_TRUE(attentionForward(O.data(), L.data(), Buf(Qb), Buf(Kb), Buf(Vb),
                               Bias.data(), Sh, C)
                  .ok());
  EXPECT_NE(0, std::memcmp(Buf(Ob), O.data(), O.size() * 4));
  Backend.release(Arena);
}

} // namespace
