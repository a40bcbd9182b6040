//===- Dispatch.cpp - An instruction's kernels on the GPU -----------------===//
//
// Every instruction kind CpuBackend::run handles, as the kernels of
// CudaKernels.h (one family per kernels/*.cuh file), the GEMMs of Gemm.cpp
// and the collectives of Collectives.cpp, on the stream run() chose; an
// instruction on bf16 or fp16 buffers whose kernel does not read them in
// place runs on float32 copies (dispatchMixed, MixedPlan.h).
//
//===----------------------------------------------------------------------===//
#include "ir/OpDef.h"
#include "runtime/CollectiveWalk.h"
#include "runtime/KernelShapes.h"
#include "runtime/TensorLayout.h"
#include "runtime/cuda/CudaBackendImpl.h"
#include "support/Diagnostics.h"
#include <algorithm>

using namespace llvm;

namespace sp::cuda {

Elems elems(const KernelCall &C, int Id) {
  DType T = C.Prog.Buffers[Id].Type.Dtype;
  return cuda::Elems(C.buffer(Id), T == DType::BF16  ? cuda::Storage::BF16
                                   : T == DType::F16 ? cuda::Storage::F16
                                                     : cuda::Storage::F32);
}

namespace {

Error noKernel(OpKind Op) {
  return makeError("the CUDA backend has no kernel for op " + opName(Op) +
                   " yet; run this plan with --device cpu");
}

/// numpy broadcasting strides of In read at Out's multi-indices (0 along
/// broadcast axes), as runtime/cpu/kernels/Common.h's broadcastStrides, with its errors.
Error broadcastStrides(const TensorType &In, const TensorType &Out,
                       cuda::DevShape &Strides) {
  int R = int(Out.rank());
  if (R > cuda::MaxRank)
    return makeError("broadcast: rank above MaxRank");
  if (In.rank() > Out.rank())
    return makeError("broadcast: input rank above output rank");
  int64_t InStrides[cuda::MaxRank];
  int64_t S = 1;
  for (int D = int(In.rank()) - 1; D >= 0; --D) {
    InStrides[D] = S;
    S *= In.Shape[D];
  }
  int Lead = R - int(In.rank());
  Strides.Rank = R;
  for (int D = 0; D < R; ++D) {
    int DI = D - Lead;
    if (DI < 0)
      Strides.Dim[D] = 0;
    else if (In.Shape[DI] == Out.Shape[D])
      Strides.Dim[D] = InStrides[DI];
    else if (In.Shape[DI] == 1)
      Strides.Dim[D] = 0;
    else
      return makeError("broadcast: shapes do not broadcast");
  }
  return Error::success();
}

cuda::DevShape devShape(ArrayRef<int64_t> Dims) {
  cuda::DevShape S;
  S.Rank = int(Dims.size());
  for (size_t D = 0; D < Dims.size() && D < size_t(cuda::MaxRank); ++D)
    S.Dim[D] = Dims[D];
  return S;
}

} // namespace

Error CudaBackend::dispatchMixed(const KernelCall &C, cudaStream_t S) {
  // As CpuBackend's runMixed, by the host-side plan of MixedPlan.h: the
  // 16-bit buffers' float32 copies in this stream's region, the operands
  // widened, the float32 kernel run, each 16-bit result rounded once to
  // nearest even. Everything is queued on S, in that order, so the region
  // is free again for S's next instruction.
  const auto &Bufs = C.Prog.Buffers;
  cuda::MixedPlan M =
      cuda::planMixed(C.I, Bufs, opDef(C.I.Op).SideEffects);
  auto Region = mixedScratch(S == Comm ? 1 : 0, M.RegionBytes);
  if (!Region)
    return Region.takeError();
  SmallVector<char *, 8> Where;
  for (const cuda::MixedBuffer &B : M.Buffers)
    Where.push_back(B.Offset >= 0 ? *Region + B.Offset : C.buffer(B.Id));
  auto Convert = [&](size_t K, bool ToFloat) {
    int Id = M.Buffers[K].Id;
    bool Bf16 = Bufs[Id].Type.Dtype == DType::BF16;
    auto *H = reinterpret_cast<uint16_t *>(C.buffer(Id));
    auto *F = reinterpret_cast<float *>(Where[K]);
    int64_t N = Bufs[Id].Type.numElements();
    if (ToFloat)
      cuda::widen16(F, H, N, Bf16, S);
    else
      cuda::narrow16(H, F, N, Bf16, S);
  };
  for (size_t K = 0; K < M.Buffers.size(); ++K)
    if (M.Buffers[K].Widen)
      Convert(K, /*ToFloat=*/true);
  if (auto E = dispatch(KernelCall{M.Local, M.LocalProgram, nullptr, C.Step,
                                   C.Training, C.Dropout, C.Seed, C.Tensor,
                                   C.Pipeline, C.Data, C.GradScale,
                                   Where.data(), C.Context},
                        S))
    return E;
  for (size_t K = 0; K < M.Buffers.size(); ++K)
    if (M.Buffers[K].Narrow)
      Convert(K, /*ToFloat=*/false);
  return Error::success();
}

Error CudaBackend::vocabParallelLoss(const KernelCall &C, cudaStream_t S,
                                     bool Grad, int64_t N, int64_t V,
                                     int64_t Valid, int64_t Ignore) {
  // As CpuBackend: the row maximum, the sum of exponentials and the target
  // logit reduced over the tensor group, so no rank holds the full logits.
  const Instruction &I = C.I;
  int64_t Start = C.Tensor.rank() * V;
  int64_t Mine = std::clamp<int64_t>(Valid - Start, 0, V);
  int64_t CountAt = (3 * N + 1) / 2 * 2; // 8-byte aligned
  auto Tmp = scratch(false, CountAt + 2);
  if (!Tmp)
    return Tmp.takeError();
  float *Max = *Tmp, *Sum = Max + N, *Target = Sum + N;
  double *Count = reinterpret_cast<double *>(*Tmp + CountAt);
  const float *Logits = reinterpret_cast<const float *>(C.buffer(I.In[0]));
  const int64_t *Targets = reinterpret_cast<const int64_t *>(C.buffer(I.In[1]));
  float *Out = reinterpret_cast<float *>(C.buffer(I.Out[0]));
  cuda::vocabParallelMax(Max, Logits, Targets, N, V, Mine, Valid, true, Ignore,
                         Err, S);
  bool Group = C.Tensor.size() > 1;
  if (Group)
    if (auto E = onNccl(C.Tensor, S, [&](NcclComm &G, cudaStream_t NS) {
          return G.allReduceMax(Max, Max, N, NS);
        }))
      return E;
  cuda::vocabParallelSums(Sum, Target, Logits, Max, Targets, N, V, Mine, Start,
                          true, Ignore, S);
  if (Group)
    if (auto E = onNccl(C.Tensor, S, [&](NcclComm &G, cudaStream_t NS) {
          if (auto E = G.allReduceSum(Sum, Sum, N, NS))
            return E;
          return Grad ? Error::success()
                      : G.allReduceSum(Target, Target, N, NS);
        }))
      return E;
  if (Grad)
    cuda::vocabParallelGrad(Out, Logits, Max, Sum, Targets,
                            reinterpret_cast<const float *>(C.buffer(I.In[2])),
                            N, V, Mine, Start, true, Ignore, Count, S);
  else
    cuda::vocabParallelLoss(Out, Sum, Max, Target, Targets, N, true, Ignore, S);
  return Error::success();
}

Error CudaBackend::dropout(const KernelCall &C, cudaStream_t S) {
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  auto Key = attrInts(I.Op, I.Attrs, "key");
  if (Key.size() != 2)
    return makeError("dropout has no Philox key; recompile the plan");
  double Ratio =
      C.Training ? C.Dropout.value_or(attrFloat(I.Op, I.Attrs, "ratio")) : 0.0;
  if (!(Ratio >= 0.0 && Ratio <= 1.0))
    return makeError("dropout ratio outside [0, 1]");
  if (Key[0] < 0 || Key[0] > 0xFFFF)
    return makeError("dropout key layer above 65535");
  if (Key[1] < 0 || Key[1] > 0xFFFF)
    return makeError("dropout key site above 65535");
  const TensorType &Local = Bufs[I.In[0]].Type;
  if (Local.rank() > size_t(cuda::MaxRank))
    return makeError("global index: rank above MaxRank");
  const Sharding &Sh = Bufs[I.In[0]].Shard;
  // The element's index in the whole tensor (as CpuBackend's).
  GlobalBlock GB = globalBlock(
      Local.Shape, Sh, C.Tensor.rank(), attrInt(I.Op, I.Attrs, "microbatch"),
      attrInt(I.Op, I.Attrs, "microbatches"), C.replica(), C.replicas());
  if (const int Cp = int(attrInt(I.Op, I.Attrs, "cp")); Cp > 1) {
    // Axis cp_dim is this rank's positions of the sequence (CpuBackend's).
    Communicator *G = C.group("cp");
    if (!G || G->size() != Cp)
      return makeError("dropout {cp = " + Twine(Cp) +
                       "} needs a context-parallel group of that size");
    std::string Why =
        withContext(GB, Local.Shape, int(attrInt(I.Op, I.Attrs, "cp_dim")),
                    G->rank(), Cp, attrInt(I.Op, I.Attrs, "cp_zigzag") != 0);
    if (!Why.empty())
      return makeError("dropout: " + Why);
  }
  uint8_t *Mask = I.Out.size() > 1
                      ? reinterpret_cast<uint8_t *>(C.buffer(I.Out[1]))
                      : nullptr;
  // causal (lower/CausalProducts.h): the input is zero above the diagonal
  // of its last two dimensions, so the output is 0 there whatever the draw;
  // the mask is set to 0 there as the CPU leaves it (the draw is not
  // skipped here).
  bool Causal = I.Op == OpKind::Dropout &&
                attrInt(I.Op, I.Attrs, "causal");
  if (Causal && (Local.rank() < 2 ||
                 (Sh.K == Sharding::Split && Sh.Dim >= int(Local.rank()) - 2)))
    return makeError("dropout {causal} needs its last two dimensions whole "
                     "on the rank; the plan is corrupt");
  cuda::dropout(elems(C, I.Out[0]), Mask, elems(C, I.In[0]), Ratio, C.Seed,
                uint32_t(Key[0]), uint32_t(Key[1]), uint32_t(C.Step),
                devShape(GB.Full), devShape(Local.Shape), devShape(GB.Offset),
                S, devShape(GB.Seam), devShape(GB.Jump));
  if (Causal && Mask) {
    int64_t Sq = Local.dim(-2), Sk = Local.dim(-1);
    if (Sq > 0 && Sk > 0)
      cuda::causalMaskBytes(Mask, Local.numElements() / (Sq * Sk), Sq, Sk, S);
  }
  return Error::success();
}

Error CudaBackend::dispatch(const KernelCall &C, cudaStream_t S) {
  const Instruction &I = C.I;
  auto In = [&](unsigned K) { return C.in<float>(K); };
  auto Out = [&](unsigned K) { return C.out<float>(K); };
  auto InT = [&](unsigned K) -> const TensorType & { return C.inType(K); };
  auto OutT = [&](unsigned K) -> const TensorType & { return C.outType(K); };
  // A float operand as the kernels taking cuda::Elems see it: float32, or
  // bf16/fp16 read and written in place (cuda::runsIn16Bit).
  auto InE = [&](unsigned K) { return elems(C, I.In[K]); };
  auto OutE = [&](unsigned K) { return elems(C, I.Out[K]); };
  auto Ids = [&](unsigned K) {
    return reinterpret_cast<const int64_t *>(C.buffer(I.In[K]));
  };
  // Doubles of the stream's scratch (the column sums' block sums).
  auto Doubles = [&](int64_t N) -> Expected<double *> {
    auto T = scratch(S == Comm, 2 * N);
    if (!T)
      return T.takeError();
    return reinterpret_cast<double *>(*T);
  };
  auto Zero = [&](unsigned K) -> Error {
    SP_CUDA_TRY(cudaMemsetAsync(Out(K), 0, OutT(K).numBytes(), S));
    return Error::success();
  };
  auto AInt = [&](StringRef Name) { return attrInt(I.Op, I.Attrs, Name); };
  auto AFloat = [&](StringRef Name) { return attrFloat(I.Op, I.Attrs, Name); };
  auto Tanh = [&] {
    return attrString(I.Op, I.Attrs, "approximate") == "tanh";
  };
  int Rank = C.Tensor.rank();

  switch (I.Op) {
  case OpKind::Embedding: {
    const TensorType &Table = InT(0);
    int64_t N = InT(1).numElements(), V = Table.Shape[0], H = Table.Shape[1];
    bool VP = AInt("vocab_parallel");
    cuda::embedding(Out(0), In(0), Ids(1), N, V, H, VP ? Rank * V : 0, VP, Err,
                    S);
    return Error::success();
  }
  case OpKind::EmbeddingGrad: {
    if (auto E = Zero(0))
      return E;
    const TensorType &Table = OutT(0);
    int64_t N = InT(0).numElements(), V = Table.Shape[0], H = Table.Shape[1];
    bool VP = AInt("vocab_parallel");
    cuda::embeddingBackward(Out(0), In(1), Ids(0), N, V, H, VP ? Rank * V : 0,
                            VP, Err, S);
    return Error::success();
  }
  case OpKind::Send:
  case OpKind::Recv:
  case OpKind::PipeBroadcast:
  case OpKind::PipeAllReduce:
    return pipelineMessage(C, S);
  case OpKind::AllReduce:
  case OpKind::AllGather:
  case OpKind::ReduceScatter:
  case OpKind::SpSplit:
  case OpKind::RingShift:
  case OpKind::RingConcat: {
    auto G = groupOf(C);
    if (!G)
      return G.takeError();
    bool Ring = I.Op == OpKind::RingShift || I.Op == OpKind::RingConcat;
    return Ring ? ring(C, *G, S) : collective(C, *G, S);
  }
  case OpKind::GatherParam:
    return gatherParam(C, S);
  case OpKind::CpSlice:
  case OpKind::CpPad:
    return contextCopy(C, S);
  case OpKind::Cast: {
    // float32 to or from bf16/fp16 (cuda::runsIn16Bit), else a copy (on
    // float32 copies, dispatchMixed rounding the result).
    DType From = InT(0).Dtype, To = OutT(0).Dtype;
    auto *Half = reinterpret_cast<uint16_t *>(
        C.buffer(From == DType::F32 ? I.Out[0] : I.In[0]));
    int64_t N = InT(0).numElements();
    if (From == DType::F32 && To != DType::F32)
      cuda::narrow16(Half, In(0), N, To == DType::BF16, S);
    else if (To == DType::F32 && From != DType::F32)
      cuda::widen16(Out(0), Half, N, From == DType::BF16, S);
    else
      SP_CUDA_TRY(cudaMemcpyAsync(Out(0), In(0), InT(0).numBytes(),
                                  cudaMemcpyDeviceToDevice, S));
    return Error::success();
  }
  case OpKind::Add:
  case OpKind::Mul: {
    bool Multiply = I.Op == OpKind::Mul;
    if (InT(0).Shape == InT(1).Shape) {
      (Multiply ? cuda::mul : cuda::add)(OutE(0), InE(0), InE(1),
                                         OutT(0).numElements(), S);
      return Error::success();
    }
    cuda::DevShape SA, SB;
    if (auto E = broadcastStrides(InT(0), OutT(0), SA))
      return E;
    if (auto E = broadcastStrides(InT(1), OutT(0), SB))
      return E;
    cuda::broadcastBinary(Out(0), devShape(OutT(0).Shape), In(0), SA, In(1),
                          SB, Multiply, S);
    return Error::success();
  }
  case OpKind::ReduceTo: {
    const TensorType &X = OutT(0), &Y = InT(0);
    cuda::DevShape SX;
    if (auto E = broadcastStrides(X, Y, SX))
      return E;
    int R = int(Y.rank());
    int64_t SY[cuda::MaxRank];
    int64_t Acc = 1;
    for (int D = R - 1; D >= 0; --D) {
      SY[D] = Acc;
      Acc *= Y.Shape[D];
    }
    cuda::DevShape Kept, KeptSX, KeptSY, Red, RedSY;
    for (int D = 0; D < R; ++D) {
      if (SX.Dim[D] == 0 && Y.Shape[D] != 1) {
        Red.Dim[Red.Rank] = Y.Shape[D];
        RedSY.Dim[Red.Rank++] = SY[D];
        RedSY.Rank = Red.Rank;
      } else {
        Kept.Dim[Kept.Rank] = Y.Shape[D];
        KeptSX.Dim[Kept.Rank] = SX.Dim[D];
        KeptSY.Dim[Kept.Rank++] = SY[D];
        KeptSX.Rank = KeptSY.Rank = Kept.Rank;
      }
    }
    cuda::reduceTo(Out(0), In(0), Kept, KeptSX, KeptSY, Red, RedSY,
                   X.numElements(), S);
    return Error::success();
  }
  case OpKind::LayerNorm: {
    int64_t H = InT(0).dim(-1), Rows = InT(0).numElements() / H;
    bool Stats = I.Out.size() == 3;
    cuda::layerNorm(OutE(0), Stats ? Out(1) : nullptr, Stats ? Out(2) : nullptr,
                    InE(0), InE(1), InE(2), Rows, H, AFloat("epsilon"), Num, S);
    return Error::success();
  }
  case OpKind::LayerNormGrad: {
    int64_t H = InT(1).dim(-1), Rows = InT(1).numElements() / H;
    if (auto E = Zero(1))
      return E;
    if (auto E = Zero(2))
      return E;
    auto Tmp = Doubles(2 * cuda::columnParts(Rows) * H);
    if (!Tmp)
      return Tmp.takeError();
    cuda::layerNormBackward(OutE(0), Out(1), Out(2), InE(0), InE(1), InE(2),
                            In(3), In(4), Rows, H, *Tmp, Num, S);
    return Error::success();
  }
  case OpKind::Linear: {
    int64_t InF = InT(0).dim(-1), OutF = OutT(0).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    return linear(S, AInt("trans_w"), Rows, OutF, InF, In(0), In(1),
                  I.In.size() > 2 ? In(2) : nullptr, Out(0), InT(0).Dtype,
                  OutT(0).Dtype);
  }
  case OpKind::LinearGelu: { // the linear, then the GELU of its result
    int64_t InF = InT(0).dim(-1), OutF = OutT(0).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    if (auto E =
            linear(S, AInt("trans_w"), Rows, OutF, InF, In(0), In(1),
                   I.In.size() > 2 ? In(2) : nullptr, Out(0), InT(0).Dtype,
                   OutT(0).Dtype))
      return E;
    cuda::gelu(OutE(1), OutE(0), OutT(0).numElements(), Tanh(), Num, S);
    return Error::success();
  }
  case OpKind::LinearGeluGrad: { // the linear, then the GELU's gradient in
                                 // place
    int64_t InF = InT(0).dim(-1), OutF = OutT(0).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    if (auto E = linear(S, AInt("trans_w"), Rows, OutF, InF, In(0), In(1),
                        nullptr, Out(0), InT(0).Dtype, OutT(0).Dtype))
      return E;
    cuda::geluBackward(OutE(0), InE(2), OutE(0), OutT(0).numElements(), Tanh(),
                       Num, S);
    return Error::success();
  }
  case OpKind::LinearGradW: {
    int64_t InF = InT(0).dim(-1), OutF = InT(1).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    if (auto E = Zero(0))
      return E;
    if (AInt("trans_w")) // DW[Out, In] += DY^T X
      return gemm(S, true, false, OutF, InF, Rows, In(1), OutF, In(0), InF,
                  1.0f, Out(0), InF, InT(0).Dtype);
    return gemm(S, true, false, InF, OutF, Rows, In(0), InF, In(1), OutF, 1.0f,
                Out(0), OutF, InT(0).Dtype);
  }
  case OpKind::BiasGrad: {
    int64_t OutF = InT(0).dim(-1);
    if (auto E = Zero(0))
      return E;
    int64_t Rows = InT(0).numElements() / OutF;
    auto Tmp = Doubles(cuda::columnParts(Rows) * OutF);
    if (!Tmp)
      return Tmp.takeError();
    cuda::biasBackward(Out(0), InE(0), Rows, OutF, *Tmp, S);
    return Error::success();
  }
  case OpKind::Gelu:
    cuda::gelu(OutE(0), InE(0), InT(0).numElements(), Tanh(), Num, S);
    return Error::success();
  case OpKind::GeluGrad:
    cuda::geluBackward(OutE(0), InE(0), InE(1), InT(0).numElements(), Tanh(),
                       Num, S);
    return Error::success();
  case OpKind::RmsNorm: {
    int64_t H = InT(0).dim(-1), Rows = InT(0).numElements() / H;
    cuda::rmsNorm(Out(0), I.Out.size() > 1 ? Out(1) : nullptr, In(0), In(1),
                  Rows, H, AFloat("epsilon"), Num, S);
    return Error::success();
  }
  case OpKind::RmsNormGrad: {
    int64_t H = InT(1).dim(-1), Rows = InT(1).numElements() / H;
    if (auto E = Zero(1))
      return E;
    auto Tmp = Doubles(cuda::columnParts(Rows) * H);
    if (!Tmp)
      return Tmp.takeError();
    cuda::rmsNormBackward(Out(0), Out(1), In(0), In(1), In(2), In(3), Rows, H,
                          *Tmp, Num, S);
    return Error::success();
  }
    // The activations of ir/Ops.def's SP_UNARY_OP lines.
#define SP_OP(Enum, Name)
#define SP_UNARY_OP(Enum, Name, OnnxName)                                      \
  case OpKind::Enum:                                                           \
    cuda::activation(Activation::Enum, Out(0), In(0), InT(0).numElements(),    \
                     S);                                                       \
    return Error::success();                                                   \
  case OpKind::Enum##Grad:                                                     \
    cuda::activationBackward(Activation::Enum, Out(0), In(0), In(1),           \
                             InT(0).numElements(), S);                         \
    return Error::success();
#include "ir/Ops.def"
  case OpKind::Rope:
  case OpKind::RopeGrad: {
    const TensorType &X = InT(0);
    int64_t Rot = InT(1).Shape[2]; // the tables' width: partial rotary
    if (Rot % 2 || Rot > X.Shape[3])
      return makeError("rope rotates an even number of dims, at most the "
                       "head size");
    int64_t CB = InT(1).Shape[0];
    if (CB != 1 && CB != X.Shape[0])
      return makeError("rope tables must have batch dimension 1 or B");
    cuda::rope(Out(0), In(0), In(1), In(2), X.Shape[0], X.Shape[1], X.Shape[2],
               X.Shape[3], CB, AInt("interleaved"), I.Op == OpKind::RopeGrad,
               Rot, S);
    return Error::success();
  }
  case OpKind::RepeatHeads: {
    const TensorType &X = InT(0);
    cuda::repeatHeads(Out(0), In(0), X.Shape[0], X.Shape[1], AInt("repeats"),
                      X.Shape[2], X.Shape[3], S);
    return Error::success();
  }
  case OpKind::RepeatHeadsGrad: {
    const TensorType &X = OutT(0);
    cuda::repeatHeadsBackward(Out(0), In(0), X.Shape[0], X.Shape[1],
                              AInt("repeats"), X.Shape[2], X.Shape[3], S);
    return Error::success();
  }
  case OpKind::ToHeads:
  case OpKind::MergeHeadsGrad: {
    const TensorType &X = OutT(0);
    cuda::mergeHeadsBackward(OutE(0), InE(0), X.Shape[0], X.Shape[2], X.Shape[1],
                             X.Shape[3], S);
    return Error::success();
  }
  case OpKind::SplitHeads: {
    const TensorType &Q = OutT(0);
    cuda::splitHeads(OutE(0), OutE(1), OutE(2), InE(0), Q.Shape[0], Q.Shape[2],
                     Q.Shape[1], Q.Shape[3], AInt("per_head"), S);
    return Error::success();
  }
  case OpKind::SplitHeadsGrad: {
    const TensorType &Q = InT(0);
    cuda::splitHeadsBackward(OutE(0), InE(0), InE(1), InE(2), Q.Shape[0],
                             Q.Shape[2], Q.Shape[1], Q.Shape[3],
                             AInt("per_head"), S);
    return Error::success();
  }
  case OpKind::MergeHeads: {
    const TensorType &X = InT(0);
    cuda::mergeHeads(OutE(0), InE(0), X.Shape[0], X.Shape[2], X.Shape[1],
                     X.Shape[3], S);
    return Error::success();
  }
  case OpKind::BatchMatMul: {
    auto G = batchMatMulShape(C, "CUDA");
    if (!G)
      return G.takeError();
    const TensorType &CT = OutT(0);
    // causal_a only says A holds zeros the product may skip: the whole
    // product is the same. causal keeps the causal triangle of the result
    // and zeroes the rest, as the CPU's row blocks do.
    bool Causal = AInt("causal");
    if (Causal && CT.Dtype != DType::F32)
      return makeError("batch_matmul {causal} on " + CT.str() +
                       ": the CUDA backend masks float32 results only "
                       "(sp-compile marks float32 and float64 plans)");
    if (auto E = batchedGemm(S, G->TransA, G->TransB, G->M, G->N, G->K, In(0),
                             In(1), Out(0), G->Batch, InT(0).Dtype,
                             CT.Dtype))
      return E;
    if (Causal)
      cuda::causalMask(Out(0), Out(0), G->Batch, G->M, G->N, 0.0, S);
    return Error::success();
  }
  case OpKind::Scale:
    cuda::scale(Out(0), In(0), InT(0).numElements(), AFloat("alpha"), S);
    return Error::success();
  case OpKind::CausalMask: {
    const TensorType &X = InT(0);
    int64_t Sq = X.dim(-2), Sk = X.dim(-1);
    cuda::causalMask(Out(0), In(0), X.numElements() / (Sq * Sk), Sq, Sk,
                     AFloat("fill"), S);
    return Error::success();
  }
  case OpKind::PaddingMask: {
    const TensorType &X = InT(0);
    int64_t B = X.Shape[0], K = X.dim(-1);
    auto KeepType = paddingKeepType(InT(1));
    if (!KeepType)
      return KeepType.takeError();
    cuda::paddingMask(Out(0), In(0), C.buffer(I.In[1]), *KeepType, B,
                      X.numElements() / (B * K), K, AFloat("fill"),
                      AInt("where"), S);
    return Error::success();
  }
  case OpKind::Softmax:
  case OpKind::SoftmaxGrad: {
    // With the attention core's scale and causal mask fused in
    // (lower/FuseAttention.cpp), or plain (alpha 1, not causal).
    const TensorType &X = InT(0);
    int64_t N = X.dim(-1);
    bool Causal = AInt("causal");
    if (Causal && X.rank() < 2)
      return makeError("a causal softmax expects rank >= 2 scores");
    int64_t Sq = Causal ? X.dim(-2) : 1;
    if (I.Op == OpKind::Softmax)
      cuda::softmax(OutE(0), InE(0), X.numElements() / N, N, AFloat("alpha"),
                    Causal, Sq, AFloat("fill"), Num, S);
    else
      cuda::softmaxBackward(OutE(0), InE(0), InE(1), X.numElements() / N, N,
                            AFloat("alpha"), Causal, Sq, AFloat("fill"), Num,
                            S);
    return Error::success();
  }
  case OpKind::Dropout:
    return dropout(C, S);
  case OpKind::DropoutAdd: // the dropout, then the residual added in place
    if (auto E = dropout(C, S))
      return E;
    cuda::add(OutE(0), OutE(0), InE(1), OutT(0).numElements(), S);
    return Error::success();
  case OpKind::Attention:
  case OpKind::AttentionGrad:
    return attention(C, S);
  case OpKind::DropoutGrad: {
    double Ratio =
        C.Training ? C.Dropout.value_or(AFloat("ratio")) : 0.0;
    cuda::dropoutBackward(OutE(0), InE(0),
                          reinterpret_cast<const uint8_t *>(In(1)),
                          InT(0).numElements(), Ratio, S);
    return Error::success();
  }
  case OpKind::CrossEntropy:
  case OpKind::CrossEntropyGrad: {
    CrossEntropyShape X = crossEntropyShape(C);
    if (X.VocabParallel)
      return vocabParallelLoss(C, S, X.Grad, X.N, X.V, X.Valid, X.Ignore);
    if (X.N <= 0)
      return makeError("cross entropy over no rows");
    if (X.Valid < 1 || X.Valid > X.V)
      return makeError("cross entropy valid vocabulary not in [1, V]");
    // Scratch: N row losses (doubles) or the count.
    auto Tmp = scratch(false, 2 * X.N + 2);
    if (!Tmp)
      return Tmp.takeError();
    double *D = reinterpret_cast<double *>(*Tmp);
    if (X.Grad)
      cuda::crossEntropyBackward(Out(0), In(0), Ids(1), In(2), X.N, X.V,
                                 X.Valid, true, X.Ignore, D, Err, S);
    else
      cuda::crossEntropy(Out(0), In(0), Ids(1), X.N, X.V, X.Valid, true,
                         X.Ignore, D, Err, S);
    return Error::success();
  }
  case OpKind::GradNorm:
    return gradNorm(C, S);
  case OpKind::Accumulate: {
    int64_t N = InT(1).numElements();
    if (AInt("first"))
      SP_CUDA_TRY(cudaMemcpyAsync(In(0), In(1), N * sizeof(float),
                                  cudaMemcpyDeviceToDevice, S));
    else
      cuda::add(In(0), In(0), In(1), N, S);
    return Error::success();
  }
  case OpKind::AdamW: {
    auto Chunk = adamwChunk(C); // with ZeRO, g, m, v are this rank's chunk
    if (!Chunk)
      return Chunk.takeError();
    cuda::adamw(In(0) + Chunk->Begin, In(1), In(2), In(3), Chunk->Count, In(4),
                In(5), In(6), AFloat("beta1"), AFloat("beta2"), AFloat("eps"),
                AFloat("weight_decay"), AFloat("max_norm"),
                float(C.GradScale), S);
    return Error::success();
  }
  default:
    return noKernel(I.Op);
  }
}

} // namespace sp::cuda
