//===- Cost.cpp - FLOPs of a node or an instruction -----------------------===//
#include "analysis/Cost.h"
#include "ir/OpDef.h"

namespace sp {

double gemmFlops(OpKind Op, const AttrList &Attrs, const TensorType &In0,
                 const TensorType &Out0) {
  double Out = double(Out0.numElements());
  switch (Op) {
  case OpKind::Linear:
  case OpKind::LinearGelu:
  case OpKind::LinearGeluGrad:
    // Y[.., n] = X[.., k] W: 2 k flops per output element.
    return 2.0 * Out * double(In0.Shape.back());
  case OpKind::LinearGradW:
    // dW[k, n] = X[m, k]^T dY[m, n]: 2 m flops per output element.
    return 2.0 * Out * double(In0.numElements()) / double(In0.Shape.back());
  case OpKind::BatchMatMul: {
    // C[.., m, n] = op(A)[.., m, k] op(B)[.., k, n].
    int64_t K = Attrs.getInt("trans_a", 0) ? In0.Shape[In0.rank() - 2]
                                           : In0.Shape.back();
    return 2.0 * Out * double(K);
  }
  case OpKind::Attention:
    // The fused core (self-attention: t = s keys): q k^T and p v, 2 s d
    // flops each per query row and head. Under context parallelism the
    // rows are this rank's s / cp, the keys all cp ranks' (the ring).
    return 4.0 * Out * double(In0.dim(-2)) * double(attrInt(Op, Attrs, "cp"));
  case OpKind::AttentionGrad:
    // q k^T again (recomputeGemmFlops), then dv, dp, dq and dk; Out is dq
    // (a third of the packed dqkv).
    return 10.0 * Out * double(In0.dim(-2)) * double(attrInt(Op, Attrs, "cp")) /
           (attentionInputs(Op, Attrs) == 1 ? 3 : 1);
  default:
    return 0;
  }
}

double recomputeGemmFlops(const Program &P, const Instruction &I) {
  if (I.Op != OpKind::AttentionGrad || I.In.empty())
    return 0;
  return gemmFlops(P, I) / 5; // the q k^T of its 10 parts
}

double gemmFlops(const Node &N) {
  if (!N.numOperands() || !N.numResults())
    return 0;
  return gemmFlops(N.op(), N.attrs(), N.operand(0)->type(),
                   N.result()->type());
}

double gemmFlops(const Program &P, const Instruction &I) {
  if (I.In.empty() || I.Out.empty())
    return 0;
  return gemmFlops(I.Op, I.Attrs, P.Buffers[I.In[0]].Type,
                   P.Buffers[I.Out[0]].Type);
}

} // namespace sp
