//===- AttentionPlan.cpp - The fused attention core as unfused ops --------===//
#include "runtime/cuda/AttentionPlan.h"
#include "ir/OpDef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/Twine.h"

using namespace llvm;

namespace sp::cuda {

namespace {

Error planError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), Msg);
}

struct Expander {
  const Instruction &I;
  const std::vector<ProgramBuffer> &Bufs;
  AttentionPlan P;
  DenseMap<int, int> Local; // the instruction's buffer -> Local's

  Expander(const Instruction &I, const std::vector<ProgramBuffer> &Bufs)
      : I(I), Bufs(Bufs) {}

  /// The instruction's buffer Id in Local.
  int outer(int Id) {
    auto [It, New] = Local.try_emplace(Id, int(P.Local.Buffers.size()));
    if (New) {
      ProgramBuffer B = Bufs[Id];
      B.Offset = -1;
      B.Data.reset();
      P.Local.Buffers.push_back(std::move(B));
      P.Outer.push_back(Id);
    }
    return It->second;
  }
  /// A float32 (or mask) tensor in the workspace.
  int work(std::initializer_list<int64_t> Shape, DType T = DType::F32,
           Sharding Shard = Sharding()) {
    ProgramBuffer B;
    B.Name = "%attention." + std::to_string(P.Local.Buffers.size());
    B.Type = TensorType(T, ArrayRef<int64_t>(Shape.begin(), Shape.end()));
    B.Bytes = B.Type.numBytes();
    B.Offset = P.WorkspaceBytes;
    B.Shard = Shard;
    P.WorkspaceBytes += (std::max<int64_t>(B.Bytes, 1) + 255) / 256 * 256;
    P.Local.Buffers.push_back(std::move(B));
    P.Outer.push_back(-1);
    return int(P.Local.Buffers.size()) - 1;
  }
  Instruction &op(OpKind Op, std::initializer_list<int> In,
                  std::initializer_list<int> Out) {
    Instruction X;
    X.Op = Op;
    X.In.assign(In.begin(), In.end());
    X.Out.assign(Out.begin(), Out.end());
    X.Layer = I.Layer;
    X.Role = I.Role;
    X.Ph = I.Ph;
    X.Name = I.Name;
    P.Local.Instrs.push_back(std::move(X));
    return P.Local.Instrs.back();
  }
};

} // namespace

Expected<AttentionPlan> planAttention(const Instruction &I,
                                      const std::vector<ProgramBuffer> &Bufs) {
  const bool Fwd = I.Op == OpKind::Attention;
  if (!Fwd && I.Op != OpKind::AttentionGrad)
    return planError("planAttention: not an attention instruction");
  const unsigned Qkv = attentionInputs(I.Op, I.Attrs), Q = Fwd ? 0 : 1,
                 KeepAt = attentionKeepOperand(I.Op, I.Attrs);
  const bool Packed = Qkv == 1;
  if (I.In.size() < KeepAt || I.In.size() > KeepAt + 1 ||
      I.Out.size() != (Fwd ? 2u : Qkv))
    return planError(opName(I.Op) + ": unexpected operand or result count");
  int64_t B, A, Sq, D, G, Sk;
  if (Packed) { // qkv [b, s, 3 a d]: split_heads' input
    const TensorType &XT = Bufs[I.In[Q]].Type;
    A = G = attrInt(I.Op, I.Attrs, "heads");
    if (XT.rank() != 3 || A <= 0 || XT.Shape[2] % (3 * A))
      return planError(opName(I.Op) + " {packed} expects qkv [b, s, 3 * "
                                      "heads * d]");
    B = XT.Shape[0];
    Sq = Sk = XT.Shape[1];
    D = XT.Shape[2] / (3 * A);
  } else {
    const TensorType &QT = Bufs[I.In[Q]].Type, &KT = Bufs[I.In[Q + 1]].Type;
    if (QT.rank() != 4 || KT.rank() != 4 ||
        Bufs[I.In[Q + 2]].Type.Shape != KT.Shape)
      return planError(opName(I.Op) + " expects q [b, a, s, d] and k, v "
                                      "[b, g, t, d]");
    B = QT.Shape[0];
    A = QT.Shape[1];
    Sq = QT.Shape[2];
    D = QT.Shape[3];
    G = KT.Shape[1];
    Sk = KT.Shape[2];
    if (G <= 0 || A % G != 0 || KT.Shape[0] != B || KT.Shape[3] != D)
      return planError(opName(I.Op) + ": k and v heads must divide q's");
  }
  const int64_t R = A / G;
  auto AF = [&](StringRef Name) { return attrFloat(I.Op, I.Attrs, Name); };
  auto AI = [&](StringRef Name) { return attrInt(I.Op, I.Attrs, Name); };
  const double Scale = AF("scale"), Fill = AF("fill");
  const bool Causal = AI("causal"), PadFirst = AI("pad_first"),
             Merged = AI("merged"), Dropout = AI("dropout"),
             Pad = I.In.size() > KeepAt;
  // The probabilities are sharded as q's heads are (the dropout op finds
  // their global index from its operand's sharding; packed qkv's heads are
  // its last axis).
  Sharding Probs = Bufs[I.In[Q]].Shard;
  if (Probs.K == Sharding::Split && Probs.Dim != (Packed ? 2 : 1))
    return planError(opName(I.Op) +
                     ": q is split along a dimension other than its heads");
  if (Probs.K != Sharding::Split)
    Probs = Sharding();
  else if (Packed)
    Probs = Sharding::split(1, Probs.Parts);

  Expander E(I, Bufs);
  E.P.Batch = B;
  E.P.Heads = A;
  E.P.Sq = Sq;
  E.P.Sk = Sk;
  // Packed: q, k, v cut from qkv by split_heads.
  int QB, KB, VB;
  if (Packed) {
    QB = E.work({B, A, Sq, D}, DType::F32, Probs);
    KB = E.work({B, A, Sk, D});
    VB = E.work({B, A, Sk, D});
    E.op(OpKind::SplitHeads, {E.outer(I.In[Q])}, {QB, KB, VB})
        .Attrs.set("heads", A);
  } else {
    QB = E.outer(I.In[Q]);
    KB = E.outer(I.In[Q + 1]);
    VB = E.outer(I.In[Q + 2]);
  }
  const int Keep = Pad ? E.outer(I.In[KeepAt]) : -1;
  auto Repeat = [&](int X) {
    if (R == 1)
      return X;
    int Y = E.work({B, A, Sk, D});
    E.op(OpKind::RepeatHeads, {X}, {Y}).Attrs.set("repeats", R);
    return Y;
  };
  const int KR = Repeat(KB), VR = Repeat(VB);

  // The masked scores, then the probabilities in place.
  const int S = E.work({B, A, Sq, Sk}, DType::F32, Probs);
  E.op(OpKind::BatchMatMul, {QB, KR}, {S}).Attrs.set("trans_b", int64_t(1));
  E.op(OpKind::Scale, {S}, {S}).Attrs.set("alpha", Scale);
  auto CausalMask = [&] {
    if (Causal)
      E.op(OpKind::CausalMask, {S}, {S}).Attrs.set("fill", Fill);
  };
  auto PaddingMask = [&] {
    if (!Pad)
      return;
    Instruction &M = E.op(OpKind::PaddingMask, {S, Keep}, {S});
    M.Attrs.set("fill", AF("pad_fill"));
    M.Attrs.set("where", AI("pad_where"));
  };
  if (PadFirst) {
    PaddingMask();
    CausalMask();
  } else {
    CausalMask();
    PaddingMask();
  }
  if (Fwd) {
    E.P.LseAfter = int(E.P.Local.Instrs.size()) - 1;
    E.P.Scores = S;
  }
  E.op(OpKind::Softmax, {S}, {S});
  int PD = S, Mask = -1;
  if (Dropout) {
    // The forward needs p no more: dropped in place. The backward keeps p
    // (softmax_grad reads it).
    PD = Fwd ? S : E.work({B, A, Sq, Sk}, DType::F32, Probs);
    Instruction *Dr;
    if (Fwd) {
      Dr = &E.op(OpKind::Dropout, {S}, {PD});
    } else {
      Mask = E.work({B, A, Sq, Sk}, DType::U8);
      Dr = &E.op(OpKind::Dropout, {S}, {PD, Mask});
    }
    for (StringRef Name : {"ratio", "key", "microbatch", "microbatches"})
      if (const Attribute *V = I.Attrs.find(Name))
        Dr->Attrs.set(Name, *V);
  }

  if (Fwd) {
    const int O = E.outer(I.Out[0]);
    if (Merged) {
      int O4 = E.work({B, A, Sq, D});
      E.op(OpKind::BatchMatMul, {PD, VR}, {O4});
      E.op(OpKind::MergeHeads, {O4}, {O});
    } else {
      E.op(OpKind::BatchMatMul, {PD, VR}, {O});
    }
    E.P.Lse = E.outer(I.Out[1]);
    E.P.LseMerged = Merged;
    return std::move(E.P);
  }

  // Backward: (do, q, k, v, o, lse, keep?) -> dq, dk, dv, or packed
  // (do, qkv, o, lse, keep?) -> dqkv (split_heads_grad of the three).
  int DO = E.outer(I.In[0]);
  if (Merged) {
    int DO4 = E.work({B, A, Sq, D});
    E.op(OpKind::MergeHeadsGrad, {DO}, {DO4}).Attrs.set("heads", A);
    DO = DO4;
  }
  int DQ, DK, DV;
  if (Packed) {
    DQ = E.work({B, A, Sq, D});
    DK = E.work({B, A, Sk, D});
    DV = E.work({B, A, Sk, D});
  } else {
    DQ = E.outer(I.Out[0]);
    DK = E.outer(I.Out[1]);
    DV = E.outer(I.Out[2]);
  }
  auto SumGroups = [&](int Y, int Into) {
    if (R > 1)
      E.op(OpKind::RepeatHeadsGrad, {Y}, {Into}).Attrs.set("repeats", R);
  };
  const int DVR = R == 1 ? DV : E.work({B, A, Sk, D});
  E.op(OpKind::BatchMatMul, {PD, DO}, {DVR}).Attrs.set("trans_a", int64_t(1));
  SumGroups(DVR, DV);
  // The probabilities' gradient, through the dropout, then the scores'.
  // Once dv is summed the dropped probabilities are dead: their gradient
  // takes their place.
  const int DS = Dropout ? PD : E.work({B, A, Sq, Sk});
  E.op(OpKind::BatchMatMul, {DO, VR}, {DS}).Attrs.set("trans_b", int64_t(1));
  if (Dropout) {
    Instruction &Dg = E.op(OpKind::DropoutGrad, {DS, Mask}, {DS});
    if (const Attribute *V = I.Attrs.find("ratio"))
      Dg.Attrs.set("ratio", *V);
  }
  // softmax_grad, the causal mask's (0 above the diagonal; the padding
  // bias passes the gradient through) and the scale's.
  Instruction &SG = E.op(OpKind::SoftmaxGrad, {S, DS}, {DS});
  SG.Attrs.set("alpha", Scale);
  SG.Attrs.set("causal", int64_t(Causal));
  SG.Attrs.set("fill", 0.0);
  E.op(OpKind::BatchMatMul, {DS, KR}, {DQ});
  const int DKR = R == 1 ? DK : E.work({B, A, Sk, D});
  E.op(OpKind::BatchMatMul, {DS, QB}, {DKR}).Attrs.set("trans_a", int64_t(1));
  SumGroups(DKR, DK);
  if (Packed)
    E.op(OpKind::SplitHeadsGrad, {DQ, DK, DV}, {E.outer(I.Out[0])});
  return std::move(E.P);
}

} // namespace sp::cuda
