//===- MixedPlan.cpp - How a 16-bit instruction runs on the GPU -----------===//
#include "runtime/cuda/MixedPlan.h"
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
