//===- AttentionCase.h - An attention op against its float64 run -*- C++
//-*-===//
//
// One configuration of the fused attention core (runtime/cpu/Attention.h)
// run by the CPU backend in float32 and float64, against either its unfused
// expansion (runtime/cuda/AttentionPlan.h) run op by op on the CPU backend
// (HostLogicTest), or the CUDA backend (KernelTest), which runs it with its
// blockwise kernels (kernels/Attention.cuh), or as the expansion for heads
// larger than they take.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TESTS_GPU_ATTENTIONCASE_H
#define SP_TESTS_GPU_ATTENTIONCASE_H

#include "ir/Float16.h"
#include "ir/OpDef.h"
#include "runtime/comm/Communicator.h"
#include "runtime/cpu/CpuBackend.h"
#include "runtime/cuda/AttentionPlan.h"
#include "OpCase.h"
#include "gtest/gtest.h"
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace sp {

/// Runs the float32 attention or attention_grad instruction of C as the
/// CUDA backend does, as its expansion's ops (AttentionPlan.h), here one by
/// one on the CPU backend with the workspace in host memory, the
/// log-sum-exp as the CUDA backend's rowLogSumExp computes it. The
/// sub-instructions get C's step, seed, dropout and groups.
inline llvm::Error runAsExpansion(CpuBackend &Cpu, const KernelCall &C) {
  auto Plan = cuda::planAttention(C.I, C.Prog.Buffers);
  if (!Plan)
    return Plan.takeError();
  std::vector<char> Work(Plan->WorkspaceBytes + 64);
  std::vector<char *> Where;
  for (size_t B = 0; B < Plan->Outer.size(); ++B)
    Where.push_back(Plan->Outer[B] >= 0
                        ? C.buffer(Plan->Outer[B])
                        : Work.data() + Plan->Local.Buffers[B].Offset);
  for (size_t J = 0; J < Plan->Local.Instrs.size(); ++J) {
    const Instruction &Sub = Plan->Local.Instrs[J];
    KernelCall SC{Sub,       Plan->Local, C.Arena,   C.Step, C.Training,
                  C.Dropout, C.Seed,      C.Tensor, C.Pipeline, C.Data};
    SC.GradScale = C.GradScale;
    SC.Where = Where.data();
    if (llvm::Error E = Cpu.run(SC))
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     opName(Sub.Op).str() + ": " +
                                         llvm::toString(std::move(E)));
    if (int(J) != Plan->LseAfter)
      continue;
    // The CUDA backend's rowLogSumExp, restated.
    const float *S = reinterpret_cast<const float *>(Where[Plan->Scores]);
    float *L = reinterpret_cast<float *>(Where[Plan->Lse]);
    for (int64_t Row = 0; Row < Plan->Batch * Plan->Heads * Plan->Sq; ++Row) {
      float M = -INFINITY;
      for (int64_t Col = 0; Col < Plan->Sk; ++Col)
        M = std::max(M, S[Row * Plan->Sk + Col]);
      double Sum = 0;
      for (int64_t Col = 0; Col < Plan->Sk; ++Col)
        Sum += std::exp(double(S[Row * Plan->Sk + Col]) - M);
      int64_t At = Row;
      if (Plan->LseMerged) {
        int64_t I = Row % Plan->Sq, BA = Row / Plan->Sq;
        At = ((BA / Plan->Heads) * Plan->Sq + I) * Plan->Heads +
             BA % Plan->Heads;
      }
      L[At] = M == -INFINITY ? -INFINITY : float(M + std::log(Sum));
    }
  }
  return llvm::Error::success();
}

/// One attention configuration: the fused op on the CPU backend (float32
/// and float64), and its expansion's ops run one by one on the CPU backend
/// with the workspace in host memory, as the CUDA backend runs them.
struct AttentionCase {
  int64_t B = 2, A = 4, G = 4, Sq = 24, Sk = 24, D = 8;
  bool Causal = true, Pad = false, PadFirst = false, PadWhere = false;
  bool Merged = false, Dropout = false;
  /// attention {packed}: q, k, v read from one [B, Sq, 3 A D] tensor (needs
  /// G = A, Sk = Sq and Merged), the gradient written into one.
  bool Packed = false;
  double Fill = -10000, PadFill = -10000;
  /// BF16 or F16: the inputs drawn are rounded to that format (so that a
  /// 16-bit run and the float32 and float64 runs read the same values).
  DType Inputs16 = DType::F32;

  using Run = OpCase;

  AttrList attrs() const {
    AttrList At;
    At.set("scale", 1.0 / std::sqrt(double(D)));
    At.set("causal", int64_t(Causal));
    At.set("fill", Fill);
    if (Pad) {
      At.set("pad_fill", PadFill);
      At.set("pad_where", int64_t(PadWhere));
      At.set("pad_first", int64_t(PadFirst));
    }
    At.set("merged", int64_t(Merged));
    if (Packed) {
      At.set("packed", int64_t(1));
      At.set("heads", A);
    }
    if (Dropout) {
      At.set("dropout", int64_t(1));
      At.set("ratio", 0.2);
      At.set("key", std::vector<int64_t>{3, 7});
    }
    return At;
  }

  /// The program: the forward, or the backward fed with the forward's o and
  /// lse (Fwd's results), in dtype T; inputs drawn from a fixed seed.
  Run make(bool Forward, DType T, const std::vector<std::vector<double>> *Fwd,
           std::vector<int> &Results) const {
    Run R;
    std::mt19937 Rng(11);
    std::normal_distribution<double> N01;
    auto Draw = [&](int Id, double Scale) {
      int64_t N = R.P.Buffers[Id].Type.numElements();
      std::vector<double> V(N);
      for (double &X : V) {
        X = N01(Rng) * Scale;
        if (Inputs16 == DType::BF16)
          X = bfloat16ToFloat(floatToBFloat16(float(X)));
        else if (Inputs16 == DType::F16)
          X = halfToFloat(floatToHalf(float(X)));
      }
      set(R, Id, V);
    };
    std::vector<int64_t> QS = {B, A, Sq, D}, KS = {B, G, Sk, D};
    std::vector<int64_t> OS = Merged ? std::vector<int64_t>{B, Sq, A * D} : QS,
                         LS = Merged ? std::vector<int64_t>{B, Sq, A}
                                     : std::vector<int64_t>{B, A, Sq};
    const std::vector<int64_t> XS = {B, Sq, 3 * A * D}; // packed qkv
    int DO = Forward ? -1 : R.buffer(T, OS);
    std::vector<int> In;
    if (Packed) {
      In = {R.buffer(T, XS)};
      Draw(In[0], 1.5);
    } else {
      In = {R.buffer(T, QS), R.buffer(T, KS), R.buffer(T, KS)};
      Draw(In[0], 1.5);
      Draw(In[1], 1.5);
      Draw(In[2], 1.0);
    }
    if (DO >= 0)
      Draw(DO, 1.0);
    if (!Forward) {
      int O = R.buffer(T, OS), L = R.buffer(T, LS);
      set(R, O, (*Fwd)[0]);
      set(R, L, (*Fwd)[1]);
      In.insert(In.begin(), DO);
      In.insert(In.end(), {O, L});
    }
    if (Pad) {
      int Keep = R.buffer(DType::F32, {B, Sk});
      std::vector<double> KeepV(B * Sk, 1.0);
      for (int64_t J = Sk - 5; J < Sk; ++J) // batch 0's last keys padded
        KeepV[J] = 0.0;
      KeepV[Sk + 2] = 0.0;
      set(R, Keep, KeepV);
      In.push_back(Keep);
    }
    Instruction I;
    I.Op = Forward ? OpKind::Attention : OpKind::AttentionGrad;
    I.In.assign(In.begin(), In.end());
    if (Forward)
      Results = {R.buffer(T, OS), R.buffer(T, LS)};
    else if (Packed)
      Results = {R.buffer(T, XS)};
    else
      Results = {R.buffer(T, QS), R.buffer(T, KS), R.buffer(T, KS)};
    I.Out.assign(Results.begin(), Results.end());
    I.Attrs = attrs();
    R.P.Instrs.push_back(I);
    return R;
  }

  static void set(Run &R, int Id, const std::vector<double> &V) {
    const DType T = R.P.Buffers[Id].Type.Dtype;
    bool F64 = T == DType::F64, Half = T == DType::BF16 || T == DType::F16;
    auto &Bytes = R.Data[Id];
    Bytes.resize(V.size() * (F64 ? 8 : Half ? 2 : 4));
    for (size_t K = 0; K < V.size(); ++K) {
      if (F64) {
        std::memcpy(Bytes.data() + 8 * K, &V[K], 8);
      } else if (Half) {
        uint16_t H = T == DType::BF16 ? floatToBFloat16(float(V[K]))
                                      : floatToHalf(float(V[K]));
        std::memcpy(Bytes.data() + 2 * K, &H, 2);
      } else {
        float F = float(V[K]);
        std::memcpy(Bytes.data() + 4 * K, &F, 4);
      }
    }
  }
  /// Buffer Id's values, its bytes at At.
  static std::vector<double> get(const Run &R, const char *At, int Id) {
    const ProgramBuffer &B = R.P.Buffers[Id];
    std::vector<double> V(B.Type.numElements());
    for (size_t K = 0; K < V.size(); ++K) {
      if (B.Type.Dtype == DType::F64) {
        std::memcpy(&V[K], At + 8 * K, 8);
      } else if (B.Type.Dtype == DType::BF16 || B.Type.Dtype == DType::F16) {
        uint16_t H;
        std::memcpy(&H, At + 2 * K, 2);
        V[K] =
            B.Type.Dtype == DType::BF16 ? bfloat16ToFloat(H) : halfToFloat(H);
      } else {
        float F;
        std::memcpy(&F, At + 4 * K, 4);
        V[K] = F;
      }
    }
    return V;
  }

  /// Runs R's one instruction on Be; returns its results.
  static std::vector<std::vector<double>> run(Backend &Be, Run &R,
                                              const std::vector<int> &Results) {
    auto Bytes = R.run(Be);
    EXPECT_TRUE(bool(Bytes)) << llvm::toString(Bytes.takeError());
    std::vector<std::vector<double>> Out;
    if (Bytes)
      for (int Id : Results)
        Out.push_back(get(R, (*Bytes)[Id].data(), Id));
    return Out;
  }

  /// Runs R's instruction as its expansion's ops (AttentionPlan.h), one by
  /// one on the CPU backend (runAsExpansion).
  static std::vector<std::vector<double>>
  runExpanded(Run &R, const std::vector<int> &Results) {
    CpuBackend Cpu;
    std::vector<char> Arena(R.P.ArenaBytes + 64);
    for (size_t K = 0; K < R.Data.size(); ++K)
      std::memcpy(Arena.data() + R.P.Buffers[K].Offset, R.Data[K].data(),
                  R.Data[K].size());
    auto Tensor = createSingleRankCommunicator();
    llvm::Error E = runAsExpansion(
        Cpu, testCall(R.P.Instrs[0], R.P, Arena.data(), *Tensor));
    EXPECT_FALSE(bool(E)) << llvm::toString(std::move(E));
    std::vector<std::vector<double>> Out;
    for (int Id : Results)
      Out.push_back(get(R, Arena.data() + R.P.Buffers[Id].Offset, Id));
    return Out;
  }

  /// max |x - ref| over max |ref|.
  static double error(const std::vector<double> &X,
                      const std::vector<double> &Ref) {
    double D = 0, S = 0;
    for (size_t K = 0; K < X.size(); ++K) {
      if (std::isinf(Ref[K]) && X[K] == Ref[K])
        continue;
      D = std::max(D, std::fabs(X[K] - Ref[K]));
      S = std::max(S, std::fabs(Ref[K]));
    }
    return S > 0 ? D / S : D;
  }

  /// The expansion's float32 results (run here on the CPU, or by Gpu's
  /// backend) are as close to the fused op's float64 ones as the fused op's
  /// float32 results are, within a factor of 8 (the two sum in different
  /// orders; each is a few float32 roundings from the exact value), or a few
  /// units of float32 rounding where that error is smaller still.
  void check(Backend *Gpu = nullptr) const {
    CpuBackend Cpu;
    std::vector<std::vector<double>> Fwd64;
    for (bool Forward : {true, false}) {
      SCOPED_TRACE(Forward ? "forward" : "backward");
      std::vector<int> Res;
      Run R64 = make(Forward, DType::F64, &Fwd64, Res);
      auto Ref = run(Cpu, R64, Res);
      Run R32 = make(Forward, DType::F32, &Fwd64, Res);
      auto Fused = run(Cpu, R32, Res);
      auto Expanded = Gpu ? run(*Gpu, R32, Res) : runExpanded(R32, Res);
      ASSERT_EQ(Expanded.size(), Ref.size());
      for (size_t K = 0; K < Ref.size(); ++K) {
        double Own = error(Fused[K], Ref[K]), Got = error(Expanded[K], Ref[K]);
        double Bound = 8 * std::max(Own, 4 * 0x1p-24);
        EXPECT_LE(Got, Bound) << "result " << K << ": the fused op's own "
                              << "float32 error is " << Own;
      }
      if (Forward)
        Fwd64 = Ref;
    }
  }

  /// The same core in 16 bits (T: BF16 or F16), every tensor but the mask
  /// stored so: Gpu's results against the CPU backend's (its float32
  /// kernel on the widened operands, each result rounded once). Each is a
  /// 16-bit rounding (unit roundoff u) of a float32 result; those two
  /// differ by at most 8 times the fused op's own float32 error (check()'s
  /// bound, measured here on the same 16-bit inputs), so the two roundings
  /// differ by at most that plus 2u, relative to the largest element.
  ///
  /// ReadsForward false: Gpu's backward recomputes the forward (the
  /// unfused ops of AttentionPlan.h: softmax_grad's row sums of dp p)
  /// instead of reading the stored o and lse (the fused kernels' row sums
  /// of do o, with o rounded to 16 bits). The two differ by that rounding
  /// of o times the cancellation in dp - rowsum, far more than 2u where the
  /// rows cancel; so its backward is checked against the float64 backward
  /// whose o and lse are the float64 forward's, within u (its one rounding)
  /// plus 8 times the fused op's float32 error on the same footing.
  void check16(Backend &Gpu, DType T, bool ReadsForward = true) const {
    AttentionCase C = *this;
    C.Inputs16 = T;
    const double U = T == DType::BF16 ? 0x1p-8 : 0x1p-11;
    CpuBackend Cpu;
    std::vector<std::vector<double>> Fwd16, Fwd64, Fwd32;
    for (bool Forward : {true, false}) {
      SCOPED_TRACE(Forward ? "forward" : "backward");
      const bool Recomputed = !Forward && !ReadsForward;
      std::vector<int> Res;
      Run R64 = C.make(Forward, DType::F64, Recomputed ? &Fwd64 : &Fwd16, Res);
      auto Ref = run(Cpu, R64, Res);
      Run R32 = C.make(Forward, DType::F32, Recomputed ? &Fwd32 : &Fwd16, Res);
      auto F32 = run(Cpu, R32, Res);
      Run R16 = C.make(Forward, T, &Fwd16, Res);
      auto Want = run(Cpu, R16, Res);
      auto Got = run(Gpu, R16, Res);
      ASSERT_EQ(Got.size(), Want.size());
      ASSERT_EQ(F32.size(), Ref.size());
      // (Recomputed: the largest share of its bound Got's error takes, and
      // the CPU's 16-bit fused result's, which reads the 16-bit o.)
      double GotShare = 0, FusedShare = 0;
      for (size_t K = 0; K < Want.size(); ++K) {
        double Own = error(F32[K], Ref[K]);
        double Float = 8 * std::max(Own, 4 * 0x1p-24);
        if (Recomputed) {
          EXPECT_LE(error(Got[K], Ref[K]), U + Float)
              << "result " << K << ": the fused op's own float32 error, "
              << "from the float32 forward, is " << Own;
          GotShare = std::max(GotShare, error(Got[K], Ref[K]) / (U + Float));
          FusedShare =
              std::max(FusedShare, error(Want[K], Ref[K]) / (U + Float));
        } else
          EXPECT_LE(error(Got[K], Want[K]), 2 * U + Float)
              << "result " << K << ": the fused op's own float32 error is "
              << Own;
      }
      if (Recomputed)
        std::printf("16-bit backward, o recomputed: %.2f of its bound (the "
                    "fused kernel's 16-bit result, from the stored o: %.2f)\n",
                    GotShare, FusedShare);
      if (Forward) {
        Fwd16 = Want;
        Fwd64 = Ref;
        Fwd32 = F32;
      }
    }
  }
};

/// The op-level cases of the GPU's (and the emulator's) FusedAttention test:
/// causal; grouped-query heads with merged output and dropout; padding in
/// both orders and both forms, with fills small enough that the masks'
/// order matters (as in AttentionPlan.PaddingInBothOrdersMatchesTheFusedKernel);
/// unequal lengths with more keys than one warp's lanes cover in a batch;
/// GPT's packed qkv read in place.
inline std::vector<AttentionCase> fusedAttentionCases() {
  std::vector<AttentionCase> Cases(1);
  AttentionCase G;
  G.G = 2;
  G.Merged = G.Dropout = true;
  Cases.push_back(G);
  for (bool PadFirst : {false, true})
    for (bool Where : {false, true}) {
      AttentionCase P;
      P.Pad = P.Dropout = true;
      P.PadFirst = PadFirst;
      P.PadWhere = Where;
      P.Fill = -2;
      P.PadFill = Where ? -INFINITY : -3;
      Cases.push_back(P);
    }
  AttentionCase N;
  N.Causal = false;
  N.Sq = 9;
  N.Sk = 300;
  Cases.push_back(N);
  AttentionCase Packed;
  Packed.Packed = Packed.Merged = Packed.Dropout = true;
  Cases.push_back(Packed);
  return Cases;
}

/// Cases across the blockwise kernels' tiles of 64 rows and keys
/// (kernels/Attention.cuh): several blocks and a partial one, the causal
/// skipping of blocks above the diagonal, head sizes that fill one or two
/// column groups or neither a multiple of 16 nor of 64, grouped-query
/// heads, and rows that see no key.
inline std::vector<AttentionCase> acrossBlocksCases() {
  std::vector<AttentionCase> Cases;
  AttentionCase Gqa;
  Gqa.A = 4;
  Gqa.G = 2;
  Gqa.Sq = Gqa.Sk = 150;
  Gqa.D = 96;
  Gqa.Merged = Gqa.Dropout = true;
  Cases.push_back(Gqa);
  AttentionCase Cross; // unequal lengths, padding, a head of 20
  Cross.Causal = false;
  Cross.Sq = 70;
  Cross.Sk = 200;
  Cross.D = 20;
  Cross.Pad = Cross.Dropout = true;
  Cases.push_back(Cross);
  AttentionCase Packed; // GPT's layout over three blocks
  Packed.A = Packed.G = 2;
  Packed.Sq = Packed.Sk = 130;
  Packed.D = 64;
  Packed.Packed = Packed.Merged = Packed.Dropout = true;
  Cases.push_back(Packed);
  AttentionCase Inf; // the -inf causal fill, a head of 128
  Inf.A = Inf.G = 2;
  Inf.Sq = Inf.Sk = 100;
  Inf.D = 128;
  Inf.Fill = -INFINITY;
  Cases.push_back(Inf);
  AttentionCase Masked; // batch 0's keys all padded: its rows see none
  Masked.Causal = false;
  Masked.Pad = Masked.PadWhere = true;
  Masked.PadFill = -INFINITY;
  Masked.Sq = 20;
  Masked.Sk = 5;
  Cases.push_back(Masked);
  return Cases;
}

/// 16-bit cases (check16): grouped heads of 96 over two blocks, and GPT's
/// packed layout with padding.
inline std::vector<AttentionCase> sixteenBitCases() {
  AttentionCase C;
  C.G = 2;
  C.Sq = C.Sk = 100;
  C.D = 96;
  C.Merged = C.Dropout = true;
  AttentionCase Packed;
  Packed.A = Packed.G = 2;
  Packed.Sq = Packed.Sk = 70;
  Packed.D = 64;
  Packed.Packed = Packed.Merged = Packed.Dropout = Packed.Pad = true;
  return {C, Packed};
}

} // namespace sp

#endif // SP_TESTS_GPU_ATTENTIONCASE_H
