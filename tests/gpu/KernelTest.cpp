//===- KernelTest.cpp - Every CUDA kernel against its CPU twin ------------===//
//
// Each test builds a one-instruction program (the op, its attributes, its
// buffers in an arena), fills the inputs with the same random data and runs
// the instruction through the CPU backend and through the CUDA backend
// (same Philox seed, step and keys), then compares every output.
//
// Bounds:
//  - ops computed in the CPU's fixed order (elementwise ops, the 8-lane row
//    reductions, the column sums, dropout): relative 1e-6, normwise
//    (max |gpu - cpu| / max |cpu|); they are in fact expected bitwise equal,
//    and the dropout masks are required to be;
//  - GEMMs (linear, linear_grad_w, batch_matmul): cuBLAS and OpenBLAS sum
//    in different orders, so both are checked against a float64 product
//    within the rigorous bound gamma_{K+1} (sum_k |a_k b_k| + |bias|),
//    gamma_n = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and Stability
//    of Numerical Algorithms, 3.5);
//  - grad_norm: double sums in another order (below 1e-15 relative), then
//    one float rounding: 1e-6; cross entropy and adamw use CUDA's double
//    log/pow (within 2 ulp of glibc's): 1e-6;
//  - the fused attention softmax (forward and backward with the scale and
//    causal mask of lower/FuseSoftmax.cpp) and dropout_add
//    (lower/FuseEpilogue.cpp) are required to be bitwise the CPU's (which
//    is the unfused sequence's, tests/unit/FuseSoftmaxTest and
//    FuseEpilogueTest).
//
// Without a CUDA device every test is skipped with that message.
//
//===----------------------------------------------------------------------===//
#include "AttentionCase.h"
#include "OpCase.h"
#include "ir/Float16.h"
#include "runtime/cpu/CpuBackend.h"
#include "runtime/cuda/AttentionPlan.h"
#include "runtime/cuda/CudaBackend.h"
#include "llvm/ADT/ScopeExit.h"
#include "gtest/gtest.h"
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <tuple>

using namespace sp;
using namespace llvm;

namespace {

std::vector<float> asFloats(const std::vector<char> &B) {
  std::vector<float> V(B.size() / 4);
  std::memcpy(V.data(), B.data(), V.size() * 4);
  return V;
}

/// max |a - b| / max |b| (0 when both are all zero).
double normwiseError(const std::vector<float> &A, const std::vector<float> &B) {
  double Diff = 0, Scale = 0;
  for (size_t I = 0; I < A.size(); ++I) {
    Diff = std::max(Diff, std::fabs(double(A[I]) - B[I]));
    Scale = std::max(Scale, std::fabs(double(B[I])));
    if (std::isnan(A[I]) != std::isnan(B[I]))
      return INFINITY;
  }
  return Scale == 0 ? Diff : Diff / Scale;
}

class CudaKernels : public ::testing::Test {
protected:
  void SetUp() override {
    if (Error E = checkCudaDevice())
      GTEST_SKIP() << "no CUDA device is present, skipping the CUDA kernel "
                      "tests: "
                   << toString(std::move(E));
    // The CPU's bits: the exact kernels (the fast ones: Fast, below).
    CudaBackendOptions XO;
    XO.Numerics = cuda::Numerics::Exact;
    XO.BlockwiseAttention = false; // the unfused ops; Blockwise below
    auto B = createCudaBackend(XO);
    ASSERT_TRUE(bool(B)) << toString(B.takeError());
    Gpu = std::move(*B);
    CudaBackendOptions FO;
    auto FB = createCudaBackend(FO);
    ASSERT_TRUE(bool(FB)) << toString(FB.takeError());
    Fast = std::move(*FB);
    CudaBackendOptions O = XO;
    O.BlockwiseAttention = true;
    auto BW = createCudaBackend(O);
    ASSERT_TRUE(bool(BW)) << toString(BW.takeError());
    Blockwise = std::move(*BW);
    CudaBackendOptions EO = XO;
    EO.CublasLtEpilogues = true;
    auto EB = createCudaBackend(EO);
    ASSERT_TRUE(bool(EB)) << toString(EB.takeError());
    Epilogues = std::move(*EB);
  }
  /// The attention core's two ways on the device: its unfused ops, and
  /// the blockwise kernels.
  std::vector<std::pair<const char *, Backend *>> attentionBackends() {
    return {{"unfused ops", Gpu.get()}, {"blockwise", Blockwise.get()}};
  }
  /// Runs C on both backends and checks the listed buffers within Tol
  /// (normwise relative); Exact: bitwise.
  void compare(OpCase &C, std::vector<int> Check, double Tol = 1e-6,
               std::optional<double> Drop = std::nullopt) {
    CpuBackend Cpu;
    auto Want = C.run(Cpu, Drop);
    ASSERT_TRUE(bool(Want)) << toString(Want.takeError());
    auto Got = C.run(*Gpu, Drop);
    ASSERT_TRUE(bool(Got)) << toString(Got.takeError());
    for (int B : Check) {
      const ProgramBuffer &PB = C.P.Buffers[B];
      if (PB.Type.Dtype != DType::F32) {
        EXPECT_EQ((*Got)[B], (*Want)[B]) << "buffer " << B << " differs";
        continue;
      }
      double Err = normwiseError(asFloats((*Got)[B]), asFloats((*Want)[B]));
      if (Err != 0) // expected bitwise for most ops: say where it is not
        std::printf("  note: %s buffer %d (%s) is not the CPU's bit for bit: "
                    "normwise difference %.3g\n",
                    opName(C.P.Instrs[0].Op).str().c_str(), B,
                    PB.Type.str().c_str(), Err);
      EXPECT_LE(Err, Tol) << opName(C.P.Instrs[0].Op).str() << ": buffer "
                          << B << " (" << PB.Type.str() << ")";
    }
  }
  std::unique_ptr<Backend> Gpu, Blockwise;
  std::unique_ptr<Backend> Fast; // --cuda-numerics fast (the default)
  std::unique_ptr<Backend> Epilogues; // --cuda-epilogues
};

TEST_F(CudaKernels, Embedding) {
  for (int Grad = 0; Grad < 2; ++Grad) {
    OpCase C;
    int Ids = C.ids({4, 16}, 0, 50);
    if (!Grad) {
      int Table = C.floats({50, 24});
      int Y = C.buffer(DType::F32, {4, 16, 24});
      C.op(OpKind::Embedding, {Table, Ids}, {Y});
      compare(C, {Y});
    } else {
      int DY = C.floats({4, 16, 24});
      int DT = C.buffer(DType::F32, {50, 24});
      C.op(OpKind::EmbeddingGrad, {Ids, DY}, {DT}).Attrs.set("vocab",
                                                           int64_t(50));
      compare(C, {DT});
    }
  }
}

TEST_F(CudaKernels, EmbeddingIdOutOfRangeIsReported) {
  OpCase C;
  int Table = C.floats({10, 8});
  int Ids = C.ids({2, 4}, 10, 12); // all outside [0, 10)
  int Y = C.buffer(DType::F32, {2, 4, 8});
  C.op(OpKind::Embedding, {Table, Ids}, {Y});
  auto R = C.run(*Gpu);
  ASSERT_FALSE(bool(R));
  EXPECT_NE(toString(R.takeError()).find("embedding id out of range"),
            std::string::npos);
}

TEST_F(CudaKernels, AddMulBroadcastAndReduceTo) {
  for (OpKind Op : {OpKind::Add, OpKind::Mul}) {
    OpCase Same;
    int A = Same.floats({3, 5, 7}), B = Same.floats({3, 5, 7});
    int Y = Same.buffer(DType::F32, {3, 5, 7});
    Same.op(Op, {A, B}, {Y});
    compare(Same, {Y});
    OpCase Bc;
    int A2 = Bc.floats({3, 1, 7}), B2 = Bc.floats({5, 1});
    int Y2 = Bc.buffer(DType::F32, {3, 5, 7});
    Bc.op(Op, {A2, B2}, {Y2});
    compare(Bc, {Y2});
  }
  OpCase R;
  int DY = R.floats({3, 5, 7});
  int DX = R.buffer(DType::F32, {5, 1});
  R.op(OpKind::ReduceTo, {DY}, {DX}).Attrs.set("shape",
                                               std::vector<int64_t>{5, 1});
  compare(R, {DX});
}

// Widths and row counts below and above the kernels' batches (Common.cuh:
// LaneBatch x RowLanes = 64 columns per lane step, ColumnBatch = 16 rows),
// so both the batched loops and their tails run.
TEST_F(CudaKernels, LayerNormForwardAndBackward) {
  // 200 rows: the column sums' blocks of 64 (LaunchGeometry.h, ColumnRows),
  // the last one partial, bit for bit.
  for (auto [Rows, H] : {std::pair<int64_t, int64_t>{6, 37}, {70, 37},
                         {35, 203}, {200, 37}}) {
    OpCase F;
    int X = F.floats({Rows, H}, 2, 0.5), G = F.floats({H}), B = F.floats({H});
    int Y = F.buffer(DType::F32, {Rows, H}), M = F.buffer(DType::F32, {Rows}),
        R = F.buffer(DType::F32, {Rows});
    F.op(OpKind::LayerNorm, {X, G, B}, {Y, M, R});
    compare(F, {Y, M, R});
    OpCase Bw;
    int DY = Bw.floats({Rows, H}), X2 = Bw.floats({Rows, H}),
        G2 = Bw.floats({H});
    int M2 = Bw.floats({Rows}, 0.1f), R2 = Bw.floats({Rows}, 0.1f, 1.0f);
    int DX = Bw.buffer(DType::F32, {Rows, H}), DG = Bw.buffer(DType::F32, {H}),
        DB = Bw.buffer(DType::F32, {H});
    Bw.op(OpKind::LayerNormGrad, {DY, X2, G2, M2, R2}, {DX, DG, DB});
    compare(Bw, {DX, DG, DB}, Rows == 200 ? 0 : 1e-6);
  }
}

/// gamma_n = n u / (1 - n u), u = 2^-24: a float32 computation of n
/// roundings has relative error at most gamma_n (Higham, 3.1).
double gammaF32(double N) {
  const double U = 0x1p-24;
  return N * U / (1 - N * U);
}

/// Buffer B's elements as doubles (float32, or bf16/fp16 widened).
std::vector<double> elements(const std::vector<char> &Bytes, DType T) {
  std::vector<double> V;
  if (T == DType::F32) {
    for (float F : asFloats(Bytes))
      V.push_back(F);
    return V;
  }
  for (size_t K = 0; K + 1 < Bytes.size(); K += 2) {
    uint16_t H;
    std::memcpy(&H, Bytes.data() + K, 2);
    V.push_back(T == DType::BF16 ? bfloat16ToFloat(H) : halfToFloat(H));
  }
  return V;
}

/// The spacing of T's values at V (bf16: 8 significant bits).
double ulpOf(double V, DType T) {
  if (V == 0 || T == DType::F32)
    return 0;
  return std::ldexp(1.0, std::ilogb(V) - (T == DType::BF16 ? 7 : 10));
}

// The fast LayerNorm (kernels/LayerNormFast.cuh, the Fast backend's) is
// checked against float64 computations of the same formulas, within bounds
// derived from float32's rounding, gamma_n above (first-order terms doubled
// where a bound is not rigorous, to cover the second-order ones, which are
// smaller by a factor of about n u here). Per row of H elements:
//  - mu' = fl(sum x) / H: H roundings, |mu' - mu| <= Emu = g_H sum|x| / H;
//  - var' = fl(sum fl(x - mu')^2) / H: each term rounds 2 times, the sum
//    H - 1, the division once, and sum (x - mu')^2 / H = var + (mu - mu')^2
//    exactly, so |var' - var| <= Ev = g_{H+2} (var + Emu^2) + Emu^2;
//  - s' = fl(1 / fl(sqrt(fl(var' + eps)))): d s / s = d var / (2 (var +
//    eps)) to first order, and 3 roundings: Es = 2 s (Ev / (2 (var + eps))
//    + g_3);
//  - y' = fl(fl(fl(x - mu') s') gamma) + beta): 4 roundings, so
//    Ey = 2 (|gamma| ((|x - mu| + Emu) Es + s Emu) + g_4 (|gamma| (|x - mu|
//    + Emu) (s + Es) + |beta|)).
// The backward, given float32 Mean and Rstd (the same inputs for every
// backend), xhat = (x - Mean) Rstd, g = dy gamma:
//  - A = fl(sum g) / H: |dA| <= EA = g_{H+1} sum|g| / H;
//  - B = fl(sum g xhat) / H, each term 4 roundings: EB = g_{H+4}
//    sum|g xhat| / H;
//  - dx = fl(Rstd fl(fl(g - A) - fl(xhat B))), 7 roundings: Edx = 2 Rstd
//    (EA + |xhat| EB + g_7 (|g| + |A| + |xhat| (|B| + EB)));
//  - dgamma = sum_r fl(dy xhat), 3 roundings a term and Rows - 1 additions
//    in any order (the chunks' partials, then the chunks in order), added
//    to zero: Edg = g_{Rows+3} sum_r |dy xhat| (rigorous); dbeta:
//    Edb = g_{Rows} sum_r |dy|.
// 16-bit outputs round y' or dx' once more: they are within the bound plus
// half a unit of the float64 value, and within one unit in the last place
// (plus the bound, which matters only under cancellation) of the exact
// form's (the CPU's) 16-bit result, which rounds a value within float32's
// error of the same real.
// The shapes: H not a multiple of the vector width (the scalar form), H
// past a thousand (a block per row, several warps; 1280: f32 rows of 96
// threads, two to a block of 192), past the registers
// (4099: vectors reread), rows not a multiple of the backward's chunk of
// 32 and fewer than one chunk; scale 0.01 makes the variance 1e-4, where
// a wrong epsilon (1e-5) would show.
TEST_F(CudaKernels, FastLayerNormIsWithinFloat32RoundingOfExact) {
  struct Shape {
    int64_t Rows, H;
    float Scale;
  };
  const double Eps = 1e-5;
  for (DType T : {DType::F32, DType::BF16})
    for (Shape Sh :
         {Shape{6, 37, 2}, Shape{70, 64, 0.01f}, Shape{33, 1030, 1},
          Shape{40, 1024, 2}, Shape{20, 1280, 1}, Shape{3, 4099, 1}}) {
      const int64_t Rows = Sh.Rows, H = Sh.H;
      SCOPED_TRACE(std::string(T == DType::F32 ? "f32" : "bf16") + ", rows " +
                   std::to_string(Rows) + ", h " + std::to_string(H));
      auto Input = [&](OpCase &C, std::vector<int64_t> S, float Scale) {
        return T == DType::F32 ? C.floats(S, Scale) : C.halfs(T, S, Scale);
      };
      CpuBackend Cpu;
      // Forward.
      OpCase F;
      int X = Input(F, {Rows, H}, Sh.Scale), G = Input(F, {H}, 1),
          B = Input(F, {H}, 1);
      int Y = F.buffer(T, {Rows, H}), M = F.buffer(DType::F32, {Rows}),
          R = F.buffer(DType::F32, {Rows});
      F.op(OpKind::LayerNorm, {X, G, B}, {Y, M, R}).Attrs.set("epsilon", Eps);
      auto Want = F.run(Cpu);
      auto Got = F.run(*Fast);
      auto Again = F.run(*Fast);
      ASSERT_TRUE(Want && Got && Again);
      EXPECT_EQ((*Got)[Y], (*Again)[Y]) << "the fast forward is not fixed";
      {
        auto Xv = elements(F.Data[X], T), Gv = elements(F.Data[G], T),
             Bv = elements(F.Data[B], T);
        auto Yf = elements((*Got)[Y], T), Yc = elements((*Want)[Y], T),
             Mf = elements((*Got)[M], DType::F32),
             Rf = elements((*Got)[R], DType::F32);
        int64_t Bad = 0, Same = 0;
        for (int64_t Rw = 0; Rw < Rows; ++Rw) {
          const double *XR = &Xv[Rw * H];
          double Sum = 0, Abs = 0, Sq = 0;
          for (int64_t J = 0; J < H; ++J)
            Sum += XR[J], Abs += std::fabs(XR[J]);
          double Mu = Sum / H;
          for (int64_t J = 0; J < H; ++J)
            Sq += (XR[J] - Mu) * (XR[J] - Mu);
          double Var = Sq / H, S = 1 / std::sqrt(Var + Eps);
          double Emu = gammaF32(H) * Abs / H;
          double Ev = gammaF32(H + 2) * (Var + Emu * Emu) + Emu * Emu;
          double Es = 2 * S * (Ev / (2 * (Var + Eps)) + gammaF32(3));
          EXPECT_LE(std::fabs(Mf[Rw] - Mu), Emu) << "mean of row " << Rw;
          EXPECT_LE(std::fabs(Rf[Rw] - S), Es) << "rstd of row " << Rw;
          for (int64_t J = 0; J < H; ++J) {
            double D = std::fabs(XR[J] - Mu),
                   Yr = (XR[J] - Mu) * S * Gv[J] + Bv[J];
            double Ey =
                2 * (std::fabs(Gv[J]) * ((D + Emu) * Es + S * Emu) +
                     gammaF32(4) * (std::fabs(Gv[J]) * (D + Emu) * (S + Es) +
                                    std::fabs(Bv[J])));
            double Got1 = Yf[Rw * H + J], Exact = Yc[Rw * H + J];
            double Ulp = std::max(ulpOf(Got1, T), ulpOf(Exact, T));
            bool Ok = std::fabs(Got1 - Yr) <= Ey + Ulp / 2 &&
                      std::fabs(Got1 - Exact) <= Ulp + 2 * Ey;
            Bad += !Ok;
            Same += Got1 == Exact;
            if (!Ok && Bad <= 3)
              ADD_FAILURE()
                  << "y[" << Rw << ", " << J << "] = " << Got1 << ", float64 "
                  << Yr << ", exact " << Exact << ", bound " << Ey;
          }
        }
        EXPECT_EQ(Bad, 0);
        std::printf("  fast layer_norm %s [%lld, %lld]: %lld of %lld y "
                    "differ from the exact form's\n",
                    T == DType::F32 ? "f32" : "bf16", (long long)Rows,
                    (long long)H, (long long)(Rows * H - Same),
                    (long long)(Rows * H));
      }
      // Backward, from the same float32 statistics on every backend.
      OpCase Bw;
      int DY = Input(Bw, {Rows, H}, 1), X2 = Input(Bw, {Rows, H}, Sh.Scale),
          G2 = Input(Bw, {H}, 1);
      int M2 = Bw.floats({Rows}, 0.1f * Sh.Scale),
          R2 = Bw.floats({Rows}, 0.1f / Sh.Scale, 1.0f / Sh.Scale);
      int DX = Bw.buffer(T, {Rows, H}), DG = Bw.buffer(DType::F32, {H}),
          DB = Bw.buffer(DType::F32, {H});
      Bw.op(OpKind::LayerNormGrad, {DY, X2, G2, M2, R2}, {DX, DG, DB});
      auto BWant = Bw.run(Cpu);
      auto BGot = Bw.run(*Fast);
      auto BAgain = Bw.run(*Fast);
      ASSERT_TRUE(BWant && BGot && BAgain);
      for (int K : {DX, DG, DB})
        EXPECT_EQ((*BGot)[K], (*BAgain)[K])
            << "the fast backward is not fixed: buffer " << K;
      auto Dyv = elements(Bw.Data[DY], T), Xv = elements(Bw.Data[X2], T),
           Gv = elements(Bw.Data[G2], T),
           Mv = elements(Bw.Data[M2], DType::F32),
           Rv = elements(Bw.Data[R2], DType::F32);
      auto DXf = elements((*BGot)[DX], T), DXc = elements((*BWant)[DX], T),
           DGf = elements((*BGot)[DG], DType::F32),
           DBf = elements((*BGot)[DB], DType::F32);
      std::vector<double> DGr(H), DBr(H), DGa(H), DBa(H);
      int64_t Bad = 0, Same = 0;
      for (int64_t Rw = 0; Rw < Rows; ++Rw) {
        double A = 0, Aa = 0, Bs = 0, Ba = 0, S = Rv[Rw];
        auto XHat = [&](int64_t J) { return (Xv[Rw * H + J] - Mv[Rw]) * S; };
        for (int64_t J = 0; J < H; ++J) {
          double Gg = Dyv[Rw * H + J] * Gv[J];
          A += Gg, Aa += std::fabs(Gg);
          Bs += Gg * XHat(J), Ba += std::fabs(Gg * XHat(J));
          DGr[J] += Dyv[Rw * H + J] * XHat(J);
          DGa[J] += std::fabs(Dyv[Rw * H + J] * XHat(J));
          DBr[J] += Dyv[Rw * H + J];
          DBa[J] += std::fabs(Dyv[Rw * H + J]);
        }
        A /= H, Bs /= H;
        double EA = gammaF32(H + 1) * Aa / H, EB = gammaF32(H + 4) * Ba / H;
        for (int64_t J = 0; J < H; ++J) {
          double Gg = Dyv[Rw * H + J] * Gv[J], Xh = XHat(J);
          double Dx = S * (Gg - A - Xh * Bs);
          double Edx = 2 * S *
                       (EA + std::fabs(Xh) * EB +
                        gammaF32(7) * (std::fabs(Gg) + std::fabs(A) +
                                       std::fabs(Xh) * (std::fabs(Bs) + EB)));
          double Got1 = DXf[Rw * H + J], Exact = DXc[Rw * H + J];
          double Ulp = std::max(ulpOf(Got1, T), ulpOf(Exact, T));
          bool Ok = std::fabs(Got1 - Dx) <= Edx + Ulp / 2 &&
                    std::fabs(Got1 - Exact) <= Ulp + 2 * Edx;
          Bad += !Ok;
          Same += Got1 == Exact;
          if (!Ok && Bad <= 3)
            ADD_FAILURE() << "dx[" << Rw << ", " << J << "] = " << Got1
                          << ", float64 " << Dx << ", exact " << Exact
                          << ", bound " << Edx;
        }
      }
      for (int64_t J = 0; J < H; ++J) {
        if (std::fabs(DGf[J] - DGr[J]) > gammaF32(Rows + 3) * DGa[J] &&
            ++Bad <= 6)
          ADD_FAILURE() << "dgamma[" << J << "] = " << DGf[J] << ", float64 "
                        << DGr[J];
        if (std::fabs(DBf[J] - DBr[J]) > gammaF32(Rows) * DBa[J] && ++Bad <= 6)
          ADD_FAILURE() << "dbeta[" << J << "] = " << DBf[J] << ", float64 "
                        << DBr[J];
      }
      EXPECT_EQ(Bad, 0);
      std::printf("  fast layer_norm_grad %s [%lld, %lld]: %lld of %lld dx "
                  "differ from the exact form's\n",
                  T == DType::F32 ? "f32" : "bf16", (long long)Rows,
                  (long long)H, (long long)(Rows * H - Same),
                  (long long)(Rows * H));
    }
}

// The fast RMSNorm (LayerNormFast.cuh with mu = 0; float32 only), against
// float64 within bounds derived as FastLayerNorm's above: per row,
//  - q' = fl(sum fl(x x)) / H: |q' - q| <= Eq = g_{H+1} q;
//  - s' = fl(1 / fl(sqrt(fl(q' + eps)))): Es = 2 s (Eq / (2 (q + eps)) +
//    g_3);
//  - y' = fl(fl(x s') gamma): Ey = 2 |x gamma| (Es + g_2 (s + Es));
// backward, xhat = x Rstd, g = dy gamma, B = fl(sum g xhat) / H (4
// roundings a term: EB = g_{H+4} sum|g xhat| / H), dx = fl(Rstd fl(g -
// fl(xhat B))): Edx = 2 Rstd (|xhat| EB + g_5 (|g| + |xhat| (|B| + EB)));
// dgamma = sum_r fl(dy xhat) in any order: g_{Rows+2} sum_r |dy xhat|.
TEST_F(CudaKernels, FastRmsNormIsWithinFloat32RoundingOfExact) {
  const double Eps = 1e-6;
  for (auto [Rows, H, Scale] : {std::tuple<int64_t, int64_t, float>{6, 37, 2},
                                {70, 64, 0.001f},
                                {33, 1030, 1},
                                {40, 1024, 2},
                                {20, 1280, 1},
                                {3, 4099, 1}}) {
    SCOPED_TRACE("rows " + std::to_string(Rows) + ", h " + std::to_string(H));
    OpCase F;
    int X = F.floats({Rows, H}, Scale), G = F.floats({H});
    int Y = F.buffer(DType::F32, {Rows, H}), R = F.buffer(DType::F32, {Rows});
    F.op(OpKind::RmsNorm, {X, G}, {Y, R}).Attrs.set("epsilon", Eps);
    auto Got = F.run(*Fast);
    auto Again = F.run(*Fast);
    ASSERT_TRUE(Got && Again);
    EXPECT_EQ((*Got)[Y], (*Again)[Y]) << "the fast forward is not fixed";
    auto Xv = elements(F.Data[X], DType::F32),
         Gv = elements(F.Data[G], DType::F32),
         Yf = elements((*Got)[Y], DType::F32),
         Rf = elements((*Got)[R], DType::F32);
    int64_t Bad = 0;
    for (int64_t Rw = 0; Rw < Rows; ++Rw) {
      double Q = 0;
      for (int64_t J = 0; J < H; ++J)
        Q += Xv[Rw * H + J] * Xv[Rw * H + J];
      Q /= H;
      double S = 1 / std::sqrt(Q + Eps), Eq = gammaF32(H + 1) * Q;
      double Es = 2 * S * (Eq / (2 * (Q + Eps)) + gammaF32(3));
      EXPECT_LE(std::fabs(Rf[Rw] - S), Es) << "rstd of row " << Rw;
      for (int64_t J = 0; J < H; ++J) {
        double XG = Xv[Rw * H + J] * Gv[J];
        double Ey = 2 * std::fabs(XG) * (Es + gammaF32(2) * (S + Es));
        if (std::fabs(Yf[Rw * H + J] - XG * S) > Ey && ++Bad <= 3)
          ADD_FAILURE() << "y[" << Rw << ", " << J << "] = " << Yf[Rw * H + J]
                        << ", float64 " << XG * S << ", bound " << Ey;
      }
    }
    OpCase Bw;
    int DY = Bw.floats({Rows, H}), X2 = Bw.floats({Rows, H}, Scale),
        G2 = Bw.floats({H}), R2 = Bw.floats({Rows}, 0.1f / Scale, 1 / Scale);
    int DX = Bw.buffer(DType::F32, {Rows, H}), DG = Bw.buffer(DType::F32, {H});
    Bw.op(OpKind::RmsNormGrad, {DY, X2, G2, R2}, {DX, DG});
    auto BGot = Bw.run(*Fast);
    auto BAgain = Bw.run(*Fast);
    ASSERT_TRUE(BGot && BAgain);
    EXPECT_EQ((*BGot)[DX], (*BAgain)[DX]) << "the fast dx is not fixed";
    EXPECT_EQ((*BGot)[DG], (*BAgain)[DG]) << "the fast dgamma is not fixed";
    auto Dyv = elements(Bw.Data[DY], DType::F32),
         X2v = elements(Bw.Data[X2], DType::F32),
         G2v = elements(Bw.Data[G2], DType::F32),
         Rv = elements(Bw.Data[R2], DType::F32),
         DXf = elements((*BGot)[DX], DType::F32),
         DGf = elements((*BGot)[DG], DType::F32);
    std::vector<double> DGr(H), DGa(H);
    for (int64_t Rw = 0; Rw < Rows; ++Rw) {
      double B = 0, Ba = 0, S = Rv[Rw];
      for (int64_t J = 0; J < H; ++J) {
        double Gg = Dyv[Rw * H + J] * G2v[J], Xh = X2v[Rw * H + J] * S;
        B += Gg * Xh, Ba += std::fabs(Gg * Xh);
        DGr[J] += Dyv[Rw * H + J] * Xh;
        DGa[J] += std::fabs(Dyv[Rw * H + J] * Xh);
      }
      B /= H;
      double EB = gammaF32(H + 4) * Ba / H;
      for (int64_t J = 0; J < H; ++J) {
        double Gg = Dyv[Rw * H + J] * G2v[J], Xh = X2v[Rw * H + J] * S;
        double Dx = S * (Gg - Xh * B);
        double Edx = 2 * S *
                     (std::fabs(Xh) * EB +
                      gammaF32(5) * (std::fabs(Gg) +
                                     std::fabs(Xh) * (std::fabs(B) + EB)));
        if (std::fabs(DXf[Rw * H + J] - Dx) > Edx && ++Bad <= 6)
          ADD_FAILURE() << "dx[" << Rw << ", " << J << "] = " << DXf[Rw * H + J]
                        << ", float64 " << Dx << ", bound " << Edx;
      }
    }
    for (int64_t J = 0; J < H; ++J)
      if (std::fabs(DGf[J] - DGr[J]) > gammaF32(Rows + 2) * DGa[J] &&
          ++Bad <= 9)
        ADD_FAILURE() << "dgamma[" << J << "] = " << DGf[J] << ", float64 "
                      << DGr[J];
    EXPECT_EQ(Bad, 0);
  }
}

/// Microseconds per run of C's instructions on B (the inputs copied once,
/// two warm-up runs, then Iters timed on the host around a synchronize).
double microsPerRun(Backend &B, OpCase &C, int Iters) {
  auto Arena = B.allocate(C.P.ArenaBytes);
  if (!Arena) {
    consumeError(Arena.takeError());
    return NAN;
  }
  auto Free = make_scope_exit([&] { B.release(*Arena); });
  for (size_t K = 0; K < C.P.Buffers.size(); ++K)
    if (!C.Data[K].empty())
      if (Error E = B.copyToBackend(*Arena + C.P.Buffers[K].Offset,
                                    C.Data[K].data(), C.Data[K].size())) {
        consumeError(std::move(E));
        return NAN;
      }
  auto Tensor = createSingleRankCommunicator();
  auto RunAll = [&](int N) {
    for (int It = 0; It < N; ++It)
      for (const Instruction &I : C.P.Instrs)
        if (Error E = B.run(testCall(I, C.P, *Arena, *Tensor))) {
          consumeError(std::move(E));
          return false;
        }
    if (Error E = B.synchronize()) {
      consumeError(std::move(E));
      return false;
    }
    return true;
  };
  if (!RunAll(2))
    return NAN;
  auto T0 = std::chrono::steady_clock::now();
  if (!RunAll(Iters))
    return NAN;
  auto T1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(T1 - T0).count() / Iters;
}

// Timings of both forms of the norms at [8192, 6144] in bf16 and f32 (the
// fast forms' target: near the memory roofline, about 47 us forward and
// 70 us backward in bf16 on an H200). Only with SP_NORM_TIMINGS set (too
// large for the emulator); it prints, it checks nothing.
TEST_F(CudaKernels, NormTimings) {
  if (!std::getenv("SP_NORM_TIMINGS"))
    GTEST_SKIP() << "set SP_NORM_TIMINGS=1 to time the norms";
  const int64_t Rows = 8192, H = 6144;
  for (DType T : {DType::BF16, DType::F32}) {
    auto Input = [&](OpCase &C, std::vector<int64_t> S) {
      return T == DType::F32 ? C.floats(S) : C.halfs(T, S);
    };
    OpCase F;
    int X = Input(F, {Rows, H}), G = Input(F, {H}), B = Input(F, {H});
    int Y = F.buffer(T, {Rows, H}), M = F.buffer(DType::F32, {Rows}),
        R = F.buffer(DType::F32, {Rows});
    F.op(OpKind::LayerNorm, {X, G, B}, {Y, M, R});
    OpCase Bw;
    int DY = Input(Bw, {Rows, H}), X2 = Input(Bw, {Rows, H}),
        G2 = Input(Bw, {H});
    int M2 = Bw.floats({Rows}, 0.1f), R2 = Bw.floats({Rows}, 0.1f, 1.0f);
    int DX = Bw.buffer(T, {Rows, H}), DG = Bw.buffer(DType::F32, {H}),
        DB = Bw.buffer(DType::F32, {H});
    Bw.op(OpKind::LayerNormGrad, {DY, X2, G2, M2, R2}, {DX, DG, DB});
    const char *Name = T == DType::F32 ? "f32" : "bf16";
    for (auto [Form, Be] :
         {std::pair<const char *, Backend *>{"exact", Gpu.get()},
          {"fast", Fast.get()}})
      std::printf("  %s %s [%lld, %lld]: layer_norm %.1f us, "
                  "layer_norm_grad %.1f us\n",
                  Form, Name, (long long)Rows, (long long)H,
                  microsPerRun(*Be, F, 20), microsPerRun(*Be, Bw, 20));
    if (T == DType::F32) { // RMSNorm runs in float32 only
      OpCase RF;
      int RX = RF.floats({Rows, H}), RG = RF.floats({H});
      int RY = RF.buffer(DType::F32, {Rows, H}),
          RR = RF.buffer(DType::F32, {Rows});
      RF.op(OpKind::RmsNorm, {RX, RG}, {RY, RR});
      OpCase RB;
      int RDY = RB.floats({Rows, H}), RX2 = RB.floats({Rows, H}),
          RG2 = RB.floats({H}), RR2 = RB.floats({Rows}, 0.1f, 1.0f);
      int RDX = RB.buffer(DType::F32, {Rows, H}),
          RDG = RB.buffer(DType::F32, {H});
      RB.op(OpKind::RmsNormGrad, {RDY, RX2, RG2, RR2}, {RDX, RDG});
      for (auto [Form, Be] :
           {std::pair<const char *, Backend *>{"exact", Gpu.get()},
            {"fast", Fast.get()}})
        std::printf("  %s f32 [%lld, %lld]: rms_norm %.1f us, "
                    "rms_norm_grad %.1f us\n",
                    Form, (long long)Rows, (long long)H,
                    microsPerRun(*Be, RF, 20), microsPerRun(*Be, RB, 20));
    }
  }
}

TEST_F(CudaKernels, RmsNormForwardAndBackward) {
  for (auto [Rows, H] :
       {std::pair<int64_t, int64_t>{9, 40}, {41, 150}, {130, 150}}) {
    OpCase F;
    int X = F.floats({Rows, H}), G = F.floats({H});
    int Y = F.buffer(DType::F32, {Rows, H}), R = F.buffer(DType::F32, {Rows});
    F.op(OpKind::RmsNorm, {X, G}, {Y, R});
    compare(F, {Y, R});
    OpCase Bw;
    int DY = Bw.floats({Rows, H}), X2 = Bw.floats({Rows, H}),
        G2 = Bw.floats({H}), R2 = Bw.floats({Rows}, 0.1f, 1.0f);
    int DX = Bw.buffer(DType::F32, {Rows, H}), DG = Bw.buffer(DType::F32, {H});
    Bw.op(OpKind::RmsNormGrad, {DY, X2, G2, R2}, {DX, DG});
    compare(Bw, {DX, DG}, Rows == 130 ? 0 : 1e-6);
  }
}

/// C = A B checked against float64 within gamma_{K+1} (sum |a b| + |bias|).
void checkProduct(const std::vector<float> &Got, const std::vector<double> &Ref,
                  const std::vector<double> &AbsSum, int64_t K,
                  const char *What) {
  const double U = std::ldexp(1.0, -24);
  double Gamma = (K + 1) * U / (1 - (K + 1) * U);
  for (size_t I = 0; I < Got.size(); ++I)
    ASSERT_LE(std::fabs(Got[I] - Ref[I]), Gamma * AbsSum[I] + 1e-30)
        << What << " element " << I;
}

/// A linear layer's exact result in double, Ref = X op(W) + Bias, and
/// the sums of its terms' magnitudes, Abs (for checkProduct), from case C's
/// float32 buffers X [Rows, In], W ([In, Out], or [Out, In] with TransW)
/// and Bias [Out].
void linearReference(const OpCase &C, int X, int W, int Bias, bool TransW,
                     std::vector<double> &Ref, std::vector<double> &Abs) {
  const int64_t In = C.P.Buffers[X].Type.dim(-1),
                Rows = C.P.Buffers[X].Type.numElements() / In,
                Out = C.P.Buffers[Bias].Type.numElements();
  auto XV = asFloats(C.Data[X]), WV = asFloats(C.Data[W]),
       BV = asFloats(C.Data[Bias]);
  Ref.assign(Rows * Out, 0);
  Abs.assign(Rows * Out, 0);
  for (int64_t R = 0; R < Rows; ++R)
    for (int64_t O = 0; O < Out; ++O) {
      double S = BV[O], A = std::fabs(BV[O]);
      for (int64_t I = 0; I < In; ++I) {
        double Wv = TransW ? WV[O * In + I] : WV[I * Out + O];
        S += double(XV[R * In + I]) * Wv;
        A += std::fabs(double(XV[R * In + I]) * Wv);
      }
      Ref[R * Out + O] = S;
      Abs[R * Out + O] = A;
    }
}

TEST_F(CudaKernels, LinearAndItsWeightGradient) {
  const int64_t Rows = 33, In = 48, Out = 20;
  for (int TransW = 0; TransW < 2; ++TransW) {
    OpCase C;
    int X = C.floats({Rows, In});
    int W = TransW ? C.floats({Out, In}) : C.floats({In, Out});
    int Bias = C.floats({Out});
    int Y = C.buffer(DType::F32, {Rows, Out});
    C.op(OpKind::Linear, {X, W, Bias}, {Y}).Attrs.set("trans_w",
                                                      int64_t(TransW));
    CpuBackend Cpu;
    auto Want = C.run(Cpu);
    auto Got = C.run(*Gpu);
    ASSERT_TRUE(bool(Want) && bool(Got));
    std::vector<double> Ref, Abs;
    linearReference(C, X, W, Bias, TransW, Ref, Abs);
    checkProduct(asFloats((*Got)[Y]), Ref, Abs, In, "cuda linear");
    checkProduct(asFloats((*Want)[Y]), Ref, Abs, In, "cpu linear");
  }
  for (int TransW = 0; TransW < 2; ++TransW) {
    OpCase C;
    int X = C.floats({Rows, In}), DY = C.floats({Rows, Out});
    int DW = TransW ? C.buffer(DType::F32, {Out, In})
                    : C.buffer(DType::F32, {In, Out});
    C.op(OpKind::LinearGradW, {X, DY}, {DW}).Attrs.set("trans_w",
                                                       int64_t(TransW));
    auto Got = C.run(*Gpu);
    ASSERT_TRUE(bool(Got)) << toString(Got.takeError());
    auto XV = asFloats(C.Data[X]), DV = asFloats(C.Data[DY]);
    std::vector<double> Ref(In * Out), Abs(In * Out);
    for (int64_t I = 0; I < In; ++I)
      for (int64_t O = 0; O < Out; ++O) {
        double S = 0, A = 0;
        for (int64_t R = 0; R < Rows; ++R) {
          S += double(XV[R * In + I]) * DV[R * Out + O];
          A += std::fabs(double(XV[R * In + I]) * DV[R * Out + O]);
        }
        size_t E = TransW ? O * In + I : I * Out + O;
        Ref[E] = S;
        Abs[E] = A;
      }
    checkProduct(asFloats((*Got)[DW]), Ref, Abs, Rows, "linear_grad_w");
  }
}

TEST_F(CudaKernels, LinearBiasInCublasLtsEpilogue) {
  // --cuda-epilogues: the bias added by cuBLASLt's epilogue after the
  // GEMM's sum (the CPU adds it first), within the same bound of the exact
  // product as LinearAndItsWeightGradient's; linear_gelu's y is the GELU
  // kernel's of its z, bit for bit. Then bf16 operands read in place, the
  // result rounded once to bf16 (the float32 bound, then bf16's unit
  // roundoff, 2^-8, of the float32 result).
  const int64_t Rows = 33, In = 48, Out = 24;
  for (int TransW = 0; TransW < 2; ++TransW) {
    OpCase C;
    int X = C.floats({Rows, In});
    int W = TransW ? C.floats({Out, In}) : C.floats({In, Out});
    int Bias = C.floats({Out});
    int Z = C.buffer(DType::F32, {Rows, Out});
    int Y = C.buffer(DType::F32, {Rows, Out});
    int Z2 = C.buffer(DType::F32, {Rows, Out});
    Instruction &LG = C.op(OpKind::LinearGelu, {X, W, Bias}, {Z, Y});
    LG.Attrs.set("trans_w", int64_t(TransW));
    LG.Attrs.set("approximate", std::string("none"));
    C.op(OpKind::Linear, {X, W, Bias}, {Z2})
        .Attrs.set("trans_w", int64_t(TransW));
    auto Got = C.run(*Epilogues);
    ASSERT_TRUE(bool(Got)) << toString(Got.takeError());
    std::vector<double> Ref, Abs;
    linearReference(C, X, W, Bias, TransW, Ref, Abs);
    checkProduct(asFloats((*Got)[Z]), Ref, Abs, In, "linear_gelu's z");
    checkProduct(asFloats((*Got)[Z2]), Ref, Abs, In, "linear");
    OpCase G;
    int GZ = G.buffer(DType::F32, {Rows, Out});
    G.Data[GZ] = (*Got)[Z];
    int GY = G.buffer(DType::F32, {Rows, Out});
    G.op(OpKind::Gelu, {GZ}, {GY})
        .Attrs.set("approximate", std::string("none"));
    auto Want = G.run(*Gpu);
    ASSERT_TRUE(bool(Want)) << toString(Want.takeError());
    EXPECT_EQ((*Got)[Y], (*Want)[GY]) << "trans_w " << TransW;
  }
  OpCase C;
  int X = C.halfs(DType::BF16, {Rows, In});
  int W = C.halfs(DType::BF16, {In, Out});
  int Bias = C.halfs(DType::BF16, {Out});
  int Y = C.buffer(DType::BF16, {Rows, Out});
  C.op(OpKind::Linear, {X, W, Bias}, {Y}).Attrs.set("trans_w", int64_t(0));
  auto Got = C.run(*Epilogues);
  ASSERT_TRUE(bool(Got)) << toString(Got.takeError());
  auto Wide = [&](int B, int64_t K) {
    return double(bfloat16ToFloat(
        reinterpret_cast<const uint16_t *>(C.Data[B].data())[K]));
  };
  const double U = std::ldexp(1.0, -24),
               Gamma = (In + 1) * U / (1 - (In + 1) * U);
  for (int64_t R = 0; R < Rows; ++R)
    for (int64_t O = 0; O < Out; ++O) {
      double S = Wide(Bias, O), A = std::fabs(S);
      for (int64_t I = 0; I < In; ++I) {
        S += Wide(X, R * In + I) * Wide(W, I * Out + O);
        A += std::fabs(Wide(X, R * In + I) * Wide(W, I * Out + O));
      }
      double G = bfloat16ToFloat(
          reinterpret_cast<const uint16_t *>((*Got)[Y].data())[R * Out + O]);
      double F = Gamma * A; // the float32 result's distance from S
      ASSERT_LE(std::fabs(G - S), F + 0x1p-8 * (std::fabs(S) + F) + 1e-30)
          << "bf16 linear element " << R * Out + O;
    }
}

TEST_F(CudaKernels, BatchMatMul) {
  const int64_t Batch = 6, M = 9, N = 11, K = 13;
  // Mode 1: causal (the result's upper triangle is 0); mode 2: causal_a
  // (A, as stored, is zero above its diagonal: lower/CausalProducts.h).
  for (int Mode = 0; Mode < 3; ++Mode)
    for (int TA = 0; TA < 2; ++TA)
      for (int TB = 0; TB < 2; ++TB) {
        OpCase C;
        int A = TA ? C.floats({2, 3, K, M}) : C.floats({2, 3, M, K});
        int B = TB ? C.floats({2, 3, N, K}) : C.floats({2, 3, K, N});
        int Y = C.buffer(DType::F32, {2, 3, M, N});
        auto &I = C.op(OpKind::BatchMatMul, {A, B}, {Y});
        I.Attrs.set("trans_a", int64_t(TA));
        I.Attrs.set("trans_b", int64_t(TB));
        if (Mode == 1)
          I.Attrs.set("causal", int64_t(1));
        if (Mode == 2) {
          I.Attrs.set("causal_a", int64_t(1));
          auto *AD = reinterpret_cast<float *>(C.Data[A].data());
          int64_t Rows = TA ? K : M, Cols = TA ? M : K;
          for (int64_t P = 0; P < Batch; ++P)
            for (int64_t R = 0; R < Rows; ++R)
              for (int64_t Cc = R + 1; Cc < Cols; ++Cc)
                AD[(P * Rows + R) * Cols + Cc] = 0;
        }
        auto Got = C.run(*Gpu);
        ASSERT_TRUE(bool(Got)) << toString(Got.takeError());
        auto AV = asFloats(C.Data[A]), BV = asFloats(C.Data[B]);
        std::vector<double> Ref(Batch * M * N), Abs(Batch * M * N);
        for (int64_t P = 0; P < Batch; ++P)
          for (int64_t R = 0; R < M; ++R)
            for (int64_t Cc = 0; Cc < N; ++Cc) {
              double S = 0, Ab = 0;
              for (int64_t Kk = 0; Kk < K; ++Kk) {
                double X = AV[P * M * K + (TA ? Kk * M + R : R * K + Kk)];
                double Z = BV[P * K * N + (TB ? Cc * K + Kk : Kk * N + Cc)];
                S += X * Z;
                Ab += std::fabs(X * Z);
              }
              bool Masked = Mode == 1 && Cc > R;
              Ref[(P * M + R) * N + Cc] = Masked ? 0 : S;
              Abs[(P * M + R) * N + Cc] = Masked ? 0 : Ab;
            }
        checkProduct(asFloats((*Got)[Y]), Ref, Abs, K, "batch_matmul");
        CpuBackend Cpu;
        auto Want = C.run(Cpu);
        ASSERT_TRUE(bool(Want)) << toString(Want.takeError());
        checkProduct(asFloats((*Want)[Y]), Ref, Abs, K, "cpu batch_matmul");
      }
}

TEST_F(CudaKernels, BiasGrad) {
  for (int64_t Rows : {4, 9, 30}) { // 28, 63 and 210 rows (four blocks)
    OpCase C;
    int DY = C.floats({Rows, 7, 19});
    int DB = C.buffer(DType::F32, {19});
    C.op(OpKind::BiasGrad, {DY}, {DB});
    compare(C, {DB}, Rows == 30 ? 0 : 1e-6);
  }
}

TEST_F(CudaKernels, GeluBothFormsForwardAndBackward) {
  for (const char *Form : {"none", "tanh"}) {
    OpCase F;
    int X = F.floats({1000}, 4);
    int Y = F.buffer(DType::F32, {1000});
    F.op(OpKind::Gelu, {X}, {Y}).Attrs.set("approximate", std::string(Form));
    compare(F, {Y});
    OpCase B;
    int X2 = B.floats({1000}, 4), DY = B.floats({1000});
    int DX = B.buffer(DType::F32, {1000});
    B.op(OpKind::GeluGrad, {X2, DY}, {DX})
        .Attrs.set("approximate", std::string(Form));
    compare(B, {DX});
  }
}

TEST_F(CudaKernels, GeluEpiloguesAreTheUnfusedPairOnTheDevice) {
  // lower/FuseEpilogue.cpp's fused ops against the pair each stands for,
  // both on the device: the same cuBLAS product, the same GELU kernel, so
  // bitwise. (The pair's kernels are checked against the CPU above; the
  // CPU's fused kernels against its pair in tests/unit/FuseEpilogueTest.)
  const int64_t Rows = 33, In = 48, Out = 20;
  for (const char *Form : {"none", "tanh"})
    for (int TransW = 0; TransW < 2; ++TransW) {
      auto Attrs = [&](Instruction &I) -> Instruction & {
        I.Attrs.set("trans_w", int64_t(TransW));
        return I;
      };
      auto Gelu = [&](Instruction &I) {
        I.Attrs.set("approximate", std::string(Form));
      };
      OpCase Fused, Pair;
      for (OpCase *C : {&Fused, &Pair}) {
        int X = C->floats({Rows, In});
        int W = TransW ? C->floats({Out, In}) : C->floats({In, Out});
        int Bias = C->floats({Out});
        int Z = C->buffer(DType::F32, {Rows, Out});
        int Y = C->buffer(DType::F32, {Rows, Out});
        int DY = C->floats({Rows, In});
        int W2 = TransW ? C->floats({Out, In}) : C->floats({In, Out});
        int DZ = C->buffer(DType::F32, {Rows, Out});
        if (C == &Fused) {
          Gelu(Attrs(C->op(OpKind::LinearGelu, {X, W, Bias}, {Z, Y})));
          Gelu(Attrs(C->op(OpKind::LinearGeluGrad, {DY, W2, Z}, {DZ})));
        } else {
          Attrs(C->op(OpKind::Linear, {X, W, Bias}, {Z}));
          Gelu(C->op(OpKind::Gelu, {Z}, {Y}));
          int D = C->buffer(DType::F32, {Rows, Out});
          Attrs(C->op(OpKind::Linear, {DY, W2}, {D}));
          Gelu(C->op(OpKind::GeluGrad, {Z, D}, {DZ}));
        }
      }
      auto Got = Fused.run(*Gpu), Want = Pair.run(*Gpu);
      ASSERT_TRUE(bool(Got)) << toString(Got.takeError());
      ASSERT_TRUE(bool(Want)) << toString(Want.takeError());
      // Buffers 3, 4 and 7 are z, y and dz in both programs.
      for (int B : {3, 4, 7})
        EXPECT_EQ((*Got)[B], (*Want)[B])
            << Form << " trans_w " << TransW << " buffer " << B;
    }
}

TEST_F(CudaKernels, ActivationsForwardAndBackward) {
  // Every SP_UNARY_OP of ir/Ops.def, and its gradient op.
  for (auto [Fwd, Bwd] : {
#define SP_OP(Enum, Name)
#define SP_UNARY_OP(Enum, Name, OnnxName)                                      \
  std::pair{OpKind::Enum, OpKind::Enum##Grad},
#include "ir/Ops.def"
       }) {
    OpCase F;
    int X = F.floats({777}, 5);
    int Y = F.buffer(DType::F32, {777});
    F.op(Fwd, {X}, {Y});
    compare(F, {Y});
    OpCase B;
    int X2 = B.floats({777}, 5), DY = B.floats({777});
    int DX = B.buffer(DType::F32, {777});
    B.op(Bwd, {X2, DY}, {DX});
    compare(B, {DX});
  }
}

TEST_F(CudaKernels, HeadLayouts) {
  const int64_t B = 2, S = 5, Heads = 3, D = 4, H = Heads * D;
  for (int64_t PerHead : {0, 1}) { // q | k | v blocks, GPT-NeoX's [a, 3, d]
    OpCase C;
    int QKV = C.floats({B, S, 3 * H});
    int Q = C.buffer(DType::F32, {B, Heads, S, D}),
        K = C.buffer(DType::F32, {B, Heads, S, D}),
        V = C.buffer(DType::F32, {B, Heads, S, D});
    auto &Op = C.op(OpKind::SplitHeads, {QKV}, {Q, K, V});
    Op.Attrs.set("heads", Heads);
    Op.Attrs.set("per_head", PerHead);
    compare(C, {Q, K, V}, 0);
  }
  for (int64_t PerHead : {0, 1}) {
    OpCase C;
    int Q = C.floats({B, Heads, S, D}), K = C.floats({B, Heads, S, D}),
        V = C.floats({B, Heads, S, D});
    int QKV = C.buffer(DType::F32, {B, S, 3 * H});
    C.op(OpKind::SplitHeadsGrad, {Q, K, V}, {QKV})
        .Attrs.set("per_head", PerHead);
    compare(C, {QKV}, 0);
  }
  for (OpKind Op : {OpKind::MergeHeads, OpKind::MergeHeadsGrad,
                    OpKind::ToHeads}) {
    OpCase C;
    bool ToBhsd = Op != OpKind::MergeHeads;
    int X = ToBhsd ? C.floats({B, S, H}) : C.floats({B, Heads, S, D});
    int Y = ToBhsd ? C.buffer(DType::F32, {B, Heads, S, D})
                   : C.buffer(DType::F32, {B, S, H});
    C.op(Op, {X}, {Y}).Attrs.set("heads", Heads);
    compare(C, {Y}, 0);
  }
  {
    OpCase C;
    int X = C.floats({B, 2, S, D});
    int Y = C.buffer(DType::F32, {B, 6, S, D});
    C.op(OpKind::RepeatHeads, {X}, {Y}).Attrs.set("repeats", int64_t(3));
    compare(C, {Y}, 0);
    OpCase G;
    int DY = G.floats({B, 6, S, D});
    int DX = G.buffer(DType::F32, {B, 2, S, D});
    G.op(OpKind::RepeatHeadsGrad, {DY}, {DX}).Attrs.set("repeats", int64_t(3));
    compare(G, {DX});
  }
}

TEST_F(CudaKernels, RopeBothFormsForwardAndBackward) {
  for (int Interleaved = 0; Interleaved < 2; ++Interleaved)
    for (OpKind Op : {OpKind::Rope, OpKind::RopeGrad})
      for (int64_t CB : {1, 2})
        for (int64_t Rot : {8, 4}) { // whole heads, GPT-NeoX's partial rotary
          OpCase C;
          int X = C.floats({2, 3, 5, 8}), Cos = C.floats({CB, 5, Rot}),
              Sin = C.floats({CB, 5, Rot});
          int Y = C.buffer(DType::F32, {2, 3, 5, 8});
          C.op(Op, {X, Cos, Sin}, {Y})
              .Attrs.set("interleaved", int64_t(Interleaved));
          compare(C, {Y});
        }
}

TEST_F(CudaKernels, ScaleMasksAndSoftmax) {
  {
    OpCase C;
    int X = C.floats({2, 3, 7, 7});
    int Y = C.buffer(DType::F32, {2, 3, 7, 7});
    C.op(OpKind::Scale, {X}, {Y}).Attrs.set("alpha", 0.125);
    compare(C, {Y});
  }
  {
    OpCase C;
    int X = C.floats({2, 3, 7, 7});
    int Y = C.buffer(DType::F32, {2, 3, 7, 7});
    C.op(OpKind::CausalMask, {X}, {Y}).Attrs.set("fill", -1e9);
    compare(C, {Y});
  }
  for (DType Keep : {DType::I64, DType::F32}) {
    OpCase C;
    int X = C.floats({2, 3, 7, 7});
    int M = Keep == DType::I64 ? C.ids({2, 7}, 0, 2) : C.buffer(Keep, {2, 7});
    if (Keep == DType::F32)
      C.setFloats(M, {1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0});
    int Y = C.buffer(DType::F32, {2, 3, 7, 7});
    C.op(OpKind::PaddingMask, {X, M}, {Y}).Attrs.set("fill", -3.4e38);
    compare(C, {Y});
  }
  {
    OpCase C;
    int X = C.floats({2, 3, 7, 33}, 3);
    int Y = C.buffer(DType::F32, {2, 3, 7, 33});
    C.op(OpKind::Softmax, {X}, {Y});
    compare(C, {Y});
    OpCase B;
    int Yv = B.floats({2, 3, 7, 33}, 0.1f, 0.2f), DY = B.floats({2, 3, 7, 33});
    int DX = B.buffer(DType::F32, {2, 3, 7, 33});
    B.op(OpKind::SoftmaxGrad, {Yv, DY}, {DX});
    compare(B, {DX});
  }
}

TEST_F(CudaKernels, FusedSoftmaxForwardAndBackwardAreTheCpusBits) {
  for (std::vector<int64_t> Shape :
       {std::vector<int64_t>{2, 3, 7, 33}, std::vector<int64_t>{2, 3, 9, 9},
        std::vector<int64_t>{1, 2, 40, 5}, std::vector<int64_t>{1, 2, 3, 150}})
    for (double Alpha : {0.125, 1.0})
      for (int Causal : {0, 1}) {
        OpCase C;
        int X = C.floats(Shape, 3);
        int Y = C.buffer(DType::F32, Shape);
        auto &I = C.op(OpKind::Softmax, {X}, {Y});
        I.Attrs.set("alpha", Alpha);
        I.Attrs.set("causal", int64_t(Causal));
        I.Attrs.set("fill", Causal && Shape[3] == 9 ? -1e4 : -INFINITY);
        compare(C, {Y}, 0);
        OpCase B;
        int Yv = B.floats(Shape, 0.1f, 0.2f), DY = B.floats(Shape);
        int DX = B.buffer(DType::F32, Shape);
        auto &G = B.op(OpKind::SoftmaxGrad, {Yv, DY}, {DX});
        G.Attrs.set("alpha", Alpha);
        G.Attrs.set("causal", int64_t(Causal));
        G.Attrs.set("fill", Shape[3] == 9 ? 0.5 : 0.0);
        compare(B, {DX}, 0);
      }
}

/// --cuda-numerics fast: softmax and softmax_grad (plain, and the fused
/// scale + causal mask of lower/FuseSoftmax.cpp) and GELU (both forms,
/// forward and backward) in float32 (kernels/AttentionSoftmax.cuh,
/// kernels/Gelu.cuh), against float64 evaluations of the same real
/// functions of the same float inputs, elementwise, within bounds derived
/// from float32's rounding (u = 2^-24, gamma_n = n u / (1 - n u); a
/// relative error of k ulp is at most 2k u; first order, times 1.01 for
/// the second-order terms):
///  - softmax: d_j = x_j - m rounded (|d_j| u: the exp's relative error
///    from it), expf within 2 ulp (4u), so e_j is within
///    eps_j = (|d_j| + 4) u; the sum of the positive e_j within
///    max_k eps_k + gamma_{N-1}; 1 / s and e_j (1 / s) one rounding each:
///    |y_j - Y_j| <= Y_j (eps_j + max_k eps_k + gamma_{N-1} + 2u). An exp
///    that underflows (d_j < -87) loses its relative precision: plus
///    2^-125, absolute (s >= 1: the max's term is 1).
///  - softmax_grad: the dot of N products in float within
///    gamma_N sum_j |DY_j Y_j|, then the difference, the product with Y_j
///    and the scale one rounding each: |dx_j - DX_j| <= |alpha Y_j|
///    gamma_N sum_k |DY_k Y_k| + 3u |DX_j|; masked columns are
///    float(alpha) * float(fill) exactly.
///  - gelu erf: Phi = erfc(z) / 2, z = -x / sqrt 2 rounded twice (2u
///    relative) moves erfc by |z| 2u |erfc'(z) / erfc(z)| <= (2x^2 + 3|x|) u
///    (erfc'(z) / erfc(z) <= 2 |z| + 1.5: Mills' ratio), erfcf within
///    4 ulp: E_Phi = (2x^2 + 3|x| + 8) u, then x Phi: + u. The gradient's
///    x phi(x): exp's argument x^2 / 2 rounded once, expf 2 ulp, the
///    constant and two products: E = (x^2 / 2 + 8) u; the sum and the
///    product with DY: 2u of |DY dy/dx|.
///  - gelu tanh: u(x) rounded 7 times (2u exact), e = expf(-2u) within
///    E_e = (14 |u| + 4) u, s = 1 / (1 + e) within E_s = E_e + 2u, y = x s
///    + u; the gradient's s and T = x s r 2k (1 + 3c x^2) (r = e s):
///    E_T = 2 E_s + E_e + 11u, then 2u of |DY dy/dx|.
///  - a Phi or s below float's normals (the far left tail): plus
///    (|x| + 1) 2^-125, times |DY| for the gradients.
/// bf16 tensors: the float32 result rounded once more, within 2^-8 of it:
/// |got - ref| <= F + 2^-8 (|ref| + F) (F the float32 bound); and the
/// softmax's bf16 probabilities at most one bf16 ulp from the exact
/// kernel's (both round a float within a few u of the same real). Every
/// run twice: the same bits.
TEST_F(CudaKernels, FastSoftmaxAndGeluAreWithinFloat32RoundingOfExact) {
  const double U = 0x1p-24, Tiny = 0x1p-125;
  auto Gamma = [&](double N) { return N * U / (1 - N * U); };
  auto Values = [](const std::vector<char> &B, DType T) {
    std::vector<double> V;
    if (T == DType::F32) {
      for (float F : asFloats(B))
        V.push_back(F);
      return V;
    }
    for (size_t K = 0; K + 1 < B.size(); K += 2) {
      uint16_t H;
      std::memcpy(&H, B.data() + K, 2);
      V.push_back(bfloat16ToFloat(H));
    }
    return V;
  };
  // Runs C on the fast backend twice (the same bits) and returns the first.
  auto RunFast = [&](OpCase &C) {
    auto A = C.run(*Fast);
    auto B = C.run(*Fast);
    EXPECT_TRUE(bool(A) && bool(B));
    if (!A || !B) {
      consumeError(A.takeError());
      consumeError(B.takeError());
      return std::vector<std::vector<char>>();
    }
    EXPECT_TRUE(*A == *B) << "two runs differ";
    return *A;
  };
  // Got against Ref within the float32 bounds F (widened for bf16).
  auto Check = [&](const std::vector<double> &Got,
                   const std::vector<double> &Ref, const std::vector<double> &F,
                   DType T, const char *What) {
    ASSERT_EQ(Got.size(), Ref.size());
    int64_t Bad = 0;
    double Worst = 0;
    for (size_t K = 0; K < Got.size(); ++K) {
      double B =
          T == DType::F32 ? F[K] : F[K] + 0x1p-8 * (std::fabs(Ref[K]) + F[K]);
      double E = std::fabs(Got[K] - Ref[K]);
      if (!(E <= B)) { // NaN fails too
        if (Bad++ < 3)
          ADD_FAILURE() << What << " element " << K << ": " << Got[K] << " vs "
                        << Ref[K] << ", bound " << B;
      }
      if (B > 0)
        Worst = std::max(Worst, E / B);
    }
    EXPECT_EQ(Bad, 0) << What;
    std::printf("  %s (%s, %zu elements): largest error %.3g of its bound\n",
                What, T == DType::F32 ? "f32" : "bf16", Got.size(), Worst);
  };
  struct SoftmaxCase {
    std::vector<int64_t> Shape;
    double Alpha;
    bool Causal;
    double Fill;
  };
  for (DType T : {DType::F32, DType::BF16})
    for (SoftmaxCase SC :
         std::vector<SoftmaxCase>{{{2, 3, 7, 33}, 1.0, false, 0.0},
                                  {{1, 2, 24, 2048}, 0.125, true, -INFINITY},
                                  {{1, 1, 5, 3000}, 0.125, true, -1e4},
                                  {{1, 1, 4, 3001}, 1.0, false, 0.0},
                                  {{1, 3, 40, 77}, 0.125, true, -INFINITY},
                                  {{2, 70001}, 1.0, false, 0.0}}) {
      const std::vector<int64_t> &Shape = SC.Shape;
      const int64_t N = Shape.back(), Sq = Shape[Shape.size() - 2];
      std::string Name = "N " + std::to_string(N) +
                         (SC.Causal ? " causal" : "") +
                         (T == DType::F32 ? " f32" : " bf16");
      SCOPED_TRACE(Name);
      const float A = float(SC.Alpha), Fl = float(SC.Fill);
      const bool Scaled = SC.Alpha != 1.0;
      // Forward.
      OpCase C;
      int X = T == DType::F32 ? C.floats(Shape, 3) : C.halfs(T, Shape, 3);
      if (!SC.Causal) { // row 1 all -inf: zeros
        if (T == DType::F32)
          for (int64_t J = 0; J < N; ++J)
            reinterpret_cast<float *>(C.Data[X].data())[N + J] = -INFINITY;
        else
          for (int64_t J = 0; J < N; ++J)
            reinterpret_cast<uint16_t *>(C.Data[X].data())[N + J] = 0xff80;
      }
      int Y = C.buffer(T, Shape);
      auto &I = C.op(OpKind::Softmax, {X}, {Y});
      I.Attrs.set("alpha", SC.Alpha);
      I.Attrs.set("causal", int64_t(SC.Causal));
      I.Attrs.set("fill", SC.Fill);
      auto Got = RunFast(C);
      ASSERT_FALSE(Got.empty());
      auto XV = Values(C.Data[X], T), YV = Values(Got[Y], T);
      const int64_t Rows = int64_t(XV.size()) / N;
      std::vector<double> Ref(XV.size()), F(XV.size());
      for (int64_t R = 0; R < Rows; ++R) {
        int64_t Keep = SC.Causal ? std::min(R % Sq + 1, N) : N;
        std::vector<double> Xr(N);
        double M = -INFINITY;
        for (int64_t J = 0; J < N; ++J) {
          float V = float(XV[R * N + J]);
          Xr[J] = J >= Keep ? Fl : Scaled ? A * V : V; // float products
          M = std::max(M, Xr[J]);
        }
        if (M == -INFINITY)
          continue; // zeros, exactly
        // Terms whose exp underflows (d_j > 104) are 0 or subnormal in
        // float: not eps_k relative but N 2^-149 absolute in s >= 1.
        double S = 0, MaxD = 0;
        for (int64_t J = 0; J < N; ++J) {
          S += std::exp(Xr[J] - M);
          if (M - Xr[J] < 104)
            MaxD = std::max(MaxD, M - Xr[J]);
        }
        for (int64_t J = 0; J < N; ++J) {
          double Yj = std::exp(Xr[J] - M) / S;
          double D = Xr[J] == -INFINITY ? 0 : M - Xr[J];
          Ref[R * N + J] = Yj;
          F[R * N + J] = 1.01 * Yj *
                             ((D + 4) * U + (MaxD + 4) * U + Gamma(N) + 2 * U +
                              N * 0x1p-149) +
                         Tiny;
        }
      }
      Check(YV, Ref, F, T, ("softmax, " + Name).c_str());
      if (T == DType::BF16) { // within a bf16 ulp of the exact kernel's
        auto Exact = C.run(*Gpu);
        ASSERT_TRUE(bool(Exact)) << toString(Exact.takeError());
        const uint16_t *G = reinterpret_cast<const uint16_t *>(Got[Y].data()),
                       *W = reinterpret_cast<const uint16_t *>(
                           (*Exact)[Y].data());
        int64_t Off = 0;
        for (size_t K = 0; K < XV.size(); ++K)
          Off += std::abs(int(G[K]) - int(W[K])) > 1;
        EXPECT_EQ(Off, 0) << "bf16 softmax elements more than one ulp from "
                             "the exact kernel's";
      }
      // Backward.
      OpCase B;
      int Yv = T == DType::F32 ? B.floats(Shape, 0.1f, 0.2f)
                               : B.halfs(T, Shape, 0.2f);
      int DY = T == DType::F32 ? B.floats(Shape) : B.halfs(T, Shape);
      int DX = B.buffer(T, Shape);
      auto &G = B.op(OpKind::SoftmaxGrad, {Yv, DY}, {DX});
      G.Attrs.set("alpha", SC.Alpha);
      G.Attrs.set("causal", int64_t(SC.Causal));
      G.Attrs.set("fill", SC.Causal ? 0.5 : 0.0);
      auto GotB = RunFast(B);
      ASSERT_FALSE(GotB.empty());
      auto YB = Values(B.Data[Yv], T), DYB = Values(B.Data[DY], T),
           DXB = Values(GotB[DX], T);
      const float GFill = SC.Causal ? 0.5f : 0.0f;
      for (int64_t R = 0; R < Rows; ++R) {
        int64_t Keep = SC.Causal ? std::min(R % Sq + 1, N) : N;
        double Dot = 0, Abs = 0;
        for (int64_t J = 0; J < N; ++J) {
          Dot += DYB[R * N + J] * YB[R * N + J];
          Abs += std::fabs(DYB[R * N + J] * YB[R * N + J]);
        }
        for (int64_t J = 0; J < N; ++J) {
          int64_t K = R * N + J;
          if (J >= Keep) {
            Ref[K] = Scaled ? A * GFill : GFill; // a float product
            F[K] = 0;
            continue;
          }
          double V = A * YB[K] * (DYB[K] - Dot);
          Ref[K] = V;
          F[K] = 1.01 *
                 (std::fabs(A * YB[K]) * Gamma(N) * Abs + 3 * U * std::fabs(V));
        }
      }
      Check(DXB, Ref, F, T, ("softmax_grad, " + Name).c_str());
    }
  for (DType T : {DType::F32, DType::BF16})
    for (const char *Form : {"none", "tanh"})
      for (std::vector<int64_t> Shape :
           {std::vector<int64_t>{1000}, std::vector<int64_t>{3, 333}}) {
        const bool Tanh = std::string(Form) == "tanh";
        std::string Name =
            std::string("gelu ") + Form + ", " + std::to_string(Shape.back());
        OpCase C;
        int X = T == DType::F32 ? C.floats(Shape, 4) : C.halfs(T, Shape, 4);
        int DY = T == DType::F32 ? C.floats(Shape) : C.halfs(T, Shape);
        int Y = C.buffer(T, Shape), DX = C.buffer(T, Shape);
        C.op(OpKind::Gelu, {X}, {Y})
            .Attrs.set("approximate", std::string(Form));
        C.op(OpKind::GeluGrad, {X, DY}, {DX})
            .Attrs.set("approximate", std::string(Form));
        auto Got = RunFast(C);
        ASSERT_FALSE(Got.empty());
        auto XV = Values(C.Data[X], T), DYV = Values(C.Data[DY], T);
        std::vector<double> RefY(XV.size()), FY(XV.size()), RefD(XV.size()),
            FD(XV.size());
        const double K2 = std::sqrt(2 / M_PI), Cu = 0.044715;
        for (size_t K = 0; K < XV.size(); ++K) {
          double Xk = XV[K], Ax = std::fabs(Xk), Dy = std::fabs(DYV[K]);
          double Floor = (Ax + 1) * Tiny, Yk, Gk, FYk, FG;
          if (!Tanh) {
            double Phi = 0.5 * std::erfc(-Xk / std::sqrt(2.0));
            double XPhi = Xk * std::exp(-0.5 * Xk * Xk) / std::sqrt(2 * M_PI);
            double EPhi = (2 * Xk * Xk + 3 * Ax + 8) * U;
            Yk = Xk * Phi;
            Gk = Phi + XPhi;
            FYk = std::fabs(Yk) * (EPhi + U);
            FG = std::fabs(Phi) * EPhi +
                 std::fabs(XPhi) * (0.5 * Xk * Xk + 8) * U;
          } else {
            double Uk = K2 * (Xk + Cu * Xk * Xk * Xk);
            double S = 1 / (1 + std::exp(-2 * Uk)),
                   R = 1 / (1 + std::exp(2 * Uk));
            double Ee = (14 * std::fabs(Uk) + 4) * U, Es = Ee + 2 * U;
            double Tk = Xk * S * R * 2 * K2 * (1 + 3 * Cu * Xk * Xk);
            Yk = Xk * S;
            Gk = S + Tk;
            FYk = std::fabs(Yk) * (Es + U);
            FG = S * Es + std::fabs(Tk) * (2 * Es + Ee + 11 * U);
          }
          RefY[K] = Yk;
          FY[K] = 1.01 * FYk + Floor;
          RefD[K] = DYV[K] * Gk;
          FD[K] =
              1.01 * (Dy * FG + 2 * U * std::fabs(DYV[K] * Gk)) + Dy * Floor;
        }
        Check(Values(Got[Y], T), RefY, FY, T, Name.c_str());
        Check(Values(Got[DX], T), RefD, FD, T, (Name + " grad").c_str());
      }
}

/// Not a check: the exact and fast kernels' times on the 22B layer's shapes
/// (bf16 scores [65536 rows, 2048], the MLP's [8192, 3072]); run with
/// --gtest_also_run_disabled_tests.
TEST_F(CudaKernels, DISABLED_FastSoftmaxAndGeluTimings) {
  auto Time = [&](Backend &Be, OpCase &C) {
    auto Arena = Be.allocate(C.P.ArenaBytes);
    if (!Arena) {
      ADD_FAILURE() << toString(Arena.takeError());
      return 0.0;
    }
    std::vector<char> Zeros(C.P.ArenaBytes);
    if (auto E = Be.copyToBackend(*Arena, Zeros.data(), Zeros.size()))
      ADD_FAILURE() << toString(std::move(E));
    auto Tensor = createSingleRankCommunicator();
    auto Run = [&] {
      if (auto E = Be.run(testCall(C.P.Instrs[0], C.P, *Arena, *Tensor)))
        ADD_FAILURE() << toString(std::move(E));
    };
    Run();
    if (auto E = Be.synchronize())
      ADD_FAILURE() << toString(std::move(E));
    auto T0 = std::chrono::steady_clock::now();
    const int Reps = 20;
    for (int K = 0; K < Reps; ++K)
      Run();
    if (auto E = Be.synchronize())
      ADD_FAILURE() << toString(std::move(E));
    auto T1 = std::chrono::steady_clock::now();
    Be.release(*Arena);
    return std::chrono::duration<double, std::micro>(T1 - T0).count() / Reps;
  };
  std::vector<int64_t> Scores = {8, 16, 512, 2048}, Mlp = {8192, 3072};
  for (int Op = 0; Op < 6; ++Op) {
    OpCase C;
    const char *Name = "";
    if (Op < 2) {
      int X = C.buffer(DType::BF16, Scores), Y = C.buffer(DType::BF16, Scores);
      Instruction *I;
      if (Op == 0) {
        Name = "softmax (causal, scaled)";
        I = &C.op(OpKind::Softmax, {X}, {Y});
        I->Attrs.set("fill", -INFINITY);
      } else {
        Name = "softmax_grad (causal, scaled)";
        int DY = C.buffer(DType::BF16, Scores);
        I = &C.op(OpKind::SoftmaxGrad, {X, DY}, {Y});
        I->Attrs.set("fill", 0.0);
      }
      I->Attrs.set("alpha", 0.125);
      I->Attrs.set("causal", int64_t(1));
    } else {
      bool Tanh = Op % 2;
      int X = C.buffer(DType::BF16, Mlp), Y = C.buffer(DType::BF16, Mlp);
      if (Op < 4) {
        Name = Tanh ? "gelu tanh" : "gelu erf";
        C.op(OpKind::Gelu, {X}, {Y})
            .Attrs.set("approximate", std::string(Tanh ? "tanh" : "none"));
      } else {
        Name = Tanh ? "gelu_grad tanh" : "gelu_grad erf";
        int DY = C.buffer(DType::BF16, Mlp);
        C.op(OpKind::GeluGrad, {X, DY}, {Y})
            .Attrs.set("approximate", std::string(Tanh ? "tanh" : "none"));
      }
    }
    double E = Time(*Gpu, C), F = Time(*Fast, C);
    std::printf("  %-30s exact %8.1f us  fast %8.1f us\n", Name, E, F);
  }
}

/// The fused attention core, forward and backward, against the fused CPU
/// kernel's float64 run: within 8 times the CPU's own float32 error
/// (AttentionCase.h). The CUDA backend runs it with its blockwise kernels
/// (kernels/Attention.cuh) for heads of up to 128, else as its unfused ops
/// (AttentionPlan.h).
TEST_F(CudaKernels, FusedAttention) {
  for (auto [Way, Be] : attentionBackends()) {
    SCOPED_TRACE(Way);
    for (const AttentionCase &C : fusedAttentionCases())
      C.check(Be);
    AttentionCase Large; // heads above the blockwise kernels': the expansion
    Large.A = Large.G = 2;
    Large.D = 160;
    Large.Dropout = true;
    {
      std::vector<int> Res;
      AttentionCase::Run R = Large.make(true, DType::F32, nullptr, Res);
      ASSERT_FALSE(cuda::runsBlockwise(R.P.Instrs[0], R.P.Buffers));
    }
    Large.check(Be);
  }
}

/// Across the blockwise kernels' tiles of 64 rows and keys (both ways): several
/// blocks and a partial one, the causal skipping of blocks above the
/// diagonal, head sizes that fill one or two column groups or neither a
/// multiple of 16 nor of 64, grouped-query heads, and rows that see no key.
TEST_F(CudaKernels, FusedAttentionAcrossBlocks) {
  for (auto [Way, Be] : attentionBackends()) {
    SCOPED_TRACE(Way);
    for (const AttentionCase &C : acrossBlocksCases())
      C.check(Be);
  }
}

/// The attention core on bf16 and fp16 tensors (the blockwise kernels read
/// and write them in place, the unfused ops run on float32 copies), against
/// the CPU backend's run of the same 16-bit instruction, or, for the
/// unfused ops' backward, which recomputes o, against the float64 one
/// (AttentionCase::check16 derives the bounds).
TEST_F(CudaKernels, FusedAttentionIn16Bit) {
  for (auto [Way, Be] : attentionBackends())
    for (DType T : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(Way) + (T == DType::BF16 ? ", bf16" : ", fp16"));
      for (const AttentionCase &C : sixteenBitCases())
        C.check16(*Be, T, /*ReadsForward=*/Be == Blockwise.get());
    }
}

TEST_F(CudaKernels, DropoutMasksAreTheCpusBitForBit) {
  // [3, 17, 29]: one Philox evaluation per element; [5, 7, 12]: one per
  // four (the innermost extent a multiple of four).
  for (std::vector<int64_t> Shape : {std::vector<int64_t>{3, 17, 29},
                                     std::vector<int64_t>{5, 7, 12}}) {
    for (double Ratio : {0.0, 0.1, 0.5, 1.0}) {
      OpCase C;
      int X = C.floats(Shape);
      int Y = C.buffer(DType::F32, Shape), M = C.buffer(DType::U8, Shape);
      auto &I = C.op(OpKind::Dropout, {X}, {Y, M});
      I.Attrs.set("key", std::vector<int64_t>{2, 5});
      I.Attrs.set("ratio", 0.1);
      I.Attrs.set("microbatch", int64_t(1));
      I.Attrs.set("microbatches", int64_t(2));
      compare(C, {Y, M}, 0, Ratio);
    }
  }
  {
    // A sequence-split input: the block of the whole tensor at rank 0.
    OpCase C;
    int X = C.floats({2, 8, 16});
    C.P.Buffers[X].Shard.K = Sharding::Split;
    C.P.Buffers[X].Shard.Dim = 1;
    C.P.Buffers[X].Shard.Parts = 2;
    int Y = C.buffer(DType::F32, {2, 8, 16}),
        M = C.buffer(DType::U8, {2, 8, 16});
    auto &I = C.op(OpKind::Dropout, {X}, {Y, M});
    I.Attrs.set("key", std::vector<int64_t>{1, 3});
    I.Attrs.set("ratio", 0.3);
    compare(C, {Y, M}, 0);
  }
  OpCase B;
  int DY = B.floats({500});
  int M = B.mask({500});
  int DX = B.buffer(DType::F32, {500});
  B.op(OpKind::DropoutGrad, {DY, M}, {DX}).Attrs.set("ratio", 0.25);
  compare(B, {DX}, 0);
}

TEST_F(CudaKernels, CausalDropoutIsTheCpusBits) {
  // dropout {causal} (lower/CausalProducts.h) of scores zero above the
  // diagonal: the CPU draws below it only, the device draws everywhere and
  // then zeroes the mask above; masks and results bitwise equal.
  for (double Ratio : {0.0, 0.1, 1.0}) {
    OpCase C;
    const int64_t Sq = 37, Sk = 37;
    int X = C.floats({2, 3, Sq, Sk});
    auto *XD = reinterpret_cast<float *>(C.Data[X].data());
    for (int64_t E = 0; E < 2 * 3 * Sq * Sk; ++E)
      if (E % Sk > E / Sk % Sq)
        XD[E] = 0;
    int Y = C.buffer(DType::F32, {2, 3, Sq, Sk}),
        M = C.buffer(DType::U8, {2, 3, Sq, Sk});
    auto &I = C.op(OpKind::Dropout, {X}, {Y, M});
    I.Attrs.set("key", std::vector<int64_t>{2, 5});
    I.Attrs.set("ratio", 0.1);
    I.Attrs.set("causal", int64_t(1));
    compare(C, {Y, M}, 0, Ratio);
  }
}

TEST_F(CudaKernels, DropoutAddIsTheCpusBits) {
  // lower/FuseEpilogue.cpp's dropout + residual add: the device runs the
  // dropout and then the add in place, the CPU adds as it writes; both
  // round the same two operations, so bitwise (the CPU's fused kernel is
  // the unfused pair's bits, tests/unit/FuseEpilogueTest).
  for (double Ratio : {0.0, 0.1, 1.0}) {
    OpCase C;
    int X = C.floats({3, 17, 29}), R = C.floats({3, 17, 29});
    int Y = C.buffer(DType::F32, {3, 17, 29}),
        M = C.buffer(DType::U8, {3, 17, 29});
    auto &I = C.op(OpKind::DropoutAdd, {X, R}, {Y, M});
    I.Attrs.set("key", std::vector<int64_t>{2, 5});
    I.Attrs.set("ratio", 0.1);
    compare(C, {Y, M}, 0, Ratio);
  }
}

TEST_F(CudaKernels, CrossEntropyForwardAndBackward) {
  for (int64_t Valid : {0, 250}) {
    OpCase F;
    int L = F.floats({64, 256}, 3);
    int T = F.ids({64}, 0, 250);
    int Loss = F.buffer(DType::F32, {});
    F.op(OpKind::CrossEntropy, {L, T}, {Loss}).Attrs.set("valid_vocab", Valid);
    compare(F, {Loss});
    OpCase B;
    int L2 = B.floats({64, 256}, 3);
    int T2 = B.ids({64}, 0, 250);
    // Some rows ignored.
    auto *Tv = reinterpret_cast<int64_t *>(B.Data[T2].data());
    Tv[3] = Tv[17] = IgnoreTarget;
    int DL = B.buffer(DType::F32, {});
    B.setFloats(DL, {0.75f});
    int DX = B.buffer(DType::F32, {64, 256});
    B.op(OpKind::CrossEntropyGrad, {L2, T2, DL}, {DX})
        .Attrs.set("valid_vocab", Valid);
    compare(B, {DX});
  }
}

/// The vocabulary-parallel loss on a group of one rank (the reductions are
/// then identities; with more GPUs the end-to-end test covers them).
TEST_F(CudaKernels, VocabParallelCrossEntropy) {
  for (int Grad = 0; Grad < 2; ++Grad) {
    OpCase C;
    int L = C.floats({40, 64}, 3);
    int T = C.ids({40}, 0, 60);
    reinterpret_cast<int64_t *>(C.Data[T].data())[5] = IgnoreTarget;
    int DL = C.buffer(DType::F32, {});
    C.setFloats(DL, {1.25f});
    int Y = Grad ? C.buffer(DType::F32, {40, 64}) : C.buffer(DType::F32, {});
    auto &I = Grad ? C.op(OpKind::CrossEntropyGrad, {L, T, DL}, {Y})
                   : C.op(OpKind::CrossEntropy, {L, T}, {Y});
    I.Attrs.set("vocab_parallel", int64_t(1));
    I.Attrs.set("valid_vocab", int64_t(60));
    compare(C, {Y});
  }
}

/// An op without a GPU kernel is an error naming it, never a silent no-op.
TEST_F(CudaKernels, OpWithoutKernelIsAClearError) {
  OpCase C;
  int A = C.floats({4}), B = C.floats({4});
  int Y = C.buffer(DType::F32, {4});
  C.op(OpKind::OnnxAdd, {A, B}, {Y});
  auto R = C.run(*Gpu);
  ASSERT_FALSE(bool(R));
  EXPECT_NE(toString(R.takeError())
                .find("the CUDA backend has no kernel for op onnx.Add yet"),
            std::string::npos);
}

TEST_F(CudaKernels, GradNormAndAdamW) {
  {
    OpCase C;
    int A = C.floats({1000}), B = C.floats({37, 11}), Cc = C.floats({70000});
    int N = C.buffer(DType::F32, {});
    C.op(OpKind::GradNorm, {A, B, Cc}, {N});
    compare(C, {N});
  }
  for (double MaxNorm : {0.0, 1.0}) {
    OpCase C;
    int P = C.floats({3000}), G = C.floats({3000}), M = C.floats({3000}, 0.1f),
        V = C.floats({3000}, 0.1f, 0.5f);
    int N = C.buffer(DType::F32, {}), Lr = C.buffer(DType::F32, {}),
        St = C.buffer(DType::F32, {});
    C.setFloats(N, {3.5f});
    C.setFloats(Lr, {1e-3f});
    C.setFloats(St, {7.0f});
    auto &I = C.op(OpKind::AdamW, {P, G, M, V, N, Lr, St}, {});
    I.Attrs.set("max_norm", MaxNorm);
    I.Attrs.set("weight_decay", 0.1);
    I.Attrs.set("beta2", 0.95);
    compare(C, {P, M, V});
  }
}

TEST_F(CudaKernels, MultiTensorAdamWIsThePerTensorUpdate) {
  // A run of adamw instructions (odd sizes, one over a chunk, more tensors
  // than one launch's table holds, weight decay on every other one) is
  // launched as multi-tensor kernels by the backend; every tensor must be
  // the CPU's adamw.
  for (double MaxNorm : {0.0, 1.0}) {
    OpCase C;
    std::vector<int64_t> Sizes = {1, 3, 1000, 65537, 70001, 333};
    for (int K = 0; K < 40; ++K)
      Sizes.push_back(17 + 2 * K);
    int N = C.buffer(DType::F32, {}), Lr = C.buffer(DType::F32, {}),
        St = C.buffer(DType::F32, {});
    C.setFloats(N, {3.5f});
    C.setFloats(Lr, {1e-3f});
    C.setFloats(St, {7.0f});
    std::vector<int> Check;
    for (size_t K = 0; K < Sizes.size(); ++K) {
      int64_t E = Sizes[K];
      int P = C.floats({E}), G = C.floats({E}), M = C.floats({E}, 0.1f),
          V = C.floats({E}, 0.1f, 0.5f);
      auto &I = C.op(OpKind::AdamW, {P, G, M, V, N, Lr, St}, {});
      I.Attrs.set("max_norm", MaxNorm);
      I.Attrs.set("weight_decay", K % 2 ? 0.0 : 0.1);
      I.Attrs.set("beta2", 0.95);
      Check.insert(Check.end(), {P, M, V});
    }
    compare(C, Check);
  }
}

TEST_F(CudaKernels, SequenceParallelSplit) {
  OpCase C;
  int X = C.floats({2, 8, 6});
  int Y = C.buffer(DType::F32, {2, 4, 6});
  auto &I = C.op(OpKind::SpSplit, {X}, {Y});
  I.Attrs.set("dim", int64_t(1));
  I.Attrs.set("parts", int64_t(2));
  compare(C, {Y}, 0);
}

/// Mixed precision (CudaBackend's dispatchMixed, kernels/Convert.cuh): an
/// instruction with bf16 or fp16 buffers runs on float32 copies, rounded
/// once where it stores, as the CPU's runMixed. Everything but the GEMMs is
/// required to be the CPU's bit for bit: the casts on every 16-bit pattern
/// and on the float32 values where rounding is delicate (ties, the half's
/// subnormals and overflow, nan), and the ops below. A GEMM's 16-bit result
/// rounds a float32 sum that cuBLAS adds in another order, so it may be one
/// unit in the last place away: normwise within 2u (u = 2^-8 for bf16,
/// 2^-11 for fp16).
TEST_F(CudaKernels, MixedPrecisionIsTheCpusBits) {
  for (DType T : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(T == DType::BF16 ? "bf16" : "fp16");
    {
      // Every 16-bit pattern widened, and float32 values narrowed.
      OpCase C;
      int All = C.buffer(T, {65536});
      std::vector<uint16_t> Bits(65536);
      for (int K = 0; K < 65536; ++K)
        Bits[K] = uint16_t(K);
      C.Data[All].assign(reinterpret_cast<const char *>(Bits.data()),
                         reinterpret_cast<const char *>(Bits.data() + 65536));
      int Wide = C.buffer(DType::F32, {65536});
      C.op(OpKind::Cast, {All}, {Wide}).Attrs.set("to", std::string("f32"));
      std::vector<float> Values = {0.0f,     -0.0f,    1.0f,     65504.0f,
                                   65519.0f, 65520.0f, 1e-8f,    3e-8f,
                                   6e-8f,    5.9e-8f,  6.1e-5f,  3.0e-5f,
                                   1e38f,    -1e38f,   1e-40f,   1.00390625f,
                                   1.01171875f, 1.0009765625f, 1.0029296875f,
                                   INFINITY, -INFINITY, NAN};
      std::mt19937 R(3);
      std::uniform_int_distribution<uint32_t> Any;
      while (Values.size() < 4096) {
        uint32_t U = Any(R);
        float F;
        std::memcpy(&F, &U, 4);
        Values.push_back(F);
      }
      int Narrow = C.buffer(DType::F32, {int64_t(Values.size())});
      C.setFloats(Narrow, Values);
      int Short = C.buffer(T, {int64_t(Values.size())});
      C.op(OpKind::Cast, {Narrow}, {Short})
          .Attrs.set("to", std::string(T == DType::BF16 ? "bf16" : "f16"));
      CpuBackend Cpu;
      auto Want = C.run(Cpu);
      auto Got = C.run(*Gpu);
      ASSERT_TRUE(bool(Want) && bool(Got));
      EXPECT_EQ((*Got)[Wide], (*Want)[Wide]) << "widened patterns differ";
      EXPECT_EQ((*Got)[Short], (*Want)[Short]) << "narrowed values differ";
    }
    {
      // LayerNorm (16-bit x, gamma, beta and y; float32 statistics), and
      // its backward.
      OpCase F;
      int X = F.halfs(T, {35, 203}, 2), G = F.halfs(T, {203}),
          B = F.halfs(T, {203});
      int Y = F.buffer(T, {35, 203}), M = F.buffer(DType::F32, {35}),
          R = F.buffer(DType::F32, {35});
      F.op(OpKind::LayerNorm, {X, G, B}, {Y, M, R});
      compare(F, {Y, M, R}, 0);
    }
    {
      OpCase C;
      int A = C.halfs(T, {3, 5, 70}), B = C.halfs(T, {3, 5, 70});
      int Y = C.buffer(T, {3, 5, 70});
      C.op(OpKind::Add, {A, B}, {Y});
      int G = C.buffer(T, {3, 5, 70});
      C.op(OpKind::Gelu, {Y}, {G});
      compare(C, {Y, G}, 0);
    }
    {
      OpCase C;
      std::vector<int64_t> Shape = {2, 3, 9, 9};
      int X = C.halfs(T, Shape, 3);
      int Y = C.buffer(T, Shape);
      auto &I = C.op(OpKind::Softmax, {X}, {Y});
      I.Attrs.set("alpha", 0.125);
      I.Attrs.set("causal", int64_t(1));
      I.Attrs.set("fill", -INFINITY);
      int D = C.buffer(T, Shape), M = C.buffer(DType::U8, Shape);
      auto &Dr = C.op(OpKind::Dropout, {Y}, {D, M});
      Dr.Attrs.set("key", std::vector<int64_t>{2, 5});
      Dr.Attrs.set("ratio", 0.1);
      compare(C, {Y, D, M}, 0);
    }
    {
      // The gradients, read and written in 16 bits in place (runsIn16Bit):
      // LayerNorm's (16-bit dx and dy, float32 dgamma and dbeta), the
      // fused softmax's, dropout's, GELU's, a bias gradient, and the
      // same-shape mul.
      OpCase C;
      int Dy = C.halfs(T, {35, 203}, 4), X = C.halfs(T, {35, 203}, 2),
          G = C.halfs(T, {203});
      int Y = C.buffer(T, {35, 203}), M = C.buffer(DType::F32, {35}),
          R = C.buffer(DType::F32, {35});
      C.op(OpKind::LayerNorm, {X, G, G}, {Y, M, R});
      int Dx = C.buffer(T, {35, 203}), Dg = C.buffer(DType::F32, {203}),
          Db = C.buffer(DType::F32, {203});
      C.op(OpKind::LayerNormGrad, {Dy, X, G, M, R}, {Dx, Dg, Db});
      int Bg = C.buffer(DType::F32, {203});
      C.op(OpKind::BiasGrad, {Dy}, {Bg});
      int Gg = C.buffer(T, {35, 203});
      C.op(OpKind::GeluGrad, {X, Dy}, {Gg});
      int Prod = C.buffer(T, {35, 203});
      C.op(OpKind::Mul, {X, Dy}, {Prod});
      compare(C, {Y, M, R, Dx, Dg, Db, Bg, Gg, Prod}, 0);
    }
    {
      // 12 keys: dropout by Philox blocks of four.
      OpCase C;
      std::vector<int64_t> Shape = {2, 3, 12, 12};
      int X = C.halfs(T, Shape, 3), Dy = C.halfs(T, Shape, 5);
      int Y = C.buffer(T, Shape);
      auto &F = C.op(OpKind::Softmax, {X}, {Y});
      F.Attrs.set("alpha", 0.125);
      F.Attrs.set("causal", int64_t(1));
      F.Attrs.set("fill", -INFINITY);
      int Dx = C.buffer(T, Shape);
      auto &B = C.op(OpKind::SoftmaxGrad, {Y, Dy}, {Dx});
      B.Attrs.set("alpha", 0.125);
      B.Attrs.set("causal", int64_t(1));
      B.Attrs.set("fill", 0.0);
      int D = C.buffer(T, Shape), Mask = C.buffer(DType::U8, Shape);
      auto &Dr = C.op(OpKind::Dropout, {Dy}, {D, Mask});
      Dr.Attrs.set("key", std::vector<int64_t>{3, 1});
      Dr.Attrs.set("ratio", 0.25);
      int Dd = C.buffer(T, Shape);
      C.op(OpKind::DropoutGrad, {Dx, Mask}, {Dd}).Attrs.set("ratio", 0.25);
      compare(C, {Y, Dx, D, Mask, Dd}, 0);
    }
    {
      // A linear layer: 16-bit x, weight and bias, a 16-bit output.
      const int64_t Rows = 33, In = 96, Out = 40;
      OpCase C;
      int X = C.halfs(T, {Rows, In}), W = C.halfs(T, {Out, In}),
          B = C.halfs(T, {Out});
      int Y = C.buffer(T, {Rows, Out});
      C.op(OpKind::Linear, {X, W, B}, {Y}).Attrs.set("trans_w", int64_t(1));
      CpuBackend Cpu;
      auto Want = C.run(Cpu);
      auto Got = C.run(*Gpu);
      ASSERT_TRUE(bool(Want) && bool(Got));
      auto Widen = [&](const std::vector<char> &Bytes) {
        std::vector<float> V(Bytes.size() / 2);
        for (size_t K = 0; K < V.size(); ++K) {
          uint16_t H;
          std::memcpy(&H, Bytes.data() + 2 * K, 2);
          V[K] = T == DType::BF16 ? bfloat16ToFloat(H) : halfToFloat(H);
        }
        return V;
      };
      double U = T == DType::BF16 ? 0x1p-8 : 0x1p-11;
      EXPECT_LE(normwiseError(Widen((*Got)[Y]), Widen((*Want)[Y])), 2 * U);
    }
  }
}

} // namespace
