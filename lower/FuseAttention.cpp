//===- FuseAttention.cpp - One softmax for the attention core --------------===//
#include "lower/FuseAttention.h"
#include "lower/MemoryPlan.h"
#include <string>
#include <vector>

namespace sp {

namespace {

/// Whether a softmax or softmax_grad is still the plain op.
bool isPlain(const Instruction &I) {
  return !I.Attrs.has("alpha") && !I.Attrs.has("causal") &&
         !I.Attrs.has("fill");
}

struct Fuser {
  Program &P;
  size_t NI, NB;
  /// The instruction defining each buffer, how many times it is read (a
  /// program output counts as a read) and by which instruction (the last).
  std::vector<int> Producer, Uses, User;
  std::vector<bool> DeadInstr, DeadBuf;

  explicit Fuser(Program &P)
      : P(P), NI(P.Instrs.size()), NB(P.Buffers.size()), Producer(NB, -1),
        Uses(NB, 0), User(NB, -1), DeadInstr(NI, false), DeadBuf(NB, false) {
    for (size_t K = 0; K < NI; ++K) {
      for (int B : P.Instrs[K].In) {
        ++Uses[B];
        User[B] = int(K);
      }
      for (int B : P.Instrs[K].Out)
        if (Producer[B] < 0)
          Producer[B] = int(K);
    }
    for (const auto &[Name, Id] : P.Outputs)
      ++Uses[Id];
  }

  /// An intermediate the fusion may drop: a temporary read once.
  bool isIntermediate(int B) const {
    return P.Buffers[B].K == ProgramBuffer::Temp && Uses[B] == 1 &&
           Producer[B] >= 0;
  }
  /// A one-operand, one-result instruction of kind Op in phase Ph, not yet
  /// fused.
  bool isLink(int K, OpKind Op, Phase Ph) const {
    const Instruction &I = P.Instrs[K];
    return I.Op == Op && I.Ph == Ph && !DeadInstr[K] && I.In.size() == 1 &&
           I.Out.size() == 1;
  }

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

  /// Drops the dead instructions and buffers in place (each kept one moves
  /// down at most once, nothing is reallocated), renumbering the rest, and
  /// recomputes the live ranges for the new indices.
  void compact() {
    std::vector<int> NewId(NB, -1);
    size_t Kept = 0;
    for (size_t B = 0; B < NB; ++B) {
      if (DeadBuf[B])
        continue;
      NewId[B] = int(Kept);
      ProgramBuffer &PB = P.Buffers[B];
      if (Kept != B && PB.K == ProgramBuffer::Temp &&
          PB.Name == "%" + std::to_string(B))
        PB.Name = "%" + std::to_string(Kept);
      if (Kept != B)
        P.Buffers[Kept] = std::move(PB);
      ++Kept;
    }
    P.Buffers.resize(Kept);
    Kept = 0;
    for (size_t K = 0; K < NI; ++K) {
      if (DeadInstr[K])
        continue;
      Instruction &I = P.Instrs[K];
      for (int &B : I.In)
        B = NewId[B];
      for (int &B : I.Out)
        B = NewId[B];
      if (Kept != K)
        P.Instrs[Kept] = std::move(I);
      ++Kept;
    }
    P.Instrs.resize(Kept);
    for (auto &[Name, Id] : P.Outputs)
      Id = NewId[Id];
    computeLiveRanges(P);
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
  if (!Any)
    return 0;
  size_t Before = P.Instrs.size();
  F.compact();
  return int(Before - P.Instrs.size());
}

} // namespace sp
