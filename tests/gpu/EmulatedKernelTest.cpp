//===- EmulatedKernelTest.cpp - CUDA kernels run on the CPU ------------===//
//
// The CUDA backend's kernels (runtime/cuda/kernels/*.cuh), their source
// compiled by the host compiler over tests/gpu/emulator/CudaEmulator.h and
// run on the CPU: their indexing, barriers, warp shuffles, shared memory, dropout
// draws and 16-bit loads and stores, tested on every machine, not only
// where a GPU is. Most of all the blockwise attention kernels
// (kernels/Attention.cuh), written where no GPU was; and LayerNorm, GELU,
// the fused softmax and dropout against the CPU kernels bit for bit. A CpuBackend whose attention and
// attention_grad run as the CUDA backend runs them blockwise (the same host
// plan: planBlockwise, setBlockwiseDropout) is compared with the fused CPU
// kernel by AttentionCase.h, in both orders of the emulator's threads.
//
// What this does not test: the device's own float arithmetic (its expf and
// logf), its memory model beyond barrier order, launch limits, and speed.
// The same cases run on a GPU in KernelTest.cpp.
//
//===----------------------------------------------------------------------===//
#include "emulator/CudaEmulator.h"
// The kernels' source, compiled for the host: every kernel of the backend.
#include "runtime/cuda/AttentionKernels.cu"
#include "runtime/cuda/ElementwiseKernels.cu"
#include "runtime/cuda/RowReductionKernels.cu"

#include "runtime/cpu/CpuBackend.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/AttentionPlan.h"
#include "AttentionCase.h"
#include "TrainCompare.h"
#include "gtest/gtest.h"
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

using namespace sp;
using namespace llvm;

namespace {

/// The CPU backend, but for the attention core, which runs as the CUDA
/// backend's blockwise path does (CudaBackend::attentionBlockwise), with
/// host memory in the device's place and the emulator's launches.
class EmulatedBlockwiseBackend : public CpuBackend {
public:
  /// Count, when given: the attention instructions run (it outlives the
  /// executor that owns this backend).
  explicit EmulatedBlockwiseBackend(int *Count = nullptr) : Count(Count) {}
  StringRef name() const override { return "emulated cuda"; }
  Error run(const KernelCall &C) override {
    const Instruction &I = C.I;
    if (I.Op != OpKind::Attention && I.Op != OpKind::AttentionGrad)
      return CpuBackend::run(C);
    if (Count)
      ++*Count;
    const auto &Bufs = C.Prog.Buffers;
    if (!cuda::runsBlockwise(I, Bufs))
      return createStringError(inconvertibleErrorCode(),
                               "not a blockwise attention");
    auto P = cuda::planBlockwise(I, Bufs);
    if (!P)
      return P.takeError();
    if (Error E = cuda::setBlockwiseDropout(
            *P, I, Bufs, C.Training, C.Dropout, C.Seed, C.Step,
            C.Tensor.rank(), C.Data ? C.Data->rank() : 0,
            C.Data ? C.Data->size() : 1))
      return E;
    const cuda::AttentionGeometry &G = P->G;
    // padding_mask's bias (the CPU's keyBias, in float; the device
    // computes it with its padding_mask kernel).
    std::vector<float> Bias;
    if (P->Keep >= 0) {
      const char *Keep = C.buffer(P->Keep);
      const DType KT = Bufs[P->Keep].Type.Dtype;
      const float Fill = float(P->PadFill);
      Bias.resize(G.Batch * G.Sk);
      for (size_t E = 0; E < Bias.size(); ++E) {
        float V = KT == DType::I64
                      ? float(reinterpret_cast<const int64_t *>(Keep)[E])
                  : KT == DType::I32
                      ? float(reinterpret_cast<const int32_t *>(Keep)[E])
                  : KT == DType::Bool
                      ? (Keep[E] ? 1.0f : 0.0f)
                      : reinterpret_cast<const float *>(Keep)[E];
        float Inv = 1.0f - V;
        Bias[E] = P->PadWhere ? (Inv != 0.0f ? Fill : 0.0f) : Inv * Fill;
      }
    }
    std::vector<float> Delta(G.Batch * G.Heads * G.Sq + 1);
    auto Op = [&](const cuda::BlockwiseOperand &X) {
      DType T = Bufs[X.Id].Type.Dtype;
      cuda::Storage K = T == DType::BF16  ? cuda::Storage::BF16
                        : T == DType::F16 ? cuda::Storage::F16
                                          : cuda::Storage::F32;
      return cuda::at(cuda::Elems(C.buffer(X.Id), K), X.Offset);
    };
    const float *B = Bias.empty() ? nullptr : Bias.data();
    if (P->Forward)
      cuda::attentionForward(Op(P->O), Op(P->Lse), Op(P->Q), Op(P->K),
                             Op(P->V), B, G, nullptr);
    else
      cuda::attentionBackward(Op(P->DQ), Op(P->DK), Op(P->DV), Op(P->DO),
                              Op(P->Q), Op(P->K), Op(P->V), Op(P->O),
                              Op(P->Lse), B, Delta.data(), G, nullptr);
    return Error::success();
  }

private:
  int *Count;
};

struct InBothOrders : ::testing::TestWithParam<bool> {
  void SetUp() override { emu::setReverseOrder(GetParam()); }
  void TearDown() override { emu::setReverseOrder(false); }
};

TEST_P(InBothOrders, BlockwiseKernelsMatchTheFusedKernel) {
  EmulatedBlockwiseBackend Emu;
  for (const AttentionCase &C : fusedAttentionCases())
    C.check(&Emu);
}

TEST_P(InBothOrders, BlockwiseKernelsAcrossBlocks) {
  EmulatedBlockwiseBackend Emu;
  for (const AttentionCase &C : acrossBlocksCases())
    C.check(&Emu);
}

INSTANTIATE_TEST_SUITE_P(EmulatedAttention, InBothOrders, ::testing::Bool(),
                         [](const auto &Info) {
                           return Info.param ? "Descending" : "Ascending";
                         });

/// Whole fused plans trained with every attention instruction run by the
/// emulated blockwise kernels, against the CPU backend (TrainCompare.h's
/// rule): our GPT-tiny here, and the exported HF-style GPT-2, Llama
/// (grouped-query heads, the padding bias before the causal fill) and BERT
/// (padding mask) that check_expanded_plans.sh passes in
/// SP_EXPANSION_MODELS.
void expectEmulatedPlanTrainsAsTheCpu(StringRef Path) {
  auto Count = std::make_shared<int>(0);
  expectFusedPlanTrainsAsTheCpu(
      Path,
      [Count] {
        return std::unique_ptr<Backend>(
            new EmulatedBlockwiseBackend(Count.get()));
      },
      Count.get(), "emulated");
}

TEST(EmulatedPlan, GptTinyTrainsAsTheCpu) {
  expectEmulatedPlanTrainsAsTheCpu(SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx");
}

/// The default model's fused plan on grids of thread ranks, with attention
/// by the emulated blockwise kernels, against the same grid on the CPU and
/// in float64: the dropout's block of the probabilities (q's heads split
/// over the tensor group; the microbatch; the data-parallel replica) as the
/// CPU's fused kernel draws it.
TEST(EmulatedPlan, ParallelLayoutsTrainAsTheCpu) {
  struct Layout {
    const char *Name;
    int TP;
    bool SP;
    int PP, Microbatches, DP;
  };
  GridBackend Emulated = [](Communicator &, const RunOptions &)
      -> Expected<std::unique_ptr<Backend>> {
    return std::unique_ptr<Backend>(new EmulatedBlockwiseBackend());
  };
  for (Layout L : {Layout{"t = 2 + SP", 2, true, 1, 1, 1},
                   Layout{"p = 2, 1F1B, 2 microbatches", 1, false, 2, 2, 1},
                   Layout{"d = 2", 1, false, 1, 1, 2}}) {
    SCOPED_TRACE(L.Name);
    std::printf("%s\n", L.Name);
    Plan P = compileTiny(L.TP, L.SP, L.PP, L.Microbatches, L.DP, 0, 1e-3,
                         DType::F32, /*Fused=*/true);
    const int Steps = 2;
    auto Emu = trainOnGrid(P, L.TP, L.PP, L.DP, Emulated, Steps);
    ASSERT_TRUE(bool(Emu)) << toString(Emu.takeError());
    auto Cpu = trainOnGrid(P, L.TP, L.PP, L.DP, nullptr, Steps);
    ASSERT_TRUE(bool(Cpu)) << toString(Cpu.takeError());
    auto Ref = trainOnGrid(widenToFloat64(P), L.TP, L.PP, L.DP, nullptr, Steps);
    ASSERT_TRUE(bool(Ref)) << toString(Ref.takeError());
    expectMatches(*Emu, *Cpu, *Ref, Steps, "emulated");
  }
}

TEST(EmulatedPlan, ExportedFamiliesTrainAsTheCpu) {
  auto Paths = exportedFamilyModels();
  if (Paths.empty())
    GTEST_SKIP() << "SP_EXPANSION_MODELS is not set: the exported Llama and "
                    "BERT models are trained by check_expanded_plans.sh";
  for (const std::string &Path : Paths)
    expectEmulatedPlanTrainsAsTheCpu(Path);
}

TEST(EmulatedAttention, BlockwiseKernelsIn16Bit) {
  EmulatedBlockwiseBackend Emu;
  for (DType T : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(T == DType::BF16 ? "bf16" : "fp16");
    for (const AttentionCase &C : sixteenBitCases())
      C.check16(Emu, T);
  }
}

//===----------------------------------------------------------------------===//
// The other kernels against the CPU kernels they restate, bit for bit, as
// KernelTest.cpp checks them on a GPU: here the launchers run on host
// memory, through the emulator.
//===----------------------------------------------------------------------===//

std::vector<float> normals(int64_t N, float Scale, unsigned Seed) {
  std::mt19937 R(Seed);
  std::normal_distribution<float> D(0.0f, Scale);
  std::vector<float> V(N);
  for (float &X : V)
    X = D(R);
  return V;
}

/// Bitwise equality of float vectors (NaNs compared by their bits).
::testing::AssertionResult sameBits(const std::vector<float> &A,
                                    const std::vector<float> &B) {
  if (A.size() != B.size())
    return ::testing::AssertionFailure() << "sizes differ";
  for (size_t K = 0; K < A.size(); ++K)
    if (std::memcmp(&A[K], &B[K], 4))
      return ::testing::AssertionFailure()
             << "element " << K << ": " << A[K] << " vs " << B[K];
  return ::testing::AssertionSuccess();
}

TEST(EmulatedKernels, LayerNormIsTheCpusBits) {
  const int64_t Rows = 130, H = 203; // three blocks of column rows
  auto X = normals(Rows * H, 2, 1), G = normals(H, 1, 2), B = normals(H, 1, 3),
       DY = normals(Rows * H, 1, 4);
  std::vector<float> Y(Rows * H), M(Rows), R(Rows), CY(Y), CM(M), CR(R);
  cuda::layerNorm(Y.data(), M.data(), R.data(), X.data(), G.data(), B.data(),
                  Rows, H, 1e-5, cuda::Numerics::Exact, nullptr);
  cpu::layerNorm(CY.data(), CM.data(), CR.data(), X.data(), G.data(),
                 B.data(), Rows, H, 1e-5);
  EXPECT_TRUE(sameBits(Y, CY));
  EXPECT_TRUE(sameBits(M, CM));
  EXPECT_TRUE(sameBits(R, CR));
  std::vector<float> DX(Rows * H), DG(H), DB(H), CDX(DX), CDG(DG), CDB(DB);
  std::vector<double> Scratch(2 * cuda::columnParts(Rows) * H);
  cuda::layerNormBackward(DX.data(), DG.data(), DB.data(), DY.data(), X.data(),
                          G.data(), M.data(), R.data(), Rows, H, Scratch.data(),
                          cuda::Numerics::Exact, nullptr);
  cpu::layerNormBackward(CDX.data(), CDG.data(), CDB.data(), DY.data(),
                         X.data(), G.data(), CM.data(), CR.data(), Rows, H);
  EXPECT_TRUE(sameBits(DX, CDX));
  EXPECT_TRUE(sameBits(DG, CDG));
  EXPECT_TRUE(sameBits(DB, CDB));
}

TEST(EmulatedKernels, GeluAndSoftmaxAreTheCpusBits) {
  const int64_t N = 3 * 5 * 70;
  auto X = normals(N, 3, 5), DY = normals(N, 1, 6);
  for (bool Tanh : {false, true}) {
    const cpu::GeluApprox A = Tanh ? cpu::GeluApprox::Tanh
                                   : cpu::GeluApprox::None;
    std::vector<float> Y(N), CY(N), DX(N), CDX(N);
    cuda::gelu(Y.data(), X.data(), N, Tanh, cuda::Numerics::Exact, nullptr);
    cpu::gelu(CY.data(), X.data(), N, A);
    EXPECT_TRUE(sameBits(Y, CY)) << (Tanh ? "tanh" : "erf");
    cuda::geluBackward(DX.data(), X.data(), DY.data(), N, Tanh,
                       cuda::Numerics::Exact, nullptr);
    cpu::geluBackward(CDX.data(), X.data(), DY.data(), N, A);
    EXPECT_TRUE(sameBits(DX, CDX)) << (Tanh ? "tanh" : "erf");
  }
  // The attention core's fused scale + causal mask + softmax, and back.
  const int64_t Batch = 6, Sq = 9, Sk = 9, Rows = Batch * Sq;
  auto S = normals(Rows * Sk, 3, 7), DS = normals(Rows * Sk, 1, 8);
  for (bool Causal : {false, true}) {
    std::vector<float> P(Rows * Sk), CP(P), DP(P), CDP(P);
    cuda::softmax(P.data(), S.data(), Rows, Sk, 0.125, Causal, Sq, -INFINITY,
                  cuda::Numerics::Exact, nullptr);
    cpu::scaledCausalSoftmax(CP.data(), S.data(), Batch, Sq, Sk, 0.125,
                             Causal, -INFINITY);
    EXPECT_TRUE(sameBits(P, CP)) << (Causal ? "causal" : "plain");
    cuda::softmaxBackward(DP.data(), CP.data(), DS.data(), Rows, Sk, 0.125,
                          Causal, Sq, 0.0, cuda::Numerics::Exact, nullptr);
    cpu::scaledCausalSoftmaxBackward(CDP.data(), CP.data(), DS.data(), Batch,
                                     Sq, Sk, 0.125, Causal, 0.0);
    EXPECT_TRUE(sameBits(DP, CDP)) << (Causal ? "causal" : "plain");
  }
}

TEST(EmulatedKernels, DropoutIsTheCpusBits) {
  // [3, 17, 29]: one Philox evaluation per element; [5, 7, 12]: one per
  // four; a block of a split tensor.
  struct Case {
    std::vector<int64_t> Local, Global, Offset;
  };
  for (const Case &C : {Case{{3, 17, 29}, {3, 17, 29}, {0, 0, 0}},
                        Case{{5, 7, 12}, {5, 7, 12}, {0, 0, 0}},
                        Case{{2, 8, 16}, {2, 16, 16}, {0, 8, 0}}}) {
    int64_t N = 1;
    for (int64_t D : C.Local)
      N *= D;
    auto X = normals(N, 1, 9);
    std::vector<float> Y(N), CY(N);
    std::vector<uint8_t> M(N), CM(N);
    cuda::DevShape G, L, O;
    G.Rank = L.Rank = O.Rank = int(C.Local.size());
    for (size_t K = 0; K < C.Local.size(); ++K) {
      G.Dim[K] = C.Global[K];
      L.Dim[K] = C.Local[K];
      O.Dim[K] = C.Offset[K];
    }
    cuda::dropout(Y.data(), M.data(), X.data(), 0.3, 77, 2, 5, 3, G, L, O,
                  nullptr);
    ASSERT_TRUE(cpu::dropout(CY.data(), CM.data(), X.data(), 0.3,
                             cpu::DropoutKey{77, 2, 5, 3},
                             cpu::GlobalIndex::block(C.Global, C.Local,
                                                     C.Offset))
                    .ok());
    EXPECT_TRUE(sameBits(Y, CY));
    EXPECT_EQ(M, CM);
  }
}

TEST(EmulatedKernels, CrossEntropyIsTheCpusBits) {
  const int64_t N = 64, V = 256, Valid = 250;
  auto Logits = normals(N * V, 3, 10);
  std::vector<int64_t> Targets(N);
  for (int64_t K = 0; K < N; ++K)
    Targets[K] = K % 7 == 3 ? -100 : (K * 37) % Valid; // some rows ignored
  std::vector<double> Scratch(N + 2);
  cuda::DeviceError Err;
  float Loss = 0, CLoss = 0;
  cuda::crossEntropy(&Loss, Logits.data(), Targets.data(), N, V, Valid, true,
                     -100, Scratch.data(), &Err, nullptr);
  ASSERT_TRUE(cpu::crossEntropy(&CLoss, Logits.data(), Targets.data(), N, V,
                                Valid, int64_t(-100))
                  .ok());
  EXPECT_EQ(Err.Code, 0);
  EXPECT_TRUE(sameBits({Loss}, {CLoss}));
  const float DLoss = 0.75f;
  std::vector<float> D(N * V), CD(N * V);
  cuda::crossEntropyBackward(D.data(), Logits.data(), Targets.data(), &DLoss,
                             N, V, Valid, true, -100, Scratch.data(), &Err,
                             nullptr);
  ASSERT_TRUE(cpu::crossEntropyBackward(CD.data(), Logits.data(),
                                        Targets.data(), DLoss, N, V, Valid,
                                        int64_t(-100))
                  .ok());
  EXPECT_TRUE(sameBits(D, CD));
}

TEST(EmulatedKernels, NormsEmbeddingAndBiasAreTheCpusBits) {
  const int64_t Rows = 130, H = 72, V = 50;
  auto X = normals(Rows * H, 2, 14), G = normals(H, 1, 15),
       DY = normals(Rows * H, 1, 16), Table = normals(V * H, 1, 17);
  // RMSNorm and its backward (the gamma gradient over three column blocks).
  std::vector<float> Y(Rows * H), R(Rows), CY(Y), CR(R);
  cuda::rmsNorm(Y.data(), R.data(), X.data(), G.data(), Rows, H, 1e-6,
                cuda::Numerics::Exact, nullptr);
  cpu::rmsNorm(CY.data(), CR.data(), X.data(), G.data(), Rows, H, 1e-6);
  EXPECT_TRUE(sameBits(Y, CY));
  EXPECT_TRUE(sameBits(R, CR));
  std::vector<float> DX(Rows * H), DG(H), CDX(DX), CDG(DG);
  std::vector<double> Scratch(2 * cuda::columnParts(Rows) * H);
  cuda::rmsNormBackward(DX.data(), DG.data(), DY.data(), X.data(), G.data(),
                        R.data(), Rows, H, Scratch.data(),
                        cuda::Numerics::Exact, nullptr);
  cpu::rmsNormBackward(CDX.data(), CDG.data(), DY.data(), X.data(), G.data(),
                       CR.data(), Rows, H);
  EXPECT_TRUE(sameBits(DX, CDX));
  EXPECT_TRUE(sameBits(DG, CDG));
  // The bias gradient.
  std::vector<float> DB(H), CDB(H);
  cuda::biasBackward(DB.data(), DY.data(), Rows, H, Scratch.data(), nullptr);
  cpu::biasBackward(CDB.data(), DY.data(), Rows, H);
  EXPECT_TRUE(sameBits(DB, CDB));
  // The embedding and its gradient (repeated ids sum in row order).
  std::vector<int64_t> Ids(Rows);
  for (int64_t K = 0; K < Rows; ++K)
    Ids[K] = (K * 7) % V;
  cuda::DeviceError Err;
  std::vector<float> E(Rows * H), CE(E), DT(V * H), CDT(DT);
  cuda::embedding(E.data(), Table.data(), Ids.data(), Rows, V, H, 0, false,
                  &Err, nullptr);
  ASSERT_TRUE(
      cpu::embedding(CE.data(), Table.data(), Ids.data(), Rows, V, H).ok());
  EXPECT_TRUE(sameBits(E, CE));
  cuda::embeddingBackward(DT.data(), DY.data(), Ids.data(), Rows, V, H, 0,
                          false, &Err, nullptr);
  ASSERT_TRUE(
      cpu::embeddingBackward(CDT.data(), DY.data(), Ids.data(), Rows, V, H)
          .ok());
  EXPECT_TRUE(sameBits(DT, CDT));
  EXPECT_EQ(Err.Code, 0);
}

TEST(EmulatedKernels, HeadLayoutsAndRopeAreTheCpusBits) {
  const int64_t B = 2, S = 9, A = 4, D = 8;
  auto QKV = normals(B * S * 3 * A * D, 1, 18), X = normals(B * A * S * D, 1, 19);
  std::vector<float> Q(B * A * S * D), K(Q), V(Q), CQ(Q), CK(Q), CV(Q);
  for (bool PerHead : {false, true}) {
    cuda::splitHeads(Q.data(), K.data(), V.data(), QKV.data(), B, S, A, D,
                     PerHead, nullptr);
    cpu::splitHeads(CQ.data(), CK.data(), CV.data(), QKV.data(), B, S, A, D,
                    PerHead);
    EXPECT_TRUE(sameBits(Q, CQ)) << PerHead;
    EXPECT_TRUE(sameBits(K, CK)) << PerHead;
    EXPECT_TRUE(sameBits(V, CV)) << PerHead;
  }
  std::vector<float> M(B * S * A * D), CM(M);
  cuda::mergeHeads(M.data(), X.data(), B, S, A, D, nullptr);
  cpu::mergeHeads(CM.data(), X.data(), B, S, A, D);
  EXPECT_TRUE(sameBits(M, CM));
  // Rotary embeddings, both layouts, forward and backward.
  // Tables [1, S, D] (any values: the kernels multiply and add them).
  // Rot < D: GPT-NeoX's partial rotary, tables [1, S, Rot].
  for (int64_t Rot : {D, D / 2}) {
    auto Cos = normals(S * Rot, 1, 20), Sin = normals(S * Rot, 1, 21);
    for (bool Interleaved : {false, true}) {
      std::vector<float> Y(X.size()), CY(X.size()), DX(X.size()), CDX(X.size());
      cuda::rope(Y.data(), X.data(), Cos.data(), Sin.data(), B, A, S, D, 1,
                 Interleaved, false, Rot, nullptr);
      cpu::rope(CY.data(), X.data(), Cos.data(), Sin.data(), B, A, S, D, 1,
                Interleaved, Rot);
      EXPECT_TRUE(sameBits(Y, CY)) << Interleaved << Rot;
      cuda::rope(DX.data(), X.data(), Cos.data(), Sin.data(), B, A, S, D, 1,
                 Interleaved, true, Rot, nullptr);
      cpu::ropeBackward(CDX.data(), X.data(), Cos.data(), Sin.data(), B, A, S,
                        D, 1, Interleaved, Rot);
      EXPECT_TRUE(sameBits(DX, CDX)) << Interleaved << Rot;
    }
  }
}

TEST(EmulatedKernels, SixteenBitInPlaceIsTheWidenedRun) {
  // LayerNorm and GELU reading and writing bf16 and fp16 where they are:
  // the bits of widening, running the float32 CPU kernel and rounding once.
  const int64_t Rows = 35, H = 203, N = Rows * H;
  for (bool Bf16 : {true, false}) {
    SCOPED_TRACE(Bf16 ? "bf16" : "fp16");
    const cuda::Storage K = Bf16 ? cuda::Storage::BF16 : cuda::Storage::F16;
    auto Narrow = [&](const std::vector<float> &F) {
      std::vector<uint16_t> B(F.size());
      cpu::narrow16(B.data(), F.data(), int64_t(F.size()), Bf16);
      return B;
    };
    auto Widen = [&](const std::vector<uint16_t> &B) {
      std::vector<float> F(B.size());
      cpu::widen16(F.data(), B.data(), int64_t(B.size()), Bf16);
      return F;
    };
    auto X16 = Narrow(normals(N, 2, 11)), G16 = Narrow(normals(H, 1, 12)),
         B16 = Narrow(normals(H, 1, 13));
    std::vector<uint16_t> Y16(N), Z16(N);
    std::vector<float> M(Rows), R(Rows);
    cuda::layerNorm(cuda::Elems(Y16.data(), K), M.data(), R.data(),
                    cuda::Elems(X16.data(), K), cuda::Elems(G16.data(), K),
                    cuda::Elems(B16.data(), K), Rows, H, 1e-5,
                    cuda::Numerics::Exact, nullptr);
    cuda::gelu(cuda::Elems(Z16.data(), K), cuda::Elems(Y16.data(), K), N, false,
               cuda::Numerics::Exact, nullptr);
    auto X = Widen(X16), G = Widen(G16), B = Widen(B16);
    std::vector<float> Y(N), CM(Rows), CR(Rows), Z(N);
    cpu::layerNorm(Y.data(), CM.data(), CR.data(), X.data(), G.data(),
                   B.data(), Rows, H, 1e-5);
    auto CY16 = Narrow(Y);
    EXPECT_EQ(Y16, CY16);
    EXPECT_TRUE(sameBits(M, CM));
    EXPECT_TRUE(sameBits(R, CR));
    auto YW = Widen(CY16);
    cpu::gelu(Z.data(), YW.data(), N, cpu::GeluApprox::None);
    EXPECT_EQ(Z16, Narrow(Z));
  }
}

//===----------------------------------------------------------------------===//
// The emulator itself.
//===----------------------------------------------------------------------===//

/// Out[t] = the value thread (t + 1) mod n of the block wrote, with or
/// without a barrier between the write and the read.
__global__ void neighbourKernel(float *Out, bool Barrier) {
  SP_DYNAMIC_SHARED(float, S);
  const int T = threadIdx.x, N = blockDim.x;
  S[T] = float(T);
  if (Barrier)
    __syncthreads();
  Out[blockIdx.x * N + T] = S[(T + 1) % N];
}

TEST(CudaEmulator, BarrierOrdersSharedMemoryAndItsLackIsSeen) {
  const int N = 64;
  for (bool Reverse : {false, true}) {
    emu::setReverseOrder(Reverse);
    std::vector<float> Out(2 * N);
    SP_LAUNCH(neighbourKernel, 2, N, N * sizeof(float), nullptr, Out.data(),
              true);
    for (int T = 0; T < 2 * N; ++T)
      EXPECT_EQ(Out[T], float((T % N + 1) % N));
    SP_LAUNCH(neighbourKernel, 1, N, N * sizeof(float), nullptr, Out.data(),
              false);
    // Without the barrier, ascending order reads slots not yet written (the
    // NaN fill), descending order reads the last thread's neighbour early.
    int Wrong = 0;
    for (int T = 0; T < N; ++T)
      Wrong += !(Out[T] == float((T + 1) % N));
    EXPECT_GT(Wrong, 0) << (Reverse ? "descending" : "ascending");
  }
  emu::setReverseOrder(false);
}

/// Out[t] = the sum over t's half warp by xor shuffles, and lane 0's value
/// of its warp by a broadcast shuffle.
__global__ void shuffleKernel(float *Sum, int *First) {
  const int T = threadIdx.x;
  float V = float(T);
  for (int Off = 8; Off > 0; Off /= 2)
    V += __shfl_xor_sync(0xffffffffu, V, Off, 16);
  Sum[T] = V;
  First[T] = __shfl_sync(0xffffffffu, T, 0);
}

TEST(CudaEmulator, ShufflesExchangeWithinWarps) {
  std::vector<float> Sum(64);
  std::vector<int> First(64);
  SP_LAUNCH(shuffleKernel, 1, 64, 0, nullptr, Sum.data(), First.data());
  for (int T = 0; T < 64; ++T) {
    int H = T / 16 * 16; // the half warp's first thread
    EXPECT_EQ(Sum[T], float(16 * H + 120)) << T;
    EXPECT_EQ(First[T], T / 32 * 32) << T;
  }
}

} // namespace
