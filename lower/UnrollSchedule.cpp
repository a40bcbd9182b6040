//===- UnrollSchedule.cpp - A pipeline schedule into programs ------------===//
#include "lower/UnrollSchedule.h"
#include "lower/ProgramBuilder.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Parallel.h"
#include <cstring>
#include <map>

using namespace llvm;

namespace sp {

namespace {

Error lowerError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), "pipeline: " + Msg);
}

bool perMicrobatch(const Node &N) { return N.tags().Ph != Phase::Optimizer; }

/// The graph cut into virtual stages: each stage's forward and backward
/// (with recompute) nodes, and the values that cross between stages.
struct StageGraph {
  int NumStages;
  /// Per stage, in graph order: the nodes of its Forward, Backward and
  /// (with a split backward) WeightGrad steps.
  std::vector<std::vector<const Node *>> Fwd, Bwd, Wgt;
  /// The step kind each per-microbatch node runs in.
  DenseMap<const Node *, StepKind> StepOf;
  /// Per stage, with a split backward: the all_gathers of its Backward step
  /// whose results its WeightGrad step reads. The W step gathers them again
  /// rather than holding their t-times-larger results from B to W.
  std::vector<std::vector<const Node *>> Regather;
  /// Values read on another stage than their producer's, numbered (the
  /// message tag is microbatch * size() + number).
  SetVector<const Value *> Cross;
  /// Message tags: microbatch * TagStride + the value's number among those
  /// going from its producer's rank to one receiving rank.
  std::map<std::pair<const Value *, int>, int> TagIndex;
  int TagStride = 1;
  /// Per stage: the crossing values it receives, and those it sends with
  /// their destination stages, each split by the phase of the producer.
  std::vector<SetVector<const Value *>> FwdImports, BwdImports;
  std::vector<MapVector<const Value *, SmallVector<int, 2>>> FwdExports,
      BwdExports;
  /// Per stage: values its per-microbatch nodes make that are read once per
  /// step (by the optimizer, or as graph outputs): summed over microbatches.
  std::vector<SetVector<const Value *>> Accumulated;
};

int stageOf(const Node &N, int NumStages) {
  return NumStages == 1 ? std::max(N.tags().Stage, 0) : N.tags().Stage;
}

Expected<StageGraph> cutStages(const Graph &G, int NumStages) {
  StageGraph SG;
  SG.NumStages = NumStages;
  SG.Fwd.resize(NumStages);
  SG.Bwd.resize(NumStages);
  SG.Wgt.resize(NumStages);
  SG.FwdImports.resize(NumStages);
  SG.BwdImports.resize(NumStages);
  SG.FwdExports.resize(NumStages);
  SG.BwdExports.resize(NumStages);
  SG.Accumulated.resize(NumStages);
  for (const Node &N : G.nodes()) {
    int S = stageOf(N, NumStages);
    bool GlobalNorm = N.op() == OpKind::GradNorm && S < 0;
    if (!GlobalNorm && (S < 0 || S >= NumStages))
      return lowerError(formatv("{0} has no pipeline stage in [0, {1}); run "
                                "the pipeline pass",
                                N.describe(), NumStages));
    if (perMicrobatch(N)) {
      bool Fwd = N.tags().Ph == Phase::Forward;
      (Fwd ? SG.Fwd : SG.Bwd)[S].push_back(&N);
      SG.StepOf[&N] = Fwd ? StepKind::Forward : StepKind::Backward;
    }
    for (Value *V : N.operands()) {
      const Node *P = V->producer();
      if (!P)
        continue;
      int From = stageOf(*P, NumStages);
      if (!perMicrobatch(*P)) {
        if (perMicrobatch(N))
          return lowerError(N.describe() + " reads a value of the optimizer");
        if (From != S && From >= 0 && !GlobalNorm)
          return lowerError(N.describe() +
                            " reads an optimizer value of another stage");
        continue;
      }
      if (!perMicrobatch(N)) {
        if (GlobalNorm) // each rank's norm reads that rank's gradients
          continue;
        if (From != S)
          return lowerError(N.describe() + " is on stage " + Twine(S) +
                            " but its gradient is made on stage " +
                            Twine(From));
        SG.Accumulated[From].insert(V);
        continue;
      }
      if (From == S)
        continue;
      SG.Cross.insert(V);
      bool FromForward = P->tags().Ph == Phase::Forward;
      (FromForward ? SG.FwdImports : SG.BwdImports)[S].insert(V);
      auto &Dest = (FromForward ? SG.FwdExports : SG.BwdExports)[From][V];
      if (!is_contained(Dest, S))
        Dest.push_back(S);
    }
  }
  for (const Graph::Output &O : G.outputs())
    if (const Node *P = O.V->producer(); P && perMicrobatch(*P))
      SG.Accumulated[stageOf(*P, NumStages)].insert(O.V);
  return SG;
}

/// Splits each stage's backward: the nodes its outgoing gradients (the
/// values it sends to earlier stages) depend on stay in Bwd, the rest move
/// to Wgt, both in graph order.
void splitBackward(StageGraph &SG) {
  SG.Regather.assign(SG.NumStages, {});
  for (int S = 0; S < SG.NumStages; ++S) {
    DenseSet<const Node *> Needed;
    SmallVector<const Node *, 32> Work;
    auto Visit = [&](const Value *V) {
      const Node *P = V->producer();
      if (P && stageOf(*P, SG.NumStages) == S &&
          SG.StepOf.lookup(P) == StepKind::Backward && Needed.insert(P).second)
        Work.push_back(P);
    };
    for (auto &Export : SG.BwdExports[S])
      Visit(Export.first);
    while (!Work.empty()) {
      const Node *N = Work.pop_back_val();
      for (const Value *V : N->operands())
        Visit(V);
    }
    std::vector<const Node *> Input;
    for (const Node *N : SG.Bwd[S]) {
      if (Needed.count(N)) {
        Input.push_back(N);
        continue;
      }
      SG.Wgt[S].push_back(N);
      SG.StepOf[N] = StepKind::WeightGrad;
    }
    SG.Bwd[S] = std::move(Input);
    // Under SP the output gradient of a row-parallel layer is all-gathered
    // to the full sequence for both its input gradient (B) and its weight
    // gradient (W); gathering it again in W keeps only the 1/t shard alive
    // in between, as Megatron gathers a layer's input again for its weight
    // gradient. An all_gather copies, so the results do not change. In
    // program order, so every TP rank issues them alike.
    for (const Node *N : SG.Bwd[S])
      if (N->op() == OpKind::AllGather &&
          any_of(N->result(0)->users(), [&](const Use &U) {
            return stageOf(*U.User, SG.NumStages) == S &&
                   SG.StepOf.lookup(U.User) == StepKind::WeightGrad;
          }))
        SG.Regather[S].push_back(N);
  }
}

/// Emits one rank's program.
class RankLowering {
public:
  RankLowering(const Graph &G, const StageGraph &SG, const PipelineLayout &L,
               int Rank, DType Dt)
      : G(G), SG(SG), L(L), Rank(Rank), B(Dt) {}

  Expected<Program> run() {
    for (const PipelineStep &S : L.Steps[Rank]) {
      int V = S.Chunk * L.Stages + Rank;
      if (V >= SG.NumStages || S.Microbatch >= L.Microbatches)
        return lowerError(formatv("rank {0}: a step of chunk {1}, microbatch "
                                  "{2} is outside the model",
                                  Rank, S.Chunk, S.Microbatch));
      if (S.Kind == StepKind::WeightGrad && !L.SplitBackward)
        return lowerError(formatv("rank {0}: a weight-gradient step in a "
                                  "layout that does not split the backward",
                                  Rank));
      if (auto E = step(V, S.Microbatch, S.Kind))
        return std::move(E);
    }
    if (auto E = optimizerAndOutputs())
      return std::move(E);
    return B.take();
  }

private:
  int rankOf(int Stage) const { return Stage % L.Stages; }

  /// The tag of V's message to or from rank Other in microbatch Mb: the
  /// same on both sides.
  int tag(const Value *V, int Mb, int ToRank) const {
    return Mb * SG.TagStride + SG.TagIndex.at({V, ToRank});
  }

  /// The buffer of operand V in microbatch Mb.
  Expected<int> operand(const Value *V, int Mb) {
    if (V->isInput() && isPerMicrobatchRole(V->inputRole())) {
      auto Key = std::make_pair(Mb, V);
      auto It = Instances.find(Key);
      if (It != Instances.end())
        return It->second;
      int Id = B.addBuffer(V->name() + "." + std::to_string(Mb), V->type(),
                           ProgramBuffer::Input);
      B.setFeed(Id, V->inputRole(), Mb);
      Instances[Key] = Id;
      return Id;
    }
    if (!V->isResult())
      return B.leaf(V);
    auto It = Instances.find({Mb, V});
    if (It == Instances.end())
      return lowerError(formatv("rank {0}: a value of {1} is read before this "
                                "rank has it (microbatch {2})",
                                Rank, V->producer()->describe(), Mb));
    return It->second;
  }

  Error emitNode(const Node &N, int Mb) {
    SmallVector<int, 4> In;
    for (Value *V : N.operands()) {
      auto Id = operand(V, Mb);
      if (!Id)
        return Id.takeError();
      In.push_back(*Id);
    }
    AttrList Extra;
    // Ops that draw dropout: the rows of the whole batch they hold (the
    // fused attention's backward draws it again).
    bool Draws = N.op() == OpKind::Dropout || N.op() == OpKind::Attention ||
                 N.op() == OpKind::AttentionGrad;
    if (Draws && L.Microbatches > 1) {
      Extra.set("microbatch", int64_t(Mb));
      Extra.set("microbatches", int64_t(L.Microbatches));
    }
    auto Out = B.emit(N, In, &Extra);
    for (unsigned K = 0; K < Out.size(); ++K)
      Instances[{Mb, N.result(K)}] = Out[K];
    return Error::success();
  }

  Error step(int Stage, int Mb, StepKind Kind) {
    bool Forward = Kind == StepKind::Forward;
    // A weight-gradient step neither receives nor sends: every value it
    // reads from another stage arrived for the forward or the backward.
    bool Communicates = Kind != StepKind::WeightGrad;
    Phase Ph = Forward ? Phase::Forward : Phase::Backward;
    const auto &Imports = Forward ? SG.FwdImports : SG.BwdImports;
    for (const Value *V : Communicates ? Imports[Stage].getArrayRef()
                                       : ArrayRef<const Value *>()) {
      int From = V->producer()->tags().Stage;
      AttrList A;
      A.set("peer", int64_t(rankOf(From)));
      A.set("tag", int64_t(tag(V, Mb, Rank)));
      Tags T = V->producer()->tags();
      T.Ph = Ph;
      T.Stage = Stage;
      auto Out = B.emitRaw(OpKind::Recv, {}, {plannedType(V, ActDtype())}, A,
                           T, "recv", {plannedBytes(V, ActDtype())});
      B.setSharding(Out[0], V->sharding());
      Instances[{Mb, V}] = Out[0];
    }
    const auto &Nodes = Forward                     ? SG.Fwd
                        : Kind == StepKind::Backward ? SG.Bwd
                                                     : SG.Wgt;
    if (Kind == StepKind::WeightGrad)
      for (const Node *N : SG.Regather[Stage])
        if (auto E = emitNode(*N, Mb)) // replaces B's instance for W's reads
          return E;
    for (const Node *N : Nodes[Stage])
      if (auto E = emitNode(*N, Mb))
        return E;
    const auto &Exports = Forward ? SG.FwdExports : SG.BwdExports;
    for (auto &[V, Dests] : Exports[Stage])
      for (int To : Communicates ? ArrayRef<int>(Dests) : ArrayRef<int>()) {
        AttrList A;
        A.set("peer", int64_t(rankOf(To)));
        A.set("tag", int64_t(tag(V, Mb, rankOf(To))));
        Tags T = V->producer()->tags();
        T.Ph = Ph;
        B.emitRaw(OpKind::Send, {Instances.at({Mb, V})}, {}, A, T, "send");
      }
    // Sum what the step made that the optimizer reads, over microbatches.
    for (const Value *V : SG.Accumulated[Stage]) {
      auto It = Instances.find({Mb, V});
      if (It == Instances.end() || SG.StepOf.lookup(V->producer()) != Kind)
        continue;
      auto Acc = Accumulators.find(V);
      if (Acc == Accumulators.end()) {
        Accumulators[V] = It->second;
        continue;
      }
      Tags T = V->producer()->tags();
      T.Role += "_accumulate";
      Acc->second = B.emitRaw(OpKind::Add, {Acc->second, It->second},
                              {V->type()}, {}, T, "accumulate")[0];
    }
    return Error::success();
  }

  DType ActDtype() const { return B.activationDtype(); }

  /// The once-per-step value of V: its sum over microbatches, or the result
  /// of an optimizer node.
  Expected<int> stepValue(const Value *V) {
    if (!V->isResult())
      return B.leaf(V);
    if (auto It = StepValues.find(V); It != StepValues.end())
      return It->second;
    if (auto It = Accumulators.find(V); It != Accumulators.end())
      return It->second;
    return lowerError(formatv("rank {0}: {1} has no value at the end of the "
                              "step",
                              Rank, V->producer()->describe()));
  }

  bool onThisRank(int Stage) const {
    return Stage >= 0 && Stage < SG.NumStages && rankOf(Stage) == Rank;
  }

  Error optimizerAndOutputs() {
    for (const Node &N : G.nodes()) {
      if (perMicrobatch(N))
        continue;
      int S = stageOf(N, SG.NumStages);
      bool GlobalNorm = N.op() == OpKind::GradNorm && S < 0;
      if (!GlobalNorm && !onThisRank(S))
        continue;
      SmallVector<int, 8> In;
      for (Value *V : N.operands()) {
        // Each rank's grad_norm covers the gradients made on that rank.
        if (GlobalNorm && V->producer() &&
            !onThisRank(stageOf(*V->producer(), SG.NumStages)))
          continue;
        auto Id = stepValue(V);
        if (!Id)
          return Id.takeError();
        In.push_back(*Id);
      }
      AttrList Extra;
      if (GlobalNorm && L.Stages > 1)
        Extra.set("pipeline", int64_t(1));
      if (N.op() == OpKind::PipeAllReduce) {
        SmallVector<int64_t, 4> Ranks;
        for (int64_t S2 : attrInts(N.op(), N.attrs(), "stages"))
          Ranks.push_back(rankOf(S2));
        Extra.set("ranks", std::vector<int64_t>(Ranks.begin(), Ranks.end()));
      }
      auto Out = B.emit(N, In, &Extra);
      for (unsigned K = 0; K < Out.size(); ++K)
        StepValues[N.result(K)] = Out[K];
    }
    int LastRank = rankOf(SG.NumStages - 1);
    for (const Graph::Output &O : G.outputs()) {
      const Node *P = O.V->producer();
      int S = P ? stageOf(*P, SG.NumStages) : -1;
      if (O.Name == "loss") {
        int Loss = -1;
        Tags T = P ? P->tags() : Tags();
        if (Rank == LastRank) {
          auto Id = stepValue(O.V);
          if (!Id)
            return Id.takeError();
          Loss = *Id; // summed over microbatches, each loss_weight'ed
        }
        if (L.Stages > 1) {
          AttrList A;
          A.set("root", int64_t(LastRank));
          SmallVector<int, 1> In;
          if (Rank == LastRank)
            In.push_back(Loss);
          Loss = B.emitRaw(OpKind::PipeBroadcast, In, {O.V->type()}, A, T,
                           "loss_broadcast")[0];
        }
        B.output("loss", Loss);
        continue;
      }
      if (!onThisRank(S))
        continue;
      auto Id = stepValue(O.V);
      if (!Id)
        return Id.takeError();
      B.output(O.Name, *Id);
    }
    return Error::success();
  }

  const Graph &G;
  const StageGraph &SG;
  const PipelineLayout &L;
  int Rank;
  ProgramBuilder B;
  std::map<std::pair<int, const Value *>, int> Instances;
  DenseMap<const Value *, int> Accumulators, StepValues;
};

} // namespace

static Expected<StageGraph> checkedCut(const Graph &G,
                                       const PipelineLayout &L) {
  if (L.Stages < 1 || L.Chunks < 1 || L.Microbatches < 1 ||
      int(L.Steps.size()) != L.Stages)
    return lowerError("malformed layout");
  auto SG = cutStages(G, L.Stages * L.Chunks);
  if (!SG)
    return SG.takeError();
  if (L.SplitBackward)
    splitBackward(*SG);
  // Number the values each pair of ranks exchanges.
  std::map<std::pair<int, int>, int> PerPair;
  for (const auto *Exports : {&SG->FwdExports, &SG->BwdExports})
    for (const auto &StageExports : *Exports)
      for (auto &[V, Dests] : StageExports)
        for (int D : Dests) {
          int From = V->producer()->tags().Stage % L.Stages,
              To = D % L.Stages;
          if (!SG->TagIndex.count({V, To}))
            SG->TagIndex[{V, To}] = PerPair[{From, To}]++;
        }
  for (auto &[Pair, Count] : PerPair)
    SG->TagStride = std::max(SG->TagStride, Count);
  if (int64_t(SG->TagStride) * L.Microbatches >= (1 << 14))
    return lowerError(formatv("{0} values cross between two ranks in each of "
                              "{1} microbatches: too many for message tags",
                              SG->TagStride, L.Microbatches));
  return SG;
}

Expected<std::vector<Program>> lowerPipeline(const Graph &G, DType Dt,
                                             const PipelineLayout &L) {
  auto SG = checkedCut(G, L);
  if (!SG)
    return SG.takeError();
  // The ranks are lowered concurrently: each reads the graph and the cut
  // and builds its own program.
  std::vector<Optional<Expected<Program>>> Lowered(L.Stages);
  parallelForEachN(0, L.Stages, [&](size_t R) {
    Lowered[R].emplace(RankLowering(G, *SG, L, int(R), Dt).run());
  });
  std::vector<Program> Programs;
  Optional<Error> First; // the lowest rank's error; the others dropped
  for (auto &P : Lowered) {
    if (*P) {
      Programs.push_back(std::move(**P));
    } else if (!First) {
      First.emplace(P->takeError());
    } else {
      consumeError(P->takeError());
    }
  }
  if (First)
    return std::move(*First);
  return Programs;
}

Expected<Program> lowerPipelineRank(const Graph &G, DType Dt,
                                    const PipelineLayout &L, int Rank) {
  auto SG = checkedCut(G, L);
  if (!SG)
    return SG.takeError();
  return RankLowering(G, *SG, L, Rank, Dt).run();
}

Expected<DenseSet<const Node *>> weightGradNodes(const Graph &G,
                                                int NumStages) {
  auto SG = cutStages(G, NumStages);
  if (!SG)
    return SG.takeError();
  splitBackward(*SG);
  DenseSet<const Node *> W;
  for (const auto &Nodes : SG->Wgt)
    W.insert(Nodes.begin(), Nodes.end());
  return W;
}

//===----------------------------------------------------------------------===//
// Verification
//===----------------------------------------------------------------------===//

Error verifyPipelinePrograms(ArrayRef<Program> Programs) {
  int P = Programs.size();
  std::vector<size_t> PC(P, 0);
  // Messages sent and not yet received: (from, to, tag) -> count.
  std::map<std::tuple<int, int, int64_t>, int> Inbox;
  auto IsCollective = [](const Instruction &I) {
    return I.Op == OpKind::PipeBroadcast || I.Op == OpKind::PipeAllReduce ||
           (I.Op == OpKind::GradNorm && attrInt(I.Op, I.Attrs, "pipeline"));
  };
  auto Participants = [&](const Instruction &I) {
    SmallVector<int, 8> R;
    if (I.Op == OpKind::PipeAllReduce)
      for (int64_t X : attrInts(I.Op, I.Attrs, "ranks"))
        R.push_back(X);
    else
      for (int X = 0; X < P; ++X)
        R.push_back(X);
    return R;
  };
  while (true) {
    bool Progress = false, Done = true;
    for (int R = 0; R < P; ++R) {
      const auto &Instrs = Programs[R].Instrs;
      while (PC[R] < Instrs.size()) {
        const Instruction &I = Instrs[PC[R]];
        if (I.Op == OpKind::Send) {
          ++Inbox[{R, int(attrInt(I.Op, I.Attrs, "peer")), attrInt(I.Op, I.Attrs, "tag")}];
        } else if (I.Op == OpKind::Recv) {
          auto It = Inbox.find(
              {int(attrInt(I.Op, I.Attrs, "peer")), R, attrInt(I.Op, I.Attrs, "tag")});
          if (It == Inbox.end() || It->second == 0)
            break;
          --It->second;
        } else if (IsCollective(I)) {
          // Passes once every participant stands at a collective of the
          // same kind; all of them then move on.
          auto Ranks = Participants(I);
          bool All = all_of(Ranks, [&](int Q) {
            if (PC[Q] >= Programs[Q].Instrs.size())
              return false;
            const Instruction &J = Programs[Q].Instrs[PC[Q]];
            // Any collective kind: -1 stands for "no tag" on both sides.
            return J.Op == I.Op &&
                   J.Attrs.getInt("tag", -1) == I.Attrs.getInt("tag", -1);
          });
          if (!All)
            break;
          for (int Q : Ranks)
            if (Q != R)
              ++PC[Q];
        }
        ++PC[R];
        Progress = true;
      }
      Done &= PC[R] == Instrs.size();
    }
    if (Done)
      break;
    if (!Progress) {
      std::string Stuck;
      raw_string_ostream OS(Stuck);
      ListSeparator LS("; ");
      for (int R = 0; R < P; ++R) {
        if (PC[R] == Programs[R].Instrs.size())
          continue;
        const Instruction &I = Programs[R].Instrs[PC[R]];
        OS << LS << "rank " << R << " at instruction " << PC[R] << " ("
           << opName(I.Op);
        if (I.Op == OpKind::Recv)
          OS << " from rank " << attrInt(I.Op, I.Attrs, "peer") << ", tag "
             << attrInt(I.Op, I.Attrs, "tag");
        OS << ")";
      }
      return createStringError(inconvertibleErrorCode(),
                               "pipeline schedule deadlocks: %s",
                               OS.str().c_str());
    }
  }
  for (auto &[Key, Count] : Inbox)
    if (Count)
      return createStringError(
          inconvertibleErrorCode(),
          "pipeline schedule: rank %d sends tag %lld to rank %d, which never "
          "receives it",
          std::get<0>(Key), (long long)std::get<2>(Key), std::get<1>(Key));
  return Error::success();
}

} // namespace sp
