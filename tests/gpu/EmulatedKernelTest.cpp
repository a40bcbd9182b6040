//===- EmulatedKernelTest.cpp - CUDA kernels run on the CPU ------------===//
//
// The CUDA backend's blockwise attention kernels (kernels/Attention.cuh),
// their source compiled by the host compiler over tests/gpu/CudaEmulator.h
// and run on the CPU: their indexing, barriers, warp shuffles, shared
// memory, dropout draws and 16-bit loads and stores, tested on every
// machine, not only where a GPU is. A CpuBackend whose attention and
// attention_grad run as the CUDA backend runs them blockwise (the same host
// plan: planBlockwise, setBlockwiseDropout) is compared with the fused CPU
// kernel by AttentionCase.h, in both orders of the emulator's threads.
//
// What this does not test: the device's own float arithmetic (its expf and
// logf), its memory model beyond barrier order, launch limits, and speed.
// The same cases run on a GPU in KernelTest.cpp.
//
//===----------------------------------------------------------------------===//
#include "CudaEmulator.h"
// The kernels' source, compiled for the host.
#include "runtime/cuda/kernels/Attention.cuh"

#include "runtime/cpu/CpuBackend.h"
#include "runtime/cuda/AttentionPlan.h"
#include "AttentionCase.h"
#include "gtest/gtest.h"
#include <cmath>
#include <vector>

using namespace sp;
using namespace llvm;

namespace {

/// The CPU backend, but for the attention core, which runs as the CUDA
/// backend's blockwise path does (CudaBackend::attentionBlockwise), with
/// host memory in the device's place and the emulator's launches.
class EmulatedBlockwiseBackend : public CpuBackend {
public:
  StringRef name() const override { return "emulated cuda"; }
  Error run(const KernelCall &C) override {
    const Instruction &I = C.I;
    if (I.Op != OpKind::Attention && I.Op != OpKind::AttentionGrad)
      return CpuBackend::run(C);
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
    // padding_mask's bias from a float32 keep (the CPU's keyBias; the
    // device computes it with its padding_mask kernel).
    std::vector<float> Bias;
    if (P->Keep >= 0) {
      if (Bufs[P->Keep].Type.Dtype != DType::F32)
        return createStringError(inconvertibleErrorCode(),
                                 "the emulated path takes a float32 keep");
      const float *Keep =
          reinterpret_cast<const float *>(C.buffer(P->Keep));
      const float Fill = float(P->PadFill);
      Bias.resize(G.Batch * G.Sk);
      for (size_t E = 0; E < Bias.size(); ++E) {
        float Inv = 1.0f - Keep[E];
        Bias[E] = P->PadWhere ? (Inv != 0.0f ? Fill : 0.0f) : Inv * Fill;
      }
    }
    std::vector<float> Delta(G.Batch * G.Heads * G.Sq + 1);
    auto Op = [&](const cuda::BlockwiseOperand &X) {
      DType T = Bufs[X.Id].Type.Dtype;
      cuda::Storage K = T == DType::BF16  ? cuda::Storage::BF16
                        : T == DType::F16 ? cuda::Storage::F16
                                          : cuda::Storage::F32;
      return cuda::Elems(C.buffer(X.Id) +
                             X.Offset * (K == cuda::Storage::F32 ? 4 : 2),
                         K);
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
};

/// The cases of KernelTest.cpp's FusedAttention.
std::vector<AttentionCase> opCases() {
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

struct InBothOrders : ::testing::TestWithParam<bool> {
  void SetUp() override { emu::setReverseOrder(GetParam()); }
  void TearDown() override { emu::setReverseOrder(false); }
};

TEST_P(InBothOrders, BlockwiseKernelsMatchTheFusedKernel) {
  EmulatedBlockwiseBackend Emu;
  for (const AttentionCase &C : opCases())
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

TEST(EmulatedAttention, BlockwiseKernelsIn16Bit) {
  EmulatedBlockwiseBackend Emu;
  for (DType T : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(T == DType::BF16 ? "bf16" : "fp16");
    for (const AttentionCase &C : sixteenBitCases())
      C.check16(Emu, T);
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
