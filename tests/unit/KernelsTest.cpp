//===- KernelsTest.cpp - The CPU kernels, forward and backward ------------===//
//
// Every backward kernel is checked against central finite differences in
// double precision on a random projection loss L = sum(W * Y), so that every
// output element matters. Then: the Philox known-answer vectors, the layout
// invariance of the dropout masks, AdamW against a hand computation, the
// float instantiation against the double one, and the results of the split
// kernels against the thread count.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Parallel.h"
#include "runtime/cpu/Philox.h"
#include "gtest/gtest.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

using namespace sp::cpu;

namespace {

using Vec = std::vector<double>;

Vec randVec(size_t N, uint64_t Seed, double Lo = -1.0, double Hi = 1.0) {
  std::mt19937_64 Gen(Seed);
  std::uniform_real_distribution<double> U(Lo, Hi);
  Vec V(N);
  for (double &X : V)
    X = U(Gen);
  return V;
}

double dotv(const Vec &A, const Vec &B) {
  double S = 0;
  for (size_t I = 0; I < A.size(); ++I)
    S += A[I] * B[I];
  return S;
}

std::vector<float> toFloat(const Vec &V) {
  return std::vector<float>(V.begin(), V.end());
}

/// Checks Grad = dL/dX by central differences: the relative error in norm
/// and the worst element (relative to the largest gradient entry).
void expectGradient(const char *What, Vec &X, const Vec &Grad,
                    const std::function<double()> &Loss, double Eps = 1e-6,
                    double Tol = 1e-6) {
  ASSERT_EQ(X.size(), Grad.size()) << What;
  double Diff2 = 0, Ref2 = 0, MaxDiff = 0, MaxRef = 0;
  for (size_t I = 0; I < X.size(); ++I) {
    double Saved = X[I];
    X[I] = Saved + Eps;
    double Lp = Loss();
    X[I] = Saved - Eps;
    double Lm = Loss();
    X[I] = Saved;
    double Num = (Lp - Lm) / (2 * Eps);
    Diff2 += (Num - Grad[I]) * (Num - Grad[I]);
    Ref2 += Num * Num;
    MaxDiff = std::max(MaxDiff, std::fabs(Num - Grad[I]));
    MaxRef = std::max(MaxRef, std::fabs(Num));
  }
  ASSERT_GT(Ref2, 0.0) << What << ": the loss does not depend on the input";
  EXPECT_LT(std::sqrt(Diff2 / Ref2), Tol) << What;
  EXPECT_LT(MaxDiff, Tol * std::max(1.0, MaxRef)) << What;
}

/// Relative closeness of a float result to the double one.
void expectClose(const std::vector<float> &F, const Vec &D, double Tol,
                 const char *What) {
  ASSERT_EQ(F.size(), D.size());
  for (size_t I = 0; I < D.size(); ++I)
    EXPECT_NEAR(F[I], D[I], Tol * std::max(1.0, std::fabs(D[I])))
        << What << " at " << I;
}

void expectOk(const Status &S) { EXPECT_TRUE(S.ok()) << S.Message; }

// (Below, with the other thread-count checks.)
void expectSameOnThreads(const char *What,
                         const std::function<std::vector<char>()> &Fn);
template <typename... V> std::vector<char> bytesOf(const V &...Vs);

//===----------------------------------------------------------------------===//
// Philox
//===----------------------------------------------------------------------===//

using sp::philox::Words4;

void expectWords(Words4 Got, uint32_t A, uint32_t B, uint32_t C, uint32_t D) {
  EXPECT_EQ(Got.V[0], A);
  EXPECT_EQ(Got.V[1], B);
  EXPECT_EQ(Got.V[2], C);
  EXPECT_EQ(Got.V[3], D);
}

TEST(CpuPhiloxTest, KnownAnswers) {
  // Random123's kat_vectors for philox4x32_10.
  expectWords(sp::philox::philox4x32_10(Words4{{0, 0, 0, 0}}, 0, 0), 0x6627e8d5,
              0xe169c58d, 0xbc57ac4c, 0x9b00dbd8);
  expectWords(sp::philox::philox4x32_10(
                  Words4{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
                  0xffffffff, 0xffffffff),
              0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd);
  expectWords(sp::philox::philox4x32_10(
                  Words4{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
                  0xa4093822, 0x299f31d0),
              0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1);
}

// The generator is usable at compile time (and so, under nvcc, on device).
static_assert(sp::philox::philox4x32_10(Words4{{0, 0, 0, 0}}, 0, 0).V[0] ==
              0x6627e8d5u);

TEST(CpuPhiloxTest, Threshold) {
  using sp::philox::dropoutThreshold;
  EXPECT_EQ(dropoutThreshold(0.0), 0u);
  EXPECT_EQ(dropoutThreshold(-1.0), 0u);
  EXPECT_EQ(dropoutThreshold(1.0), uint64_t(1) << 32);
  EXPECT_EQ(dropoutThreshold(0.5), uint64_t(1) << 31);
  EXPECT_EQ(dropoutThreshold(0.25), uint64_t(1) << 30);
  // ceil: the smallest word whose uniform is >= ratio.
  uint64_t T = dropoutThreshold(0.1);
  EXPECT_GE(sp::philox::uniform(uint32_t(T)), 0.1);
  EXPECT_LT(sp::philox::uniform(uint32_t(T - 1)), 0.1);
}

//===----------------------------------------------------------------------===//
// GEMM
//===----------------------------------------------------------------------===//

TEST(CpuGemmTest, BetaZeroOverwritesAndEmptyK) {
  std::vector<double> A = {1, 2, 3, 4}, B = {5, 6, 7, 8};
  std::vector<double> C(4, std::numeric_limits<double>::quiet_NaN());
  gemm<double>(false, false, 2, 2, 2, 1.0, A.data(), 2, B.data(), 2, 0.0,
               C.data(), 2);
  EXPECT_EQ(C, (std::vector<double>{19, 22, 43, 50}));
  gemm<double>(false, false, 2, 2, 0, 1.0, A.data(), 0, B.data(), 2, 2.0,
               C.data(), 2);
  EXPECT_EQ(C, (std::vector<double>{38, 44, 86, 100}));
}

//===----------------------------------------------------------------------===//
// 1. Embedding
//===----------------------------------------------------------------------===//

TEST(CpuKernelsTest, EmbeddingGradient) {
  const int64_t V = 7, H = 5, N = 6;
  std::vector<int64_t> Ids = {3, 0, 6, 3, 1, 3};
  Vec Table = randVec(V * H, 1), W = randVec(N * H, 2);
  auto Loss = [&] {
    Vec Y(N * H);
    EXPECT_TRUE(embedding(Y.data(), Table.data(), Ids.data(), N, V, H).ok());
    return dotv(W, Y);
  };
  Vec DTable(V * H, 0.0);
  expectOk(embeddingBackward(DTable.data(), W.data(), Ids.data(), N, V, H));
  expectGradient("embedding table", Table, DTable, Loss);
  // Accumulates.
  Vec Twice = DTable;
  expectOk(embeddingBackward(Twice.data(), W.data(), Ids.data(), N, V, H));
  for (size_t I = 0; I < Twice.size(); ++I)
    EXPECT_DOUBLE_EQ(Twice[I], 2 * DTable[I]);
}

TEST(CpuKernelsTest, EmbeddingRejectsBadIds) {
  Vec Table(4 * 2, 1.0), Y(3 * 2, -1.0), DTable(4 * 2, 0.0), DY(3 * 2, 1.0);
  std::vector<int64_t> Ids = {0, 4, 1};
  Status S = embedding(Y.data(), Table.data(), Ids.data(), 3, 4, 2);
  ASSERT_FALSE(S.ok());
  EXPECT_STREQ(S.Message, "embedding id out of range");
  EXPECT_EQ(S.Index, 1);
  EXPECT_EQ(S.Value, 4);
  EXPECT_EQ(Y, Vec(6, -1.0)) << "the output is untouched on error";
  Ids[1] = -1;
  S = embeddingBackward(DTable.data(), DY.data(), Ids.data(), 3, 4, 2);
  ASSERT_FALSE(S.ok());
  EXPECT_EQ(S.Value, -1);
  EXPECT_EQ(DTable, Vec(8, 0.0));
}

//===----------------------------------------------------------------------===//
// 2. Add and reduceToShape
//===----------------------------------------------------------------------===//

/// addBroadcast and mulBroadcast run rows of the last dimension over the
/// threads: every element is the one sum or product of its operands'
/// broadcast elements, for operands broadcast along any dimensions (the
/// last one too), bit for bit on any thread count; reduceToShape, its
/// gradient, sums each element in double in Y's order, over the threads.
TEST(CpuKernelsTest, BroadcastRowsAreElementwise) {
  struct Case {
    std::vector<int64_t> Y, A, B;
  };
  for (const Case &C : {Case{{8, 128, 256}, {8, 128, 256}, {1, 128, 256}},
                        Case{{8, 128, 256}, {128, 256}, {8, 128, 256}},
                        Case{{4, 3, 300}, {4, 3, 1}, {300}},
                        Case{{2, 5, 7, 9}, {5, 1, 9}, {2, 1, 7, 1}},
                        Case{{6}, {1}, {6}},
                        Case{{}, {}, {}}}) {
    auto Count = [](const std::vector<int64_t> &S) {
      int64_t N = 1;
      for (int64_t D : S)
        N *= D;
      return N;
    };
    int64_t N = Count(C.Y);
    std::vector<float> A = toFloat(randVec(Count(C.A), 91)),
                       B = toFloat(randVec(Count(C.B), 92));
    // The reference: each element's operands by its index.
    std::vector<float> WantAdd(N), WantMul(N);
    std::vector<double> SumA(A.size());
    const int R = int(C.Y.size());
    for (int64_t I = 0; I < N; ++I) {
      int64_t Rest = I, OffA = 0, OffB = 0, StrA = 1, StrB = 1;
      for (int D = R - 1; D >= 0; --D) {
        int64_t Idx = Rest % C.Y[D];
        Rest /= C.Y[D];
        int DA = D - (R - int(C.A.size())), DB = D - (R - int(C.B.size()));
        if (DA >= 0) {
          OffA += (C.A[DA] == 1 ? 0 : Idx) * StrA;
          StrA *= C.A[DA];
        }
        if (DB >= 0) {
          OffB += (C.B[DB] == 1 ? 0 : Idx) * StrB;
          StrB *= C.B[DB];
        }
      }
      WantAdd[I] = A[OffA] + B[OffB];
      WantMul[I] = A[OffA] * B[OffB];
      SumA[OffA] += double(WantAdd[I]); // reduceToShape's order: Y's
    }
    std::vector<float> WantDA(SumA.begin(), SumA.end());
    auto Run = [&] {
      std::vector<float> Add(N, -1), Mul(N, -1), DA(A.size(), -1);
      expectOk(addBroadcast(Add.data(), C.Y, A.data(), C.A, B.data(), C.B));
      expectOk(mulBroadcast(Mul.data(), C.Y, A.data(), C.A, B.data(), C.B));
      expectOk(reduceToShape(DA.data(), C.A, Add.data(), C.Y));
      return bytesOf(Add, Mul, DA);
    };
    expectSameOnThreads("broadcast", Run);
    EXPECT_TRUE(Run() == bytesOf(WantAdd, WantMul, WantDA)) << N;
  }
}

TEST(CpuKernelsTest, AddBroadcastGradient) {
  std::vector<int64_t> YS = {2, 3, 4}, AS = {3, 1}, BS = {2, 1, 4};
  Vec A = randVec(3, 3), B = randVec(8, 4), W = randVec(24, 5);
  auto Loss = [&] {
    Vec Y(24);
    EXPECT_TRUE(addBroadcast(Y.data(), YS, A.data(), AS, B.data(), BS).ok());
    return dotv(W, Y);
  };
  Vec Y(24);
  expectOk(addBroadcast(Y.data(), YS, A.data(), AS, B.data(), BS));
  EXPECT_DOUBLE_EQ(Y[1 * 12 + 2 * 4 + 3], A[2] + B[1 * 4 + 3]);
  Vec DA(3), DB(8);
  expectOk(reduceToShape(DA.data(), AS, W.data(), YS));
  expectOk(reduceToShape(DB.data(), BS, W.data(), YS));
  expectGradient("broadcast a", A, DA, Loss);
  expectGradient("broadcast b", B, DB, Loss);
}

/// The parameter gradients' column sums are in the one order the CUDA
/// kernels reproduce (Kernels.h, ColumnRows): blocks of ColumnRows rows
/// from 0, their sums added in order, in double; the plain row order up to
/// ColumnRows rows. Checked bit for bit against that order written out, on
/// the double kernels (in float the one rounding of the double sum hides
/// most orders), at row counts below, at and past a block, on a width past
/// a column block.
TEST(CpuKernelsTest, ColumnSumsAreBlocksOfRowsInOrder) {
  const int64_t H = 300;
  for (int64_t Rows : {int64_t(1), int64_t(63), ColumnRows, int64_t(200)}) {
    SCOPED_TRACE("rows " + std::to_string(Rows));
    Vec X = randVec(Rows * H, 71, -3, 3), DY = randVec(Rows * H, 72, -2, 2),
        Gamma = randVec(H, 73, 0.5, 1.5), Beta = randVec(H, 74);
    Vec Y(Rows * H), Mean(Rows), Rstd(Rows), DX(Rows * H);
    layerNorm(Y.data(), Mean.data(), Rstd.data(), X.data(), Gamma.data(),
              Beta.data(), Rows, H, 1e-5);
    Vec DG(H, 0.0), DB(H, 0.0), DBias(H, 0.0), DR(H, 0.0), RRstd(Rows),
        RY(Rows * H);
    layerNormBackward(DX.data(), DG.data(), DB.data(), DY.data(), X.data(),
                      Gamma.data(), Mean.data(), Rstd.data(), Rows, H);
    biasBackward(DBias.data(), DY.data(), Rows, H);
    rmsNorm(RY.data(), RRstd.data(), X.data(), Gamma.data(), Rows, H, 1e-6);
    rmsNormBackward((double *)nullptr, DR.data(), DY.data(), X.data(),
                    Gamma.data(), RRstd.data(), Rows, H);
    auto Blocked = [&](int64_t J, auto Term) {
      double Total = 0;
      for (int64_t R0 = 0; R0 < Rows; R0 += ColumnRows) {
        double Part = 0;
        for (int64_t R = R0; R < std::min(Rows, R0 + ColumnRows); ++R)
          Part += Term(R, J);
        Total += Part;
      }
      return Total;
    };
    for (int64_t J = 0; J < H; ++J) {
      double G = Blocked(J, [&](int64_t R, int64_t C) {
        return DY[R * H + C] * ((X[R * H + C] - Mean[R]) * Rstd[R]);
      });
      double B = Blocked(J, [&](int64_t R, int64_t C) { return DY[R * H + C]; });
      double Rm = Blocked(J, [&](int64_t R, int64_t C) {
        return DY[R * H + C] * (X[R * H + C] * RRstd[R]);
      });
      ASSERT_EQ(DG[J], G) << "dgamma " << J;
      ASSERT_EQ(DB[J], B) << "dbeta " << J;
      ASSERT_EQ(DBias[J], B) << "dbias " << J;
      ASSERT_EQ(DR[J], Rm) << "rms dgamma " << J;
    }
  }
}

TEST(CpuKernelsTest, AddSameShape) {
  Vec A = {1, 2, 3}, B = {10, 20, 30}, Y(3);
  add(Y.data(), A.data(), B.data(), 3);
  EXPECT_EQ(Y, (Vec{11, 22, 33}));
}

TEST(CpuKernelsTest, ReduceToShape) {
  // [2, 3] -> [3] (bias-like), -> [2, 1], -> [] (everything), -> itself.
  Vec DY = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> YS = {2, 3};
  Vec D3(3), D21(2), D0(1), D23(6);
  expectOk(reduceToShape(D3.data(), std::vector<int64_t>{3}, DY.data(), YS));
  EXPECT_EQ(D3, (Vec{5, 7, 9}));
  expectOk(
      reduceToShape(D21.data(), std::vector<int64_t>{2, 1}, DY.data(), YS));
  EXPECT_EQ(D21, (Vec{6, 15}));
  expectOk(reduceToShape(D0.data(), Shape(), DY.data(), YS));
  EXPECT_EQ(D0, (Vec{21}));
  expectOk(reduceToShape(D23.data(), YS, DY.data(), YS));
  EXPECT_EQ(D23, DY);
  // Rank 4 with interleaved broadcast dimensions.
  std::vector<int64_t> Y4 = {2, 3, 4, 5}, X4 = {2, 1, 4, 1};
  Vec Big = randVec(120, 6), Small(8);
  expectOk(reduceToShape(Small.data(), X4, Big.data(), Y4));
  for (int A = 0; A < 2; ++A)
    for (int C = 0; C < 4; ++C) {
      double S = 0;
      for (int B = 0; B < 3; ++B)
        for (int D = 0; D < 5; ++D)
          S += Big[((A * 3 + B) * 4 + C) * 5 + D];
      EXPECT_NEAR(Small[A * 4 + C], S, 1e-12);
    }
  // Errors.
  EXPECT_FALSE(
      reduceToShape(D3.data(), std::vector<int64_t>{2}, DY.data(), YS).ok());
  EXPECT_FALSE(
      reduceToShape(D3.data(), std::vector<int64_t>{1, 2, 3}, DY.data(), YS)
          .ok());
}

//===----------------------------------------------------------------------===//
// 3. LayerNorm
//===----------------------------------------------------------------------===//

TEST(CpuKernelsTest, LayerNormGradient) {
  const int64_t Rows = 4, H = 6;
  const double Eps = 1e-5;
  Vec X = randVec(Rows * H, 7, -2, 2), Gamma = randVec(H, 8),
      Beta = randVec(H, 9), W = randVec(Rows * H, 10);
  auto Loss = [&] {
    Vec Y(Rows * H);
    layerNorm(Y.data(), (double *)nullptr, (double *)nullptr, X.data(),
              Gamma.data(), Beta.data(), Rows, H, Eps);
    return dotv(W, Y);
  };
  Vec Y(Rows * H), Mean(Rows), Rstd(Rows);
  layerNorm(Y.data(), Mean.data(), Rstd.data(), X.data(), Gamma.data(),
            Beta.data(), Rows, H, Eps);
  // The saved statistics.
  for (int64_t R = 0; R < Rows; ++R) {
    double M = 0, V = 0;
    for (int64_t J = 0; J < H; ++J)
      M += X[R * H + J] / H;
    for (int64_t J = 0; J < H; ++J)
      V += (X[R * H + J] - M) * (X[R * H + J] - M) / H;
    EXPECT_NEAR(Mean[R], M, 1e-14);
    EXPECT_NEAR(Rstd[R], 1 / std::sqrt(V + Eps), 1e-12);
  }
  Vec DX(Rows * H), DGamma(H, 0.0), DBeta(H, 0.0);
  layerNormBackward(DX.data(), DGamma.data(), DBeta.data(), W.data(), X.data(),
                    Gamma.data(), Mean.data(), Rstd.data(), Rows, H);
  expectGradient("layer norm x", X, DX, Loss);
  expectGradient("layer norm gamma", Gamma, DGamma, Loss);
  expectGradient("layer norm beta", Beta, DBeta, Loss);
}

//===----------------------------------------------------------------------===//
// 4. Linear
//===----------------------------------------------------------------------===//

void checkLinear(bool TransW) {
  SCOPED_TRACE(TransW ? "trans_w" : "no trans_w");
  const int64_t Rows = 3, In = 4, Out = 5;
  Vec X = randVec(Rows * In, 11), Wt = randVec(In * Out, 12),
      B = randVec(Out, 13), W = randVec(Rows * Out, 14);
  auto Forward = [&] {
    Vec Y(Rows * Out);
    linear(Y.data(), X.data(), Wt.data(), B.data(), Rows, In, Out, TransW);
    return Y;
  };
  // Against the definition.
  Vec Y = Forward();
  for (int64_t R = 0; R < Rows; ++R)
    for (int64_t O = 0; O < Out; ++O) {
      double S = B[O];
      for (int64_t I = 0; I < In; ++I)
        S += X[R * In + I] * (TransW ? Wt[O * In + I] : Wt[I * Out + O]);
      EXPECT_NEAR(Y[R * Out + O], S, 1e-14);
    }
  Vec NoBias(Rows * Out, std::numeric_limits<double>::quiet_NaN());
  linear(NoBias.data(), X.data(), Wt.data(), (const double *)nullptr, Rows, In,
         Out, TransW);
  for (int64_t I = 0; I < Rows * Out; ++I)
    EXPECT_NEAR(NoBias[I], Y[I] - B[I % Out], 1e-14);

  auto Loss = [&] { return dotv(W, Forward()); };
  Vec DX(Rows * In), DW(In * Out, 0.0), DB(Out, 0.0);
  linearBackwardInput(DX.data(), W.data(), Wt.data(), Rows, In, Out, TransW);
  linearBackwardWeight(DW.data(), X.data(), W.data(), Rows, In, Out, TransW);
  biasBackward(DB.data(), W.data(), Rows, Out);
  expectGradient("linear x", X, DX, Loss);
  expectGradient("linear w", Wt, DW, Loss);
  expectGradient("linear bias", B, DB, Loss);

  // dx is linear(dy, W, !trans_w), as autodiff emits it.
  Vec DX2(Rows * In);
  linear(DX2.data(), W.data(), Wt.data(), (const double *)nullptr, Rows, Out,
         In, !TransW);
  for (int64_t I = 0; I < Rows * In; ++I)
    EXPECT_NEAR(DX2[I], DX[I], 1e-14);

  // Parameter gradients accumulate.
  Vec DW2 = DW, DB2 = DB;
  linearBackwardWeight(DW2.data(), X.data(), W.data(), Rows, In, Out, TransW);
  biasBackward(DB2.data(), W.data(), Rows, Out);
  for (size_t I = 0; I < DW.size(); ++I)
    EXPECT_NEAR(DW2[I], 2 * DW[I], 1e-14);
  for (size_t I = 0; I < DB.size(); ++I)
    EXPECT_NEAR(DB2[I], 2 * DB[I], 1e-14);
}

TEST(CpuKernelsTest, LinearGradient) {
  checkLinear(true);
  checkLinear(false);
}

//===----------------------------------------------------------------------===//
// 5. GELU
//===----------------------------------------------------------------------===//

TEST(CpuKernelsTest, GeluValuesAndGradient) {
  double One = 1.0, Y;
  gelu(&Y, &One, 1, GeluApprox::None);
  EXPECT_NEAR(Y, 0.8413447460685429, 1e-15);
  gelu(&Y, &One, 1, GeluApprox::Tanh);
  EXPECT_NEAR(Y, 0.8411919906082768, 1e-15);
  for (GeluApprox A : {GeluApprox::None, GeluApprox::Tanh}) {
    const int64_t N = 40;
    Vec X = randVec(N, 15, -4, 4), W = randVec(N, 16);
    auto Loss = [&] {
      Vec Y(N);
      gelu(Y.data(), X.data(), N, A);
      return dotv(W, Y);
    };
    Vec DX(N);
    geluBackward(DX.data(), X.data(), W.data(), N, A);
    expectGradient(A == GeluApprox::None ? "gelu erf" : "gelu tanh", X, DX,
                   Loss);
  }
}

//===----------------------------------------------------------------------===//
// 6. Head layouts
//===----------------------------------------------------------------------===//

TEST(CpuKernelsTest, SplitHeadsLayoutAndGradient) {
  const int64_t B = 2, S = 3, Heads = 2, D = 4, H = Heads * D;
  const int64_t NQ = B * Heads * S * D;
  Vec QKV = randVec(B * S * 3 * H, 17);
  Vec Q(NQ), K(NQ), V(NQ);
  splitHeads(Q.data(), K.data(), V.data(), QKV.data(), B, S, Heads, D);
  // q[b=1, a=1, s=2, t=3] = qkv[1, 2, 0H + 1D + 3], and likewise for k, v.
  int64_t Dst = ((1 * Heads + 1) * S + 2) * D + 3;
  int64_t Src = (1 * S + 2) * 3 * H + 1 * D + 3;
  EXPECT_EQ(Q[Dst], QKV[Src]);
  EXPECT_EQ(K[Dst], QKV[Src + H]);
  EXPECT_EQ(V[Dst], QKV[Src + 2 * H]);

  Vec WQ = randVec(NQ, 18), WK = randVec(NQ, 19), WV = randVec(NQ, 20);
  auto Loss = [&] {
    Vec Q(NQ), K(NQ), V(NQ);
    splitHeads(Q.data(), K.data(), V.data(), QKV.data(), B, S, Heads, D);
    return dotv(WQ, Q) + dotv(WK, K) + dotv(WV, V);
  };
  Vec DQKV(QKV.size());
  splitHeadsBackward(DQKV.data(), WQ.data(), WK.data(), WV.data(), B, S, Heads,
                     D);
  expectGradient("split heads", QKV, DQKV, Loss);

  // GPT-NeoX's per-head layout: part p of head a at columns (3a + p) D.
  splitHeads(Q.data(), K.data(), V.data(), QKV.data(), B, S, Heads, D, true);
  int64_t PerHead = (1 * S + 2) * 3 * H + 3 * 1 * D + 3;
  EXPECT_EQ(Q[Dst], QKV[PerHead]);
  EXPECT_EQ(K[Dst], QKV[PerHead + D]);
  EXPECT_EQ(V[Dst], QKV[PerHead + 2 * D]);
  auto PerHeadLoss = [&] {
    Vec Q(NQ), K(NQ), V(NQ);
    splitHeads(Q.data(), K.data(), V.data(), QKV.data(), B, S, Heads, D, true);
    return dotv(WQ, Q) + dotv(WK, K) + dotv(WV, V);
  };
  splitHeadsBackward(DQKV.data(), WQ.data(), WK.data(), WV.data(), B, S, Heads,
                     D, true);
  expectGradient("per-head split heads", QKV, DQKV, PerHeadLoss);
}

TEST(CpuKernelsTest, MergeHeadsLayoutAndGradient) {
  const int64_t B = 2, S = 3, Heads = 2, D = 4, N = B * Heads * S * D;
  Vec X = randVec(N, 21), W = randVec(N, 22), Y(N);
  mergeHeads(Y.data(), X.data(), B, S, Heads, D);
  // y[b=1, s=2, a=1 D + t=3] = x[1, 1, 2, 3].
  EXPECT_EQ(Y[(1 * S + 2) * Heads * D + 1 * D + 3],
            X[((1 * Heads + 1) * S + 2) * D + 3]);
  auto Loss = [&] {
    Vec Y(N);
    mergeHeads(Y.data(), X.data(), B, S, Heads, D);
    return dotv(W, Y);
  };
  Vec DX(N);
  mergeHeadsBackward(DX.data(), W.data(), B, S, Heads, D);
  expectGradient("merge heads", X, DX, Loss);
  // The backward is the inverse permutation.
  Vec Back(N);
  mergeHeadsBackward(Back.data(), Y.data(), B, S, Heads, D);
  EXPECT_EQ(Back, X);
}

//===----------------------------------------------------------------------===//
// 7. Batched matrix product
//===----------------------------------------------------------------------===//

/// C = op(A) op(B) for every flag combination, against the definition; its
/// gradients composed from batchMatMul by the chain rule, against finite
/// differences.
void checkBatchMatMul(bool TA, bool TB) {
  SCOPED_TRACE(testing::Message() << "trans_a " << TA << " trans_b " << TB);
  const int64_t P = 2, M = 3, N = 4, K = 5;
  Vec A = randVec(P * M * K, 23), B = randVec(P * K * N, 24),
      W = randVec(P * M * N, 25);
  auto Forward = [&] {
    Vec C(P * M * N);
    batchMatMul(C.data(), A.data(), B.data(), P, M, N, K, TA, TB);
    return C;
  };
  Vec C = Forward();
  for (int64_t Pi = 0; Pi < P; ++Pi)
    for (int64_t I = 0; I < M; ++I)
      for (int64_t J = 0; J < N; ++J) {
        double S = 0;
        for (int64_t L = 0; L < K; ++L)
          S += A[Pi * M * K + (TA ? L * M + I : I * K + L)] *
               B[Pi * K * N + (TB ? J * K + L : L * N + J)];
        EXPECT_NEAR(C[(Pi * M + I) * N + J], S, 1e-14);
      }
  // Rules (dC = W), with the stored shapes of A and B:
  //   dA = dC op(B)^T   (A = [M,K])   or op(B) dC^T   (A^T stored [K,M])
  //   dB = op(A)^T dC   (B = [K,N])   or dC^T op(A)   (B^T stored [N,K])
  Vec DA(A.size()), DB(B.size());
  if (!TA) // [M,N] x op(B)^T [N,K]
    batchMatMul(DA.data(), W.data(), B.data(), P, M, K, N, false, !TB);
  else // op(B) [K,N] x dC^T [N,M]
    batchMatMul(DA.data(), B.data(), W.data(), P, K, M, N, TB, true);
  if (!TB) // op(A)^T [K,M] x dC [M,N]
    batchMatMul(DB.data(), A.data(), W.data(), P, K, N, M, !TA, false);
  else // dC^T [N,M] x op(A) [M,K]
    batchMatMul(DB.data(), W.data(), A.data(), P, N, K, M, true, TA);
  auto Loss = [&] { return dotv(W, Forward()); };
  expectGradient("batch matmul a", A, DA, Loss);
  expectGradient("batch matmul b", B, DB, Loss);
}

TEST(CpuKernelsTest, BatchMatMulFlagsAndGradient) {
  for (bool TA : {false, true})
    for (bool TB : {false, true})
      checkBatchMatMul(TA, TB);
}

//===----------------------------------------------------------------------===//
// 8-10. Scale, causal mask, softmax
//===----------------------------------------------------------------------===//

TEST(CpuKernelsTest, ScaleGradient) {
  const int64_t N = 10;
  const double Alpha = 0.35355339;
  Vec X = randVec(N, 26), W = randVec(N, 27);
  auto Loss = [&] {
    Vec Y(N);
    scale(Y.data(), X.data(), N, Alpha);
    return dotv(W, Y);
  };
  Vec DX(N);
  scale(DX.data(), W.data(), N, Alpha);
  expectGradient("scale", X, DX, Loss);
}

TEST(CpuKernelsTest, AddKeyBiasBroadcastsOverHeadsAndQueries) {
  // X[b, a * q, k] + Bias[b, k], exactly; the backward is then the identity
  // (autodiff's rule for padding_mask needs no kernel).
  const int64_t B = 2, Inner = 6, K = 5;
  Vec X = randVec(B * Inner * K, 40), Bias = randVec(B * K, 41);
  Vec Y(B * Inner * K);
  addKeyBias(Y.data(), X.data(), Bias.data(), B, Inner, K);
  for (int64_t Bi = 0; Bi < B; ++Bi)
    for (int64_t I = 0; I < Inner; ++I)
      for (int64_t J = 0; J < K; ++J) {
        int64_t E = (Bi * Inner + I) * K + J;
        EXPECT_EQ(Y[E], X[E] + Bias[Bi * K + J]);
      }
  // In place.
  Vec Z = X;
  addKeyBias(Z.data(), Z.data(), Bias.data(), B, Inner, K);
  EXPECT_EQ(Z, Y);
}

TEST(CpuKernelsTest, CausalMaskGradientAndOffsets) {
  const int64_t P = 2, S = 5;
  Vec X = randVec(P * S * S, 28), W = randVec(P * S * S, 29);
  const double NegInf = -std::numeric_limits<double>::infinity();
  Vec Y(P * S * S);
  causalMask(Y.data(), X.data(), P, S, S, NegInf);
  for (int64_t Pi = 0; Pi < P; ++Pi)
    for (int64_t I = 0; I < S; ++I)
      for (int64_t J = 0; J < S; ++J) {
        int64_t E = (Pi * S + I) * S + J;
        if (J > I)
          EXPECT_EQ(Y[E], NegInf);
        else
          EXPECT_EQ(Y[E], X[E]);
      }
  auto Loss = [&] {
    Vec Y(P * S * S);
    causalMask(Y.data(), X.data(), P, S, S,
               -2.0); // a small fill: no cancellation
    return dotv(W, Y);
  };
  Vec DX(P * S * S);
  causalMask(DX.data(), W.data(), P, S, S, 0.0);
  expectGradient("causal mask", X, DX, Loss);

  // A block of queries [2, 5) and keys [1, 4) masks like the full matrix.
  const int64_t Q0 = 2, Sq = 3, K0 = 1, Sk = 3;
  Vec Blk(P * Sq * Sk), BlkY(P * Sq * Sk);
  for (int64_t Pi = 0; Pi < P; ++Pi)
    for (int64_t I = 0; I < Sq; ++I)
      for (int64_t J = 0; J < Sk; ++J)
        Blk[(Pi * Sq + I) * Sk + J] = X[(Pi * S + Q0 + I) * S + K0 + J];
  causalMask(BlkY.data(), Blk.data(), P, Sq, Sk, NegInf, Q0, K0);
  for (int64_t Pi = 0; Pi < P; ++Pi)
    for (int64_t I = 0; I < Sq; ++I)
      for (int64_t J = 0; J < Sk; ++J)
        EXPECT_EQ(BlkY[(Pi * Sq + I) * Sk + J],
                  Y[(Pi * S + Q0 + I) * S + K0 + J]);
}

TEST(CpuKernelsTest, SoftmaxGradient) {
  const int64_t Rows = 3, N = 7;
  Vec X = randVec(Rows * N, 30, -3, 3), W = randVec(Rows * N, 31);
  auto Forward = [&] {
    Vec Y(Rows * N);
    softmax(Y.data(), X.data(), Rows, N);
    return Y;
  };
  Vec Y = Forward();
  for (int64_t R = 0; R < Rows; ++R) {
    double S = 0;
    for (int64_t J = 0; J < N; ++J)
      S += Y[R * N + J];
    EXPECT_NEAR(S, 1.0, 1e-14);
  }
  Vec DX(Rows * N);
  softmaxBackward(DX.data(), Y.data(), W.data(), Rows, N);
  expectGradient("softmax", X, DX, [&] { return dotv(W, Forward()); });
}

TEST(CpuKernelsTest, SoftmaxMaskedAndLargeRows) {
  const double Inf = std::numeric_limits<double>::infinity();
  Vec X = {-Inf, -Inf, -Inf, 1000, 1001, -Inf, 0, 0, 0};
  Vec Y(9);
  softmax(Y.data(), X.data(), 3, 3);
  for (int J = 0; J < 3; ++J)
    EXPECT_EQ(Y[J], 0.0) << "an all -inf row gives zeros";
  EXPECT_NEAR(Y[3], 1 / (1 + std::exp(1.0)), 1e-15);
  EXPECT_NEAR(Y[4], 1 / (1 + std::exp(-1.0)), 1e-15);
  EXPECT_EQ(Y[5], 0.0);
  for (int J = 6; J < 9; ++J)
    EXPECT_NEAR(Y[J], 1.0 / 3, 1e-15);
  // In place.
  softmax(X.data(), X.data(), 3, 3);
  EXPECT_EQ(X, Y);
}

//===----------------------------------------------------------------------===//
// 11. Dropout
//===----------------------------------------------------------------------===//

std::vector<uint8_t> maskOf(double Ratio, const DropoutKey &K,
                            const GlobalIndex &G) {
  std::vector<uint8_t> M(G.numLocal());
  Status S = dropoutMask(M.data(), Ratio, K, G);
  EXPECT_TRUE(S.ok()) << S.Message;
  return M;
}

TEST(CpuDropoutTest, FixedMaskGradient) {
  const int64_t N = 50;
  const double Ratio = 0.3;
  DropoutKey K{1234, 2, 1, 0};
  std::vector<int64_t> Sh = {N};
  GlobalIndex G = GlobalIndex::whole(Sh);
  Vec X = randVec(N, 32), W = randVec(N, 33), Y(N);
  std::vector<uint8_t> Mask(N);
  expectOk(dropout(Y.data(), Mask.data(), X.data(), Ratio, K, G));
  for (int64_t I = 0; I < N; ++I)
    EXPECT_NEAR(Y[I], Mask[I] ? X[I] / (1 - Ratio) : 0.0, 1e-15);
  auto Loss = [&] {
    Vec Y(N);
    EXPECT_TRUE(
        dropout(Y.data(), (uint8_t *)nullptr, X.data(), Ratio, K, G).ok());
    return dotv(W, Y);
  };
  Vec DX(N);
  dropoutBackward(DX.data(), W.data(), Mask.data(), N, Ratio);
  expectGradient("dropout", X, DX, Loss);
}

TEST(CpuDropoutTest, MappingIsTheDocumentedOne) {
  // keep(e) = Philox4x32_10(ctr = (lo(e/4), hi(e/4), layer | site << 16,
  //           stream), key = (lo(seed), hi(seed)))[e % 4] >= ceil(r 2^32).
  const DropoutKey K{0x0123456789abcdefull, 7, 3, 11};
  const double Ratio = 0.4;
  const uint64_t Threshold = uint64_t(std::ceil(Ratio * 4294967296.0));
  std::vector<int64_t> Sh = {5, 13};
  auto M = maskOf(Ratio, K, GlobalIndex::whole(Sh));
  for (uint64_t E = 0; E < M.size(); ++E) {
    uint64_t Blk = E / 4;
    Words4 Ctr{{uint32_t(Blk), uint32_t(Blk >> 32), 7u | (3u << 16), 11u}};
    Words4 Out = sp::philox::philox4x32_10(Ctr, 0x89abcdefu, 0x01234567u);
    EXPECT_EQ(M[E], Out.V[E % 4] >= Threshold ? 1 : 0) << E;
    EXPECT_EQ(Out.V[E % 4], sp::philox::dropoutWord(K.Seed, 7, 3, 11, E));
  }
  // The high word of the index reaches the counter.
  uint64_t Far = (uint64_t(5) << 34) + 6; // block (5 << 32) + 1, lane 2
  Words4 Ctr{{1u, 5u, 7u | (3u << 16), 11u}};
  EXPECT_EQ(sp::philox::dropoutWord(K.Seed, 7, 3, 11, Far),
            sp::philox::philox4x32_10(Ctr, 0x89abcdefu, 0x01234567u).V[2]);
}

TEST(CpuDropoutTest, LayoutInvariance) {
  // [B, S, H] with sizes that do not align with Philox's blocks of four.
  const int64_t B = 3, S = 10, H = 7;
  std::vector<int64_t> GS = {B, S, H};
  const DropoutKey K{42, 1, 0, 5};
  const double Ratio = 0.5;
  auto Full = maskOf(Ratio, K, GlobalIndex::whole(GS));
  auto At = [&](int64_t Bi, int64_t Si, int64_t Hi) {
    return Full[(Bi * S + Si) * H + Hi];
  };
  // Sequence shards of uneven lengths, as a concatenation along S.
  for (auto [S0, Len] : {std::pair<int64_t, int64_t>{0, 4}, {4, 3}, {7, 3}}) {
    std::vector<int64_t> LS = {B, Len, H}, Off = {0, S0, 0};
    auto M = maskOf(Ratio, K, GlobalIndex::block(GS, LS, Off));
    for (int64_t Bi = 0; Bi < B; ++Bi)
      for (int64_t Si = 0; Si < Len; ++Si)
        for (int64_t Hi = 0; Hi < H; ++Hi)
          ASSERT_EQ(M[(Bi * Len + Si) * H + Hi], At(Bi, S0 + Si, Hi))
              << "sequence shard at " << S0;
  }
  // Batch shards: contiguous slices of the full mask.
  for (int64_t Bi = 0; Bi < B; ++Bi) {
    std::vector<int64_t> LS = {1, S, H}, Off = {Bi, 0, 0};
    auto M = maskOf(Ratio, K, GlobalIndex::block(GS, LS, Off));
    ASSERT_TRUE(std::equal(M.begin(), M.end(), Full.begin() + Bi * S * H));
  }
  // A 4-D block: heads [1, 3) of [B, a, S, S] and a sequence shard.
  std::vector<int64_t> G4 = {2, 4, 6, 6}, L4 = {2, 2, 3, 6}, O4 = {0, 1, 3, 0};
  auto Full4 = maskOf(Ratio, K, GlobalIndex::whole(G4));
  auto M4 = maskOf(Ratio, K, GlobalIndex::block(G4, L4, O4));
  int64_t L = 0;
  for (int64_t I0 = 0; I0 < 2; ++I0)
    for (int64_t I1 = 0; I1 < 2; ++I1)
      for (int64_t I2 = 0; I2 < 3; ++I2)
        for (int64_t I3 = 0; I3 < 6; ++I3)
          ASSERT_EQ(M4[L++], Full4[((I0 * 4 + I1 + 1) * 6 + I2 + 3) * 6 + I3]);
  // dropout() applies the same mask as dropoutMask().
  std::vector<int64_t> LS = {B, 4, H}, Off = {0, 4, 0};
  GlobalIndex G = GlobalIndex::block(GS, LS, Off);
  Vec X(G.numLocal(), 1.0), Y(G.numLocal());
  std::vector<uint8_t> M(G.numLocal());
  expectOk(dropout(Y.data(), M.data(), X.data(), Ratio, K, G));
  EXPECT_EQ(M, maskOf(Ratio, K, G));
}

TEST(CpuDropoutTest, BatchedPhiloxIsTheScalarDefinition) {
  // The kernels generate many Philox blocks side by side; every element must
  // still be philox::dropoutWord of its global index. Blocks of a huge
  // global tensor (never allocated) reach indices whose block number crosses
  // 2^32, at offsets that do not align with blocks of four, with rows longer
  // and shorter than the kernels' batches.
  const DropoutKey K{0xfedcba9876543210ull, 513, 2, 77};
  const double Ratio = 0.3;
  const uint64_t Threshold = sp::philox::dropoutThreshold(Ratio);
  std::vector<int64_t> GS = {int64_t(1) << 20, int64_t(1) << 15};
  struct Case {
    int64_t Rows, Cols, Row0, Col0;
  };
  for (Case C : {Case{3, 2500, (int64_t(1) << 19) - 1, 5},
                 Case{5, 7, (int64_t(1) << 19) - 2, (int64_t(1) << 15) - 9},
                 Case{2, int64_t(1) << 15, 0, 0}}) {
    std::vector<int64_t> LS = {C.Rows, C.Cols}, Off = {C.Row0, C.Col0};
    GlobalIndex G = GlobalIndex::block(GS, LS, Off);
    auto M = maskOf(Ratio, K, G);
    for (int64_t R = 0; R < C.Rows; ++R)
      for (int64_t J = 0; J < C.Cols; ++J) {
        uint64_t E = uint64_t(C.Row0 + R) * uint64_t(GS[1]) + uint64_t(C.Col0 + J);
        uint32_t W = sp::philox::dropoutWord(K.Seed, K.Layer, K.Site, K.Stream, E);
        ASSERT_EQ(M[R * C.Cols + J], W >= Threshold ? 1 : 0)
            << "row " << R << " col " << J << " of the block at " << C.Row0;
      }
  }
}

TEST(CpuDropoutTest, RateAndReproducibility) {
  const int64_t N = 1000000;
  std::vector<int64_t> Sh = {N};
  GlobalIndex G = GlobalIndex::whole(Sh);
  for (double Ratio : {0.1, 0.5}) {
    auto M = maskOf(Ratio, DropoutKey{7, 3, 2, 0}, G);
    int64_t Dropped = 0;
    for (uint8_t B : M)
      Dropped += !B;
    // Binomial standard deviation at 1e6 draws is at most 5e-4.
    EXPECT_NEAR(double(Dropped) / N, Ratio, 3e-3);
    EXPECT_EQ(M, maskOf(Ratio, DropoutKey{7, 3, 2, 0}, G)) << "reproducible";
  }
  // Every key component changes the mask.
  std::vector<int64_t> Small = {4096};
  GlobalIndex GS = GlobalIndex::whole(Small);
  auto Base = maskOf(0.5, DropoutKey{7, 3, 2, 1}, GS);
  for (DropoutKey K : {DropoutKey{8, 3, 2, 1}, DropoutKey{7ull << 32, 3, 2, 1},
                       DropoutKey{7, 4, 2, 1}, DropoutKey{7, 3, 3, 1},
                       DropoutKey{7, 3, 2, 2}}) {
    auto M = maskOf(0.5, K, GS);
    int64_t Diff = 0;
    for (size_t I = 0; I < M.size(); ++I)
      Diff += M[I] != Base[I];
    EXPECT_GT(Diff, 1500) << "seed " << K.Seed << " layer " << K.Layer
                          << " site " << K.Site << " stream " << K.Stream;
  }
}

TEST(CpuDropoutTest, EdgeRatiosAndErrors) {
  std::vector<int64_t> Sh = {2, 3};
  GlobalIndex G = GlobalIndex::whole(Sh);
  Vec X = {1, 2, 3, 4, 5, 6}, Y(6);
  std::vector<uint8_t> M(6);
  expectOk(dropout(Y.data(), M.data(), X.data(), 0.0, DropoutKey{}, G));
  EXPECT_EQ(Y, X);
  EXPECT_EQ(M, std::vector<uint8_t>(6, 1));
  expectOk(dropout(Y.data(), M.data(), X.data(), 1.0, DropoutKey{}, G));
  EXPECT_EQ(Y, Vec(6, 0.0));
  EXPECT_EQ(M, std::vector<uint8_t>(6, 0));
  Vec DX(6, 1.0);
  dropoutBackward(DX.data(), X.data(), M.data(), 6, 1.0);
  EXPECT_EQ(DX, Vec(6, 0.0));

  EXPECT_FALSE(
      dropout(Y.data(), M.data(), X.data(), 1.5, DropoutKey{}, G).ok());
  EXPECT_FALSE(dropout(Y.data(), M.data(), X.data(), 0.1,
                       DropoutKey{0, 1u << 16, 0, 0}, G)
                   .ok());
  EXPECT_FALSE(dropout(Y.data(), M.data(), X.data(), 0.1,
                       DropoutKey{0, 0, 1u << 16, 0}, G)
                   .ok());
  std::vector<int64_t> Local = {2, 3}, Off = {1, 0};
  EXPECT_FALSE(GlobalIndex::block(Sh, Local, Off).check().ok())
      << "block outside the tensor";
  std::vector<int64_t> Local1 = {6};
  EXPECT_FALSE(GlobalIndex::block(Sh, Local1, {}).check().ok())
      << "ranks disagree";
  // A scalar is element 0 of itself.
  GlobalIndex Scalar = GlobalIndex::whole(Shape());
  EXPECT_EQ(Scalar.numLocal(), 1);
  double S = 2.0, SY;
  uint8_t SM;
  expectOk(dropout(&SY, &SM, &S, 0.5, DropoutKey{9}, Scalar));
  EXPECT_EQ(SM, maskOf(0.5, DropoutKey{9}, G)[0]);
}

//===----------------------------------------------------------------------===//
// 12. Cross entropy
//===----------------------------------------------------------------------===//

TEST(CpuKernelsTest, CrossEntropyGradientWithPadding) {
  const int64_t N = 4, V = 9, ValidV = 7;
  Vec Logits = randVec(N * V, 34, -3, 3);
  std::vector<int64_t> Targets = {0, 6, 3, 3};
  const double DLoss = 1.7;
  auto Loss = [&] {
    double L;
    EXPECT_TRUE(
        crossEntropy(&L, Logits.data(), Targets.data(), N, V, ValidV).ok());
    return DLoss * L;
  };
  Vec DLogits(N * V, std::numeric_limits<double>::quiet_NaN());
  expectOk(crossEntropyBackward(DLogits.data(), Logits.data(), Targets.data(),
                                DLoss, N, V, ValidV));
  for (int64_t R = 0; R < N; ++R)
    for (int64_t J = ValidV; J < V; ++J)
      EXPECT_EQ(DLogits[R * V + J], 0.0) << "padding gets no gradient";
  expectGradient("cross entropy", Logits, DLogits, Loss);

  // The padding is invisible: huge padded logits change nothing, and the
  // loss equals the one over the sliced logits.
  double L1, L2;
  expectOk(crossEntropy(&L1, Logits.data(), Targets.data(), N, V, ValidV));
  Vec Sliced, Padded = Logits;
  for (int64_t R = 0; R < N; ++R)
    for (int64_t J = 0; J < V; ++J) {
      if (J < ValidV)
        Sliced.push_back(Logits[R * V + J]);
      else
        Padded[R * V + J] = 1e30;
    }
  expectOk(crossEntropy(&L2, Sliced.data(), Targets.data(), N, ValidV, ValidV));
  EXPECT_NEAR(L1, L2, 1e-14);
  expectOk(crossEntropy(&L2, Padded.data(), Targets.data(), N, V, ValidV));
  EXPECT_EQ(L1, L2);

  // Uniform logits: log(ValidV).
  Vec Zeros(N * V, 0.0);
  expectOk(crossEntropy(&L1, Zeros.data(), Targets.data(), N, V, ValidV));
  EXPECT_NEAR(L1, std::log(double(ValidV)), 1e-15);
}

TEST(CpuKernelsTest, CrossEntropyRejectsBadTargets) {
  Vec Logits(2 * 5, 0.0), D(2 * 5);
  double L;
  std::vector<int64_t> Targets = {1, 4};
  Status S = crossEntropy(&L, Logits.data(), Targets.data(), 2, 5, 4);
  ASSERT_FALSE(S.ok());
  EXPECT_STREQ(S.Message, "cross entropy target out of range");
  EXPECT_EQ(S.Index, 1);
  EXPECT_EQ(S.Value, 4);
  Targets = {-100, 0};
  EXPECT_FALSE(crossEntropyBackward(D.data(), Logits.data(), Targets.data(),
                                    1.0, 2, 5, 5)
                   .ok());
  Targets = {0, 0};
  EXPECT_FALSE(crossEntropy(&L, Logits.data(), Targets.data(), 2, 5, 6).ok());
  EXPECT_FALSE(crossEntropy(&L, Logits.data(), Targets.data(), 0, 5, 5).ok());
}

TEST(CpuKernelsTest, CrossEntropyIgnoreIndex) {
  const int64_t N = 6, V = 9, ValidV = 7, Ignore = -100;
  Vec Logits = randVec(N * V, 70, -3, 3);
  std::vector<int64_t> Targets = {2, Ignore, 6, Ignore, 0, 3};
  const double DLoss = 1.3;
  auto Loss = [&] {
    double L;
    EXPECT_TRUE(crossEntropy(&L, Logits.data(), Targets.data(), N, V, ValidV,
                             Ignore)
                    .ok());
    return DLoss * L;
  };
  Vec DLogits(N * V, std::numeric_limits<double>::quiet_NaN());
  expectOk(crossEntropyBackward(DLogits.data(), Logits.data(), Targets.data(),
                                DLoss, N, V, ValidV, Ignore));
  for (int64_t R : {1, 3})
    for (int64_t J = 0; J < V; ++J)
      EXPECT_EQ(DLogits[R * V + J], 0.0) << "an ignored row gets no gradient";
  expectGradient("cross entropy ignore index", Logits, DLogits, Loss);

  // The mean is over the counted rows: the same as the loss and gradient of
  // only those rows.
  Vec Kept, DKept(4 * V);
  std::vector<int64_t> KeptTargets;
  for (int64_t R = 0; R < N; ++R)
    if (Targets[R] != Ignore) {
      Kept.insert(Kept.end(), Logits.begin() + R * V,
                  Logits.begin() + (R + 1) * V);
      KeptTargets.push_back(Targets[R]);
    }
  double L1, L2;
  expectOk(crossEntropy(&L1, Logits.data(), Targets.data(), N, V, ValidV,
                        Ignore));
  expectOk(crossEntropy(&L2, Kept.data(), KeptTargets.data(), 4, V, ValidV));
  EXPECT_NEAR(L1, L2, 1e-15);
  expectOk(crossEntropyBackward(DKept.data(), Kept.data(), KeptTargets.data(),
                                DLoss, 4, V, ValidV));
  for (int64_t R = 0, K = 0; R < N; ++R)
    if (Targets[R] != Ignore) {
      for (int64_t J = 0; J < V; ++J)
        EXPECT_NEAR(DLogits[R * V + J], DKept[K * V + J], 1e-16);
      ++K;
    }

  // An ignore index inside the vocabulary (e.g. a padding token): only the
  // targets equal to it are dropped; the class stays in the softmax.
  std::vector<int64_t> PadTargets = {2, 3, 6, 3, 0, 3};
  expectOk(crossEntropy(&L1, Logits.data(), PadTargets.data(), N, V, ValidV,
                        int64_t(3)));
  Vec Rows024;
  for (int64_t R : {0, 2, 4})
    Rows024.insert(Rows024.end(), Logits.begin() + R * V,
                   Logits.begin() + (R + 1) * V);
  std::vector<int64_t> Targets024 = {2, 6, 0};
  expectOk(crossEntropy(&L2, Rows024.data(), Targets024.data(), 3, V, ValidV));
  EXPECT_NEAR(L1, L2, 1e-15);

  // Everything ignored: loss 0 (torch gives NaN, 0 / 0) and zero gradients
  // (as torch).
  std::vector<int64_t> None(N, Ignore);
  double L0 = -1;
  expectOk(
      crossEntropy(&L0, Logits.data(), None.data(), N, V, ValidV, Ignore));
  EXPECT_EQ(L0, 0.0);
  Vec D0(N * V, std::numeric_limits<double>::quiet_NaN());
  expectOk(crossEntropyBackward(D0.data(), Logits.data(), None.data(), DLoss,
                                N, V, ValidV, Ignore));
  EXPECT_EQ(D0, Vec(N * V, 0.0));

  // Targets out of range that are not the ignore index are still errors.
  std::vector<int64_t> Bad = {Ignore, 7, 1, 1, 1, 1};
  Status S = crossEntropy(&L0, Logits.data(), Bad.data(), N, V, ValidV, Ignore);
  ASSERT_FALSE(S.ok());
  EXPECT_STREQ(S.Message, "cross entropy target out of range");
  EXPECT_EQ(S.Index, 1);
  EXPECT_EQ(S.Value, 7);
  S = crossEntropyBackward(D0.data(), Logits.data(), Bad.data(), DLoss, N, V,
                           ValidV, int64_t(-1));
  ASSERT_FALSE(S.ok());
  EXPECT_EQ(S.Index, 0);
  EXPECT_EQ(S.Value, Ignore);
}

//===----------------------------------------------------------------------===//
// 13. Optimizer
//===----------------------------------------------------------------------===//

TEST(CpuOptimizerTest, AdamWThreeSteps) {
  const double Lr = 1e-2, B1 = 0.9, B2 = 0.95, Eps = 1e-8, Wd = 0.1;
  const int64_t N = 3;
  Vec P = {0.5, -1.0, 2.0}, M(N, 0.0), V(N, 0.0);
  Vec HP = P, HM = M, HV = V; // the hand computation, in mhat/vhat form
  const Vec Grads[3] = {{0.1, -0.2, 0.3}, {-0.4, 0.5, 0.0}, {1.0, 1e-3, -2.0}};
  const double Scales[3] = {1.0, 0.5, 0.25};
  for (int T = 1; T <= 3; ++T) {
    adamw(P.data(), Grads[T - 1].data(), M.data(), V.data(), N, Lr, B1, B2, Eps,
          Wd, Scales[T - 1], T);
    for (int64_t I = 0; I < N; ++I) {
      double G = Grads[T - 1][I] * Scales[T - 1];
      HP[I] -= Lr * Wd * HP[I];
      HM[I] = B1 * HM[I] + (1 - B1) * G;
      HV[I] = B2 * HV[I] + (1 - B2) * G * G;
      double MHat = HM[I] / (1 - std::pow(B1, T));
      double VHat = HV[I] / (1 - std::pow(B2, T));
      HP[I] -= Lr * MHat / (std::sqrt(VHat) + Eps);
      EXPECT_NEAR(P[I], HP[I], 1e-15) << "step " << T << " element " << I;
      EXPECT_NEAR(M[I], HM[I], 1e-16);
      EXPECT_NEAR(V[I], HV[I], 1e-16);
    }
  }
  // Step 1 without decay moves each weight by lr * sign(g) (mhat/sqrt(vhat)
  // = g/|g|), up to eps.
  Vec P1 = {1.0, 1.0}, G1 = {3.0, -0.5}, M1(2, 0.0), V1(2, 0.0);
  adamw(P1.data(), G1.data(), M1.data(), V1.data(), 2, 0.1, 0.9, 0.999, 1e-8,
        0.0, 1.0, 1);
  EXPECT_NEAR(P1[0], 0.9, 1e-8);
  EXPECT_NEAR(P1[1], 1.1, 1e-8);
  // float against double.
  std::vector<float> FP = {0.5f, -1.0f, 2.0f}, FM(N, 0.0f), FV(N, 0.0f);
  Vec DP = {0.5, -1.0, 2.0}, DM(N, 0.0), DV(N, 0.0);
  for (int T = 1; T <= 3; ++T) {
    auto FG = toFloat(Grads[T - 1]);
    adamw(FP.data(), FG.data(), FM.data(), FV.data(), N, Lr, B1, B2, Eps, Wd,
          Scales[T - 1], T);
    adamw(DP.data(), Grads[T - 1].data(), DM.data(), DV.data(), N, Lr, B1, B2,
          Eps, Wd, Scales[T - 1], T);
  }
  expectClose(FP, DP, 1e-6, "adamw float");
}

TEST(CpuOptimizerTest, ClipCoefficientAndSumSquares) {
  EXPECT_EQ(clipCoefficient(10.0f, 1.0f), (1.0f / (10.0f + 1e-6f)) * 1.0f);
  EXPECT_EQ(clipCoefficient(10.0, 1.0), (1.0 / (10.0 + 1e-6)) * 1.0);
  EXPECT_NEAR(clipCoefficient(4.0, 2.0), 0.5, 1e-6);
  EXPECT_EQ(clipCoefficient(0.5f, 1.0f), 1.0f);
  EXPECT_EQ(clipCoefficient(0.0f, 1.0f), 1.0f);
  // Exactly at the bound the 1e-6 keeps the coefficient just below 1.
  EXPECT_LT(clipCoefficient(1.0f, 1.0f), 1.0f);
  std::vector<float> G = {3.0f, -4.0f, 0.5f};
  EXPECT_DOUBLE_EQ(sumSquares(G.data(), 3), 25.25);
}

//===----------------------------------------------------------------------===//
// 14. RMSNorm
//===----------------------------------------------------------------------===//

TEST(CpuKernelsTest, RmsNormGradient) {
  const int64_t Rows = 4, H = 6;
  const double Eps = 1e-6;
  Vec X = randVec(Rows * H, 60, -2, 2), Gamma = randVec(H, 61),
      W = randVec(Rows * H, 62);
  auto Loss = [&] {
    Vec Y(Rows * H);
    rmsNorm(Y.data(), (double *)nullptr, X.data(), Gamma.data(), Rows, H, Eps);
    return dotv(W, Y);
  };
  Vec Y(Rows * H), Rstd(Rows);
  rmsNorm(Y.data(), Rstd.data(), X.data(), Gamma.data(), Rows, H, Eps);
  // Against the definition.
  for (int64_t R = 0; R < Rows; ++R) {
    double MeanSq = 0;
    for (int64_t J = 0; J < H; ++J)
      MeanSq += X[R * H + J] * X[R * H + J] / H;
    double Ref = 1 / std::sqrt(MeanSq + Eps);
    EXPECT_NEAR(Rstd[R], Ref, 1e-14);
    for (int64_t J = 0; J < H; ++J)
      EXPECT_NEAR(Y[R * H + J], X[R * H + J] * Ref * Gamma[J], 1e-14);
  }
  Vec DX(Rows * H), DGamma(H, 0.0);
  rmsNormBackward(DX.data(), DGamma.data(), W.data(), X.data(), Gamma.data(),
                  Rstd.data(), Rows, H);
  expectGradient("rms norm x", X, DX, Loss);
  expectGradient("rms norm gamma", Gamma, DGamma, Loss);
  // Each output alone gives the same values; DGamma accumulates.
  Vec DXOnly(Rows * H), Twice = DGamma;
  rmsNormBackward(DXOnly.data(), (double *)nullptr, W.data(), X.data(),
                  Gamma.data(), Rstd.data(), Rows, H);
  EXPECT_EQ(DXOnly, DX);
  rmsNormBackward((double *)nullptr, Twice.data(), W.data(), X.data(),
                  Gamma.data(), Rstd.data(), Rows, H);
  for (int64_t J = 0; J < H; ++J)
    EXPECT_DOUBLE_EQ(Twice[J], 2 * DGamma[J]);
}

//===----------------------------------------------------------------------===//
// 15. SiLU
//===----------------------------------------------------------------------===//

TEST(CpuKernelsTest, SiluValuesAndGradient) {
  double One = 1.0, Y;
  activation(Activation::Silu, &Y, &One, 1);
  EXPECT_NEAR(Y, 0.7310585786300049, 1e-15); // 1 / (1 + e^-1)
  // Far out, no overflow and no NaN: silu(x) = x and silu'(x) = 1 above,
  // both 0 below.
  for (bool Float : {false, true}) {
    Vec X = {1e4, -1e4, 800, -800}, DY(4, 1.0), Y(4), DX(4);
    if (Float) {
      std::vector<float> FX = toFloat(X), FDY = toFloat(DY), FY(4), FDX(4);
      activation(Activation::Silu, FY.data(), FX.data(), 4);
      activationBackward(Activation::Silu, FDX.data(), FX.data(), FDY.data(), 4);
      Y.assign(FY.begin(), FY.end());
      DX.assign(FDX.begin(), FDX.end());
    } else {
      activation(Activation::Silu, Y.data(), X.data(), 4);
      activationBackward(Activation::Silu, DX.data(), X.data(), DY.data(), 4);
    }
    EXPECT_EQ(Y, (Vec{1e4, 0.0, 800, 0.0})) << (Float ? "float" : "double");
    EXPECT_EQ(DX, (Vec{1.0, 0.0, 1.0, 0.0})) << (Float ? "float" : "double");
  }

  const int64_t N = 40;
  Vec X = randVec(N, 63, -6, 6), W = randVec(N, 64);
  auto Loss = [&] {
    Vec Y(N);
    activation(Activation::Silu, Y.data(), X.data(), N);
    return dotv(W, Y);
  };
  Vec DX(N);
  activationBackward(Activation::Silu, DX.data(), X.data(), W.data(), N);
  expectGradient("silu", X, DX, Loss);
  // In place.
  Vec Ref(N), InPlace = X, DInPlace = W;
  activation(Activation::Silu, Ref.data(), X.data(), N);
  activation(Activation::Silu, InPlace.data(), InPlace.data(), N);
  EXPECT_EQ(InPlace, Ref);
  activationBackward(Activation::Silu, DInPlace.data(), X.data(), DInPlace.data(), N);
  EXPECT_EQ(DInPlace, DX);
}

/// Every activation of ir/Ops.def (SP_UNARY_OP): its derivative matches
/// finite differences of its value, it runs in place, float rounds the double
/// result once, and far-out inputs stay finite.
TEST(CpuKernelsTest, EveryActivationHasItsDerivative) {
  struct Named {
    Activation F;
    const char *Name;
  };
  const Named All[] = {
#define SP_OP(Enum, Name)
#define SP_UNARY_OP(Enum, Name, OnnxName) {Activation::Enum, Name},
#include "ir/Ops.def"
  };
  const int64_t N = 64;
  for (const Named &A : All) {
    Vec X = randVec(N, 71, -6, 6), W = randVec(N, 72);
    auto Loss = [&] {
      Vec Y(N);
      activation(A.F, Y.data(), X.data(), N);
      return dotv(W, Y);
    };
    Vec DX(N);
    activationBackward(A.F, DX.data(), X.data(), W.data(), N);
    expectGradient(A.Name, X, DX, Loss);

    Vec Y(N), InPlace = X, DInPlace = W;
    activation(A.F, Y.data(), X.data(), N);
    activation(A.F, InPlace.data(), InPlace.data(), N);
    EXPECT_EQ(InPlace, Y) << A.Name;
    activationBackward(A.F, DInPlace.data(), X.data(), DInPlace.data(), N);
    EXPECT_EQ(DInPlace, DX) << A.Name;

    // float: the double value rounded once (half an ulp, 2^-24 relative).
    std::vector<float> FX = toFloat(X), FW = toFloat(W), FY(N), FDX(N);
    Vec XR(FX.begin(), FX.end()), WR(FW.begin(), FW.end()), YR(N), DXR(N);
    activation(A.F, FY.data(), FX.data(), N);
    activation(A.F, YR.data(), XR.data(), N);
    activationBackward(A.F, FDX.data(), FX.data(), FW.data(), N);
    activationBackward(A.F, DXR.data(), XR.data(), WR.data(), N);
    for (int64_t I = 0; I < N; ++I) {
      EXPECT_EQ(FY[I], float(YR[I])) << A.Name << " at " << I;
      EXPECT_EQ(FDX[I], float(DXR[I])) << A.Name << " at " << I;
    }

    Vec Far = {1e4, -1e4, 800, -800, 0}, Ones(Far.size(), 1.0);
    Vec FarY(Far.size()), FarDX(Far.size());
    activation(A.F, FarY.data(), Far.data(), int64_t(Far.size()));
    activationBackward(A.F, FarDX.data(), Far.data(), Ones.data(),
                       int64_t(Far.size()));
    for (size_t I = 0; I < Far.size(); ++I)
      EXPECT_TRUE(std::isfinite(FarY[I]) && std::isfinite(FarDX[I]))
          << A.Name << " at " << Far[I];
  }
}

//===----------------------------------------------------------------------===//
// 16. Elementwise product
//===----------------------------------------------------------------------===//

TEST(CpuKernelsTest, MulBroadcastGradient) {
  std::vector<int64_t> YS = {2, 3, 4}, AS = {3, 1}, BS = {2, 1, 4};
  Vec A = randVec(3, 65), B = randVec(8, 66), W = randVec(24, 67);
  auto Loss = [&] {
    Vec Y(24);
    EXPECT_TRUE(mulBroadcast(Y.data(), YS, A.data(), AS, B.data(), BS).ok());
    return dotv(W, Y);
  };
  Vec Y(24);
  expectOk(mulBroadcast(Y.data(), YS, A.data(), AS, B.data(), BS));
  EXPECT_DOUBLE_EQ(Y[1 * 12 + 2 * 4 + 3], A[2] * B[1 * 4 + 3]);
  // The backward, composed: DA = reduceToShape(AShape, DY * B), likewise DB.
  Vec WB(24), WA(24), DA(3), DB(8);
  expectOk(mulBroadcast(WB.data(), YS, W.data(), YS, B.data(), BS));
  expectOk(mulBroadcast(WA.data(), YS, W.data(), YS, A.data(), AS));
  expectOk(reduceToShape(DA.data(), AS, WB.data(), YS));
  expectOk(reduceToShape(DB.data(), BS, WA.data(), YS));
  expectGradient("mul broadcast a", A, DA, Loss);
  expectGradient("mul broadcast b", B, DB, Loss);

  // Shape errors are addBroadcast's.
  Vec Out(24);
  std::vector<int64_t> Bad = {3}, TooLong = {1, 2, 3, 4}, Rank7(7, 1);
  for (const std::vector<int64_t> &In : {Bad, TooLong}) {
    Status SA = addBroadcast(Out.data(), YS, A.data(), In, B.data(), BS);
    Status SM = mulBroadcast(Out.data(), YS, A.data(), In, B.data(), BS);
    ASSERT_FALSE(SM.ok());
    EXPECT_STREQ(SM.Message, SA.Message);
    EXPECT_EQ(SM.Index, SA.Index);
  }
  Status SM = mulBroadcast(Out.data(), Rank7, A.data(), AS, B.data(), BS);
  ASSERT_FALSE(SM.ok());
  EXPECT_STREQ(SM.Message, "broadcast: rank above MaxRank");
}

TEST(CpuKernelsTest, MulSameShapeAndInPlace) {
  Vec A = {1, 2, 3}, B = {10, -20, 0.5}, Y(3);
  mul(Y.data(), A.data(), B.data(), 3);
  EXPECT_EQ(Y, (Vec{10, -40, 1.5}));
  Vec A2 = A, B2 = B;
  mul(A2.data(), A2.data(), B.data(), 3);
  mul(B2.data(), A.data(), B2.data(), 3);
  EXPECT_EQ(A2, Y);
  EXPECT_EQ(B2, Y);
}

//===----------------------------------------------------------------------===//
// 17. Rotary position embedding
//===----------------------------------------------------------------------===//

/// rope written as the reference implementations write it: rot(x) built as
/// a vector (HF rotate_half, or GPT-J rotate_every_two), then x * c +
/// rot(x) * s.
Vec ropeReference(const Vec &X, const Vec &Cos, const Vec &Sin, int64_t B,
                  int64_t A, int64_t S, int64_t D, int64_t CB,
                  bool Interleaved) {
  Vec Y(X.size()), Rot(D);
  const int64_t Half = D / 2;
  for (int64_t Bi = 0; Bi < B; ++Bi)
    for (int64_t Ai = 0; Ai < A; ++Ai)
      for (int64_t Si = 0; Si < S; ++Si) {
        const double *XR = &X[((Bi * A + Ai) * S + Si) * D];
        const double *C = &Cos[((CB == 1 ? 0 : Bi) * S + Si) * D];
        const double *N = &Sin[((CB == 1 ? 0 : Bi) * S + Si) * D];
        for (int64_t I = 0; I < Half; ++I) {
          if (Interleaved) {
            Rot[2 * I] = -XR[2 * I + 1];
            Rot[2 * I + 1] = XR[2 * I];
          } else {
            Rot[I] = -XR[I + Half];
            Rot[I + Half] = XR[I];
          }
        }
        double *YR = &Y[((Bi * A + Ai) * S + Si) * D];
        for (int64_t I = 0; I < D; ++I)
          YR[I] = XR[I] * C[I] + Rot[I] * N[I];
      }
  return Y;
}

/// HF's tables for positions Pos0[b] + s: angle(s, k) = (Pos0[b] + s) *
/// Base^(-2k / D), laid out as cat(freqs, freqs) (half form) or each
/// frequency twice in a row (interleaved).
void ropeTables(Vec &Cos, Vec &Sin, const std::vector<int64_t> &Pos0,
                int64_t S, int64_t D, bool Interleaved) {
  const double Base = 10000.0;
  int64_t CB = int64_t(Pos0.size());
  Cos.assign(CB * S * D, 0.0);
  Sin.assign(CB * S * D, 0.0);
  for (int64_t Bi = 0; Bi < CB; ++Bi)
    for (int64_t Si = 0; Si < S; ++Si)
      for (int64_t I = 0; I < D; ++I) {
        int64_t K = Interleaved ? I / 2 : I % (D / 2);
        double Angle = double(Pos0[Bi] + Si) * std::pow(Base, -2.0 * K / D);
        Cos[(Bi * S + Si) * D + I] = std::cos(Angle);
        Sin[(Bi * S + Si) * D + I] = std::sin(Angle);
      }
}

TEST(CpuKernelsTest, RopeValuesAndGradient) {
  const int64_t B = 2, A = 3, S = 4, D = 6, N = B * A * S * D;
  for (bool Interleaved : {false, true})
    for (int64_t CB : {int64_t(1), B}) {
      SCOPED_TRACE(testing::Message()
                   << (Interleaved ? "interleaved" : "half") << " CB " << CB);
      // Random tables (no symmetry between the halves or the pairs, so that
      // a wrong index in the transpose shows).
      Vec X = randVec(N, 80), W = randVec(N, 81),
          Cos = randVec(CB * S * D, 82), Sin = randVec(CB * S * D, 83);
      auto Forward = [&] {
        Vec Y(N);
        rope(Y.data(), X.data(), Cos.data(), Sin.data(), B, A, S, D, CB,
             Interleaved);
        return Y;
      };
      Vec Y = Forward(),
          Ref = ropeReference(X, Cos, Sin, B, A, S, D, CB, Interleaved);
      for (int64_t I = 0; I < N; ++I)
        EXPECT_NEAR(Y[I], Ref[I], 1e-15) << I;
      Vec DX(N);
      ropeBackward(DX.data(), W.data(), Cos.data(), Sin.data(), B, A, S, D, CB,
                   Interleaved);
      expectGradient("rope", X, DX, [&] { return dotv(W, Forward()); });

      // HF's tables for positions that differ per batch row (CB = B) or are
      // shared: a rotation of each pair, so every row keeps its norm.
      std::vector<int64_t> Pos0 =
          CB == 1 ? std::vector<int64_t>{0} : std::vector<int64_t>{0, 5};
      ropeTables(Cos, Sin, Pos0, S, D, Interleaved);
      Y = Forward();
      Ref = ropeReference(X, Cos, Sin, B, A, S, D, CB, Interleaved);
      for (int64_t R = 0; R < N / D; ++R) {
        double NX = 0, NY = 0;
        for (int64_t I = 0; I < D; ++I) {
          NX += X[R * D + I] * X[R * D + I];
          NY += Y[R * D + I] * Y[R * D + I];
          EXPECT_NEAR(Y[R * D + I], Ref[R * D + I], 1e-15);
        }
        EXPECT_NEAR(NY, NX, 1e-14);
      }
    }
  // A table shared by the batch is the same as that table repeated.
  Vec X = randVec(N, 84), Cos1 = randVec(S * D, 85), Sin1 = randVec(S * D, 86);
  Vec CosB = Cos1, SinB = Sin1;
  CosB.insert(CosB.end(), Cos1.begin(), Cos1.end());
  SinB.insert(SinB.end(), Sin1.begin(), Sin1.end());
  Vec Y1(N), YB(N);
  rope(Y1.data(), X.data(), Cos1.data(), Sin1.data(), B, A, S, D, 1, false);
  rope(YB.data(), X.data(), CosB.data(), SinB.data(), B, A, S, D, B, false);
  EXPECT_EQ(Y1, YB);
}

TEST(CpuKernelsTest, PartialRopeRotatesTheFirstDimsAndPassesTheRest) {
  // GPT-NeoX's rotary_pct: [1, S, R] tables rotate dims [0, R) of each row
  // as a rope of width R would, and dims [R, D) are copied, forward and
  // backward, in both forms.
  const int64_t B = 2, A = 3, S = 4, D = 8, R = 4, Rows = B * A * S;
  Vec X = randVec(Rows * D, 91), Cos = randVec(S * R, 92),
      Sin = randVec(S * R, 93);
  Vec Narrow(Rows * R);
  for (int64_t Row = 0; Row < Rows; ++Row)
    for (int64_t I = 0; I < R; ++I)
      Narrow[Row * R + I] = X[Row * D + I];
  for (bool Interleaved : {false, true})
    for (bool Backward : {false, true}) {
      Vec Y(X.size()), Want(Narrow.size());
      auto Run = Backward ? ropeBackward<double> : rope<double>;
      Run(Y.data(), X.data(), Cos.data(), Sin.data(), B, A, S, D, 1,
          Interleaved, R);
      Run(Want.data(), Narrow.data(), Cos.data(), Sin.data(), B, A, S, R, 1,
          Interleaved, 0);
      for (int64_t Row = 0; Row < Rows; ++Row)
        for (int64_t I = 0; I < D; ++I)
          EXPECT_EQ(Y[Row * D + I], I < R ? Want[Row * R + I] : X[Row * D + I])
              << Interleaved << Backward << Row << " " << I;
    }
}

//===----------------------------------------------------------------------===//
// 18. Grouped-query attention's head repeat
//===----------------------------------------------------------------------===//

TEST(CpuKernelsTest, RepeatHeadsLayoutAndGradient) {
  const int64_t B = 2, G = 3, R = 2, S = 3, D = 4;
  const int64_t NX = B * G * S * D, NY = NX * R;
  Vec X = randVec(NX, 90), W = randVec(NY, 91), Y(NY);
  repeatHeads(Y.data(), X.data(), B, G, R, S, D);
  for (int64_t Bi = 0; Bi < B; ++Bi)
    for (int64_t Gi = 0; Gi < G; ++Gi)
      for (int64_t Ri = 0; Ri < R; ++Ri)
        for (int64_t Si = 0; Si < S; ++Si)
          for (int64_t T = 0; T < D; ++T)
            ASSERT_EQ(Y[((Bi * G * R + Gi * R + Ri) * S + Si) * D + T],
                      X[((Bi * G + Gi) * S + Si) * D + T]);
  auto Loss = [&] {
    Vec Y(NY);
    repeatHeads(Y.data(), X.data(), B, G, R, S, D);
    return dotv(W, Y);
  };
  Vec DX(NX);
  repeatHeadsBackward(DX.data(), W.data(), B, G, R, S, D);
  expectGradient("repeat heads", X, DX, Loss);
  // It is the broadcast reduction [B, G, R, S, D] -> [B, G, 1, S, D].
  Vec Reduced(NX);
  expectOk(reduceToShape(Reduced.data(), std::vector<int64_t>{B, G, 1, S, D},
                         W.data(), std::vector<int64_t>{B, G, R, S, D}));
  EXPECT_EQ(Reduced, DX);
  // R = 1 is a copy both ways.
  Vec Copy(NX), Back(NX);
  repeatHeads(Copy.data(), X.data(), B, G, 1, S, D);
  repeatHeadsBackward(Back.data(), Copy.data(), B, G, 1, S, D);
  EXPECT_EQ(Copy, X);
  EXPECT_EQ(Back, X);
}

//===----------------------------------------------------------------------===//
// float against double
//===----------------------------------------------------------------------===//

TEST(CpuFloatTest, MatchesDouble) {
  const int64_t Rows = 5, H = 16;
  Vec X = randVec(Rows * H, 40, -3, 3), Gamma = randVec(H, 41),
      Beta = randVec(H, 42), DY = randVec(Rows * H, 43);
  auto FX = toFloat(X), FGamma = toFloat(Gamma), FBeta = toFloat(Beta),
       FDY = toFloat(DY);
  {
    Vec Y(Rows * H), Mean(Rows), Rstd(Rows), DX(Rows * H), DG(H, 0.0);
    std::vector<float> FY(Rows * H), FMean(Rows), FRstd(Rows), FDX(Rows * H),
        FDG(H, 0.0f);
    layerNorm(Y.data(), Mean.data(), Rstd.data(), X.data(), Gamma.data(),
              Beta.data(), Rows, H, 1e-5);
    layerNorm(FY.data(), FMean.data(), FRstd.data(), FX.data(), FGamma.data(),
              FBeta.data(), Rows, H, 1e-5);
    expectClose(FY, Y, 1e-5, "layer norm");
    layerNormBackward(DX.data(), DG.data(), (double *)nullptr, DY.data(),
                      X.data(), Gamma.data(), Mean.data(), Rstd.data(), Rows,
                      H);
    layerNormBackward(FDX.data(), FDG.data(), (float *)nullptr, FDY.data(),
                      FX.data(), FGamma.data(), FMean.data(), FRstd.data(),
                      Rows, H);
    expectClose(FDX, DX, 1e-5, "layer norm backward");
    expectClose(FDG, DG, 1e-5, "layer norm dgamma");
  }
  {
    Vec Y(Rows * H);
    std::vector<float> FY(Rows * H);
    softmax(Y.data(), X.data(), Rows, H);
    softmax(FY.data(), FX.data(), Rows, H);
    expectClose(FY, Y, 1e-6, "softmax");
    for (GeluApprox A : {GeluApprox::None, GeluApprox::Tanh}) {
      gelu(Y.data(), X.data(), Rows * H, A);
      gelu(FY.data(), FX.data(), Rows * H, A);
      expectClose(FY, Y, 1e-6, "gelu");
      geluBackward(Y.data(), X.data(), DY.data(), Rows * H, A);
      geluBackward(FY.data(), FX.data(), FDY.data(), Rows * H, A);
      expectClose(FY, Y, 1e-5, "gelu backward");
    }
  }
  {
    const int64_t Out = 8;
    Vec W = randVec(Out * H, 44), Y(Rows * Out);
    std::vector<float> FW = toFloat(W), FY(Rows * Out);
    linear(Y.data(), X.data(), W.data(), Beta.data(), Rows, H, Out, true);
    linear(FY.data(), FX.data(), FW.data(), FBeta.data(), Rows, H, Out, true);
    expectClose(FY, Y, 1e-5, "linear");
  }
  {
    std::vector<int64_t> Targets = {1, 15, 0, 7, 7};
    double L;
    float FL;
    expectOk(crossEntropy(&L, X.data(), Targets.data(), Rows, H, 14 + 2));
    expectOk(crossEntropy(&FL, FX.data(), Targets.data(), Rows, H, 16));
    EXPECT_NEAR(FL, L, 1e-6 * std::max(1.0, L));
  }
}

TEST(CpuFloatTest, GeluIsAccurateIncludingTheTails) {
  // The float GELUs are computed in double and rounded once: within a few
  // float ulps *relative* of a double reference written so that it does not
  // cancel (erfc, and 1 + tanh u = 2 / (1 + exp(-2u))), also far in the
  // lower tail, where 0.5 x (1 + erf) in float would lose every digit.
  std::vector<float> FX;
  for (double X = -12.0; X <= 12.0; X += 1.0 / 64)
    FX.push_back(float(X) + 1e-3f);
  FX.insert(FX.end(), {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-8f, -1e-8f});
  const int64_t N = int64_t(FX.size());
  std::vector<float> FDY(N, 1.0f), FY(N);
  const double Pi = 3.14159265358979323846;
  for (GeluApprox A : {GeluApprox::None, GeluApprox::Tanh})
    for (bool Backward : {false, true}) {
      if (Backward)
        geluBackward(FY.data(), FX.data(), FDY.data(), N, A);
      else
        gelu(FY.data(), FX.data(), N, A);
      for (int64_t I = 0; I < N; ++I) {
        double X = FX[I], Ref;
        if (A == GeluApprox::None) {
          double Cdf = 0.5 * std::erfc(-X / std::sqrt(2.0));
          Ref = Backward ? Cdf + X * std::exp(-0.5 * X * X) / std::sqrt(2 * Pi)
                         : X * Cdf;
        } else {
          double C = std::sqrt(2 / Pi), U = C * (X + 0.044715 * X * X * X);
          double P = 2 / (1 + std::exp(-2 * U)), Q = 2 / (1 + std::exp(2 * U));
          double DU = C * (1 + 3 * 0.044715 * X * X);
          Ref = Backward ? 0.5 * P + 0.5 * X * P * Q * DU : 0.5 * X * P;
        }
        EXPECT_NEAR(FY[I], Ref, 4e-7 * std::fabs(Ref) + 1e-40)
            << (A == GeluApprox::None ? "erf" : "tanh")
            << (Backward ? " backward" : " forward") << " at x = " << X;
      }
    }
}

TEST(CpuFloatTest, SiluIsAccurateIncludingTheTails) {
  // Computed in double and rounded once: within a float ulp relative
  // (2^-23; one rounding is at most half of it) of a double reference, also
  // where sigmoid is tiny (x << 0) or 1 - sigmoid is (x >> 0, the backward's
  // x (1 - s)), and finite at +-1e4 and +-3e38. 1e-44 absolute covers
  // float's subnormal results (activation(Activation::Silu, x) for x below about -88).
  std::vector<float> FX;
  for (double X = -90.0; X <= 90.0; X += 1.0 / 16)
    FX.push_back(float(X) + 1e-3f);
  FX.insert(FX.end(), {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-8f, -1e-8f, 1e4f,
                       -1e4f, 3e38f, -3e38f});
  const int64_t N = int64_t(FX.size());
  std::vector<float> FDY(N, 1.0f), FY(N);
  for (bool Backward : {false, true}) {
    if (Backward)
      activationBackward(Activation::Silu, FY.data(), FX.data(), FDY.data(), N);
    else
      activation(Activation::Silu, FY.data(), FX.data(), N);
    for (int64_t I = 0; I < N; ++I) {
      double X = FX[I];
      double Sig = 1 / (1 + std::exp(-X)), OneMinus = 1 / (1 + std::exp(X));
      double Ref = Backward ? Sig * (1 + X * OneMinus) : X * Sig;
      ASSERT_TRUE(std::isfinite(FY[I])) << "at x = " << X;
      EXPECT_NEAR(FY[I], Ref, 0x1p-23 * std::fabs(Ref) + 1e-44)
          << (Backward ? "backward" : "forward") << " at x = " << X;
    }
  }
}

/// Float's unit roundoff: rounding a real number to float moves it by at
/// most FloatU times its magnitude.
constexpr double FloatU = 0x1p-24;

/// Inputs that float represents exactly, so that the float and the double
/// kernels see the same values and differ only by their own roundings.
Vec floatValues(Vec V) {
  for (double &X : V)
    X = double(float(X));
  return V;
}

/// F (the float kernel) against D (the double kernel on the same inputs)
/// within K float roundings of Scale[i], a bound on the magnitudes of the
/// terms element i is computed from (so that a cancellation between them is
/// allowed for). The double kernel's own error (2^-53 relative) is far
/// below and ignored. denorm_min covers results in float's subnormal range.
void expectWithinRoundings(const std::vector<float> &F, const Vec &D,
                           const Vec &Scale, double K, const char *What) {
  ASSERT_EQ(F.size(), D.size());
  ASSERT_EQ(Scale.size(), D.size());
  for (size_t I = 0; I < D.size(); ++I)
    EXPECT_NEAR(F[I], D[I],
                K * FloatU * Scale[I] +
                    std::numeric_limits<float>::denorm_min())
        << What << " at " << I;
}

Vec absOf(const Vec &V) {
  Vec A(V.size());
  for (size_t I = 0; I < V.size(); ++I)
    A[I] = std::fabs(V[I]);
  return A;
}

/// |first term| + |second term| of every element of rope (Backward: of
/// ropeBackward) on X: |x[i] c[i]| + |x[p] n[i]| (backward: n[p]), p the
/// element i is paired with. The scale of the float kernel's rounding errors.
Vec ropeTermScale(const Vec &X, const Vec &Cos, const Vec &Sin, int64_t B,
                  int64_t A, int64_t S, int64_t D, int64_t CB,
                  bool Interleaved, bool Backward) {
  Vec Scale(X.size());
  for (int64_t Row = 0; Row < B * A * S; ++Row) {
    int64_t Table = ((CB == 1 ? 0 : Row / (A * S)) * S + Row % S) * D;
    for (int64_t I = 0; I < D; ++I) {
      int64_t P = Interleaved ? (I ^ 1) : (I < D / 2 ? I + D / 2 : I - D / 2);
      double N = Sin[Table + (Backward ? P : I)];
      Scale[Row * D + I] = std::fabs(X[Row * D + I] * Cos[Table + I]) +
                           std::fabs(X[Row * D + P] * N);
    }
  }
  return Scale;
}

TEST(CpuFloatTest, MatchesDoubleWithinRoundings) {
  const int64_t Rows = 5, H = 16, N = Rows * H;
  Vec X = floatValues(randVec(N, 100, -3, 3)),
      Gamma = floatValues(randVec(H, 101)), DY = floatValues(randVec(N, 102));
  auto FX = toFloat(X), FGamma = toFloat(Gamma), FDY = toFloat(DY);
  {
    // Both kernels evaluate the same double expressions; the float one rounds
    // Y and Rstd once: 1 rounding of |Y|, |Rstd|.
    Vec Y(N), Rstd(Rows), DX(N), DG(H, 0.0);
    std::vector<float> FY(N), FRstd(Rows), FDX(N), FDG(H, 0.0f);
    rmsNorm(Y.data(), Rstd.data(), X.data(), Gamma.data(), Rows, H, 1e-6);
    rmsNorm(FY.data(), FRstd.data(), FX.data(), FGamma.data(), Rows, H, 1e-6);
    expectWithinRoundings(FY, Y, absOf(Y), 1, "rms norm");
    expectWithinRoundings(FRstd, Rstd, absOf(Rstd), 1, "rms norm rstd");
    rmsNormBackward(DX.data(), DG.data(), DY.data(), X.data(), Gamma.data(),
                    Rstd.data(), Rows, H);
    rmsNormBackward(FDX.data(), FDG.data(), FDY.data(), FX.data(),
                    FGamma.data(), FRstd.data(), Rows, H);
    // The float backward reads Rstd rounded, r (1 + d) with |d| <= u, so
    // xhat and m = mean(g xhat) carry (1 + d) each: DX = r (g - xhat m) is
    // off by u r |g - xhat m| + 2u r |xhat m|, then rounded once: at most
    // 4u r (|g| + |xhat m|); K = 8 leaves a factor 2. DGamma = sum DY xhat:
    // u sum |DY xhat| plus one rounding, K = 4.
    Vec ScaleDX(N), ScaleDG(H, 0.0);
    for (int64_t R = 0; R < Rows; ++R) {
      double M = 0;
      for (int64_t J = 0; J < H; ++J)
        M += DY[R * H + J] * Gamma[J] * X[R * H + J] * Rstd[R] / H;
      for (int64_t J = 0; J < H; ++J) {
        double XHat = X[R * H + J] * Rstd[R];
        ScaleDX[R * H + J] =
            Rstd[R] * (std::fabs(DY[R * H + J] * Gamma[J]) +
                       std::fabs(XHat * M));
        ScaleDG[J] += std::fabs(DY[R * H + J] * XHat);
      }
    }
    expectWithinRoundings(FDX, DX, ScaleDX, 8, "rms norm backward");
    expectWithinRoundings(FDG, DG, ScaleDG, 4, "rms norm dgamma");
  }
  {
    // SiLU: the same double expression, rounded once.
    Vec Y(N), DX(N);
    std::vector<float> FY(N), FDX(N);
    activation(Activation::Silu, Y.data(), X.data(), N);
    activation(Activation::Silu, FY.data(), FX.data(), N);
    expectWithinRoundings(FY, Y, absOf(Y), 1, "silu");
    activationBackward(Activation::Silu, DX.data(), X.data(), DY.data(), N);
    activationBackward(Activation::Silu, FDX.data(), FX.data(), FDY.data(), N);
    expectWithinRoundings(FDX, DX, absOf(DX), 1, "silu backward");
  }
  {
    // A product of two floats is exact in double: one rounding.
    Vec Y(N);
    std::vector<float> FY(N);
    mul(Y.data(), X.data(), DY.data(), N);
    mul(FY.data(), FX.data(), FDY.data(), N);
    expectWithinRoundings(FY, Y, absOf(Y), 1, "mul");
    std::vector<int64_t> YS = {Rows, H}, GS = {H};
    expectOk(mulBroadcast(Y.data(), YS, X.data(), YS, Gamma.data(), GS));
    expectOk(mulBroadcast(FY.data(), YS, FX.data(), YS, FGamma.data(), GS));
    expectWithinRoundings(FY, Y, absOf(Y), 1, "mul broadcast");
  }
  {
    // rope in float rounds x c, x' n and their sum: at most
    // u |x c| + u |x' n| + u (|x c| + |x' n|) (1 + u), so K = 3 of
    // |x c| + |x' n| (and likewise for the backward's terms).
    const int64_t B = 2, A = 2, S = 5, D = 8, NR = B * A * S * D;
    for (bool Interleaved : {false, true}) {
      Vec RX = floatValues(randVec(NR, 103)),
          RDY = floatValues(randVec(NR, 104));
      Vec Cos, Sin;
      ropeTables(Cos, Sin, {3, 11}, S, D, Interleaved);
      Cos = floatValues(Cos);
      Sin = floatValues(Sin);
      auto FRX = toFloat(RX), FRDY = toFloat(RDY), FCos = toFloat(Cos),
           FSin = toFloat(Sin);
      Vec Y(NR), DX(NR);
      std::vector<float> FY(NR), FDX(NR);
      rope(Y.data(), RX.data(), Cos.data(), Sin.data(), B, A, S, D, B,
           Interleaved);
      rope(FY.data(), FRX.data(), FCos.data(), FSin.data(), B, A, S, D, B,
           Interleaved);
      ropeBackward(DX.data(), RDY.data(), Cos.data(), Sin.data(), B, A, S, D,
                   B, Interleaved);
      ropeBackward(FDX.data(), FRDY.data(), FCos.data(), FSin.data(), B, A, S,
                   D, B, Interleaved);
      expectWithinRoundings(
          FY, Y, ropeTermScale(RX, Cos, Sin, B, A, S, D, B, Interleaved, false),
          3, "rope");
      expectWithinRoundings(
          FDX, DX,
          ropeTermScale(RDY, Cos, Sin, B, A, S, D, B, Interleaved, true), 3,
          "rope backward");
    }
  }
  {
    // repeatHeads copies; its backward sums R floats in double (error
    // R 2^-53 relative to sum |DY|) and rounds once: K = 2 of sum_r |DY|.
    const int64_t B = 1, G = 2, R = 3, S = 2, D = 4, NX = B * G * S * D;
    Vec RDY = floatValues(randVec(NX * R, 105)), DX(NX), Scale(NX, 0.0);
    auto FRDY = toFloat(RDY);
    std::vector<float> FDX(NX), FY(NX * R);
    repeatHeads(FY.data(), FX.data(), B, G, R, S, D);
    for (int64_t P = 0; P < B * G; ++P)
      for (int64_t Ri = 0; Ri < R; ++Ri)
        for (int64_t E = 0; E < S * D; ++E) {
          ASSERT_EQ(FY[(P * R + Ri) * S * D + E], FX[P * S * D + E]);
          Scale[P * S * D + E] += std::fabs(RDY[(P * R + Ri) * S * D + E]);
        }
    repeatHeadsBackward(DX.data(), RDY.data(), B, G, R, S, D);
    repeatHeadsBackward(FDX.data(), FRDY.data(), B, G, R, S, D);
    expectWithinRoundings(FDX, DX, Scale, 2, "repeat heads backward");
  }
  {
    // Cross entropy with ignored targets: the same double sums, the loss and
    // each gradient entry rounded once.
    std::vector<int64_t> Targets = {1, -100, 0, 13, -100};
    const int64_t Ignore = -100, ValidV = 14;
    double L;
    float FL;
    expectOk(crossEntropy(&L, X.data(), Targets.data(), Rows, H, ValidV,
                          Ignore));
    expectOk(crossEntropy(&FL, FX.data(), Targets.data(), Rows, H, ValidV,
                          Ignore));
    expectWithinRoundings({FL}, {L}, {std::fabs(L)}, 1, "cross entropy");
    Vec DL(N);
    std::vector<float> FDL(N);
    expectOk(crossEntropyBackward(DL.data(), X.data(), Targets.data(), 0.7,
                                  Rows, H, ValidV, Ignore));
    expectOk(crossEntropyBackward(FDL.data(), FX.data(), Targets.data(), 0.7,
                                  Rows, H, ValidV, Ignore));
    expectWithinRoundings(FDL, DL, absOf(DL), 1, "cross entropy backward");
  }
}

/// Runs Fn once with one kernel thread and once with three; Fn returns the
/// bytes of its results.
void expectSameOnThreads(const char *What,
                         const std::function<std::vector<char>()> &Fn) {
  setKernelThreads(1);
  std::vector<char> One = Fn();
  setKernelThreads(3);
  std::vector<char> Three = Fn();
  setKernelThreads(1);
  EXPECT_TRUE(One == Three) << What << " depends on the thread count";
}

template <typename... V> std::vector<char> bytesOf(const V &...Vs) {
  std::vector<char> B;
  (
      [&](const auto &X) {
        const char *P = reinterpret_cast<const char *>(X.data());
        B.insert(B.end(), P, P + X.size() * sizeof(X[0]));
      }(Vs),
      ...);
  return B;
}

/// Jobs of 1 to 4 parts back to back on 4 threads (more than this machine's
/// cores, so that workers are descheduled mid-read): every index is run
/// exactly once and every job waits for its parts. A worker left out of one
/// job may still be reading it while the next is written; the pool's
/// seqlock keeps it from taking the next job's part count for the old job's
/// (which ran a part twice and drove the pending count below zero: the
/// caller then waited forever).
TEST(CpuParallelTest, PoolRunsEveryIndexOnceAcrossJobsOfAnySize) {
  const int Before = kernelThreads();
  setKernelThreads(4);
  std::mt19937 Rng(7);
  std::vector<std::atomic<int>> Hits(64);
  int Bad = 0;
  for (int Job = 0; Job < 5000 && Bad == 0; ++Job) {
    int64_t N = 1 + Rng() % 4, Grain = 1;
    if (Rng() % 2)
      N = 4 + Rng() % 60; // 4 parts of varied sizes
    for (int64_t I = 0; I < N; ++I)
      Hits[I].store(0, std::memory_order_relaxed);
    parallelFor(N, Grain, [&](int64_t Begin, int64_t End) {
      for (int64_t I = Begin; I < End; ++I)
        Hits[I].fetch_add(1, std::memory_order_relaxed);
    });
    for (int64_t I = 0; I < N; ++I)
      Bad += Hits[I].load(std::memory_order_relaxed) != 1;
  }
  setKernelThreads(Before);
  EXPECT_EQ(Bad, 0);
}

TEST(CpuParallelTest, KernelsAreBitwiseIndependentOfTheThreadCount) {
  // Sizes well above the kernels' grains, so that three threads split them.
  const int64_t Rows = 301, H = 257, N = Rows * H;
  Vec XD = randVec(N, 50, -4, 4), DYD = randVec(N, 51);
  std::vector<float> X = toFloat(XD), DY = toFloat(DYD),
                     Gamma = toFloat(randVec(H, 52)),
                     Beta = toFloat(randVec(H, 53));
  expectSameOnThreads("gelu", [&] {
    std::vector<float> Y(N), DX(N), Y2(N), DX2(N);
    gelu(Y.data(), X.data(), N, GeluApprox::None);
    geluBackward(DX.data(), X.data(), DY.data(), N, GeluApprox::None);
    gelu(Y2.data(), X.data(), N, GeluApprox::Tanh);
    geluBackward(DX2.data(), X.data(), DY.data(), N, GeluApprox::Tanh);
    return bytesOf(Y, DX, Y2, DX2);
  });
  expectSameOnThreads("dropout", [&] {
    const DropoutKey K{99, 4, 1, 3};
    std::vector<int64_t> GS = {3, Rows, H}, LS = {2, Rows - 100, H},
                         Off = {1, 37, 0};
    std::vector<float> Y(N), DX(N), YB(2 * (Rows - 100) * H);
    // The block has more elements than X: its own input.
    std::vector<float> XB = toFloat(randVec(YB.size(), 54, -4, 4));
    std::vector<uint8_t> M(N), MB(YB.size());
    expectOk(dropout(Y.data(), M.data(), X.data(), 0.1, K,
                     GlobalIndex::whole(std::vector<int64_t>{Rows, H})));
    dropoutBackward(DX.data(), DY.data(), M.data(), N, 0.1);
    expectOk(dropout(YB.data(), MB.data(), XB.data(), 0.1, K,
                     GlobalIndex::block(GS, LS, Off)));
    return bytesOf(Y, M, DX, YB, MB);
  });
  expectSameOnThreads("softmax and causal mask", [&] {
    std::vector<float> S(N), P(N), DS(N);
    causalMask(S.data(), X.data(), 1, Rows, H, -1e9, 3, 0);
    softmax(P.data(), S.data(), Rows, H);
    softmaxBackward(DS.data(), P.data(), DY.data(), Rows, H);
    return bytesOf(S, P, DS);
  });
  expectSameOnThreads("layer norm", [&] {
    std::vector<float> Y(N), Mean(Rows), Rstd(Rows), DX(N), DG(H, 0.5f),
        DB(H, -0.25f), DBias(H, 1.0f);
    layerNorm(Y.data(), Mean.data(), Rstd.data(), X.data(), Gamma.data(),
              Beta.data(), Rows, H, 1e-5);
    layerNormBackward(DX.data(), DG.data(), DB.data(), DY.data(), X.data(),
                      Gamma.data(), Mean.data(), Rstd.data(), Rows, H);
    biasBackward(DBias.data(), DY.data(), Rows, H);
    return bytesOf(Y, Mean, Rstd, DX, DG, DB, DBias);
  });
  expectSameOnThreads("head layouts", [&] {
    // 600 tokens of 3 x 4 heads of 8: split into several runs per thread.
    const int64_t B = 2, S = 300, Heads = 4, D = 8, E = B * S * Heads * D;
    std::vector<float> QKV = toFloat(randVec(3 * E, 90)), Q(E), K(E), V(E),
                       Back(3 * E), M(E), MB(E);
    splitHeads(Q.data(), K.data(), V.data(), QKV.data(), B, S, Heads, D);
    splitHeadsBackward(Back.data(), Q.data(), K.data(), V.data(), B, S, Heads,
                       D);
    EXPECT_EQ(Back, QKV);
    mergeHeads(M.data(), Q.data(), B, S, Heads, D);
    mergeHeadsBackward(MB.data(), M.data(), B, S, Heads, D);
    EXPECT_EQ(MB, Q);
    return bytesOf(Q, K, V, M);
  });
  expectSameOnThreads("cross entropy", [&] {
    std::vector<int64_t> Targets(Rows);
    for (int64_t R = 0; R < Rows; ++R)
      Targets[R] = (R * 37) % 250;
    std::vector<float> Loss(1), DL(N);
    expectOk(crossEntropy(Loss.data(), X.data(), Targets.data(), Rows, H, 250));
    expectOk(crossEntropyBackward(DL.data(), X.data(), Targets.data(), 1.0,
                                  Rows, H, 250));
    return bytesOf(Loss, DL);
  });
  expectSameOnThreads("adamw", [&] {
    std::vector<float> P = X, M(N, 0.01f), V(N, 0.02f), Sum(1);
    adamw(P.data(), DY.data(), M.data(), V.data(), N, 1e-3, 0.9, 0.999, 1e-8,
          0.01, 0.5, 3);
    Sum[0] = float(sumSquares(P.data(), N));
    return bytesOf(P, M, V, Sum);
  });
  expectSameOnThreads("rms norm", [&] {
    std::vector<float> Y(N), Rstd(Rows), DX(N), DG(H, 0.5f);
    rmsNorm(Y.data(), Rstd.data(), X.data(), Gamma.data(), Rows, H, 1e-6);
    rmsNormBackward(DX.data(), DG.data(), DY.data(), X.data(), Gamma.data(),
                    Rstd.data(), Rows, H);
    return bytesOf(Y, Rstd, DX, DG);
  });
  expectSameOnThreads("silu and mul", [&] {
    std::vector<float> Y(N), DX(N), P(N);
    activation(Activation::Silu, Y.data(), X.data(), N);
    activationBackward(Activation::Silu, DX.data(), X.data(), DY.data(), N);
    mul(P.data(), X.data(), DY.data(), N);
    return bytesOf(Y, DX, P);
  });
  expectSameOnThreads("rope", [&] {
    // [B, A, S, D] = [3, 7, 43, 64]: 903 rows of 64, tables per batch row
    // and shared, both forms.
    const int64_t B = 3, A = 7, S = 43, D = 64, NR = B * A * S * D;
    std::vector<float> Cos(X.begin(), X.begin() + B * S * D),
        Sin(DY.begin(), DY.begin() + B * S * D), Out;
    for (bool Interleaved : {false, true})
      for (int64_t CB : {int64_t(1), B}) {
        std::vector<float> Y(NR), DX(NR);
        rope(Y.data(), X.data(), Cos.data(), Sin.data(), B, A, S, D, CB,
             Interleaved);
        ropeBackward(DX.data(), DY.data(), Cos.data(), Sin.data(), B, A, S, D,
                     CB, Interleaved);
        Out.insert(Out.end(), Y.begin(), Y.end());
        Out.insert(Out.end(), DX.begin(), DX.end());
      }
    return bytesOf(Out);
  });
  expectSameOnThreads("cross entropy with ignored targets", [&] {
    std::vector<int64_t> Targets(Rows);
    for (int64_t R = 0; R < Rows; ++R)
      Targets[R] = R % 3 == 0 ? -100 : (R * 37) % 250;
    std::vector<float> Loss(1), DL(N);
    expectOk(crossEntropy(Loss.data(), X.data(), Targets.data(), Rows, H, 250,
                          int64_t(-100)));
    expectOk(crossEntropyBackward(DL.data(), X.data(), Targets.data(), 1.0,
                                  Rows, H, 250, int64_t(-100)));
    return bytesOf(Loss, DL);
  });
}

/// gemm cuts a large product into tiles fixed by its shape: they cover C
/// once, their sides are multiples of 128 but for the last, there are at
/// least 4 where the product allows it, small products stay whole,
/// and the result is each element's whole dot product (within K float
/// roundings of the sum of the terms' magnitudes, against double) on any
/// thread count, bitwise.
TEST(CpuGemmTest, TilesCoverCAndDoNotDependOnTheThreadCount) {
  EXPECT_EQ(gemmTiles(64, 64, 32).count(), 1);     // attention's blocks
  EXPECT_EQ(gemmTiles(1024, 1024, 256).count(), 4); // 2^28 multiply-adds
  EXPECT_GE(gemmTiles(1024, 3072, 768).count(), 8);
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1024, 1024, 256},
                         {300, 700, 129},
                         {1000, 130, 64},
                         {129, 1025, 200},
                         {8192, 768, 1024}}) {
    GemmTiles G = gemmTiles(M, N, K);
    EXPECT_EQ(G.Rows, (M + G.TM - 1) / G.TM);
    EXPECT_EQ(G.Cols, (N + G.TN - 1) / G.TN);
    EXPECT_TRUE(G.TM == M || G.TM % 128 == 0) << M << " " << G.TM;
    EXPECT_TRUE(G.TN == N || G.TN % 128 == 0) << N << " " << G.TN;
    if (G.count() > 1) { // no tile smaller than gemm's MinWork
      EXPECT_GE(std::min(G.TM, M) * std::min(G.TN, N) * K, int64_t(1) << 18);
    }
  }
  for (std::pair<bool, bool> Flags :
       {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
    // (Named copies: clang 14's lambdas cannot capture structured bindings.)
    const bool TA = Flags.first, TB = Flags.second;
    const int64_t M = 300, N = 700, K = 129, Ldc = N + 3;
    ASSERT_GT(gemmTiles(M, N, K).count(), 1);
    Vec AD = randVec(M * K, 60), BD = randVec(K * N, 61),
        CD = randVec(M * Ldc, 62);
    std::vector<float> A = toFloat(AD), B = toFloat(BD), C0 = toFloat(CD);
    // The product at beta 1 in double from the float inputs, and the sum
    // of its terms' magnitudes.
    Vec Want(M * N), Scale(M * N);
    for (int64_t I = 0; I < M; ++I)
      for (int64_t J = 0; J < N; ++J) {
        double S = 0.5 * double(C0[I * Ldc + J]),
               Abs = std::fabs(S);
        for (int64_t X = 0; X < K; ++X) {
          double T = double(A[TA ? X * M + I : I * K + X]) *
                     double(B[TB ? J * K + X : X * N + J]);
          S += T;
          Abs += std::fabs(T);
        }
        Want[I * N + J] = S;
        Scale[I * N + J] = Abs;
      }
    auto Run = [&] {
      std::vector<float> C = C0;
      gemm<float>(TA, TB, M, N, K, 1.0f, A.data(), TA ? M : K, B.data(),
                  TB ? K : N, 0.5f, C.data(), Ldc);
      return C;
    };
    expectSameOnThreads("gemm", [&] { return bytesOf(Run()); });
    std::vector<float> C = Run(), Got(M * N);
    for (int64_t I = 0; I < M; ++I) {
      for (int64_t J = 0; J < N; ++J)
        Got[I * N + J] = C[I * Ldc + J];
      for (int64_t J = N; J < Ldc; ++J) // the padding is not written
        EXPECT_EQ(C[I * Ldc + J], C0[I * Ldc + J]);
    }
    expectWithinRoundings(Got, Want, Scale, double(K + 2), "tiled gemm");
  }
}

/// A linear layer's bias is written tile by tile, by the thread that then
/// computes the tile (gemm's SetBias): the result is bit for bit gemm on C
/// filled with the bias beforehand, on any thread count.
TEST(CpuGemmTest, BiasTilesAreTheGemmOnTheBias) {
  for (std::tuple<int64_t, int64_t, int64_t> Shape :
       {std::tuple<int64_t, int64_t, int64_t>{300, 129, 700},
        {1024, 256, 1024},
        {7, 5, 3}})
    for (bool TransW : {false, true}) {
      // (Named copies: clang 14's lambdas cannot capture structured
      // bindings.)
      const int64_t Rows = std::get<0>(Shape), In = std::get<1>(Shape),
                    Out = std::get<2>(Shape);
      std::vector<float> X = toFloat(randVec(Rows * In, 80)),
                         W = toFloat(randVec(In * Out, 81)),
                         Bias = toFloat(randVec(Out, 82));
      std::vector<float> Want(Rows * Out);
      for (int64_t R = 0; R < Rows; ++R)
        std::copy(Bias.begin(), Bias.end(), Want.begin() + R * Out);
      gemm<float>(false, TransW, Rows, Out, In, 1.0f, X.data(), In, W.data(),
                  TransW ? In : Out, 1.0f, Want.data(), Out);
      auto Run = [&] {
        std::vector<float> Y(Rows * Out, -1.0f);
        linear(Y.data(), X.data(), W.data(), Bias.data(), Rows, In, Out,
               TransW);
        return Y;
      };
      expectSameOnThreads("linear", [&] { return bytesOf(Run()); });
      EXPECT_TRUE(bytesOf(Run()) == bytesOf(Want)) << Rows << " " << TransW;
    }
}

/// sumSquares over several chunks: each chunk a lane sum, the chunks' sums
/// in order, the same on any thread count.
TEST(CpuOptimizerTest, SumSquaresChunksInOrder) {
  const int64_t N = 3 * SquaresChunk + 12345;
  std::vector<float> G = toFloat(randVec(N, 83, -3, 3));
  double Want = 0;
  for (int64_t I0 = 0; I0 < N; I0 += SquaresChunk) {
    double Lane[8] = {};
    for (int64_t I = I0; I < std::min(N, I0 + SquaresChunk); ++I)
      Lane[(I - I0) % 8] += double(G[I]) * G[I];
    Want += ((Lane[0] + Lane[1]) + (Lane[2] + Lane[3])) +
            ((Lane[4] + Lane[5]) + (Lane[6] + Lane[7]));
  }
  EXPECT_EQ(sumSquares(G.data(), N), Want);
  expectSameOnThreads("sumSquares", [&] {
    double S = sumSquares(G.data(), N);
    std::vector<char> B(sizeof S);
    std::memcpy(B.data(), &S, sizeof S);
    return B;
  });
}

/// The fused attention softmax (scale, causal mask, softmax in one pass per
/// row, the masked tail's exps skipped where they are exactly 0) and its
/// gradient have the bits of the three kernels one after the other: for
/// fills whose exps are 0 (-inf, finfo.min, -1e4) and one whose are not
/// (-12), a scale and none, causal and not, in place and not, with a NaN
/// row, a -inf row and an infinite gradient.
template <typename T> void checkScaledCausalSoftmax() {
  const int64_t Batch = 3, Sq = 37, Sk = 37;
  const int64_t N = Batch * Sq * Sk;
  Vec XD = randVec(N, 70, -30, 30);
  std::vector<T> X(XD.begin(), XD.end());
  X[5 * Sk + 2] = std::numeric_limits<T>::quiet_NaN();
  for (int64_t J = 0; J < Sk; ++J)
    X[(Sq + 3) * Sk + J] = -std::numeric_limits<T>::infinity();
  for (double Fill : {-std::numeric_limits<double>::infinity(),
                      double(std::numeric_limits<float>::lowest()), -1e4,
                      -12.0})
    for (double Alpha : {1.0, 0.125})
      for (bool Causal : {true, false})
        for (bool InPlace : {false, true}) {
          std::vector<T> Want(N);
          const T *Src = X.data();
          if (Alpha != 1.0) {
            scale(Want.data(), Src, N, Alpha);
            Src = Want.data();
          }
          if (Causal) {
            causalMask(Want.data(), Src, Batch, Sq, Sk, Fill);
            Src = Want.data();
          }
          softmax(Want.data(), Src, Batch * Sq, Sk);
          std::vector<T> Got = InPlace ? X : std::vector<T>(N, T(7));
          scaledCausalSoftmax(Got.data(), InPlace ? Got.data() : X.data(),
                              Causal ? Batch : Batch * Sq, Causal ? Sq : 1,
                              Sk, Alpha, Causal, Fill);
          EXPECT_EQ(std::memcmp(Got.data(), Want.data(), N * sizeof(T)), 0)
              << "fill " << Fill << " alpha " << Alpha << " causal "
              << Causal << " in place " << InPlace;
          // The backward: softmaxBackward, causalMask (the gradient's fill,
          // 0, or here also the forward's), scale.
          Vec DYD = randVec(N, 71);
          std::vector<T> DY(DYD.begin(), DYD.end());
          DY[7] = std::numeric_limits<T>::infinity();
          for (double GradFill : {0.0, Fill}) {
            std::vector<T> WantD(N);
            softmaxBackward(WantD.data(), Want.data(), DY.data(), Batch * Sq,
                            Sk);
            if (Causal)
              causalMask(WantD.data(), WantD.data(), Batch, Sq, Sk, GradFill);
            if (Alpha != 1.0)
              scale(WantD.data(), WantD.data(), N, Alpha);
            std::vector<T> GotD = InPlace ? DY : std::vector<T>(N, T(7));
            scaledCausalSoftmaxBackward(
                GotD.data(), Want.data(), InPlace ? GotD.data() : DY.data(),
                Causal ? Batch : Batch * Sq, Causal ? Sq : 1, Sk, Alpha,
                Causal, GradFill);
            EXPECT_EQ(
                std::memcmp(GotD.data(), WantD.data(), N * sizeof(T)), 0)
                << "backward: fill " << Fill << " gradient fill " << GradFill
                << " alpha " << Alpha << " causal " << Causal << " in place "
                << InPlace;
          }
        }
}

TEST(CpuKernelsTest, ScaledCausalSoftmaxAndItsGradientAreTheThreeKernels) {
  checkScaledCausalSoftmax<float>();
  checkScaledCausalSoftmax<double>();
}

} // namespace
