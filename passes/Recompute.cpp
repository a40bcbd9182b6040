//===- Recompute.cpp - Activation recomputation ---------------------------===//
//
// Drops forward values from what the backward keeps and recomputes them in
// the backward instead (Section 5 of the paper). Runs on the training graph,
// last in the pipeline, so that it sees the whole program it trades memory
// in.
//
// What is recomputed is a set R of forward nodes. The backward is walked in
// program order; when a backward node reads a result of a node in R, that
// node is cloned just before the reader, after the clones of whatever it
// needs from R, and the reader is pointed at the clone. Clones keep the
// layer, role and attributes of their original (a dropout its Philox key, so
// its mask is bitwise the same) and are tagged phase = recompute. Nodes of R
// whose results no gradient rule reads are never cloned. The forward
// originals stay; their results now die in the forward.
//
//  - selective: R = the attention core of every layer (qk, scale, mask,
//    softmax, attention dropout, av). The backward then reads Q, K and V
//    instead of the softmax output, its mask and the dropped-out scores.
//    attention over V is not cloned: no gradient rule reads its output (the
//    output projection saves the merged heads).
//  - full: R = every forward node of a group of K consecutive layers
//    (--recompute-layers K) except those whose results the forward beyond
//    the group reads: only each group's input is kept.
//  - auto: per layer, the moves none -> selective and selective -> full
//    (or none -> full when that saves more bytes per FLOP), sorted by bytes
//    saved per recomputed GEMM FLOP, both measured on the graph by planning
//    one layer's move. A binary search over how many moves to take (the
//    planned peak falls as moves are added) finds the fewest that fit
//    --memory-budget; each candidate is planned exactly (a copy of the
//    graph, recomputed, lowered and placed), so the budget is checked
//    against the real peak. When not even every layer on full fits, the
//    error gives the smallest budget that does.
//
//===----------------------------------------------------------------------===//
#include "analysis/Activations.h"
#include "analysis/Cost.h"
#include "lower/Finalize.h"
#include "lower/LowerGraph.h"
#include "lower/MemoryPlan.h"
#include "passes/Passes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>

using namespace llvm;

namespace sp {
namespace {

enum class LayerPolicy : uint8_t { None, Selective, Full };

bool isAttentionCore(const Node &N) {
  return isAttentionCoreRole(N.tags().Role);
}

int numLayers(const Graph &G) {
  int L = 0;
  for (const Node &N : G.nodes())
    L = std::max(L, N.tags().Layer + 1);
  return L;
}

/// Each layer's group (recomputeGroups): consecutive full layers of the
/// same K (K[L]; empty: 1), K at a time; every other layer alone.
std::vector<int> layerGroups(ArrayRef<LayerPolicy> Policy, ArrayRef<int> K) {
  std::vector<int> Group(Policy.size(), -1);
  auto KOf = [&](int L) { return K.empty() ? 1 : std::max(K[L], 1); };
  for (int L = 0, Next = -1, Run = 0; L < int(Policy.size()); ++L) {
    bool Joins = L > 0 && Run > 0 && Policy[L] == LayerPolicy::Full &&
                 Policy[L - 1] == LayerPolicy::Full && KOf(L) == KOf(L - 1);
    if (!Joins) {
      ++Next;
      Run = 0;
    }
    Group[L] = Next;
    Run = Policy[L] == LayerPolicy::Full ? (Run + 1) % KOf(L) : 0;
  }
  return Group;
}

/// The nodes to recompute for a per-layer policy, full layers recomputed
/// by Group (recomputeGroups: each layer's group; empty: every layer
/// alone).
DenseSet<const Node *> recomputeSet(const Graph &G,
                                    ArrayRef<LayerPolicy> Policy,
                                    ArrayRef<int> Group) {
  auto GroupOf = [&](const Node &N) {
    int L = N.tags().Layer;
    if (L < 0 || L >= int(Policy.size()))
      return -1;
    return Group.empty() ? L : Group[L];
  };
  DenseSet<const Node *> R;
  for (const Node &N : G.nodes()) {
    if (N.tags().Ph != Phase::Forward || N.tags().Layer < 0)
      continue;
    LayerPolicy P = Policy[N.tags().Layer];
    if (P == LayerPolicy::Selective && isAttentionCore(N))
      R.insert(&N);
    if (P != LayerPolicy::Full)
      continue;
    // Keep what the forward beyond the group reads (the group's output).
    bool Boundary = any_of(N.results(), [&](Value *V) {
      return any_of(V->users(), [&](const Use &U) {
        return U.User->tags().Ph == Phase::Forward &&
               GroupOf(*U.User) != GroupOf(N);
      });
    });
    if (!Boundary)
      R.insert(&N);
  }
  return R;
}

/// Clones the nodes of R that the backward reads, before their first
/// reader, and points the backward at the clones.
void applyRecompute(Graph &G, const DenseSet<const Node *> &R) {
  if (R.empty())
    return;
  DenseMap<const Node *, unsigned> Order;
  SmallVector<Node *, 256> Backward;
  for (Node &N : G.nodes()) {
    Order[&N] = Order.size();
    if (N.tags().Ph == Phase::Backward)
      Backward.push_back(&N);
  }
  DenseMap<Value *, Value *> Clone;
  auto InR = [&](Value *V) {
    return V->producer() && R.count(V->producer());
  };
  SmallVector<Node *, 16> Work, Needed;
  DenseSet<Node *> Seen;
  for (Node *B : Backward) {
    for (unsigned I = 0; I < B->numOperands(); ++I) {
      Value *V = B->operand(I);
      if (!InR(V))
        continue;
      if (!Clone.count(V)) {
        // Everything V needs from R that has no clone yet, in program order.
        Work.assign({V->producer()});
        Needed.clear();
        Seen.clear();
        Seen.insert(V->producer());
        while (!Work.empty()) {
          Node *N = Work.pop_back_val();
          Needed.push_back(N);
          for (Value *O : N->operands())
            if (InR(O) && !Clone.count(O) && Seen.insert(O->producer()).second)
              Work.push_back(O->producer());
        }
        llvm::sort(Needed, [&](Node *A, Node *C) {
          return Order.lookup(A) < Order.lookup(C);
        });
        for (Node *N : Needed) {
          SmallVector<Value *, 4> Ops;
          for (Value *O : N->operands())
            Ops.push_back(Clone.lookup(O) ? Clone.lookup(O) : O);
          SmallVector<TensorType, 3> Types;
          for (Value *Res : N->results())
            Types.push_back(Res->type());
          Node *C = G.create(B->getIterator(), N->op(), Ops, Types, N->name());
          C->attrs() = N->attrs();
          C->tags() = N->tags();
          C->tags().Ph = Phase::Recompute;
          for (unsigned J = 0; J < N->numResults(); ++J) {
            C->result(J)->setSharding(N->result(J)->sharding());
            Clone[N->result(J)] = C->result(J);
          }
        }
      }
      B->setOperand(I, Clone.lookup(V));
    }
  }
}

/// The planned peak bytes per rank of G with Policy applied (on a copy).
int64_t plannedPeak(const Graph &G, ArrayRef<LayerPolicy> Policy,
                    DType ActDtype, ActivationReport *Report = nullptr) {
  std::unique_ptr<Graph> C = G.clone();
  applyRecompute(*C, recomputeSet(*C, Policy, /*Group=*/{}));
  Program P = cantFail(lowerGraph(*C, ActDtype));
  finalizeProgram(P);
  if (Report)
    *Report = analyzeActivations(P);
  return P.ArenaBytes;
}

struct Move {
  int Layer;
  LayerPolicy To;
  double Ratio; // stored bytes saved per recomputed FLOP
};

/// Bytes saved and FLOPs added by moving one middle layer from From to To.
std::pair<double, double> measureMove(const Graph &G, int Layers,
                                      LayerPolicy From, LayerPolicy To,
                                      DType ActDtype) {
  int Mid = Layers / 2;
  std::vector<LayerPolicy> A(Layers, LayerPolicy::None), B = A;
  A[Mid] = From;
  B[Mid] = To;
  ActivationReport RA, RB;
  plannedPeak(G, A, ActDtype, &RA);
  plannedPeak(G, B, ActDtype, &RB);
  return {double(RA.StoredBytes - RB.StoredBytes),
          RB.RecomputeFlops - RA.RecomputeFlops};
}

Error runAuto(Graph &G, const PassContext &Ctx,
              std::vector<LayerPolicy> &Policy) {
  int L = Policy.size();
  DType Dt = Ctx.ActivationDtype;
  int64_t Budget = Ctx.Recompute.MemoryBudget;
  auto Ratio = [](std::pair<double, double> BF) {
    return BF.first / std::max(BF.second, 1.0);
  };
  double Sel = Ratio(measureMove(G, L, LayerPolicy::None,
                                 LayerPolicy::Selective, Dt));
  double SelFull = Ratio(measureMove(G, L, LayerPolicy::Selective,
                                     LayerPolicy::Full, Dt));
  double Full = Ratio(measureMove(G, L, LayerPolicy::None, LayerPolicy::Full,
                                  Dt));
  std::vector<Move> Moves;
  for (int I = 0; I < L; ++I) {
    if (Full > Sel) {
      Moves.push_back({I, LayerPolicy::Full, Full});
    } else {
      Moves.push_back({I, LayerPolicy::Selective, Sel});
      Moves.push_back({I, LayerPolicy::Full, SelFull});
    }
  }
  // Largest ratio first; a layer's selective move precedes its full one
  // (its ratio is larger whenever both are listed), so the sort is stable.
  llvm::stable_sort(Moves, [](const Move &A, const Move &B) {
    return A.Ratio > B.Ratio;
  });
  auto PolicyAfter = [&](size_t N) {
    std::vector<LayerPolicy> P(L, LayerPolicy::None);
    for (size_t I = 0; I < N; ++I)
      P[Moves[I].Layer] = std::max(P[Moves[I].Layer], Moves[I].To);
    return P;
  };
  DenseMap<size_t, int64_t> Peaks;
  auto Peak = [&](size_t N) {
    auto It = Peaks.find(N);
    if (It != Peaks.end())
      return It->second;
    return Peaks[N] = plannedPeak(G, PolicyAfter(N), Dt);
  };
  if (Peak(Moves.size()) > Budget) {
    int64_t Smallest = Peak(Moves.size());
    for (auto &[N, P] : Peaks)
      Smallest = std::min(Smallest, P);
    return createStringError(
        inconvertibleErrorCode(),
        "no plan fits --memory-budget %lld bytes: the smallest, full "
        "recomputation of every layer, needs %lld bytes per rank; raise the "
        "budget to at least that",
        (long long)Budget, (long long)Smallest);
  }
  // The fewest moves that fit: binary search, then step forward in case the
  // placement made the peak non-monotone.
  size_t Lo = 0, Hi = Moves.size();
  while (Lo < Hi) {
    size_t Mid = (Lo + Hi) / 2;
    if (Peak(Mid) <= Budget)
      Hi = Mid;
    else
      Lo = Mid + 1;
  }
  while (Peak(Lo) > Budget)
    ++Lo;
  Policy = PolicyAfter(Lo);
  return Error::success();
}

class RecomputePass : public Pass {
public:
  StringRef name() const override { return "recompute"; }

  Error run(Graph &G, PassContext &Ctx) override {
    const RecomputeOptions &O = Ctx.Recompute;
    if (O.Mode == RecomputeMode::None && O.LayerModes.empty())
      return Error::success();
    bool Training = any_of(G.outputs(), [](const Graph::Output &Out) {
      return Out.Name == "loss";
    });
    if (!Training)
      return createStringError(inconvertibleErrorCode(),
                               "recompute needs a training graph (run "
                               "autodiff first)");
    int L = numLayers(G);
    if (L == 0)
      return createStringError(inconvertibleErrorCode(),
                               "recompute needs layer tags (run "
                               "detect-transformer first)");
    std::vector<LayerPolicy> Policy(L, LayerPolicy::None);
    if (!O.LayerModes.empty()) {
      if (!O.LayerGroups.empty() && int(O.LayerGroups.size()) != L)
        return createStringError(inconvertibleErrorCode(),
                                 "recompute: %zu per-layer group sizes for "
                                 "the %d layers of the model",
                                 O.LayerGroups.size(), L);
      if (any_of(O.LayerGroups, [&](int G) { return G < 1 || G > L; }))
        return createStringError(inconvertibleErrorCode(),
                                 "recompute: a per-layer group size is not "
                                 "between 1 and the %d layers",
                                 L);
      if (int(O.LayerModes.size()) != L)
        return createStringError(inconvertibleErrorCode(),
                                 "recompute: %zu per-layer modes for the %d "
                                 "layers of the model",
                                 O.LayerModes.size(), L);
      for (int I = 0; I < L; ++I) {
        RecomputeMode M = O.LayerModes[I];
        if (M == RecomputeMode::Auto)
          return createStringError(inconvertibleErrorCode(),
                                   "recompute: layer %d's mode is auto; a "
                                   "layer's mode is none, selective or full",
                                   I);
        Policy[I] = M == RecomputeMode::Full        ? LayerPolicy::Full
                    : M == RecomputeMode::Selective ? LayerPolicy::Selective
                                                    : LayerPolicy::None;
      }
      applyRecompute(G, recomputeSet(G, Policy, recomputeGroups(O, L)));
      return Error::success();
    }
    switch (O.Mode) {
    case RecomputeMode::None:
      break;
    case RecomputeMode::Selective:
      Policy.assign(L, LayerPolicy::Selective);
      break;
    case RecomputeMode::Full:
      if (O.Layers > L)
        return createStringError(inconvertibleErrorCode(),
                                 "--recompute-layers %d is more than the %d "
                                 "layers of the model",
                                 O.Layers, L);
      Policy.assign(L, LayerPolicy::Full);
      break;
    case RecomputeMode::Auto:
      if (auto E = runAuto(G, Ctx, Policy))
        return E;
      break;
    }
    // Groups only where full recomputation names them (auto's full layers
    // are recomputed one by one).
    applyRecompute(G, recomputeSet(G, Policy, recomputeGroups(O, L)));
    return Error::success();
  }
};

} // namespace

std::vector<int> recomputeGroups(const RecomputeOptions &O, int L) {
  std::vector<LayerPolicy> Policy(L, LayerPolicy::None);
  std::vector<int> K;
  if (!O.LayerModes.empty()) {
    if (int(O.LayerModes.size()) != L ||
        (!O.LayerGroups.empty() && int(O.LayerGroups.size()) != L))
      return layerGroups(Policy, K); // the recompute pass refuses these
    for (int I = 0; I < L; ++I)
      if (O.LayerModes[I] == RecomputeMode::Full)
        Policy[I] = LayerPolicy::Full;
    K = O.LayerGroups;
  } else if (O.Mode == RecomputeMode::Full) {
    Policy.assign(L, LayerPolicy::Full);
    K.assign(L, std::max(O.Layers, 1));
  }
  return layerGroups(Policy, K);
}

std::unique_ptr<Pass> createRecomputePass() {
  return std::make_unique<RecomputePass>();
}

} // namespace sp
