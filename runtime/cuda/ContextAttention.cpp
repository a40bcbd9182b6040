//===- ContextAttention.cpp - Context parallelism on the GPU --------------===//
//
// attention and attention_grad {cp = C > 1} (passes/ContextParallel.cpp):
// this rank's q, k, v, o are its positions of the sequence (the zigzag runs
// of ir/ContextLayout.h), and the core runs over the cp group as the CPU's
// does (runtime/cpu/ContextAttention.h), on the blockwise kernels
// (kernels/Attention.cuh) and the group's NCCL communicator, with the
// kernels of kernels/ContextParallel.cuh around them:
//
// ring (cp_comm "ring"). Each rank's K and V go once around the ring: at
//   each step one NCCL group (the block to the next rank, the next block
//   from the one before) is posted on the NCCL stream after the compute so
//   far, then the step's compute is queued on the compute stream, which
//   waits for the transfer only before the next step: the transfer overlaps
//   the block's attention. Each (query run, key run) pair of the two ranks'
//   layouts is one call of the kernels on a window of the tensors (pointers
//   moved to the runs, the runs' global positions as Query0 and Key0 and as
//   the probabilities' block, so the causal mask and the dropout draws are
//   the one-device run's). The forward merges each call's rows into a
//   running output and log-sum-exp in float32 (ringMerge); the backward
//   sums dq in float32, and each block's dk, dv in float32 sums that travel
//   one step behind the block (in the next step's NCCL group, so the
//   messages between two ranks keep one order) and reach their owner after
//   one more shift. A pair wholly above the causal diagonal is skipped by
//   the kernels when the device finds every row's log-sum-exp far enough
//   above its masked scores (ringNegligible: the kernels' own rule), so
//   skipping changes no result.
//
// all-to-all (cp_comm "a2a", DeepSpeed-Ulysses). Heads traded for
//   positions: one NCCL group of sends and receives per tensor gives this
//   rank heads [r A / C, (r + 1) A / C) (and the matching key/value heads)
//   of the whole sequence, placed in global order from each sender's runs
//   (copyBox, which reads and writes any layout by its strides, merged o
//   included); the kernels run on them as on one device; a second exchange
//   returns each rank's positions of every head.
//
// all-to-all + ring (cp_comm "a2a+ring", cp_a2a K). The all-to-all inside
//   each group of K consecutive cp ranks (KernelCall::ContextInner) gives a
//   rank A / K heads of its group's positions (a rank's positions of the
//   layout grouped by K: ContextLayout::grouped), and the ring runs across
//   the C / K groups (ContextOuter) on those, as above; then the all-to-all
//   back. The plain all-to-all is this with one group and no ring.
//
// The results match the CPU's ring and all-to-all within a few float32
// roundings (the kernels' products sum in another order), and are the same
// bits on every run. Scratch: one region per stream, grown as needed.
//
// cp_slice and cp_pad: strided device copies of the runs (TensorLayout.h's
// contextCopy on the CPU).
//
//===----------------------------------------------------------------------===//
#include "ir/OpDef.h"
#include "runtime/ContextCopy.h"
#include "runtime/TensorLayout.h"
#include "runtime/cuda/CudaBackendImpl.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>

using namespace llvm;

namespace sp::cuda {

namespace {

using CpRun = ContextLayout::Run;

/// Offsets of aligned pieces of one scratch region.
struct CpCarve {
  int64_t Bytes = 0;
  int64_t take(int64_t N) {
    int64_t At = Bytes;
    Bytes += (std::max<int64_t>(N, 1) + 255) / 256 * 256;
    return At;
  }
};

int storageBytes(Storage K) { return K == Storage::F32 ? 4 : 2; }

/// Rows [First, First + Count) of every (b, h) of a tensor whose (b, h,
/// row) strides are St.
ContextRows cpRows(const int64_t (&St)[3], int64_t Batch, int64_t Heads,
                   int64_t First, int64_t Count) {
  ContextRows R;
  R.Batch = Batch;
  R.Heads = Heads;
  R.Rows = Count;
  R.Base = First * St[2];
  std::copy_n(St, 3, R.Stride);
  return R;
}

/// Dst (N elements of its storage) = Src (float32).
Error storeFloats(Elems Dst, const float *Src, int64_t N, cudaStream_t S) {
  if (Dst.Kind == Storage::F32)
    SP_CUDA_TRY(cudaMemcpyAsync(Dst.Data, Src, size_t(N) * 4,
                                cudaMemcpyDeviceToDevice, S));
  else
    narrow16(static_cast<uint16_t *>(Dst.Data), Src, N,
             Dst.Kind == Storage::BF16, S);
  return Error::success();
}

} // namespace

/// One context-parallel attention call: the blockwise kernels' geometry of
/// this rank's tensors (Sq = Sk = L.local()), its operands (null where the
/// direction has none), the layout and the group (and communicator) the
/// ring runs over, the padding bias of the whole sequence (or null), and
/// the scratch region (ContextWork) to use.
struct CudaBackend::ContextCall {
  AttentionGeometry G;
  bool Forward = true;
  Elems Q, K, V, O, Lse, DO, DQ, DK, DV;
  ContextLayout L;
  Communicator *Group = nullptr;
  NcclComm *Nccl = nullptr;
  const float *Bias = nullptr;
  int Region = 0;
};

Error CudaBackend::contextAttention(const KernelCall &C, cudaStream_t S) {
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  const int Cp = int(attrInt(I.Op, I.Attrs, "cp"));
  Communicator *G = C.group("cp");
  if (!G || G->size() != Cp)
    return makeError(formatv("attention {{cp = {0}} needs a context-parallel "
                             "group of {0} ranks",
                             Cp));
  if (attentionInputs(I.Op, I.Attrs) == 1)
    return makeError("attention {cp > 1, packed = 1}: the ring needs q, k and "
                     "v apart; recompile the plan");
  // The all-to-all's group size: 1 (the ring), C (the all-to-all) or K
  // (all-to-all inside groups of K, the ring across them).
  const std::string CommKind = attrString(I.Op, I.Attrs, "cp_comm");
  const int K = CommKind == "ring"       ? 1
                : CommKind == "a2a"      ? Cp
                : CommKind == "a2a+ring" ? int(attrInt(I.Op, I.Attrs, "cp_a2a"))
                                         : 0;
  if (K < 1 || Cp % K)
    return makeError("attention {cp_comm = " + CommKind +
                     ", cp = " + Twine(Cp) +
                     "}: not a variant the CUDA backend runs "
                     "(ring, a2a, or a2a+ring with cp_a2a dividing cp); "
                     "recompile the plan");
  auto Plan = planBlockwise(I, Bufs);
  if (!Plan)
    return makeError("attention {cp = " + Twine(Cp) +
                     "} runs on the blockwise kernels, which refuse it: " +
                     toString(Plan.takeError()));
  if (auto E = setBlockwiseDropout(*Plan, I, Bufs, C.Training, C.Dropout,
                                   C.Seed, C.Step, C.Tensor.rank(), C.replica(),
                                   C.replicas()))
    return E;
  ContextCall X;
  X.G = Plan->G;
  X.L =
      ContextLayout{Cp, attrInt(I.Op, I.Attrs, "cp_zigzag") != 0, X.G.Sk * Cp};
  if (!X.L.divides() || X.G.Sq != X.L.local())
    return makeError(formatv("attention {{cp = {0}}: {1} queries and {2} keys "
                             "on a rank do not cut a sequence into the "
                             "layout's chunks",
                             Cp, X.G.Sq, X.G.Sk));
  X.G.ProbGlobal[2] = X.G.ProbGlobal[3] = X.L.Seq;
  X.Forward = Plan->Forward;
  auto Op = [&](const BlockwiseOperand &B) {
    return B.Id >= 0 ? at(elems(C, B.Id), B.Offset) : Elems();
  };
  X.Q = Op(Plan->Q), X.K = Op(Plan->K), X.V = Op(Plan->V), X.O = Op(Plan->O),
  X.Lse = Op(Plan->Lse), X.DO = Op(Plan->DO), X.DQ = Op(Plan->DQ),
  X.DK = Op(Plan->DK), X.DV = Op(Plan->DV);
  const int Slot = S == Comm ? 1 : 0;
  if (Plan->Keep >= 0) { // the padding bias of every key, as padding_mask's
    auto KeepType = paddingKeepType(Bufs[Plan->Keep].Type);
    if (!KeepType)
      return KeepType.takeError();
    const int64_t N = X.G.Batch * X.L.Seq;
    auto Bias = grow(ContextBias[Slot], ContextBiasBytes[Slot], N * 4);
    if (!Bias)
      return Bias.takeError();
    float *B = reinterpret_cast<float *>(*Bias);
    SP_CUDA_TRY(cudaMemsetAsync(B, 0, size_t(N) * sizeof(float), S));
    paddingMask(B, B, C.buffer(Plan->Keep), *KeepType, X.G.Batch, 1, X.L.Seq,
                Plan->PadFill, Plan->PadWhere, S);
    X.Bias = B;
  }
  if (K == 1) {
    auto N = nccl(*G);
    if (!N)
      return N.takeError();
    X.Group = G, X.Nccl = *N, X.Region = 2 * Slot;
    return ringAttention(X, S);
  }
  Communicator *Inner = K == Cp ? G : C.ContextInner,
               *Outer = K == Cp ? nullptr : C.ContextOuter;
  if (!Inner || Inner->size() != K ||
      (K < Cp && (!Outer || Outer->size() != Cp / K)))
    return makeError(formatv("attention {{cp_comm = a2a+ring, cp_a2a = {0}} "
                             "needs the cp group split into groups of {0} "
                             "and rings of {1}",
                             K, Cp / K));
  X.Region = 2 * Slot + 1;
  return ulyssesAttention(X, *Inner, Outer, S);
}

Error CudaBackend::ringAttention(const ContextCall &X, cudaStream_t S) {
  const AttentionGeometry &G = X.G;
  const bool Fwd = X.Forward;
  const Elems Q = X.Q, K = X.K, V = X.V, Lse = X.Lse;
  const int Es = storageBytes(Q.Kind), Ls = storageBytes(Lse.Kind);
  const int64_t NK = G.Batch * G.KvHeads * G.Sk * G.D,
                NQ = G.Batch * G.Heads * G.Sq * G.D,
                NL = G.Batch * G.Heads * G.Sq, KvBytes = 2 * NK * Es;
  const int Parts = X.L.Parts, Rank = X.Group->rank();
  const int Next = (Rank + 1) % Parts, Prev = (Rank + Parts - 1) % Parts;

  // The scratch: the block held and the one arriving (K then V), the
  // padding bias of a key run, the negligible flag; forward:
  // a call's output and log-sum-exp, and the running ones; backward: the
  // travelling dk, dv sums (two), this step's, a call's dq and dk, dv, the
  // dq sum, the kernels' Delta.
  CpCarve W;
  const int64_t KvAt[2] = {W.take(KvBytes), W.take(KvBytes)};
  const bool Padded = X.Bias != nullptr;
  const int64_t BiasRunAt = W.take(Padded ? G.Batch * G.Sk * 4 : 0),
                FlagAt = W.take(sizeof(int));
  int64_t OpAt = 0, LpAt = 0, RunOAt = 0, RunLAt = 0, DkvAt[2] = {}, DkcAt = 0,
          DqwAt = 0, DkvwAt = 0, DqaAt = 0, DeltaAt = 0;
  if (Fwd) {
    OpAt = W.take(NQ * Es);
    LpAt = W.take(NL * Ls);
    RunOAt = W.take(NQ * 4);
    RunLAt = W.take(NL * 4);
  } else {
    DkvAt[0] = W.take(2 * NK * 4);
    DkvAt[1] = W.take(2 * NK * 4);
    DkcAt = W.take(2 * NK * 4);
    DqwAt = W.take(NQ * Es);
    DkvwAt = W.take(2 * NK * Es);
    DqaAt = W.take(NQ * 4);
    DeltaAt = W.take(NL * 4);
  }
  auto Region =
      grow(ContextWork[X.Region], ContextWorkBytes[X.Region], W.Bytes);
  if (!Region)
    return Region.takeError();
  char *Base = *Region;
  auto Floats = [&](int64_t At) {
    return reinterpret_cast<float *>(Base + At);
  };
  auto Like = [&](int64_t At, Storage Kind) { return Elems(Base + At, Kind); };
  char *Kv[2] = {Base + KvAt[0], Base + KvAt[1]};
  const float *Bias = X.Bias;
  float *BiasRun = Padded ? Floats(BiasRunAt) : nullptr;
  int *Flag = reinterpret_cast<int *>(Base + FlagAt);
  SP_CUDA_TRY(cudaMemcpyAsync(Kv[0], K.Data, size_t(NK) * Es,
                              cudaMemcpyDeviceToDevice, S));
  SP_CUDA_TRY(cudaMemcpyAsync(Kv[0] + NK * Es, V.Data, size_t(NK) * Es,
                              cudaMemcpyDeviceToDevice, S));
  if (!Fwd) {
    SP_CUDA_TRY(cudaMemsetAsync(Floats(DqaAt), 0, size_t(NQ) * 4, S));
  }

  const auto Mine = X.L.runs(Rank);
  for (int Step = 0; Step < Parts; ++Step) {
    const int Src = (Rank - Step + Parts) % Parts;
    char *Cur = Kv[Step % 2], *Arriving = Kv[(Step + 1) % 2];
    float *DIn = Fwd ? nullptr : Floats(DkvAt[Step % 2]),
          *DOut = Fwd ? nullptr : Floats(DkvAt[(Step + 1) % 2]);
    // The transfers of this step, after the compute so far: the next
    // block; in the backward also the sums of the block held last step to
    // the next rank, and those of this step's block from the rank before.
    const bool Shift = Step + 1 < Parts, Sums = !Fwd && Step > 0;
    if (Shift || Sums) {
      if (auto E = hopToNccl(S))
        return E;
      cudaStream_t NS = ncclStream();
      if (auto E = NcclComm::grouped([&]() -> Error {
            if (Shift) {
              if (auto E = X.Nccl->send(Cur, KvBytes, Next, NS))
                return E;
              if (auto E = X.Nccl->recv(Arriving, KvBytes, Prev, NS))
                return E;
            }
            if (Sums) {
              if (auto E = X.Nccl->send(DOut, 2 * NK * 4, Next, NS))
                return E;
              if (auto E = X.Nccl->recv(DIn, 2 * NK * 4, Prev, NS))
                return E;
            }
            return Error::success();
          }))
        return E;
    }
    if (!Fwd)
      SP_CUDA_TRY(cudaMemsetAsync(Floats(DkcAt), 0, size_t(2 * NK) * 4, S));
    const Elems CurK(Cur, Q.Kind), CurV(Cur + NK * Es, Q.Kind);
    // Key run by key run (its padding bias gathered once), each against
    // this rank's query runs: every row and key sums in the order of the
    // pairs either way.
    const auto Theirs = X.L.runs(Src);
    for (size_t KI = 0; KI < Theirs.size(); ++KI) {
      const CpRun &Kr = Theirs[KI];
      if (BiasRun)
        SP_CUDA_TRY(cudaMemcpy2DAsync(BiasRun, size_t(Kr.Length) * 4,
                                      Bias + Kr.Global, size_t(X.L.Seq) * 4,
                                      size_t(Kr.Length) * 4, size_t(G.Batch),
                                      cudaMemcpyDeviceToDevice, S));
      for (const CpRun &Qr : Mine) {
        AttentionGeometry Wg = G;
        Wg.Sq = Qr.Length;
        Wg.Sk = Kr.Length;
        Wg.Query0 = Wg.ProbOffset[2] = Qr.Global;
        Wg.Key0 = Wg.ProbOffset[3] = Kr.Global;
        const ContextRows QRows = cpRows(G.Q, G.Batch, G.Heads, Qr.Local,
                                         Qr.Length),
                          ORows = cpRows(G.O, G.Batch, G.Heads, Qr.Local,
                                         Qr.Length),
                          LRows = cpRows(G.L, G.Batch, G.Heads, Qr.Local,
                                         Qr.Length),
                          KRows = cpRows(G.K, G.Batch, G.KvHeads, Kr.Local,
                                         Kr.Length);
        const bool First = Fwd && Step == 0 && KI == 0;
        if (!First && G.Causal && Kr.Global > Qr.Global + Qr.Length - 1) {
          ringNegligible(Flag, Fwd ? Elems(Floats(RunLAt)) : Lse, LRows,
                         BiasRun, Kr.Length, G.Fill, S);
          Wg.SkipIf = Flag;
        }
        if (Fwd) {
          const Elems Op = Like(OpAt, Q.Kind), Lp = Like(LpAt, Lse.Kind);
          attentionForward(at(Op, ORows.Base), at(Lp, LRows.Base),
                           at(Q, QRows.Base), at(CurK, KRows.Base),
                           at(CurV, KRows.Base), BiasRun, Wg, S);
          ringMerge(Floats(RunOAt), Floats(RunLAt), Op, Lp, ORows, LRows, G.D,
                    First, Wg.SkipIf, S);
          continue;
        }
        const Elems DQw = Like(DqwAt, Q.Kind), DKw = Like(DkvwAt, Q.Kind),
                    DVw = at(DKw, NK), DO = X.DO, O = X.O;
        attentionBackward(at(DQw, QRows.Base), at(DKw, KRows.Base),
                          at(DVw, KRows.Base), at(DO, ORows.Base),
                          at(Q, QRows.Base), at(CurK, KRows.Base),
                          at(CurV, KRows.Base), at(O, ORows.Base),
                          at(Lse, LRows.Base), BiasRun, Floats(DeltaAt), Wg, S);
        ringAccumulate(Floats(DqaAt), DQw, QRows, G.D, Wg.SkipIf, S);
        ringAccumulate(Floats(DkcAt), DKw, KRows, G.D, Wg.SkipIf, S);
        ringAccumulate(Floats(DkcAt) + NK, DVw, KRows, G.D, Wg.SkipIf, S);
      }
    }
    if (Shift || Sums)
      if (auto E = hopBack(S))
        return E;
    if (!Fwd) { // this step's block: the sums so far, plus this rank's
      if (Step == 0)
        SP_CUDA_TRY(cudaMemcpyAsync(DIn, Floats(DkcAt), size_t(2 * NK) * 4,
                                    cudaMemcpyDeviceToDevice, S));
      else
        add(DIn, DIn, Floats(DkcAt), 2 * NK, S);
    }
  }
  if (Fwd) {
    if (auto E = storeFloats(X.O, Floats(RunOAt), NQ, S))
      return E;
    return storeFloats(Lse, Floats(RunLAt), NL, S);
  }
  // One more shift: this rank's own block's sums, from the rank before it.
  float *Own = Floats(DkvAt[(Parts - 1) % 2]);
  if (Parts > 1) {
    float *Last = Own;
    Own = Floats(DkvAt[Parts % 2]);
    if (auto E = onNccl(*X.Group, S, [&](NcclComm &Nc, cudaStream_t NS) {
          return NcclComm::grouped([&]() -> Error {
            if (auto E = Nc.send(Last, 2 * NK * 4, Next, NS))
              return E;
            return Nc.recv(Own, 2 * NK * 4, Prev, NS);
          });
        }))
      return E;
  }
  if (auto E = storeFloats(X.DQ, Floats(DqaAt), NQ, S))
    return E;
  if (auto E = storeFloats(X.DK, Own, NK, S))
    return E;
  return storeFloats(X.DV, Own + NK, NK, S);
}

Error CudaBackend::ulyssesAttention(const ContextCall &X, Communicator &Inner,
                                    Communicator *Outer, cudaStream_t S) {
  const AttentionGeometry &G = X.G;
  const bool Fwd = X.Forward;
  // Inner rank I of group Gr (cp rank Gr K + I) trades with its group.
  const int K = Inner.size(), I = Inner.rank(), Gr = Outer ? Outer->rank() : 0;
  if (G.Heads % K || G.KvHeads % K)
    return makeError(formatv("all-to-all attention: a group of {0} does not "
                             "divide the {1} heads and {2} key/value heads of "
                             "a rank",
                             K, G.Heads, G.KvHeads));
  // The group's positions (the whole sequence for a group of every cp
  // rank), in global order: its rank's of the grouped layout.
  const ContextLayout Lg = X.L.grouped(K);
  const int64_t Hc = G.Heads / K, Gc = G.KvHeads / K, Sw = Lg.local(),
                Sl = X.L.local(), D = G.D;
  const Elems Q = X.Q, Lse = X.Lse;
  const int Es = storageBytes(Q.Kind), Ls = storageBytes(Lse.Kind);
  // The kernels' (or the ring's) view: this rank's heads of the group's
  // positions, compact [B, Hc, Sw, D] (and [B, Hc, Sw] for the
  // log-sum-exp), their dropout at the heads' global offset.
  AttentionGeometry F = G;
  F.Heads = Hc, F.KvHeads = Gc, F.Sq = F.Sk = Sw;
  const int64_t QSt[3] = {Hc * Sw * D, Sw * D, D},
                KSt[3] = {Gc * Sw * D, Sw * D, D}, LSt[3] = {Hc * Sw, Sw, 1};
  std::copy_n(QSt, 3, F.Q);
  std::copy_n(QSt, 3, F.O);
  std::copy_n(KSt, 3, F.K);
  std::copy_n(LSt, 3, F.L);
  F.Query0 = F.Key0 = 0;
  F.ProbOffset[1] += int64_t(I) * Hc;
  F.ProbOffset[2] = F.ProbOffset[3] = 0;

  const int64_t NQf = G.Batch * Hc * Sw * D, NKf = G.Batch * Gc * Sw * D,
                NLf = G.Batch * Hc * Sw;
  // The largest message (q's, or the log-sum-exp's when float32 and D 1).
  const int64_t Block = G.Batch * Hc * Sl * std::max<int64_t>(D * Es, Ls);
  CpCarve W;
  const int64_t SendAt = W.take(K * Block), RecvAt = W.take(K * Block);
  // q, k, v, o, lse; backward also do, dq, dk, dv, Delta.
  const int64_t QfAt = W.take(NQf * Es), KfAt = W.take(NKf * Es),
                VfAt = W.take(NKf * Es), OfAt = W.take(NQf * Es),
                LfAt = W.take(NLf * Ls);
  int64_t DOfAt = 0, DQfAt = 0, DKfAt = 0, DVfAt = 0, DeltaAt = 0;
  if (!Fwd) {
    DOfAt = W.take(NQf * Es);
    DQfAt = W.take(NQf * Es);
    DKfAt = W.take(NKf * Es);
    DVfAt = W.take(NKf * Es);
    DeltaAt = W.take(NLf * 4);
  }
  auto Region =
      grow(ContextWork[X.Region], ContextWorkBytes[X.Region], W.Bytes);
  if (!Region)
    return Region.takeError();
  char *Base = *Region;
  auto Full = [&](int64_t At, Storage Kind) { return Elems(Base + At, Kind); };

  // One exchange of a tensor with H heads of RowElems elements per row:
  // ToSequence, from this rank's positions of every head (Local, strides
  // St) to its heads of the group's positions (Whole, compact); else back.
  // Member J's runs (of cp rank Gr K + J) lie in the group's at Lg.localOf.
  auto Exchange = [&](Elems Local, const int64_t *St, Elems Whole, int64_t H,
                      int64_t RowElems, bool ToSequence) -> Error {
    const int64_t Hr = H / K;
    const int Eb = storageBytes(Local.Kind);
    const int64_t Msg = G.Batch * Hr * Sl * RowElems; // elements
    const int64_t MsgSt[3] = {Hr * Sl * RowElems, Sl * RowElems, RowElems},
                  WholeSt[3] = {Hr * Sw * RowElems, Sw * RowElems, RowElems};
    char *Send = Base + SendAt, *Recv = Base + RecvAt;
    // Member J's runs: its local rows and the group's rows they are.
    auto RunsOf = [&](int J,
                      llvm::function_ref<void(const CpRun &, int64_t)> Fn) {
      for (const CpRun &Run : X.L.runs(Gr * K + J))
        Fn(Run, Lg.localOf(Gr, Run.Global));
    };
    auto Box = [&](int64_t Rows, int64_t SrcBase, const int64_t *Src,
                   int64_t DstBase, const int64_t *Dst) {
      ContextBox B;
      B.Dims[0] = G.Batch, B.Dims[1] = Hr, B.Dims[2] = Rows;
      B.Dims[3] = RowElems;
      B.SrcBase = SrcBase, B.DstBase = DstBase;
      std::copy_n(Src, 3, B.Src);
      std::copy_n(Dst, 3, B.Dst);
      return B;
    };
    // Member J's message: its heads of this rank's positions (ToSequence),
    // or this rank's heads of J's positions.
    auto Pack = [&](int J) {
      char *Out = Send + J * Msg * Eb;
      if (ToSequence)
        return copyBox(Out, Local.Data, Eb,
                       Box(Sl, J * Hr * St[1], St, 0, MsgSt), S);
      RunsOf(J, [&](const CpRun &Run, int64_t At) {
        copyBox(Out, Whole.Data, Eb,
                Box(Run.Length, At * RowElems, WholeSt, Run.Local * RowElems,
                    MsgSt),
                S);
      });
    };
    // What came from member J, put in place.
    auto Place = [&](const char *Got, int J) {
      if (!ToSequence)
        return copyBox(Local.Data, Got, Eb,
                       Box(Sl, 0, MsgSt, J * Hr * St[1], St), S);
      RunsOf(J, [&](const CpRun &Run, int64_t At) {
        copyBox(Whole.Data, Got, Eb,
                Box(Run.Length, Run.Local * RowElems, MsgSt, At * RowElems,
                    WholeSt),
                S);
      });
    };
    for (int J = 0; J < K; ++J)
      Pack(J);
    if (auto E = onNccl(Inner, S, [&](NcclComm &Nc, cudaStream_t NS) {
          return NcclComm::grouped([&]() -> Error {
            for (int J = 0; J < K; ++J)
              if (J != I) {
                if (auto E = Nc.send(Send + J * Msg * Eb, Msg * Eb, J, NS))
                  return E;
                if (auto E = Nc.recv(Recv + J * Msg * Eb, Msg * Eb, J, NS))
                  return E;
              }
            return Error::success();
          });
        }))
      return E;
    for (int J = 0; J < K; ++J)
      Place((J == I ? Send : Recv) + J * Msg * Eb, J);
    return Error::success();
  };

  // The traded tensors: q, k, v (and do, o, lse backward) in; o, lse (or
  // dq, dk, dv) out.
  ContextCall Y;
  Y.G = F, Y.Forward = Fwd, Y.L = Lg, Y.Bias = X.Bias;
  Y.Q = Full(QfAt, Q.Kind), Y.K = Full(KfAt, Q.Kind), Y.V = Full(VfAt, Q.Kind),
  Y.O = Full(OfAt, Q.Kind), Y.Lse = Full(LfAt, Lse.Kind);
  if (!Fwd)
    Y.DO = Full(DOfAt, Q.Kind), Y.DQ = Full(DQfAt, Q.Kind),
    Y.DK = Full(DKfAt, Q.Kind), Y.DV = Full(DVfAt, Q.Kind);
  struct Traded {
    Elems Local;
    const int64_t *St;
    Elems Whole;
    int64_t Heads, Row;
  };
  auto Trade = [&](const Traded &T, bool ToSequence) {
    return Exchange(T.Local, T.St, T.Whole, T.Heads, T.Row, ToSequence);
  };
  SmallVector<Traded, 6> In = {{Q, G.Q, Y.Q, G.Heads, D},
                               {X.K, G.K, Y.K, G.KvHeads, D},
                               {X.V, G.K, Y.V, G.KvHeads, D}},
                         Out;
  if (Fwd) {
    Out = {{X.O, G.O, Y.O, G.Heads, D}, {Lse, G.L, Y.Lse, G.Heads, 1}};
  } else {
    In.append({{X.DO, G.O, Y.DO, G.Heads, D},
               {X.O, G.O, Y.O, G.Heads, D},
               {Lse, G.L, Y.Lse, G.Heads, 1}});
    Out = {{X.DQ, G.Q, Y.DQ, G.Heads, D},
           {X.DK, G.K, Y.DK, G.KvHeads, D},
           {X.DV, G.K, Y.DV, G.KvHeads, D}};
  }
  for (const Traded &T : In)
    if (auto E = Trade(T, true))
      return E;
  if (Outer) { // the ring across the groups, on the group's positions
    auto N = nccl(*Outer);
    if (!N)
      return N.takeError();
    Y.Group = Outer, Y.Nccl = *N, Y.Region = X.Region - 1;
    if (auto E = ringAttention(Y, S))
      return E;
  } else if (Fwd) { // every position: one device's kernel
    attentionForward(Y.O, Y.Lse, Y.Q, Y.K, Y.V, X.Bias, F, S);
  } else {
    attentionBackward(Y.DQ, Y.DK, Y.DV, Y.DO, Y.Q, Y.K, Y.V, Y.O, Y.Lse, X.Bias,
                      reinterpret_cast<float *>(Base + DeltaAt), F, S);
  }
  for (const Traded &T : Out)
    if (auto E = Trade(T, false))
      return E;
  return Error::success();
}

Error CudaBackend::contextCopy(const KernelCall &C, cudaStream_t S) {
  auto X = contextCopyCall(C);
  if (!X)
    return X.takeError();
  const AxisView A = around(X->WholeType, X->Dim);
  const int64_t E = dtypeSize(X->WholeType.Dtype) * A.Inner;
  const int64_t WholeRow = X->WholeType.Shape[X->Dim] * E,
                LocalRow = X->Layout.local() * E;
  if (!X->Slice)
    SP_CUDA_TRY(cudaMemsetAsync(X->Whole, 0, size_t(A.Outer * WholeRow), S));
  for (const CpRun &R : X->Layout.runs(X->Rank)) {
    char *W = X->Whole + R.Global * E, *Lc = X->Local + R.Local * E;
    const size_t Width = size_t(R.Length * E);
    if (X->Slice)
      SP_CUDA_TRY(cudaMemcpy2DAsync(Lc, size_t(LocalRow), W, size_t(WholeRow),
                                    Width, size_t(A.Outer),
                                    cudaMemcpyDeviceToDevice, S));
    else
      SP_CUDA_TRY(cudaMemcpy2DAsync(W, size_t(WholeRow), Lc, size_t(LocalRow),
                                    Width, size_t(A.Outer),
                                    cudaMemcpyDeviceToDevice, S));
  }
  return Error::success();
}

} // namespace sp::cuda
