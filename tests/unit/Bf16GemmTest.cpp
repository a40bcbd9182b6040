//===- Bf16GemmTest.cpp - the bfloat16 GEMMs (VDPBF16PS, AMX) and twins ---===//
//
// cpu::gemmBf16 against a float64 reference, for every micro-kernel: the
// portable twins of the instructions on every CPU, the AVX-512 BF16 and the
// AMX ones where the CPU has them. The bound is the classical one for a float32 sum in any
// order: |C - exact| <= gamma(n) (sum_k |a_k||b_k| + |C0|), gamma(n) =
// n u / (1 - n u), u = 2^-24, n the roundings on one element's path
// (bf16GemmRoundings: one per k, one per k-block added to C). The products
// of two bfloat16 values are exact in float32 and float64, so the float64
// reference has no error of its own at these sizes (a relative 2^-53 K,
// 2^-29 of the bound).
//
//===----------------------------------------------------------------------===//
#include "ir/Float16.h"
#include "runtime/cpu/Bf16Gemm.h"
#include "runtime/cpu/Parallel.h"
#include "gtest/gtest.h"
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace sp;
using namespace sp::cpu;

namespace {

struct GemmCase {
  bool TA, TB;
  int64_t M, N, K;
  float Beta;
};

/// Values of mixed signs over several binades, some exact zeros and, when
/// asked, bfloat16 denormals (which the instruction reads as zero).
std::vector<uint16_t> randomBf16(size_t N, uint32_t Seed, bool Denormals) {
  std::mt19937 Rng(Seed);
  std::uniform_real_distribution<float> U(-1, 1);
  std::vector<uint16_t> V(N);
  for (auto &X : V) {
    unsigned R = Rng() % 64;
    if (R == 0)
      X = 0;
    else if (R == 1 && Denormals)
      X = uint16_t(1 + Rng() % 0x7f) | uint16_t(Rng() % 2 ? 0x8000 : 0);
    else
      X = floatToBFloat16(std::ldexp(U(Rng), int(Rng() % 9) - 4));
  }
  return V;
}

/// The value the instruction reads: bfloat16 denormals are zero.
double readAs(uint16_t B) {
  float F = bfloat16ToFloat(B);
  return std::fpclassify(F) == FP_SUBNORMAL ? 0.0 : double(F);
}

/// Runs one case with Kernel and checks every element of C against the
/// float64 sum; C has a leading dimension above N whose padding must stay
/// untouched. Returns C.
std::vector<float> check(const GemmCase &T, Bf16Kernel Kernel, bool Denormals) {
  const int64_t Lda = (T.TA ? T.M : T.K) + 3, Ldb = (T.TB ? T.K : T.N) + 5,
                Ldc = T.N + 7;
  auto A = randomBf16((T.TA ? T.K : T.M) * Lda, 11 + T.M, Denormals);
  auto B = randomBf16((T.TB ? T.N : T.K) * Ldb, 13 + T.N, Denormals);
  std::vector<float> C(T.M * Ldc), C0(T.M * Ldc);
  std::mt19937 Rng(17);
  for (auto &X : C0)
    X = T.Beta != 0 ? float(int(Rng() % 201) - 100) / 64
                    : std::numeric_limits<float>::quiet_NaN(); // never read
  C = C0;
  gemmBf16(T.TA, T.TB, T.M, T.N, T.K, A.data(), Lda, B.data(), Ldb, T.Beta,
           C.data(), Ldc, Kernel);
  const double U = std::ldexp(1.0, -24);
  const double NU = double(bf16GemmRoundings(T.K, T.Beta)) * U;
  const double Gamma = NU / (1 - NU);
  for (int64_t I = 0; I < T.M; ++I) {
    for (int64_t J = 0; J < T.N; ++J) {
      double Exact = T.Beta != 0 ? double(C0[I * Ldc + J]) : 0.0;
      double Scale = std::fabs(Exact);
      for (int64_t K = 0; K < T.K; ++K) {
        double P = readAs(T.TA ? A[K * Lda + I] : A[I * Lda + K]) *
                   readAs(T.TB ? B[J * Ldb + K] : B[K * Ldb + J]);
        Exact += P;
        Scale += std::fabs(P);
      }
      float Got = C[I * Ldc + J];
      EXPECT_LE(std::fabs(double(Got) - Exact), Gamma * Scale)
          << "C[" << I << "," << J << "] of " << T.M << "x" << T.N << "x"
          << T.K << " TA " << T.TA << " TB " << T.TB << " Beta " << T.Beta;
      if (std::fabs(double(Got) - Exact) > Gamma * Scale)
        return C;
    }
    for (int64_t J = T.N; J < Ldc; ++J) {
      float Kept = C[I * Ldc + J], Was = C0[I * Ldc + J];
      EXPECT_TRUE(std::memcmp(&Kept, &Was, 4) == 0)
          << "padding C[" << I << "," << J << "] was written";
    }
  }
  return C;
}

/// Shapes at and across every blocking edge: the 12 x 32 micro-tile, the
/// 144-row A block, the 512-column and 576-row tiles, the 256-k block, odd
/// K, a single row, column or k; for AMX the 16 x 16 tiles, the 32 x 32
/// blocks, the 32-k tile step and the 128-row A block.
std::vector<GemmCase> gemmCases() {
  std::vector<GemmCase> Out;
  const int64_t Ms[] = {1, 12, 16, 33, 150, 600};
  const int64_t Ns[] = {1, 16, 31, 33, 520};
  const int64_t Ks[] = {1, 2, 7, 32, 33, 256, 259, 600};
  int Pick = 0;
  for (int64_t M : Ms)
    for (int64_t N : Ns)
      for (int64_t K : Ks) {
        if (M * N * K > 40'000'000)
          continue;
        ++Pick;
        // Every transpose combination and both betas over the shapes.
        Out.push_back({bool(Pick & 1), bool(Pick & 2), M, N, K,
                       float((Pick >> 2) & 1)});
      }
  return Out;
}

TEST(Bf16Gemm, EmulatedKernelWithinFloat32Bound) {
  for (const GemmCase &T : gemmCases()) {
    check(T, Bf16Kernel::Emulated, /*Denormals=*/true);
    if (HasFailure())
      return;
  }
}

/// Checks Native within the bound over every case and reports how often it
/// agrees bit for bit with Twin (reported, not asserted: the SDM defines an
/// order of the FMAs, and a CPU may fuse them or order them otherwise).
void checkNativeAgainstTwin(Bf16Kernel Native, Bf16Kernel Twin,
                            const char *Instruction) {
  int64_t Same = 0, All = 0;
  for (const GemmCase &T : gemmCases()) {
    auto Got = check(T, Native, /*Denormals=*/true);
    if (::testing::Test::HasFailure())
      return;
    auto Ref = check(T, Twin, true);
    for (int64_t I = 0; I < T.M; ++I)
      for (int64_t J = 0; J < T.N; ++J) {
        int64_t E = I * (T.N + 7) + J;
        Same += std::memcmp(&Got[E], &Ref[E], 4) == 0;
        ++All;
      }
  }
  ::testing::Test::RecordProperty("bitwise_equal_to_twin",
                                  std::to_string(Same) + "/" +
                                      std::to_string(All));
  std::printf("native %s equals its twin on %lld of %lld elements\n",
              Instruction, (long long)Same, (long long)All);
}

/// Every kernel this CPU runs: the twins everywhere, the instructions where
/// it has them.
std::vector<Bf16Kernel> kernelsHere() {
  std::vector<Bf16Kernel> Kernels = {Bf16Kernel::Emulated,
                                     Bf16Kernel::AmxEmulated};
  if (hasBf16Dot())
    Kernels.push_back(Bf16Kernel::Native);
  if (hasAmxBf16())
    Kernels.push_back(Bf16Kernel::Amx);
  return Kernels;
}

TEST(Bf16Gemm, NativeKernelWithinFloat32Bound) {
  if (!hasBf16Dot())
    GTEST_SKIP() << "this CPU has no AVX-512 BF16 (VDPBF16PS)";
  checkNativeAgainstTwin(Bf16Kernel::Native, Bf16Kernel::Emulated,
                         "VDPBF16PS");
}

TEST(Bf16Gemm, AmxTwinWithinFloat32Bound) {
  for (const GemmCase &T : gemmCases()) {
    check(T, Bf16Kernel::AmxEmulated, /*Denormals=*/true);
    if (HasFailure())
      return;
  }
}

TEST(Bf16Gemm, AmxKernelWithinFloat32Bound) {
  if (!hasAmxBf16())
    GTEST_SKIP() << "this CPU has no AMX-BF16 (or Linux does not let this "
                    "process use its tiles)";
  checkNativeAgainstTwin(Bf16Kernel::Amx, Bf16Kernel::AmxEmulated,
                         "TDPBF16PS");
}

/// The tiles split over threads, never the sums: any thread count gives the
/// same bits, with every kernel.
TEST(Bf16Gemm, ThreadCountDoesNotChangeTheResult) {
  const GemmCase T{false, true, 700, 1100, 300, 0};
  auto A = randomBf16(T.M * T.K, 1, false), B = randomBf16(T.N * T.K, 2, false);
  int Before = kernelThreads();
  for (Bf16Kernel Kernel : kernelsHere()) {
    std::vector<std::vector<float>> Runs;
    for (int Threads : {1, 2, 3}) {
      setKernelThreads(Threads);
      std::vector<float> C(T.M * T.N);
      gemmBf16(T.TA, T.TB, T.M, T.N, T.K, A.data(), T.K, B.data(), T.K, 0,
               C.data(), T.N, Kernel);
      Runs.push_back(std::move(C));
    }
    EXPECT_EQ(0,
              std::memcmp(Runs[0].data(), Runs[1].data(), Runs[0].size() * 4))
        << bf16KernelName(Kernel);
    EXPECT_EQ(0,
              std::memcmp(Runs[0].data(), Runs[2].data(), Runs[0].size() * 4))
        << bf16KernelName(Kernel);
  }
  setKernelThreads(Before);
}

/// The twin follows the instruction's definition: a denormal input is zero,
/// and a denormal sum is flushed to a zero of its sign.
TEST(Bf16Gemm, TwinFlushesDenormals) {
  const uint16_t Tiny = 0x0001; // the smallest bfloat16 denormal
  const uint16_t One = floatToBFloat16(1.0f);
  uint16_t A[2] = {Tiny, One}, B[2] = {One, One};
  float C = -7;
  // 2^-100 * 2^-30 = 2^-130: a float32 denormal, flushed.
  uint16_t P[1] = {floatToBFloat16(std::ldexp(1.0f, -100))},
           Q[1] = {floatToBFloat16(std::ldexp(1.0f, -30))};
  for (Bf16Kernel Kernel : kernelsHere()) {
    C = -7;
    gemmBf16(false, false, 1, 1, 2, A, 2, B, 1, 0, &C, 1, Kernel);
    EXPECT_EQ(C, 1.0f) << bf16KernelName(Kernel); // Tiny * 1 read as 0
    gemmBf16(false, false, 1, 1, 1, P, 1, Q, 1, 0, &C, 1, Kernel);
    EXPECT_EQ(C, 0.0f) << bf16KernelName(Kernel);
  }
}

} // namespace
