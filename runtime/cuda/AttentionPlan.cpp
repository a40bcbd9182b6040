//===- AttentionPlan.cpp - The fused attention core as unfused ops --------===//
#include "runtime/cuda/AttentionPlan.h"
#include "ir/OpDef.h"
#include "runtime/Backend.h"
#include "runtime/TensorLayout.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/Twine.h"

using namespace llvm;

namespace sp::cuda {

namespace {

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

/// The sizes of an attention or attention_grad instruction, checked.
struct Dims {
  bool Fwd, Packed;
  unsigned Qkv, Q, KeepAt;
  int64_t B, A, Sq, D, G, Sk;
};

Expected<Dims> attentionDims(const Instruction &I,
                             const std::vector<ProgramBuffer> &Bufs) {
  Dims X;
  X.Fwd = I.Op == OpKind::Attention;
  if (!X.Fwd && I.Op != OpKind::AttentionGrad)
    return makeError("planAttention: not an attention instruction");
  X.Qkv = attentionInputs(I.Op, I.Attrs);
  X.Q = X.Fwd ? 0 : 1;
  X.KeepAt = attentionKeepOperand(I.Op, I.Attrs);
  X.Packed = X.Qkv == 1;
  if (I.In.size() < X.KeepAt || I.In.size() > X.KeepAt + 1 ||
      I.Out.size() != (X.Fwd ? 2u : X.Qkv))
    return makeError(opName(I.Op) + ": unexpected operand or result count");
  if (X.Packed) { // qkv [b, s, 3 a d]: split_heads' input
    const TensorType &XT = Bufs[I.In[X.Q]].Type;
    X.A = X.G = attrInt(I.Op, I.Attrs, "heads");
    if (XT.rank() != 3 || X.A <= 0 || XT.Shape[2] % (3 * X.A))
      return makeError(opName(I.Op) + " {packed} expects qkv [b, s, 3 * "
                                      "heads * d]");
    X.B = XT.Shape[0];
    X.Sq = X.Sk = XT.Shape[1];
    X.D = XT.Shape[2] / (3 * X.A);
  } else {
    const TensorType &QT = Bufs[I.In[X.Q]].Type, &KT = Bufs[I.In[X.Q + 1]].Type;
    if (QT.rank() != 4 || KT.rank() != 4 ||
        Bufs[I.In[X.Q + 2]].Type.Shape != KT.Shape)
      return makeError(opName(I.Op) + " expects q [b, a, s, d] and k, v "
                                      "[b, g, t, d]");
    X.B = QT.Shape[0];
    X.A = QT.Shape[1];
    X.Sq = QT.Shape[2];
    X.D = QT.Shape[3];
    X.G = KT.Shape[1];
    X.Sk = KT.Shape[2];
    if (X.G <= 0 || X.A % X.G != 0 || KT.Shape[0] != X.B || KT.Shape[3] != X.D)
      return makeError(opName(I.Op) + ": k and v heads must divide q's");
  }
  return X;
}

} // namespace

Expected<AttentionPlan> planAttention(const Instruction &I,
                                      const std::vector<ProgramBuffer> &Bufs) {
  auto Sz = attentionDims(I, Bufs);
  if (!Sz)
    return Sz.takeError();
  const bool Fwd = Sz->Fwd, Packed = Sz->Packed;
  const unsigned Q = Sz->Q, KeepAt = Sz->KeepAt;
  const int64_t B = Sz->B, A = Sz->A, Sq = Sz->Sq, D = Sz->D, G = Sz->G,
                Sk = Sz->Sk;
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
    return makeError(opName(I.Op) +
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

namespace {

bool isKernelFloat(DType T) {
  return T == DType::F32 || T == DType::BF16 || T == DType::F16;
}
} // namespace

std::optional<int> paddingKeepCode(DType T) {
  switch (T) {
  case DType::I64:
    return 0;
  case DType::I32:
    return 1;
  case DType::Bool:
    return 2;
  case DType::F32:
    return 3;
  default:
    return std::nullopt;
  }
}

Expected<BlockwisePlan> planBlockwise(const Instruction &I,
                                      const std::vector<ProgramBuffer> &Bufs) {
  auto Sz = attentionDims(I, Bufs);
  if (!Sz)
    return Sz.takeError();
  const Dims &X = *Sz;
  if (X.D <= 0)
    return makeError(opName(I.Op) + ": heads of no elements");
  if (X.D > AttentionMaxHeadDim)
    return makeError(opName(I.Op) + ": heads of " + Twine(X.D) +
                     " exceed the blockwise kernels' " +
                     Twine(AttentionMaxHeadDim));
  // The grid: query or key blocks, heads, batch.
  const int64_t Blocks =
      (std::max(X.Sq, X.Sk) + AttentionBlock - 1) / AttentionBlock;
  if (X.A > 65535 || X.B > 65535 || Blocks > 0x7fffffff)
    return makeError(opName(I.Op) + ": more heads or batch rows than a CUDA "
                                    "grid holds (65535)");
  BlockwisePlan P;
  P.Forward = X.Fwd;
  AttentionGeometry &G = P.G;
  G.Batch = X.B;
  G.Heads = X.A;
  G.KvHeads = X.G;
  G.Sq = X.Sq;
  G.Sk = X.Sk;
  G.D = X.D;
  const int64_t H = X.A * X.D;
  if (X.Packed) { // [b, s, 3, a, d]: q, k, v at 0, a d, 2 a d of each row
    const int64_t Row = 3 * H;
    for (int64_t *S : {G.Q, G.K}) {
      S[0] = X.Sq * Row;
      S[1] = X.D;
      S[2] = Row;
    }
  } else {
    G.Q[0] = X.A * X.Sq * X.D;
    G.Q[1] = X.Sq * X.D;
    G.Q[2] = X.D;
    G.K[0] = X.G * X.Sk * X.D;
    G.K[1] = X.Sk * X.D;
    G.K[2] = X.D;
  }
  const bool Merged = attrInt(I.Op, I.Attrs, "merged");
  if (Merged) { // o [b, s, a d], lse [b, s, a]
    G.O[0] = X.Sq * H;
    G.O[1] = X.D;
    G.O[2] = H;
    G.L[0] = X.Sq * X.A;
    G.L[1] = 1;
    G.L[2] = X.A;
  } else { // o [b, a, s, d], lse [b, a, s]
    G.O[0] = X.A * X.Sq * X.D;
    G.O[1] = X.Sq * X.D;
    G.O[2] = X.D;
    G.L[0] = X.A * X.Sq;
    G.L[1] = X.Sq;
    G.L[2] = 1;
  }
  G.Scale = float(attrFloat(I.Op, I.Attrs, "scale"));
  G.Fill = float(attrFloat(I.Op, I.Attrs, "fill"));
  G.Causal = attrInt(I.Op, I.Attrs, "causal");
  G.PadFirst = attrInt(I.Op, I.Attrs, "pad_first");
  P.Dropout = attrInt(I.Op, I.Attrs, "dropout");

  // The operands: (q, k, v | qkv, keep?) -> o, lse; (do, q, k, v | qkv, o,
  // lse, keep?) -> dq, dk, dv | dqkv.
  auto Three = [&](unsigned First, ArrayRef<int> List, BlockwiseOperand &A0,
                   BlockwiseOperand &A1, BlockwiseOperand &A2) {
    BlockwiseOperand *Ops[3] = {&A0, &A1, &A2};
    for (int K = 0; K < 3; ++K) {
      Ops[K]->Id = List[X.Packed ? First : First + K];
      Ops[K]->Offset = X.Packed ? K * H : 0;
    }
  };
  Three(X.Q, I.In, P.Q, P.K, P.V);
  const unsigned AfterQkv = X.Q + X.Qkv;
  if (X.Fwd) {
    P.O.Id = I.Out[0];
    P.Lse.Id = I.Out[1];
  } else {
    P.DO.Id = I.In[0];
    P.O.Id = I.In[AfterQkv];
    P.Lse.Id = I.In[AfterQkv + 1];
    Three(0, I.Out, P.DQ, P.DK, P.DV);
  }
  if (I.In.size() > X.KeepAt) {
    P.Keep = I.In[X.KeepAt];
    P.PadFill = attrFloat(I.Op, I.Attrs, "pad_fill");
    P.PadWhere = attrInt(I.Op, I.Attrs, "pad_where");
  }

  // Types and sizes: the kernels index the tensors by the strides above.
  const DType T = Bufs[P.Q.Id].Type.Dtype;
  if (!isKernelFloat(T))
    return makeError(opName(I.Op) + ": q is not a float tensor");
  auto Check = [&](const BlockwiseOperand &Op, int64_t Elements, bool SameType,
                   const char *What) -> Error {
    if (Op.Id < 0)
      return Error::success();
    const TensorType &Ty = Bufs[Op.Id].Type;
    if (SameType ? Ty.Dtype != T : !isKernelFloat(Ty.Dtype))
      return makeError(opName(I.Op) + ": " + What + " is " + Ty.str() +
                       (SameType ? ", not q's type" : ", not a float tensor"));
    if (Ty.numElements() != Elements)
      return makeError(opName(I.Op) + ": " + What + " has " +
                       Twine(Ty.numElements()) + " elements, not " +
                       Twine(Elements));
    return Error::success();
  };
  const int64_t QN = X.Packed ? X.B * X.Sq * 3 * H : X.B * X.Sq * H,
                KN = X.Packed ? QN : X.B * X.Sk * X.G * X.D,
                ON = X.B * X.Sq * H, LN = X.B * X.Sq * X.A;
  for (auto [Op, N, Same, What] : {std::tuple{&P.Q, QN, true, "q"},
                                   {&P.K, KN, true, "k"},
                                   {&P.V, KN, true, "v"},
                                   {&P.O, ON, true, "o"},
                                   {&P.Lse, LN, false, "the log-sum-exp"},
                                   {&P.DO, ON, true, "do"},
                                   {&P.DQ, QN, true, "dq"},
                                   {&P.DK, KN, true, "dk"},
                                   {&P.DV, KN, true, "dv"}})
    if (Error E = Check(*Op, N, Same, What))
      return E;
  if (P.Keep >= 0) {
    const TensorType &KT = Bufs[P.Keep].Type;
    // (Under context parallelism: the whole sequence's keys.)
    const int64_t Keys =
        X.Sk * std::max<int64_t>(1, attrInt(I.Op, I.Attrs, "cp"));
    if (!paddingKeepCode(KT.Dtype) || KT.numElements() != X.B * Keys)
      return makeError(opName(I.Op) + ": the padding mask is " + KT.str() +
                       "; the blockwise kernels take [b, keys] of int64, "
                       "int32, bool or float32");
  }
  return P;
}

bool runsBlockwise(const Instruction &I,
                   const std::vector<ProgramBuffer> &Buffers) {
  if (I.Op != OpKind::Attention && I.Op != OpKind::AttentionGrad)
    return false;
  auto P = planBlockwise(I, Buffers);
  if (!P) {
    consumeError(P.takeError());
    return false;
  }
  return true;
}

Error probsBlock(const Instruction &I, const std::vector<ProgramBuffer> &Bufs,
                 int TensorRank, int DataRank, int DataSize,
                 AttentionGeometry &G) {
  const unsigned Q = I.Op == OpKind::Attention ? 0 : 1;
  const bool Packed = attentionInputs(I.Op, I.Attrs) == 1;
  // Heads split over the tensor group as q's are (packed qkv's last axis,
  // q's second), rows of the microbatch and the data-parallel replica.
  const Sharding &S = Bufs[I.In[Q]].Shard;
  if (S.K == Sharding::Split && S.Dim != (Packed ? 2 : 1))
    return makeError(opName(I.Op) +
                     ": q is split along a dimension other than its heads");
  const int64_t Probs[4] = {G.Batch, G.Heads, G.Sq, G.Sk};
  GlobalBlock B = globalBlock(
      Probs, S.K == Sharding::Split ? Sharding::split(1, S.Parts) : Sharding(),
      TensorRank, attrInt(I.Op, I.Attrs, "microbatch"),
      attrInt(I.Op, I.Attrs, "microbatches"), DataRank, DataSize);
  for (int K = 0; K < 4; ++K) {
    G.ProbGlobal[K] = B.Full[K];
    G.ProbOffset[K] = B.Offset[K];
  }
  return Error::success();
}

Error setBlockwiseDropout(BlockwisePlan &P, const Instruction &I,
                          const std::vector<ProgramBuffer> &Bufs,
                          bool Training, std::optional<double> Dropout,
                          uint64_t Seed, int64_t Step, int TensorRank,
                          int DataRank, int DataSize) {
  if (!P.Dropout)
    return Error::success();
  auto Key = attrInts(I.Op, I.Attrs, "key");
  if (Key.size() != 2)
    return makeError("attention has no Philox key; recompile the plan");
  if (Key[0] < 0 || Key[0] > 0xFFFF || Key[1] < 0 || Key[1] > 0xFFFF)
    return makeError("dropout key: layer or site above 65535");
  AttentionGeometry &G = P.G;
  G.Ratio = Training ? Dropout.value_or(attrFloat(I.Op, I.Attrs, "ratio")) : 0;
  if (!(G.Ratio >= 0.0 && G.Ratio <= 1.0))
    return makeError("dropout ratio outside [0, 1]");
  G.Seed = Seed;
  G.Layer = uint32_t(Key[0]);
  G.Site = uint32_t(Key[1]);
  G.Stream = uint32_t(Step);
  return probsBlock(I, Bufs, TensorRank, DataRank, DataSize, G);
}

} // namespace sp::cuda
