//===- MixedPlan.cpp - How a 16-bit instruction runs on the GPU -----------===//
#include "runtime/cuda/MixedPlan.h"
#include "runtime/cuda/AttentionPlan.h"
#include "llvm/ADT/STLExtras.h"
#include <algorithm>

namespace sp::cuda {

static bool is16Bit(DType T) { return T == DType::BF16 || T == DType::F16; }

bool touches16Bit(const Instruction &I,
                  const std::vector<ProgramBuffer> &Buffers) {
  for (const auto *List : {&I.Out, &I.In})
    for (int B : *List)
      if (is16Bit(Buffers[B].Type.Dtype))
        return true;
  return false;
}

bool runsIn16Bit(const Instruction &I,
                 const std::vector<ProgramBuffer> &Buffers) {
  auto Type = [&](int B) { return Buffers[B].Type.Dtype; };
  auto F32 = [&](int B) { return Type(B) == DType::F32; };
  // The kernels are compiled for one storage of their tensors (Common.cuh,
  // withStorage); the parameter gradients they accumulate (LayerNorm's, the
  // bias's) are float32, as the plans' gradients are.
  auto OneType = [&](std::initializer_list<int> Ids) {
    return llvm::all_of(Ids, [&](int B) { return Type(B) == Type(*Ids.begin()); });
  };
  const auto &In = I.In;
  const auto &Out = I.Out;
  switch (I.Op) {
  case OpKind::Add:
  case OpKind::Mul: // a broadcast runs on copies
    return In.size() == 2 && Out.size() == 1 &&
           Buffers[In[0]].Type.Shape == Buffers[In[1]].Type.Shape &&
           OneType({In[0], In[1], Out[0]});
  case OpKind::LayerNorm: // (x, gamma, beta) -> y, float32 statistics
    return In.size() == 3 && OneType({In[0], In[1], In[2], Out[0]}) &&
           llvm::all_of(llvm::drop_begin(Out), F32);
  case OpKind::LayerNormGrad: // (dy, x, gamma, mean, rstd) -> dx, ...
    return In.size() == 5 && Out.size() == 3 &&
           OneType({In[0], In[1], In[2], Out[0]}) && F32(In[3]) &&
           F32(In[4]) && F32(Out[1]) && F32(Out[2]);
  case OpKind::Cast: // one side float32: a widening or a rounding
    return In.size() == 1 && Out.size() == 1 && (F32(In[0]) || F32(Out[0])) &&
           (is16Bit(Type(In[0])) || is16Bit(Type(Out[0])));
  case OpKind::BiasGrad:
    return In.size() == 1 && Out.size() == 1 && F32(Out[0]);
  case OpKind::Gelu:
  case OpKind::Softmax:
  case OpKind::Dropout: // x -> y (and dropout's mask)
  case OpKind::DropoutGrad: // (dy, mask) -> dx
    return !In.empty() && !Out.empty() && OneType({In[0], Out[0]});
  case OpKind::GeluGrad:
  case OpKind::SoftmaxGrad:
    return In.size() == 2 && Out.size() == 1 &&
           OneType({In[0], In[1], Out[0]});
  case OpKind::Linear: // (x, w[, bias]) -> y: cuBLAS writes the 16-bit y
  case OpKind::LinearGelu: // ... -> (pre-activation, y)
  case OpKind::LinearGeluGrad: // (dy, w, pre-activation) -> dx
  case OpKind::BatchMatMul: // (a, b) -> c; causal masks float32 only
    return In.size() >= 2 && is16Bit(Type(In[0])) &&
           llvm::all_of(In, [&](int B) { return Type(B) == Type(In[0]); }) &&
           llvm::all_of(Out, [&](int B) { return Type(B) == Type(In[0]); }) &&
           !(I.Op == OpKind::BatchMatMul && I.Attrs.getInt("causal", 0));
  case OpKind::SplitHeads: // permutations: bytes moved as they are
  case OpKind::SplitHeadsGrad:
  case OpKind::MergeHeads:
  case OpKind::MergeHeadsGrad:
    return llvm::all_of(In, [&](int B) { return Type(B) == Type(Out[0]); }) &&
           llvm::all_of(Out, [&](int B) { return Type(B) == Type(Out[0]); });
  case OpKind::Attention: // the blockwise kernels (AttentionPlan.h)
  case OpKind::AttentionGrad:
    return runsBlockwise(I, Buffers);
  case OpKind::RingShift:  // bytes moved as they are (CudaBackend::ring)
  case OpKind::RingConcat:
  case OpKind::CpSlice: // (CudaBackend::contextCopy)
  case OpKind::CpPad:
    return !In.empty() && Out.size() == 1 &&
           llvm::all_of(In, [&](int B) { return Type(B) == Type(Out[0]); });
  default:
    return false;
  }
}

MixedPlan planMixed(const Instruction &I,
                    const std::vector<ProgramBuffer> &Buffers,
                    bool SideEffects) {
  MixedPlan P;
  P.Local = I;
  P.Gemm16 = (I.Op == OpKind::Linear || I.Op == OpKind::LinearGradW ||
              I.Op == OpKind::BatchMatMul) &&
             I.In.size() >= 2 && is16Bit(Buffers[I.In[0]].Type.Dtype) &&
             Buffers[I.In[0]].Type.Dtype == Buffers[I.In[1]].Type.Dtype;
  auto Map = [&](int &B) {
    auto It = llvm::find_if(P.Buffers,
                            [&](const MixedBuffer &M) { return M.Id == B; });
    if (It != P.Buffers.end()) {
      B = int(It - P.Buffers.begin());
      return;
    }
    ProgramBuffer PB = Buffers[B];
    PB.Offset = -1;
    MixedBuffer M;
    M.Id = B;
    bool InPlace16 = P.Gemm16 && (B == I.In[0] || B == I.In[1]) &&
                     !llvm::is_contained(I.Out, B);
    if (is16Bit(PB.Type.Dtype) && !InPlace16) {
      PB.Type.Dtype = DType::F32;
      PB.Bytes = PB.Type.numBytes();
      PB.Offset = P.RegionBytes;
      M.Offset = P.RegionBytes;
      int64_t Size = std::max<int64_t>(PB.Bytes, 1);
      P.RegionBytes += (Size + 255) / 256 * 256;
      M.Widen = SideEffects || llvm::is_contained(I.In, B);
      M.Narrow = SideEffects || llvm::is_contained(I.Out, B);
    }
    P.LocalProgram.Buffers.push_back(std::move(PB));
    P.Buffers.push_back(M);
    B = int(P.Buffers.size()) - 1;
  };
  for (int &B : P.Local.In)
    Map(B);
  for (int &B : P.Local.Out)
    Map(B);
  return P;
}

} // namespace sp::cuda
