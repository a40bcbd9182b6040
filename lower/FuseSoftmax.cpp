//===- FuseSoftmax.cpp - One softmax for the attention core ---------------===//
//
// The program pass fuse-softmax; what it fuses and when: lower/FuseSoftmax.h.
//
//===----------------------------------------------------------------------===//
#include "lower/FuseSoftmax.h"
#include "lower/Peephole.h"
#include "lower/ProgramPass.h"
#include <optional>

namespace sp {

namespace {

/// Whether a softmax or softmax_grad is still the plain op.
bool isPlain(const Instruction &I) {
  return !I.Attrs.has("alpha") && !I.Attrs.has("causal") &&
         !I.Attrs.has("fill");
}

struct SoftmaxFuser : Peephole {
  using Peephole::Peephole;

  /// scale? -> causal_mask? -> softmax (at instruction K).
  bool fuseForward(int K) {
    Instruction &S = P.Instrs[K];
    if (S.In.size() != 1 || !isPlain(S))
      return false;
    int X = S.In[0];
    auto Fill = takeProducer(X, OpKind::CausalMask, "fill", S.Ph);
    auto Alpha = takeProducer(X, OpKind::Scale, "alpha", S.Ph);
    if (!Fill && !Alpha)
      return false;
    S.In[0] = X;
    setAttrs(S, Alpha, Fill);
    return true;
  }

  /// softmax_grad (at instruction K) -> causal_mask? -> scale?; the fused
  /// instruction takes the place of the chain's last one.
  bool fuseBackward(int K) {
    const Instruction &G = P.Instrs[K];
    if (G.Out.size() != 1 || !isPlain(G))
      return false;
    int D = G.Out[0], Last = K;
    auto Fill = takeUser(D, Last, K, OpKind::CausalMask, "fill", G.Ph);
    auto Alpha = takeUser(D, Last, K, OpKind::Scale, "alpha", G.Ph);
    if (!Fill && !Alpha)
      return false;
    Instruction F = G;
    F.Out[0] = D;
    setAttrs(F, Alpha, Fill);
    DeadInstr[K] = true;
    P.Instrs[Last] = std::move(F);
    return true;
  }

  /// If the intermediate X is made by a link Op of phase Ph: marks the link
  /// and X dead, moves X to the link's input and returns the link's
  /// attribute Attr.
  std::optional<double> takeProducer(int &X, OpKind Op, llvm::StringRef Attr,
                                     Phase Ph) {
    if (!isIntermediate(X) || !isLink(Producer[X], Op, Ph))
      return std::nullopt;
    int L = Producer[X];
    DeadInstr[L] = true;
    DeadBuf[X] = true;
    X = P.Instrs[L].In[0];
    return attrFloat(Op, P.Instrs[L].Attrs, Attr);
  }

  /// If the intermediate D is read by a link Op of phase Ph: marks D dead,
  /// moves D to the link's result and Last (the chain's last instruction so
  /// far, dead unless it is the chain's First) to the link, and returns the
  /// link's attribute Attr.
  std::optional<double> takeUser(int &D, int &Last, int First, OpKind Op,
                                 llvm::StringRef Attr, Phase Ph) {
    if (!isIntermediate(D) || !isLink(User[D], Op, Ph))
      return std::nullopt;
    int L = User[D];
    DeadBuf[D] = true;
    D = P.Instrs[L].Out[0];
    if (Last != First)
      DeadInstr[Last] = true;
    Last = L;
    return attrFloat(Op, P.Instrs[L].Attrs, Attr);
  }

  static void setAttrs(Instruction &I, std::optional<double> Alpha,
                       std::optional<double> Fill) {
    if (Alpha)
      I.Attrs.set("alpha", *Alpha);
    if (Fill) {
      I.Attrs.set("causal", int64_t(1));
      I.Attrs.set("fill", *Fill);
    }
  }
};

} // namespace

int fuseAttentionSoftmax(Program &P) {
  SoftmaxFuser F(P);
  return F.fuseEachLive([&](int K) -> int {
    if (P.Instrs[K].Op == OpKind::Softmax)
      return F.fuseForward(K);
    if (P.Instrs[K].Op == OpKind::SoftmaxGrad)
      return F.fuseBackward(K);
    return 0;
  });
}

std::unique_ptr<ProgramPass> createFuseSoftmaxPass() {
  return rewritePass("fuse-softmax", fuseAttentionSoftmax);
}

} // namespace sp
