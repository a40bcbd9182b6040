//===- FuseSoftmax.cpp - One softmax for the attention core ---------------===//
//
// The program pass fuse-softmax; what it fuses and when: lower/FuseSoftmax.h.
//
//===----------------------------------------------------------------------===//
#include "lower/FuseSoftmax.h"
#include "lower/Peephole.h"
#include "lower/ProgramPass.h"

namespace sp {

namespace {

/// Whether a softmax or softmax_grad is still the plain op.
bool isPlain(const Instruction &I) {
  return !I.Attrs.has("alpha") && !I.Attrs.has("causal") &&
         !I.Attrs.has("fill");
}

struct Fuser : Peephole {
  using Peephole::Peephole;

  /// scale? -> causal_mask? -> softmax (at instruction K).
  bool fuseForward(int K) {
    Instruction &S = P.Instrs[K];
    if (S.In.size() != 1 || !isPlain(S))
      return false;
    int X = S.In[0];
    bool Causal = false, Scaled = false;
    double Fill = 0, Alpha = 1;
    if (isIntermediate(X) && isLink(Producer[X], OpKind::CausalMask, S.Ph)) {
      int M = Producer[X];
      Causal = true;
      Fill = attrFloat(OpKind::CausalMask, P.Instrs[M].Attrs, "fill");
      DeadInstr[M] = true;
      DeadBuf[X] = true;
      X = P.Instrs[M].In[0];
    }
    if (isIntermediate(X) && isLink(Producer[X], OpKind::Scale, S.Ph)) {
      int C = Producer[X];
      Scaled = true;
      Alpha = attrFloat(OpKind::Scale, P.Instrs[C].Attrs, "alpha");
      DeadInstr[C] = true;
      DeadBuf[X] = true;
      X = P.Instrs[C].In[0];
    }
    if (!Causal && !Scaled)
      return false;
    S.In[0] = X;
    setAttrs(S, Scaled, Alpha, Causal, Fill);
    return true;
  }

  /// softmax_grad (at instruction K) -> causal_mask? -> scale?; the fused
  /// instruction takes the place of the chain's last one.
  bool fuseBackward(int K) {
    const Instruction &G = P.Instrs[K];
    if (G.Out.size() != 1 || !isPlain(G))
      return false;
    int D = G.Out[0], Last = K;
    bool Causal = false, Scaled = false;
    double Fill = 0, Alpha = 1;
    if (isIntermediate(D) && isLink(User[D], OpKind::CausalMask, G.Ph)) {
      int M = User[D];
      Causal = true;
      Fill = attrFloat(OpKind::CausalMask, P.Instrs[M].Attrs, "fill");
      DeadBuf[D] = true;
      D = P.Instrs[M].Out[0];
      Last = M;
    }
    if (isIntermediate(D) && isLink(User[D], OpKind::Scale, G.Ph)) {
      int C = User[D];
      Scaled = true;
      Alpha = attrFloat(OpKind::Scale, P.Instrs[C].Attrs, "alpha");
      DeadBuf[D] = true;
      D = P.Instrs[C].Out[0];
      if (Last != K)
        DeadInstr[Last] = true;
      Last = C;
    }
    if (!Causal && !Scaled)
      return false;
    Instruction F = G;
    F.Out[0] = D;
    setAttrs(F, Scaled, Alpha, Causal, Fill);
    DeadInstr[K] = true;
    P.Instrs[Last] = std::move(F);
    return true;
  }

  static void setAttrs(Instruction &I, bool Scaled, double Alpha, bool Causal,
                       double Fill) {
    if (Scaled)
      I.Attrs.set("alpha", Alpha);
    if (Causal) {
      I.Attrs.set("causal", int64_t(1));
      I.Attrs.set("fill", Fill);
    }
  }
};

} // namespace

int fuseAttentionSoftmax(Program &P) {
  Fuser F(P);
  bool Any = false;
  for (size_t K = 0; K < F.NI; ++K) {
    if (F.DeadInstr[K])
      continue;
    if (P.Instrs[K].Op == OpKind::Softmax)
      Any |= F.fuseForward(int(K));
    else if (P.Instrs[K].Op == OpKind::SoftmaxGrad)
      Any |= F.fuseBackward(int(K));
  }
  return Any ? F.compact() : 0;
}

std::unique_ptr<ProgramPass> createFuseSoftmaxPass() {
  return rewritePass("fuse-softmax", fuseAttentionSoftmax);
}

} // namespace sp
