//===- PipelineStages.cpp - Pipeline stages of a training graph -----------===//
//
// With --pp P (and --interleave M model chunks per rank), splits the layers
// into P * M contiguous virtual stages and tags every node with its stage;
// the schedule is unrolled into per-rank programs at lowering
// (lower/UnrollSchedule.h). Runs last, on the whole training graph, so that the
// cost model sees the backward and the recomputation.
//
//  - Cost of a layer: its GEMM FLOPs (forward, backward, recompute) plus
//    BytesWeight FLOPs per byte it stores for the backward, so that memory
//    heavy layers weigh more. The embedding counts toward the first stage,
//    the final norm, head and loss toward the last. Partition.h finds the
//    contiguous split that minimises the costliest stage (a dynamic
//    program); --pp-partition uniform gives every stage L / (P M) layers.
//  - Stage of a node: its layer's; the embedding's nodes are on the first
//    stage and the head's on the last; backward nodes outside the layers
//    follow the forward node of their role; optimizer nodes the gradient
//    they apply; grad_norm runs on every rank (stage -1).
//  - A weight used on several pipeline ranks (a tied embedding: the first
//    stage's lookup and the last stage's head) is replicated, as Megatron
//    does: each rank keeps a copy (named W@stage), sums its share of the
//    gradient over the microbatches, and pipe_all_reduce adds the shares
//    over those ranks before the identical AdamW updates. The global
//    gradient norm counts the weight once.
//
//===----------------------------------------------------------------------===//
#include "analysis/Cost.h"
#include "analysis/Partition.h"
#include "ir/ShapeInference.h"
#include "lower/ProgramBuilder.h"
#include "passes/Passes.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"
#include <map>

using namespace llvm;

namespace sp {

namespace {

/// FLOPs one stored byte is worth in the stage cost model: an A100's
/// 312 TFLOP/s over its 2 TB/s.
constexpr double BytesWeight = 156;

class PipelinePass : public Pass {
public:
  StringRef name() const override { return "pipeline-stages"; }

  Error run(Graph &G, PassContext &Ctx) override {
    const PipelineOptions &O = Ctx.Pipeline;
    if (!O.enabled())
      return Error::success();
    if (!any_of(G.nodes(), [](const Node &N) {
          return N.op() == OpKind::AdamW;
        }))
      return makeError("pipeline-stages needs a training graph with its "
                       "optimizer (run autodiff and optimizer first)");
    int L = 0;
    for (const Node &N : G.nodes())
      L = std::max(L, N.tags().Layer + 1);
    int S = O.Stages * O.Interleave;
    if (S > L)
      return makeError(formatv(
          "--pp {0} x --interleave {1} = {2} stages, but the model has only "
          "{3} layers; use at most {3} stages",
          O.Stages, O.Interleave, S, L));
    P = O.Stages;
    NumStages = S;
    Dt = Ctx.ActivationDtype;
    // Full recomputation of groups of layers recomputes a group from its
    // first layer's input: a stage holds whole groups.
    if (auto E = assignLayers(G, L, Ctx.Recompute, O.Uniform))
      return E;
    if (auto E = tagStages(G))
      return E;
    return replicateSharedWeights(G);
  }

private:
  int rankOf(int Stage) const { return Stage % P; }

  /// Splits the L layers, in whole recomputation groups (recomputeGroups of
  /// R), over the stages.
  Error assignLayers(Graph &G, int L, const RecomputeOptions &R, bool Uniform) {
    std::vector<double> Cost(L, 0.0);
    double First = 0, Last = 0;
    bool SeenLayer = false;
    for (const Node &N : G.nodes()) {
      int Layer = N.tags().Layer;
      SeenLayer |= Layer >= 0 && N.tags().Ph == Phase::Forward;
      double C = gemmFlops(N);
      // Bytes kept for the backward: forward results a backward-side node
      // reads.
      if (N.tags().Ph == Phase::Forward)
        for (Value *R : N.results())
          if (any_of(R->users(), [](const Use &U) {
                return U.User->tags().Ph == Phase::Backward ||
                       U.User->tags().Ph == Phase::Recompute;
              }))
            C += BytesWeight * double(plannedBytes(R, Dt));
      if (Layer >= 0)
        Cost[Layer] += C;
      else if (N.tags().Ph != Phase::Optimizer)
        (SeenLayer ? Last : First) += C;
    }
    std::vector<int> GroupOf = recomputeGroups(R, L);
    int Groups = L ? GroupOf.back() + 1 : 0;
    std::vector<double> GroupCost(Groups, 0.0);
    std::vector<int> GroupStart(Groups + 1, L); // first layer; L at the end
    for (int Layer = L - 1; Layer >= 0; --Layer) {
      GroupCost[GroupOf[Layer]] += Cost[Layer];
      GroupStart[GroupOf[Layer]] = Layer;
    }
    bool Grouped = Groups < L;
    // --recompute-layers K (uniform groups), or the planner's per-layer
    // groups.
    bool Uniformly = R.LayerModes.empty();
    int K = std::max(R.Layers, 1);
    if (Grouped && Groups < NumStages)
      return makeError(
          Uniformly
              ? formatv("--recompute-layers {0} makes {1} group{5} of the {2} "
                        "layers, each recomputed from its first layer's "
                        "input on one stage, but the pipeline has {3} "
                        "stages; use --recompute-layers {4} or less",
                        K, Groups, L, NumStages, std::max(1, L / NumStages),
                        Groups == 1 ? "" : "s")
                    .str()
              : formatv("the per-layer recomputation groups make {0} "
                        "group{3} of the {1} layers, each on one stage, but "
                        "the pipeline has {2} stages",
                        Groups, L, NumStages, Groups == 1 ? "" : "s")
                    .str());
    auto Starts = partitionLayers(GroupCost, First, Last, NumStages, Uniform);
    if (!Starts)
      return !Grouped ? Starts.takeError()
             : Uniformly
                 ? makeError(formatv(
                       "with --recompute-layers {0} a stage holds whole "
                       "groups of {0} layers ({1} groups): {2}",
                       K, Groups, toString(Starts.takeError())))
                 : makeError(formatv(
                       "a stage holds whole per-layer recomputation groups "
                       "({0} groups): {1}",
                       Groups, toString(Starts.takeError())));
    StageOfLayer.assign(L, 0);
    for (int St = 0; St < NumStages; ++St) {
      int End = St + 1 < NumStages ? GroupStart[(*Starts)[St + 1]] : L;
      for (int Layer = GroupStart[(*Starts)[St]]; Layer < End; ++Layer)
        StageOfLayer[Layer] = St;
    }
    return Error::success();
  }

  Error tagStages(Graph &G) {
    std::map<Role, int> RoleStage;
    bool SeenLayer = false;
    for (Node &N : G.nodes()) {
      Tags &T = N.tags();
      if (T.Ph != Phase::Forward)
        continue;
      if (T.Layer >= 0) {
        SeenLayer = true;
        T.Stage = StageOfLayer[T.Layer];
      } else {
        T.Stage = SeenLayer ? NumStages - 1 : 0;
        RoleStage.try_emplace(T.Role, T.Stage);
      }
    }
    for (Node &N : G.nodes()) {
      Tags &T = N.tags();
      if (T.Ph == Phase::Forward)
        continue;
      if (T.Ph == Phase::Optimizer) {
        T.Stage = -1; // grad_norm; adamw follows its gradient below
        continue;
      }
      if (T.Layer >= 0) {
        T.Stage = StageOfLayer[T.Layer];
        continue;
      }
      auto It = RoleStage.find(T.Role);
      if (It != RoleStage.end()) {
        T.Stage = It->second;
        continue;
      }
      // Outside the layers with no forward role (a gradient's sum over the
      // tensor-parallel group): where its operand is made.
      T.Stage = -1;
      for (Value *V : N.operands())
        if (V->producer() && V->producer()->tags().Stage >= 0) {
          T.Stage = V->producer()->tags().Stage;
          break;
        }
      if (T.Stage < 0)
        return makeError(N.describe() + " has no pipeline stage");
    }
    for (Node &N : G.nodes())
      if (N.op() == OpKind::AdamW) {
        const Node *Grad = N.operand(1)->producer();
        N.tags().Stage = Grad ? Grad->tags().Stage : 0;
      }
    return Error::success();
  }

  /// The contributions summed into a gradient: the leaves of its tree of
  /// backward adds.
  static void collectLeaves(Value *V, SmallVectorImpl<Value *> &Leaves) {
    SmallVector<Value *, 8> Work{V};
    while (!Work.empty()) {
      Value *X = Work.pop_back_val();
      Node *N = X->producer();
      if (N && N->op() == OpKind::Add && N->tags().Ph == Phase::Backward) {
        Work.push_back(N->operand(1));
        Work.push_back(N->operand(0));
        continue;
      }
      Leaves.push_back(X);
    }
  }

  Error replicateSharedWeights(Graph &G) {
    Node *Norm = nullptr;
    DenseMap<Value *, Node *> Update; // parameter -> adamw
    for (Node &N : G.nodes()) {
      if (N.op() == OpKind::GradNorm)
        Norm = &N;
      if (N.op() == OpKind::AdamW)
        Update[N.operand(0)] = &N;
    }
    int64_t Tag = 1 << 14;
    SmallVector<Value *, 8> Params;
    for (const auto &W : G.params())
      Params.push_back(W.get());
    for (Value *W : Params) {
      // The pipeline ranks that read W; the owner holds its earliest stage.
      SmallVector<int, 4> Ranks;
      int OwnerStage = NumStages;
      for (const Use &U : W->users())
        if (U.User->tags().Ph != Phase::Optimizer) {
          if (!is_contained(Ranks, rankOf(U.User->tags().Stage)))
            Ranks.push_back(rankOf(U.User->tags().Stage));
          OwnerStage = std::min(OwnerStage, U.User->tags().Stage);
        }
      if (Ranks.size() < 2)
        continue;
      Node *Adam = Update.lookup(W);
      if (!Adam || !Norm)
        return makeError("parameter '" + W->name() +
                         "' has no optimizer update");
      Value *Grad = Adam->operand(1);
      SmallVector<Value *, 4> Leaves;
      collectLeaves(Grad, Leaves);
      // Each rank's share: its contributions summed in program order.
      MapVector<int, Value *> Share;
      for (Value *Leaf : Leaves) {
        Node *LP = Leaf->producer();
        if (!LP || LP->tags().Stage < 0)
          return makeError("the gradient of '" + W->name() +
                           "', used on several pipeline stages, is not "
                           "a sum of per-stage parts");
        int R = rankOf(LP->tags().Stage);
        auto [It, New] = Share.insert({R, Leaf});
        if (New)
          continue;
        // After both parts, on the stage of the two whose backward runs
        // last (the lower one).
        Node *Prev = It->second->producer();
        Node *Sum = cantFail(buildNode(G, Norm->getIterator(), OpKind::Add,
                                       {It->second, Leaf}, {}, W->name()));
        Sum->tags() = LP->tags();
        Sum->tags().Ph = Phase::Backward;
        Sum->tags().Stage = std::min(Prev->tags().Stage, LP->tags().Stage);
        Sum->result()->setSharding(Grad->sharding());
        It->second = Sum->result();
      }
      AttrList A;
      std::vector<int64_t> Stages;
      for (auto &[R, V] : Share)
        Stages.push_back(V->producer()->tags().Stage);
      A.set("stages", Stages);
      A.set("tag", Tag++);
      for (auto &[R, V] : Share) {
        Node *Sum = cantFail(buildNode(G, Norm->getIterator(),
                                       OpKind::PipeAllReduce, {V}, A,
                                       W->name()));
        Sum->tags().Role = Role::TiedGradSum;
        Sum->tags().Ph = Phase::Optimizer;
        Sum->tags().Stage = V->producer()->tags().Stage;
        // Laid out like the gradient it replaces (split over the
        // tensor-parallel group with a vocabulary-parallel embedding), which
        // grad_norm reads.
        Sum->result()->setSharding(Grad->sharding());
        Value *Total = Sum->result();
        if (R == rankOf(OwnerStage)) {
          // The owner: its update, the norm and the output see the total.
          G.replaceAllUsesWith(Grad, Total, Sum);
          Adam->tags().Stage = Sum->tags().Stage;
          continue;
        }
        // A replica: its own copy of W for the users on its rank, and its
        // own update with the same total.
        Value *Copy = G.addParam(W->name() + "@" +
                                     std::to_string(Sum->tags().Stage),
                                 W->type(), W->data());
        Copy->setSharding(W->sharding());
        SmallVector<Use, 4> Uses(W->users().begin(), W->users().end());
        for (const Use &U : Uses)
          if (U.User->tags().Ph != Phase::Optimizer &&
              rankOf(U.User->tags().Stage) == R)
            U.User->setOperand(U.OperandNo, Copy);
        SmallVector<Value *, 7> Ops(Adam->operands().begin(),
                                    Adam->operands().end());
        Ops[0] = Copy;
        Ops[1] = Total;
        Ops[2] = G.addState(G.uniqueLeafName(Adam->operand(2)->name() + "@" +
                                             std::to_string(Sum->tags().Stage)),
                            Adam->operand(2)->type());
        Ops[3] = G.addState(G.uniqueLeafName(Adam->operand(3)->name() + "@" +
                                             std::to_string(Sum->tags().Stage)),
                            Adam->operand(3)->type());
        Node *Replica = cantFail(buildNode(G, G.nodes().end(), OpKind::AdamW,
                                           Ops, Adam->attrs(),
                                           Adam->name() + "@replica"));
        Replica->tags() = Adam->tags();
        Replica->tags().Stage = Sum->tags().Stage;
      }
    }
    G.eraseDeadNodes();
    return Error::success();
  }

  int P = 1, NumStages = 1;
  DType Dt = DType::F32;
  std::vector<int> StageOfLayer;
};

} // namespace

std::unique_ptr<Pass> createPipelineStagesPass() {
  return std::make_unique<PipelinePass>();
}

} // namespace sp
