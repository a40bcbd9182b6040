//===- FuseEpilogue.cpp - GELU and residual adds fused --------------------===//
//
// The program pass fuse-epilogue; what it fuses and when:
// lower/FuseEpilogue.h.
//
//===----------------------------------------------------------------------===//
#include "lower/FuseEpilogue.h"
#include "lower/Peephole.h"
#include "lower/ProgramPass.h"

namespace sp {

namespace {

struct EpilogueFuser : Peephole {
  using Peephole::Peephole;

  /// A linear of MinOperands to MaxOperands operands in phase Ph, not yet
  /// fused, without the attributes of other uses (a vocabulary-parallel
  /// head's).
  bool isPlainLinear(int K, size_t MinOperands, size_t MaxOperands,
                     Phase Ph) const {
    if (K < 0 || DeadInstr[K])
      return false;
    const Instruction &L = P.Instrs[K];
    return L.Op == OpKind::Linear && L.Ph == Ph && L.Out.size() == 1 &&
           L.In.size() >= MinOperands && L.In.size() <= MaxOperands &&
           !L.Attrs.has("valid_vocab") && allWide(L);
  }
  static AttrList fusedAttrs(const Instruction &Linear,
                             const Instruction &Gelu) {
    AttrList A;
    A.set("trans_w", Linear.Attrs.getInt("trans_w", 0));
    A.set("approximate", attrString(Gelu.Op, Gelu.Attrs, "approximate"));
    return A;
  }

  /// linear -> gelu (at instruction K).
  bool fuseForward(int K) {
    const Instruction &G = P.Instrs[K];
    if (G.In.size() != 1 || G.Out.size() != 1 || !allWide(G))
      return false;
    int Z = G.In[0], Y = G.Out[0], L = Producer[Z];
    if (!isPlainLinear(L, 2, 3, G.Ph) || P.Instrs[L].Out[0] != Z ||
        Producer[Y] != K || writtenBetween(Z, L, K))
      return false;
    Instruction &Lin = P.Instrs[L];
    AttrList A = fusedAttrs(Lin, G);
    Lin.Op = OpKind::LinearGelu;
    Lin.Attrs = std::move(A);
    Lin.Out.push_back(Y);
    DeadInstr[K] = true;
    return true;
  }

  /// linear -> gelu_grad (at instruction K, reading the linear's result as
  /// its dy).
  bool fuseBackward(int K) {
    const Instruction &G = P.Instrs[K];
    if (G.In.size() != 2 || G.Out.size() != 1 || !allWide(G))
      return false;
    int D = G.In[1], L = Producer[D];
    if (!isIntermediate(D) || !isPlainLinear(L, 2, 2, G.Ph) ||
        P.Instrs[L].Out[0] != D || G.In[0] == D)
      return false;
    const Instruction &Lin = P.Instrs[L];
    for (int B : Lin.In)
      if (writtenBetween(B, L, K))
        return false;
    Instruction F = G;
    F.Op = OpKind::LinearGeluGrad;
    F.Attrs = fusedAttrs(Lin, G);
    F.In = {Lin.In[0], Lin.In[1], G.In[0]};
    DeadInstr[L] = true;
    DeadBuf[D] = true;
    P.Instrs[K] = std::move(F);
    return true;
  }

  /// dropout -> add (at instruction K, reading the dropout's result and a
  /// residual of the same type).
  bool fuseDropoutAdd(int K) {
    const Instruction &A = P.Instrs[K];
    if (A.In.size() != 2 || A.Out.size() != 1 || !allWide(A) ||
        A.In[0] == A.In[1])
      return false;
    for (int Side = 0; Side < 2; ++Side) {
      int D = A.In[Side], R = A.In[1 - Side], L = Producer[D];
      if (!isIntermediate(D) || L < 0 || DeadInstr[L])
        continue;
      const Instruction &Drop = P.Instrs[L];
      if (Drop.Op != OpKind::Dropout || Drop.Ph != A.Ph ||
          Drop.In.size() != 1 || Drop.Out[0] != D ||
          P.Buffers[R].Type != P.Buffers[D].Type || !isWide(Drop.In[0]) ||
          writtenBetween(Drop.In[0], L, K) ||
          (Drop.Out.size() > 1 && readBetween(Drop.Out[1], L, K)))
        continue;
      Instruction F = Drop;
      F.Op = OpKind::DropoutAdd;
      F.In = {Drop.In[0], R};
      F.Out[0] = A.Out[0];
      DeadInstr[L] = true;
      DeadBuf[D] = true;
      P.Instrs[K] = std::move(F);
      return true;
    }
    return false;
  }
};

} // namespace

int fuseEpilogues(Program &P) {
  EpilogueFuser F(P);
  return F.fuseEachLive([&](int K) -> int {
    switch (P.Instrs[K].Op) {
    case OpKind::Gelu:
      return F.fuseForward(K);
    case OpKind::GeluGrad:
      return F.fuseBackward(K);
    case OpKind::Add:
      return F.fuseDropoutAdd(K);
    default:
      return 0;
    }
  });
}

std::unique_ptr<ProgramPass> createFuseEpiloguePass() {
  return rewritePass("fuse-epilogue", fuseEpilogues);
}

} // namespace sp
