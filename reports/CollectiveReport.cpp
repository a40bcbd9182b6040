//===- CollectiveReport.cpp -----------------------------------------------===//
#include "reports/CollectiveReport.h"
#include "ir/OpDef.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

std::vector<LayerCollectives> collectiveReport(const Program &P, int T) {
  int MaxLayer = -1;
  for (const Instruction &I : P.Instrs)
    MaxLayer = std::max(MaxLayer, I.Layer);
  std::vector<LayerCollectives> R(MaxLayer + 2);
  for (int L = -1; L <= MaxLayer; ++L)
    R[L + 1].Layer = L;
  if (T <= 1)
    return R;
  for (const Instruction &I : P.Instrs) {
    // The tensor-parallel group's (the data-parallel sums are another
    // group's, of another size).
    if (collectiveGroup(I.Op, I.Attrs) != "tp")
      continue;
    int64_t Full;
    double Factor = double(T - 1) / T;
    switch (I.Op) {
    case OpKind::AllReduce: // one tensor, or a bucket of them
      Full = 0;
      for (int B : I.Out)
        Full += P.Buffers[B].Bytes;
      Factor *= 2;
      break;
    case OpKind::AllGather:
      Full = P.Buffers[I.Out[0]].Bytes;
      break;
    case OpKind::ReduceScatter:
      Full = P.Buffers[I.In[0]].Bytes;
      break;
    case OpKind::RingShift: // one chunk to the next rank (t - 1 of them
                            // carry an all-gather's bytes)
      Full = P.Buffers[I.In[0]].Bytes;
      Factor = 1;
      break;
    default:
      continue;
    }
    CollectiveUse U{I.Op, roleName(I.Role).str(), I.Ph, isRegatherRole(I.Role),
                    int64_t(Full * Factor), ""};
    if (I.Beside >= 0) {
      const Instruction &G = P.Instrs[I.Beside];
      U.Beside = (opName(G.Op) + " " + roleName(G.Role)).str();
    }
    LayerCollectives &L = R[I.Layer + 1];
    if (!U.Beside.empty())
      L.Overlapped += U.Bytes;
    (U.Regather ? L.Regather : I.Ph == Phase::Forward ? L.Forward
                                                      : L.Backward) += U.Bytes;
    L.Uses.push_back(std::move(U));
  }
  return R;
}

static std::string kib(int64_t B) {
  return formatv("{0:F1} KiB", B / 1024.0).str();
}

ContextTraffic contextTraffic(const Program &P, const Instruction &I) {
  ContextTraffic T;
  if (I.Op != OpKind::Attention && I.Op != OpKind::AttentionGrad)
    return T;
  const int C = int(attrInt(I.Op, I.Attrs, "cp"));
  if (C <= 1)
    return T;
  T.Parts = C;
  T.Forward = I.Op == OpKind::Attention;
  const std::string Comm = attrString(I.Op, I.Attrs, "cp_comm");
  T.AllToAll = Comm == "a2a"        ? C
               : Comm == "a2a+ring" ? int(attrInt(I.Op, I.Attrs, "cp_a2a"))
                                    : 1;
  const int K = T.AllToAll, Ring = C / std::max(K, 1);
  if (K > 1) {
    // Every tensor but the padding mask, out and back: (K - 1) / K of each,
    // K - 1 messages each.
    const unsigned Keep = attentionKeepOperand(I.Op, I.Attrs);
    int Tensors = 0;
    for (unsigned J = 0; J < I.In.size(); ++J)
      if (J != Keep) {
        T.InFlightBytes += P.Buffers[I.In[J]].Bytes;
        ++Tensors;
      }
    for (int Id : I.Out) {
      T.InFlightBytes += P.Buffers[Id].Bytes;
      ++Tensors;
    }
    T.AllToAllBytes = T.InFlightBytes * (K - 1) / K;
    T.AllToAllMessages = Tensors * (K - 1);
  }
  if (Ring > 1) {
    // The ring: the key/value block (operands 1 and 2 of the forward, 2 and
    // 3 of the backward; after the all-to-all, the same bytes) passed on
    // Ring - 1 times, and in the backward its gradients Ring times; two
    // blocks in flight, with their gradients.
    const unsigned Kv = T.Forward ? 1 : 2;
    const int64_t Block =
        P.Buffers[I.In[Kv]].Bytes + P.Buffers[I.In[Kv + 1]].Bytes;
    T.RingGradientMessages = T.Forward ? 0 : Ring;
    T.RingMessages = Ring - 1 + T.RingGradientMessages;
    T.BlockBytes = Block;
    T.RingBytes = T.RingMessages * Block;
    T.InFlightBytes += 4 * Block;
  }
  return T;
}

const char *ContextRing::comm() const {
  return AllToAll == 1 ? "ring" : AllToAll == Parts ? "a2a" : "a2a+ring";
}

ContextRing contextRingReport(const Program &P) {
  ContextRing R;
  for (const Instruction &I : P.Instrs) {
    ContextTraffic T = contextTraffic(P, I);
    if (T.Parts <= 1)
      continue;
    const unsigned K = T.Forward ? 1 : 2; // k
    R.Parts = T.Parts;
    R.Zigzag = attrInt(I.Op, I.Attrs, "cp_zigzag") != 0;
    R.AllToAll = T.AllToAll;
    R.PositionsPerRank = P.Buffers[I.In[K]].Type.dim(-2);
    if (T.RingMessages)
      R.BlockBytes = std::max(R.BlockBytes, P.Buffers[I.In[K]].Bytes +
                                                P.Buffers[I.In[K + 1]].Bytes);
    R.InFlightBytes = std::max(R.InFlightBytes, T.InFlightBytes);
    R.Layers += T.Forward;
    (T.Forward ? R.ForwardLayer : R.BackwardLayer) = T;
    (T.Forward ? R.ForwardBytes : R.BackwardBytes) += T.RingBytes;
    (T.Forward ? R.AllToAllForwardBytes : R.AllToAllBackwardBytes) +=
        T.AllToAllBytes;
  }
  return R;
}

/// The transfers of one attention layer, in order, and what each overlaps
/// (the report's lines and the manifest's "transfers_per_attention_layer").
struct ContextTransfer {
  const char *Phase, *What, *Group;
  int Messages;
  int64_t Bytes; // all Messages together, per rank
  const char *Overlaps;
};
static std::vector<ContextTransfer> contextTransfers(const ContextRing &R) {
  std::vector<ContextTransfer> T;
  const ContextTraffic &F = R.ForwardLayer, &B = R.BackwardLayer;
  const char *Across =
      R.AllToAll > 1 ? "across the groups" : "over the cp group";
  const char *Inside =
      R.AllToAll == R.Parts ? "over the cp group" : "inside a group";
  const char *Nothing = "nothing (before and after the kernel)";
  const char *Block = "ring: the key/value block to the next rank";
  if (F.AllToAllMessages)
    T.push_back({"forward", "all-to-all of q, k, v and of o, lse", Inside,
                 F.AllToAllMessages, F.AllToAllBytes, Nothing});
  if (F.RingMessages)
    T.push_back({"forward", Block, Across, F.RingMessages, F.RingBytes,
                 "the attention on the block held"});
  if (B.AllToAllMessages)
    T.push_back({"backward",
                 "all-to-all of do, q, k, v, o, lse and of dq, dk, dv", Inside,
                 B.AllToAllMessages, B.AllToAllBytes, Nothing});
  if (const int Blocks = B.RingMessages - B.RingGradientMessages; Blocks)
    T.push_back({"backward", Block, Across, Blocks, Blocks * B.BlockBytes,
                 "the attention gradients on the block held"});
  if (B.RingGradientMessages)
    T.push_back({"backward",
                 "ring: the block's dK, dV sums, one step behind it", Across,
                 B.RingGradientMessages, B.RingGradientMessages * B.BlockBytes,
                 "the next step's attention gradients (the last one: none)"});
  return T;
}

nlohmann::json contextRingToJson(const ContextRing &R) {
  nlohmann::json Transfers = nlohmann::json::array();
  for (const ContextTransfer &X : contextTransfers(R))
    Transfers.push_back({{"phase", X.Phase},
                         {"what", X.What},
                         {"group", X.Group},
                         {"messages", X.Messages},
                         {"bytes", X.Bytes},
                         {"overlaps", X.Overlaps}});
  nlohmann::json J = {{"cp", R.Parts},
                      {"transfers_per_attention_layer", Transfers},
                      {"cp_comm", R.comm()},
                      {"zigzag", R.Zigzag},
                      {"positions_per_rank", R.PositionsPerRank},
                      {"attention_layers", R.Layers},
                      {"block_bytes", R.BlockBytes},
                      {"ring_forward_bytes", R.ForwardBytes},
                      {"ring_backward_bytes", R.BackwardBytes},
                      {"a2a_forward_bytes", R.AllToAllForwardBytes},
                      {"a2a_backward_bytes", R.AllToAllBackwardBytes},
                      {"in_flight_bytes", R.InFlightBytes}};
  if (R.AllToAll > 1 && R.AllToAll < R.Parts)
    J["cp_a2a"] = R.AllToAll;
  return J;
}

/// Each attention layer's transfers, one line each.
static void printContextTransfers(const ContextRing &R, raw_ostream &OS) {
  for (const ContextTransfer &X : contextTransfers(R))
    OS << formatv("    per attention layer, {0}: {1} ({2}): {3} message{4}, "
                  "{5}; overlaps {6}\n",
                  X.Phase, X.What, X.Group, X.Messages,
                  X.Messages == 1 ? "" : "s", kib(X.Bytes), X.Overlaps);
}

void printContextRing(const ContextRing &R, raw_ostream &OS) {
  if (R.Parts <= 1)
    return;
  OS << formatv(
      "context parallelism: c = {0}, {1} positions per rank{2}; "
      "activations are this rank's positions' (stored as the plan "
      "says)\n",
      R.Parts, R.PositionsPerRank,
      R.Zigzag
          ? formatv(" (zigzag chunks r and {0} - r)", 2 * R.Parts - 1).str()
          : std::string());
  if (R.AllToAll == R.Parts) {
    OS << formatv("  all-to-all (bytes sent per rank, {0} attention layers): "
                  "forward {1}, backward {2}; in flight beside the arena: up "
                  "to {3} (this rank's heads of the whole sequence)\n",
                  R.Layers, kib(R.AllToAllForwardBytes),
                  kib(R.AllToAllBackwardBytes), kib(R.InFlightBytes));
    printContextTransfers(R, OS);
    return;
  }
  if (R.AllToAll > 1)
    OS << formatv("  all-to-all inside groups of {0} consecutive ranks "
                  "(bytes sent per rank, {1} attention layers): forward {2}, "
                  "backward {3}\n",
                  R.AllToAll, R.Layers, kib(R.AllToAllForwardBytes),
                  kib(R.AllToAllBackwardBytes));
  OS << formatv(
      "  ring{0} (bytes sent per rank, {1} attention layers): "
      "forward {2}, backward {3}; in flight beside the arena: {4} "
      "({5}the block computed on and the one arriving, with their "
      "gradients)\n",
      R.AllToAll > 1 ? formatv(" across the {0} groups", R.ringSize()).str()
                     : std::string(),
      R.Layers, kib(R.ForwardBytes), kib(R.BackwardBytes), kib(R.InFlightBytes),
      R.AllToAll > 1 ? "this rank's heads of its group's "
                       "positions, "
                     : "");
  printContextTransfers(R, OS);
}

nlohmann::json collectivesToJson(const std::vector<LayerCollectives> &R) {
  nlohmann::json Layers = nlohmann::json::array();
  int64_t F = 0, B = 0, G = 0, O = 0;
  for (const LayerCollectives &L : R) {
    Layers.push_back({{"layer", L.Layer},
                      {"forward_bytes", L.Forward},
                      {"backward_bytes", L.Backward},
                      {"regather_bytes", L.Regather},
                      {"overlapped_bytes", L.Overlapped}});
    F += L.Forward;
    B += L.Backward;
    G += L.Regather;
    O += L.Overlapped;
  }
  return {{"per_layer", Layers},
          {"total_forward_bytes", F},
          {"total_backward_bytes", B},
          {"total_regather_bytes", G},
          {"total_overlapped_bytes", O}};
}

void printCollectives(const std::vector<LayerCollectives> &R, int T,
                      raw_ostream &OS) {
  if (T <= 1)
    return;
  OS << formatv("collectives (bytes sent per rank, ring algorithms, t = {0}):\n",
                T);
  // Layers with the same collectives print once, with their range.
  auto Same = [](const LayerCollectives &A, const LayerCollectives &B) {
    if (A.Uses.size() != B.Uses.size())
      return false;
    for (size_t I = 0; I < A.Uses.size(); ++I)
      if (A.Uses[I].Op != B.Uses[I].Op || A.Uses[I].Bytes != B.Uses[I].Bytes ||
          A.Uses[I].Role != B.Uses[I].Role || A.Uses[I].Ph != B.Uses[I].Ph ||
          A.Uses[I].Beside != B.Uses[I].Beside)
        return false;
    return true;
  };
  size_t I = 0;
  while (I < R.size()) {
    size_t End = I;
    while (R[I].Layer >= 0 && End + 1 < R.size() && Same(R[I], R[End + 1]))
      ++End;
    const LayerCollectives &L = R[I];
    std::string Name = L.Layer < 0 ? "outside layers"
                       : I == End  ? formatv("layer {0}", L.Layer).str()
                                   : formatv("layers {0}-{1} (each)", L.Layer,
                                             R[End].Layer)
                                         .str();
    OS << formatv("  {0}: forward {1}, backward {2}, regather {3}", Name,
                  kib(L.Forward), kib(L.Backward), kib(L.Regather));
    if (L.Overlapped)
      OS << formatv("; {0} of it beside GEMMs", kib(L.Overlapped));
    OS << "\n";
    // Repeated collectives of one kind (the gradient sums) print once.
    for (size_t U = 0; U < L.Uses.size();) {
      const CollectiveUse &C = L.Uses[U];
      size_t Next = U;
      int64_t Bytes = 0;
      while (Next < L.Uses.size() && L.Uses[Next].Op == C.Op &&
             L.Uses[Next].Role == C.Role && L.Uses[Next].Ph == C.Ph &&
             L.Uses[Next].Beside == C.Beside)
        Bytes += L.Uses[Next++].Bytes;
      std::string Count =
          Next - U > 1 ? formatv(" ({0} calls)", Next - U).str() : "";
      std::string Beside = C.Beside.empty() ? "" : "  beside " + C.Beside;
      std::string Line =
          formatv("    {0,-4} {1,-15} {2,-22} {3,-9}{4}{5}", phaseName(C.Ph),
                  opName(C.Op), C.Role, kib(Bytes), Count, Beside)
              .str();
      OS << StringRef(Line).rtrim() << "\n";
      U = Next;
    }
    I = End + 1;
  }
}

} // namespace sp
