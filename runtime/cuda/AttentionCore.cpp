//===- AttentionCore.cpp - The fused attention core on the GPU ------------===//
//
// attention and attention_grad: with CudaBackendOptions::BlockwiseAttention
// (the default) by the blockwise kernels (kernels/Attention.cuh,
// planBlockwise), the scores never stored; else, and for heads above 128,
// as their unfused ops on a workspace (AttentionPlan.h's planAttention, one
// region per stream).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaBackendImpl.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/SmallVector.h"

using namespace llvm;

namespace sp::cuda {

Error CudaBackend::attention(const KernelCall &C, cudaStream_t S) {
  if (attrInt(C.I.Op, C.I.Attrs, "cp") > 1) // ContextAttention.cpp
    return contextAttention(C, S);
  if (Blockwise) {
    auto Plan = cuda::planBlockwise(C.I, C.Prog.Buffers);
    if (Plan)
      return attentionBlockwise(C, std::move(*Plan), S);
    consumeError(Plan.takeError()); // larger heads
  }
  // Unless asked for the blockwise kernels (or for larger heads): the
  // unfused ops. A 16-bit attention reaches here through
  // dispatchMixed, on float32 copies: every buffer below is float32 (or the
  // mask's bytes).
  auto Plan = cuda::planAttention(C.I, C.Prog.Buffers);
  if (!Plan)
    return Plan.takeError();
  int K = S == Comm ? 1 : 0;
  auto Work = grow(AttentionWork[K], AttentionWorkBytes[K],
                   Plan->WorkspaceBytes);
  if (!Work)
    return Work.takeError();
  const Program &L = Plan->Local;
  SmallVector<char *, 16> Where;
  for (size_t B = 0; B < L.Buffers.size(); ++B)
    Where.push_back(Plan->Outer[B] >= 0 ? C.buffer(Plan->Outer[B])
                                        : *Work + L.Buffers[B].Offset);
  for (size_t J = 0; J < L.Instrs.size(); ++J) {
    const Instruction &Sub = L.Instrs[J];
    if (cuda::touches16Bit(Sub, L.Buffers))
      return makeError("attention on 16-bit buffers runs on float32 copies");
    KernelCall SC{Sub,       L,         nullptr,          C.Step,
                  C.Training, C.Dropout, C.Seed,          C.Tensor,
                  C.Pipeline, C.Data,    C.GradScale,     Where.data()};
    if (auto E = dispatch(SC, S))
      return E;
    if (int(J) == Plan->LseAfter)
      cuda::rowLogSumExp(reinterpret_cast<float *>(Where[Plan->Lse]),
                         reinterpret_cast<const float *>(Where[Plan->Scores]),
                         Plan->Batch * Plan->Heads * Plan->Sq, Plan->Sk,
                         Plan->Heads, Plan->Sq, Plan->LseMerged, S);
  }
  return Error::success();
}

Expected<int> paddingKeepType(const TensorType &M) {
  if (std::optional<int> Code = cuda::paddingKeepCode(M.Dtype))
    return *Code;
  return makeError("padding_mask: unsupported mask type " + M.str());
}

Error CudaBackend::attentionBlockwise(const KernelCall &C,
                                      cuda::BlockwisePlan Plan,
                                      cudaStream_t S) {
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  if (auto E = cuda::setBlockwiseDropout(Plan, I, Bufs, C.Training, C.Dropout,
                                         C.Seed, C.Step, C.Tensor.rank(),
                                         C.replica(), C.replicas()))
    return E;
  const cuda::AttentionGeometry &G = Plan.G;
  // Scratch: the padding bias [b, keys], then the backward's Delta.
  const int64_t BiasN = Plan.Keep >= 0 ? G.Batch * G.Sk : 0,
                DeltaN = Plan.Forward ? 0 : G.Batch * G.Heads * G.Sq;
  auto Tmp = scratch(S == Comm, BiasN + DeltaN + 1);
  if (!Tmp)
    return Tmp.takeError();
  float *Bias = BiasN ? *Tmp : nullptr, *Delta = *Tmp + BiasN;
  if (Bias) {
    // padding_mask's bias, added to zeros (its kernel; the same floats as
    // the CPU's keyBias).
    auto KeepType = paddingKeepType(Bufs[Plan.Keep].Type);
    if (!KeepType)
      return KeepType.takeError();
    SP_CUDA_TRY(cudaMemsetAsync(Bias, 0, size_t(BiasN) * sizeof(float), S));
    cuda::paddingMask(Bias, Bias, C.buffer(Plan.Keep), *KeepType, G.Batch, 1,
                      G.Sk, Plan.PadFill, Plan.PadWhere, S);
  }
  auto Op = [&](const cuda::BlockwiseOperand &X) {
    return cuda::at(elems(C, X.Id), X.Offset);
  };
  if (Plan.Forward)
    cuda::attentionForward(Op(Plan.O), Op(Plan.Lse), Op(Plan.Q), Op(Plan.K),
                           Op(Plan.V), Bias, G, S);
  else
    cuda::attentionBackward(Op(Plan.DQ), Op(Plan.DK), Op(Plan.DV), Op(Plan.DO),
                            Op(Plan.Q), Op(Plan.K), Op(Plan.V), Op(Plan.O),
                            Op(Plan.Lse), Bias, Delta, G, S);
  return Error::success();
}

} // namespace sp::cuda
