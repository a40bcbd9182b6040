//===- MixedPrecisionTest.cpp - bf16 / fp16 casts and kernels -------------===//
//
// The 16-bit formats against torch (every widening, and the narrowings where
// rounding decides: every representable value, every tie between neighbours
// and its float32 neighbours, specials, random bit patterns), and the CPU
// backend's mixed-precision path: an instruction over 16-bit buffers is the
// float32 kernel on the widened values, each result rounded once.
//
//===----------------------------------------------------------------------===//
#include "ir/Float16.h"
#include "runtime/cpu/Bf16Gemm.h"
#include "runtime/cpu/CpuBackend.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Parallel.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"
#include "gtest/gtest.h"
#include <cmath>
#include <cstring>
#include <random>

using namespace sp;
using namespace llvm;

namespace {

float bitsToFloat(uint32_t B) {
  float F;
  std::memcpy(&F, &B, 4);
  return F;
}

uint32_t floatToBits(float F) {
  uint32_t B;
  std::memcpy(&B, &F, 4);
  return B;
}

template <typename T>
void writeRaw(const std::string &Path, const std::vector<T> &V) {
  std::error_code EC;
  raw_fd_ostream OS(Path, EC);
  ASSERT_FALSE(EC) << Path;
  OS.write(reinterpret_cast<const char *>(V.data()), V.size() * sizeof(T));
}

template <typename T> std::vector<T> readRaw(const std::string &Path) {
  auto Buf = MemoryBuffer::getFile(Path);
  if (!Buf)
    return {};
  std::vector<T> V((*Buf)->getBufferSize() / sizeof(T));
  std::memcpy(V.data(), (*Buf)->getBufferStart(), V.size() * sizeof(T));
  return V;
}

/// Float32 inputs where the rounding decides: for every 16-bit pattern of
/// both formats, its value, the midpoint to the next pattern (a tie, which
/// goes to the even one) and the float32 values one ulp either side of it;
/// infinities, nans, the largest values and beyond; random bit patterns.
std::vector<float> narrowingInputs() {
  std::vector<float> X;
  auto Around = [&](float A, float B) {
    float Mid = (A + B) / 2; // exact: A and B have few significant bits
    X.push_back(A);
    X.push_back(Mid);
    X.push_back(std::nextafter(Mid, -INFINITY));
    X.push_back(std::nextafter(Mid, INFINITY));
  };
  for (uint32_t H = 0; H < 0x10000; ++H) {
    float A = bfloat16ToFloat(H), B = bfloat16ToFloat(H + 1);
    if (std::isfinite(A) && std::isfinite(B) && (H & 0x7fff) != 0x7fff)
      Around(A, B);
    A = halfToFloat(H), B = halfToFloat(H + 1);
    if (std::isfinite(A) && std::isfinite(B) && (H & 0x7fff) != 0x7fff)
      Around(A, B);
  }
  for (float S : {1.f, -1.f}) {
    X.push_back(S * INFINITY);
    X.push_back(S * 65504.f);
    X.push_back(S * 65520.f); // the tie above half's largest: to infinity
    X.push_back(std::nextafter(S * 65520.f, 0.f));
    X.push_back(S * std::numeric_limits<float>::max());
    X.push_back(S * std::numeric_limits<float>::denorm_min());
    X.push_back(S * 0.f);
  }
  X.push_back(NAN);
  std::mt19937 Rng(20261124);
  for (int I = 0; I < (1 << 20); ++I)
    X.push_back(bitsToFloat(Rng()));
  return X;
}

/// Both are the same value, or both nan (torch and sp may pick other nan
/// payloads).
bool sameBits16(uint16_t A, uint16_t B, bool Half) {
  auto IsNan = [&](uint16_t H) {
    return Half ? (H & 0x7c00) == 0x7c00 && (H & 0x3ff)
                : (H & 0x7f80) == 0x7f80 && (H & 0x7f);
  };
  return A == B || (IsNan(A) && IsNan(B));
}

TEST(MixedPrecision, CastsMatchTorch) {
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("sp-casts", Dir));
  std::string D = Dir.str().str();
  std::vector<float> X = narrowingInputs();
  std::vector<uint16_t> All(0x10000);
  for (uint32_t H = 0; H < 0x10000; ++H)
    All[H] = uint16_t(H);
  writeRaw(D + "/x.f32", X);
  writeRaw(D + "/all.u16", All);
  std::string Script =
      "import numpy as np, torch, sys\n"
      "d = sys.argv[1]\n"
      "x = torch.from_numpy(np.fromfile(d + '/x.f32', '<f4'))\n"
      "h = torch.from_numpy(np.fromfile(d + '/all.u16', '<u2').astype('<i2'))\n"
      "for t, n in ((torch.bfloat16, 'bf16'), (torch.float16, 'f16')):\n"
      "    x.to(t).view(torch.int16).numpy().tofile(d + '/x.' + n)\n"
      "    h.view(t).to(torch.float32).numpy().tofile(d + '/all.' + n)\n";
  std::vector<StringRef> Args = {SP_PYTHON, "-c", Script, D};
  ASSERT_EQ(sys::ExecuteAndWait(SP_PYTHON, Args), 0)
      << "torch failed (is python3-torch installed?)";
  for (bool Half : {false, true}) {
    std::string Name = Half ? "f16" : "bf16";
    auto Narrow = readRaw<uint16_t>(D + "/x." + Name);
    auto Wide = readRaw<float>(D + "/all." + Name);
    ASSERT_EQ(Narrow.size(), X.size()) << Name;
    ASSERT_EQ(Wide.size(), All.size()) << Name;
    int Bad = 0;
    for (size_t I = 0; I < X.size() && Bad < 5; ++I) {
      uint16_t Mine = Half ? floatToHalf(X[I]) : floatToBFloat16(X[I]);
      if (!sameBits16(Mine, Narrow[I], Half)) {
        ++Bad;
        ADD_FAILURE() << Name << " of " << X[I] << " (bits 0x" << std::hex
                      << floatToBits(X[I]) << "): sp 0x" << Mine
                      << ", torch 0x" << Narrow[I];
      }
    }
    for (uint32_t H = 0; H < 0x10000 && Bad < 5; ++H) {
      float Mine = Half ? halfToFloat(H) : bfloat16ToFloat(H);
      bool Same = floatToBits(Mine) == floatToBits(Wide[H]) ||
                  (std::isnan(Mine) && std::isnan(Wide[H]));
      if (!Same) {
        ++Bad;
        ADD_FAILURE() << Name << " 0x" << std::hex << H << " widens to "
                      << Mine << ", torch " << Wide[H];
      }
    }
  }
  sys::fs::remove_directories(Dir);
}

/// The vectorised conversions of the CPU backend (cpu::widen16, narrow16)
/// are the scalar ones above, bit for bit, nans included: every 16-bit
/// pattern widened, every narrowing input rounded, on several threads.
TEST(MixedPrecision, VectorConversionsAreTheScalarOnes) {
  std::vector<float> X = narrowingInputs();
  std::vector<uint16_t> All(0x10000);
  for (uint32_t H = 0; H < 0x10000; ++H)
    All[H] = uint16_t(H);
  int Before = cpu::kernelThreads();
  cpu::setKernelThreads(3);
  for (bool Bf16 : {true, false}) {
    SCOPED_TRACE(Bf16 ? "bf16" : "f16");
    std::vector<float> Wide(All.size());
    cpu::widen16(Wide.data(), All.data(), All.size(), Bf16);
    for (uint32_t H = 0; H < 0x10000; ++H)
      ASSERT_EQ(floatToBits(Wide[H]),
                floatToBits(Bf16 ? bfloat16ToFloat(H) : halfToFloat(H)))
          << std::hex << "0x" << H;
    std::vector<uint16_t> Narrow(X.size());
    cpu::narrow16(Narrow.data(), X.data(), X.size(), Bf16);
    for (size_t I = 0; I < X.size(); ++I)
      ASSERT_EQ(Narrow[I], Bf16 ? floatToBFloat16(X[I]) : floatToHalf(X[I]))
          << std::hex << "bits 0x" << floatToBits(X[I]);
  }
  cpu::setKernelThreads(Before);
}

/// One instruction over buffers of the given types, at 64-byte offsets.
struct OneInstruction {
  Program P;
  Instruction I;
  CpuBackend B;
  char *Arena = nullptr;
  OneInstruction(OpKind Op, std::vector<TensorType> In, TensorType Out) {
    I.Op = Op;
    In.push_back(Out);
    int64_t Offset = 0;
    for (size_t K = 0; K < In.size(); ++K) {
      ProgramBuffer PB;
      PB.Name = "b" + std::to_string(K);
      PB.Type = In[K];
      PB.Bytes = In[K].numBytes();
      PB.Offset = Offset;
      Offset += (PB.Bytes + 63) / 64 * 64;
      P.Buffers.push_back(PB);
      (K + 1 < In.size() ? I.In : I.Out).push_back(K);
    }
    P.ArenaBytes = Offset;
    Arena = cantFail(B.allocate(P.ArenaBytes));
  }
  ~OneInstruction() { B.release(Arena); }
  char *buffer(int K) { return Arena + P.Buffers[K].Offset; }
  Error run() {
    auto One = createSingleRankCommunicator();
    return B.run(
        KernelCall{I, P, Arena, 1, true, std::nullopt, 0, *One, nullptr,
                   nullptr});
  }
};

/// bf16 operands and result: the float32 sum of the widened operands,
/// rounded to nearest even once. The operands make every kind of tie.
TEST(MixedPrecision, KernelRoundsItsFloat32ResultOnce) {
  for (DType T : {DType::BF16, DType::F16}) {
    bool Half = T == DType::F16;
    const int N = 4096;
    TensorType Ty(T, {N});
    OneInstruction K(OpKind::Add, {Ty, Ty}, Ty);
    auto *A = reinterpret_cast<uint16_t *>(K.buffer(0));
    auto *B = reinterpret_cast<uint16_t *>(K.buffer(1));
    auto *Y = reinterpret_cast<uint16_t *>(K.buffer(2));
    std::mt19937 Rng(7);
    auto Widen = [&](uint16_t H) {
      return Half ? halfToFloat(H) : bfloat16ToFloat(H);
    };
    auto Round = [&](float F) {
      return Half ? floatToHalf(F) : floatToBFloat16(F);
    };
    for (int E = 0; E < N; ++E) {
      // Values of one binade and a small neighbour: their sums are often
      // exactly between two 16-bit values.
      A[E] = Round(std::ldexp(1.0f + float(Rng() % 128) / 128, int(Rng() % 8)));
      B[E] = Round(std::ldexp(1.0f + float(Rng() % 128) / 128,
                              int(Rng() % 8) - 8));
    }
    ASSERT_FALSE(bool(K.run()));
    int Ties = 0;
    for (int E = 0; E < N; ++E) {
      float Exact = Widen(A[E]) + Widen(B[E]);
      ASSERT_EQ(Y[E], Round(Exact)) << E;
      Ties += Widen(Round(Exact)) != Exact;
    }
    EXPECT_GT(Ties, N / 4); // most results were rounded
  }
}

/// A cast: an f32 parameter to its bf16 compute copy, rounded to nearest
/// even; a float32 result (a weight's gradient) is written in float32.
TEST(MixedPrecision, CastAndFloat32Results) {
  const int N = 1000;
  OneInstruction K(OpKind::Cast, {TensorType(DType::F32, {N})},
                   TensorType(DType::BF16, {N}));
  K.I.Attrs.set("to", std::string("bf16"));
  auto *X = reinterpret_cast<float *>(K.buffer(0));
  for (int E = 0; E < N; ++E)
    X[E] = std::sin(float(E)) * 1e3f;
  ASSERT_FALSE(bool(K.run()));
  auto *Y = reinterpret_cast<uint16_t *>(K.buffer(1));
  for (int E = 0; E < N; ++E)
    ASSERT_EQ(Y[E], floatToBFloat16(X[E])) << E;

  // bf16 + bf16 into f32: the float32 sum itself.
  OneInstruction S(OpKind::Add,
                   {TensorType(DType::BF16, {N}), TensorType(DType::BF16, {N})},
                   TensorType(DType::F32, {N}));
  auto *A = reinterpret_cast<uint16_t *>(S.buffer(0));
  auto *B = reinterpret_cast<uint16_t *>(S.buffer(1));
  for (int E = 0; E < N; ++E) {
    A[E] = floatToBFloat16(float(E) + 0.5f);
    B[E] = floatToBFloat16(1.0f / float(E + 1));
  }
  ASSERT_FALSE(bool(S.run()));
  auto *Z = reinterpret_cast<float *>(S.buffer(2));
  for (int E = 0; E < N; ++E)
    ASSERT_EQ(Z[E], bfloat16ToFloat(A[E]) + bfloat16ToFloat(B[E])) << E;
}

/// The GEMM instructions of a bf16 plan, on every path the CPU backend has:
/// the AVX-512 BF16 dot product and the AMX tiles (where the CPU has them)
/// and float32 GEMMs on widened copies. Each bf16 result is within one bf16 rounding (u = 2^-8)
/// of a float32 sum, itself within gamma(n) sum |a||b| of the exact sum in
/// any order (n = K + 2 covers the bias and the dot kernel's block adds at
/// these sizes); a float32 result (a weight's gradient) within gamma(n).
TEST(MixedPrecision, Bf16GemmsOnBothPaths) {
  const bool Before = cpu::bf16DotEnabled(), AmxBefore = cpu::amxEnabled();
  // 0: widened; 1: VDPBF16PS; 2: AMX.
  std::vector<int> Paths = {0};
  if (cpu::hasBf16Dot())
    Paths.push_back(1);
  if (cpu::hasAmxBf16())
    Paths.push_back(2);
  std::mt19937 Rng(5);
  std::uniform_real_distribution<float> U(-2, 2);
  auto Fill = [&](OneInstruction &K, int B) {
    const TensorType &T = K.P.Buffers[B].Type;
    auto *H = reinterpret_cast<uint16_t *>(K.buffer(B));
    for (int64_t E = 0; E < T.numElements(); ++E)
      H[E] = floatToBFloat16(U(Rng));
  };
  auto Val = [](OneInstruction &K, int B, int64_t E) {
    return double(
        bfloat16ToFloat(reinterpret_cast<uint16_t *>(K.buffer(B))[E]));
  };
  // |got - exact| within the bound, for a sum of Terms products.
  auto Check = [](double Got, double Exact, double Abs, int64_t Terms,
                  bool Bf16) {
    double NU = double(Terms + 2) * std::ldexp(1.0, -24);
    double Sum = NU / (1 - NU) * Abs;
    double Bound = Bf16 ? Sum + std::ldexp(1.0, -8) * (std::fabs(Exact) + Sum)
                        : Sum;
    return std::fabs(Got - Exact) <= Bound;
  };
  const int64_t Rows = 150, In = 259, Out = 70;
  for (int Dot : Paths) {
    cpu::setBf16DotEnabled(Dot > 0);
    cpu::setAmxEnabled(Dot == 2);
    for (int TransW : {0, 1}) {
      SCOPED_TRACE(formatv("dot {0} trans_w {1}", Dot, TransW).str());
      TensorType WT(DType::BF16, TransW ? std::vector<int64_t>{Out, In}
                                        : std::vector<int64_t>{In, Out});
      // Y = X W + bias, bf16.
      OneInstruction L(OpKind::Linear,
                       {TensorType(DType::BF16, {Rows, In}), WT,
                        TensorType(DType::BF16, {Out})},
                       TensorType(DType::BF16, {Rows, Out}));
      L.I.Attrs.set("trans_w", int64_t(TransW));
      for (int B : {0, 1, 2})
        Fill(L, B);
      ASSERT_FALSE(bool(L.run()));
      auto W = [&](OneInstruction &K, int B, int64_t I, int64_t J) {
        return TransW ? Val(K, B, J * In + I) : Val(K, B, I * Out + J);
      };
      for (int64_t R = 0; R < Rows; ++R)
        for (int64_t J = 0; J < Out; ++J) {
          double Exact = Val(L, 2, J), Abs = std::fabs(Exact);
          for (int64_t K = 0; K < In; ++K) {
            double P = Val(L, 0, R * In + K) * W(L, 1, K, J);
            Exact += P;
            Abs += std::fabs(P);
          }
          ASSERT_TRUE(Check(Val(L, 3, R * Out + J), Exact, Abs, In, true))
              << "Y[" << R << "," << J << "]";
        }
      // DW = X^T DY (or DY^T X), f32.
      OneInstruction G(OpKind::LinearGradW,
                       {TensorType(DType::BF16, {Rows, In}),
                        TensorType(DType::BF16, {Rows, Out})},
                       TensorType(DType::F32, WT.Shape));
      G.I.Attrs.set("trans_w", int64_t(TransW));
      Fill(G, 0);
      Fill(G, 1);
      ASSERT_FALSE(bool(G.run()));
      auto *DW = reinterpret_cast<float *>(G.buffer(2));
      for (int64_t I = 0; I < In; ++I)
        for (int64_t J = 0; J < Out; ++J) {
          double Exact = 0, Abs = 0;
          for (int64_t R = 0; R < Rows; ++R) {
            double P = Val(G, 0, R * In + I) * Val(G, 1, R * Out + J);
            Exact += P;
            Abs += std::fabs(P);
          }
          ASSERT_TRUE(Check(DW[TransW ? J * In + I : I * Out + J], Exact, Abs,
                            Rows, false))
              << "DW[" << I << "," << J << "]";
        }
    }
    // C = op(A) op(B) per batch, bf16.
    const int64_t Batch = 3, M = 40, N = 33, K = 70;
    for (int TA : {0, 1})
      for (int TB : {0, 1}) {
        SCOPED_TRACE(formatv("dot {0} ta {1} tb {2}", Dot, TA, TB).str());
        OneInstruction BM(
            OpKind::BatchMatMul,
            {TensorType(DType::BF16, TA ? std::vector<int64_t>{Batch, K, M}
                                        : std::vector<int64_t>{Batch, M, K}),
             TensorType(DType::BF16, TB ? std::vector<int64_t>{Batch, N, K}
                                        : std::vector<int64_t>{Batch, K, N})},
            TensorType(DType::BF16, {Batch, M, N}));
        BM.I.Attrs.set("trans_a", int64_t(TA));
        BM.I.Attrs.set("trans_b", int64_t(TB));
        Fill(BM, 0);
        Fill(BM, 1);
        ASSERT_FALSE(bool(BM.run()));
        for (int64_t P = 0; P < Batch; ++P)
          for (int64_t I = 0; I < M; ++I)
            for (int64_t J = 0; J < N; ++J) {
              double Exact = 0, Abs = 0;
              for (int64_t Q = 0; Q < K; ++Q) {
                double X = Val(BM, 0, P * M * K + (TA ? Q * M + I : I * K + Q)) *
                           Val(BM, 1, P * K * N + (TB ? J * K + Q : Q * N + J));
                Exact += X;
                Abs += std::fabs(X);
              }
              ASSERT_TRUE(Check(Val(BM, 2, (P * M + I) * N + J), Exact, Abs, K,
                                true))
                  << "C[" << P << "," << I << "," << J << "]";
            }
      }
  }
  cpu::setBf16DotEnabled(Before);
  cpu::setAmxEnabled(AmxBefore);
}

} // namespace
