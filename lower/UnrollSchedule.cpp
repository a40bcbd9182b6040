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
#include <optional>
#include <set>

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
  /// (with a split backward) WeightGrad steps; with a split backward,
  /// Whole holds the unsplit backward (Bwd and Wgt together).
  std::vector<std::vector<const Node *>> Fwd, Bwd, Wgt, Whole;
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
  /// The nodes that run once per step (the optimizer's), in graph order:
  /// each rank emits its own, without walking the whole graph again.
  std::vector<const Node *> StepLevel;
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
    } else {
      SG.StepLevel.push_back(&N);
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
    SG.Whole.push_back(std::move(SG.Bwd[S]));
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

/// Emits one rank's compact program: a template per model chunk and step
/// kind, over a symbolic microbatch, then the steps of the schedule.
class RankLowering {
public:
  RankLowering(const Graph &G, const StageGraph &SG, const PipelineLayout &L,
               int Rank, DType Dt)
      : G(G), SG(SG), L(L), Rank(Rank), B(Dt) {}

  Expected<Program> run() {
    for (const PipelineStep &S : L.Steps[Rank]) {
      int V = S.Chunk * L.Stages + Rank;
      if (V >= SG.NumStages || S.Microbatch >= L.Microbatches ||
          S.Microbatch < 0 || S.Chunk < 0)
        return lowerError(formatv("rank {0}: a step of chunk {1}, microbatch "
                                  "{2} is outside the model",
                                  Rank, S.Chunk, S.Microbatch));
      if (S.Kind == StepKind::WeightGrad && !L.SplitBackward)
        return lowerError(formatv("rank {0}: a weight-gradient step in a "
                                  "layout that does not split the backward",
                                  Rank));
    }
    int Chunks = 0;
    while (Chunks < L.Chunks && Chunks * L.Stages + Rank < SG.NumStages)
      ++Chunks;
    // A rank whose every weight-gradient step follows its backward directly
    // (ZB-H1 with delay 0) runs 1F1B's whole backward as one step instead:
    // the same arithmetic, and 1F1B's memory, where two steps would keep
    // the backward's values for the weight gradients in a slot of their own.
    Split = L.SplitBackward;
    if (Split) {
      const auto &Steps = L.Steps[Rank];
      Split = false;
      for (size_t K = 0; K < Steps.size(); ++K)
        if (Steps[K].Kind == StepKind::WeightGrad &&
            (K == 0 || Steps[K - 1].Kind != StepKind::Backward ||
             Steps[K - 1].Microbatch != Steps[K].Microbatch ||
             Steps[K - 1].Chunk != Steps[K].Chunk))
          Split = true;
    }
    // The prologue: every 16-bit parameter copy the steps read, cast once.
    begin(TemplateKind::Prologue, -1);
    if (B.mixedPrecision())
      for (int C = 0; C < Chunks; ++C) {
        int V = C * L.Stages + Rank;
        for (const auto *Nodes : {&SG.Fwd, &SG.Bwd, &SG.Wgt})
          for (const Node *N : (*Nodes)[V])
            for (Value *Op : N->operands())
              if (Op->isParam() && isFloat(Op->type().Dtype))
                B.computeCopy(B.leaf(Op), N->tags());
      }
    end();
    for (int C = 0; C < Chunks; ++C) {
      int V = C * L.Stages + Rank;
      for (StepKind K : {StepKind::Forward, StepKind::Backward,
                         StepKind::WeightGrad}) {
        if (K == StepKind::WeightGrad && !Split)
          continue;
        TemplateOf[{int(K), C}] = Templates.size();
        begin(K == StepKind::Forward    ? TemplateKind::Forward
              : K == StepKind::Backward ? TemplateKind::Backward
                                        : TemplateKind::WeightGrad,
              C);
        if (auto E = step(V, K))
          return E;
        end();
      }
    }
    begin(TemplateKind::Epilogue, -1);
    if (auto E = optimizerAndOutputs())
      return E;
    end();
    Program P = B.take();
    P.Templates = std::move(Templates);
    P.Microbatches = L.Microbatches;
    P.TagStride = SG.TagStride;
    if (auto E = scopeBuffers(P))
      return E;
    if (auto E = schedule(P))
      return E;
    return P;
  }

private:
  int rankOf(int Stage) const { return Stage % L.Stages; }

  void begin(TemplateKind K, int Chunk) {
    ProgramTemplate T;
    T.Kind = K;
    T.Chunk = Chunk;
    T.Begin = B.numInstructions();
    Templates.push_back(T);
  }
  void end() { Templates.back().End = B.numInstructions(); }

  /// The tag of V's message to or from rank ToRank, less the microbatch's
  /// share (Microbatch x TagStride, added when the step runs).
  int tag(const Value *V, int ToRank) const {
    return SG.TagIndex.at({V, ToRank});
  }

  /// The buffer of operand V in a step of Stage.
  Expected<int> operand(const Value *V, int Stage) {
    if (V->isInput() && isPerMicrobatchRole(V->inputRole())) {
      auto It = Inputs.find(V);
      if (It != Inputs.end())
        return It->second;
      int Id = B.addBuffer(V->name(), V->type(), ProgramBuffer::Input);
      B.setFeed(Id, V->inputRole(), -1);
      B.setScope(Id, BufferScope::Microbatch);
      Inputs[V] = Id;
      return Id;
    }
    if (!V->isResult())
      return B.leaf(V);
    auto It = Instances.find({Stage, V});
    if (It == Instances.end())
      return lowerError(formatv("rank {0}: a value of {1} is read before this "
                                "rank has it (stage {2})",
                                Rank, V->producer()->describe(), Stage));
    return It->second;
  }

  Error emitNode(const Node &N, int Stage) {
    SmallVector<int, 4> In;
    for (Value *V : N.operands()) {
      auto Id = operand(V, Stage);
      if (!Id)
        return Id.takeError();
      In.push_back(*Id);
    }
    AttrList Extra;
    // Ops that draw dropout: the rows of the whole batch they hold (the
    // fused attention's backward draws it again). The step's microbatch is
    // set when it runs.
    bool Draws = N.op() == OpKind::Dropout || N.op() == OpKind::Attention ||
                 N.op() == OpKind::AttentionGrad;
    if (Draws && L.Microbatches > 1) {
      Extra.set("microbatch", int64_t(0));
      Extra.set("microbatches", int64_t(L.Microbatches));
    }
    auto Out = B.emit(N, In, &Extra);
    for (unsigned K = 0; K < Out.size(); ++K)
      Instances[{Stage, N.result(K)}] = Out[K];
    return Error::success();
  }

  Error step(int Stage, StepKind Kind) {
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
      A.set("tag", int64_t(tag(V, Rank)));
      Tags T = V->producer()->tags();
      T.Ph = Ph;
      T.Stage = Stage;
      TensorType Ty = B.plannedType(V);
      auto Out = B.emitRaw(OpKind::Recv, {}, {Ty}, A, T, "recv",
                           {Ty.numElements() * dtypeSize(Ty.Dtype)});
      B.setSharding(Out[0], V->sharding());
      Instances[{Stage, V}] = Out[0];
    }
    const auto &Nodes = Forward                     ? SG.Fwd
                        : Kind == StepKind::Backward ? SG.Bwd
                                                     : SG.Wgt;
    if (Kind == StepKind::WeightGrad)
      for (const Node *N : SG.Regather[Stage])
        if (auto E = emitNode(*N, Stage)) // replaces B's instance for W
          return E;
    // A rank that does not split runs the whole backward, in graph order
    // (1F1B's).
    bool Unsplit = Kind == StepKind::Backward && L.SplitBackward && !Split;
    for (const Node *N : (Unsplit ? SG.Whole : Nodes)[Stage])
      if (auto E = emitNode(*N, Stage))
        return E;
    const auto &Exports = Forward ? SG.FwdExports : SG.BwdExports;
    for (auto &[V, Dests] : Exports[Stage])
      for (int To : Communicates ? ArrayRef<int>(Dests) : ArrayRef<int>()) {
        AttrList A;
        A.set("peer", int64_t(rankOf(To)));
        A.set("tag", int64_t(tag(V, rankOf(To))));
        Tags T = V->producer()->tags();
        T.Ph = Ph;
        B.emitRaw(OpKind::Send, {Instances.at({Stage, V})}, {}, A, T, "send");
      }
    // Sum what the step made that the optimizer reads over the
    // microbatches, in the order the steps run (microbatch order).
    for (const Value *V : SG.Accumulated[Stage]) {
      auto It = Instances.find({Stage, V});
      StepKind Made = SG.StepOf.lookup(V->producer());
      if (!Split && Made == StepKind::WeightGrad)
        Made = StepKind::Backward;
      if (It == Instances.end() || Made != Kind)
        continue;
      auto Acc = Accumulators.find(V);
      if (Acc == Accumulators.end()) {
        int Id = B.addBuffer("sum:" + std::to_string(It->second),
                             B.buffer(It->second).Type, ProgramBuffer::Temp);
        B.setSharding(Id, B.buffer(It->second).Shard);
        Acc = Accumulators.insert({V, Id}).first;
      }
      Tags T = V->producer()->tags();
      B.emitRaw(OpKind::Accumulate, {Acc->second, It->second}, {}, {}, T,
                "accumulate");
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
    for (const Node *NP : SG.StepLevel) {
      const Node &N = *NP;
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

  /// The steps: the prologue, the layout's steps of this rank, the
  /// epilogue; then how many slots each region needs (assignSlots).
  Error schedule(Program &P) {
    P.Steps.push_back({0, -1});
    for (const PipelineStep &S : L.Steps[Rank]) { // checked by run()
      if (S.Kind == StepKind::WeightGrad && !Split)
        continue; // in its backward's step
      P.Steps.push_back({TemplateOf.at({int(S.Kind), S.Chunk}), S.Microbatch});
    }
    P.Steps.push_back({int(P.Templates.size()) - 1, -1});
    auto A = assignSlots(P, /*CheckCounts=*/false);
    if (!A)
      return A.takeError();
    for (size_t R = 0; R < P.Slots.size(); ++R)
      P.Slots[R].Count = A->Counts[R];
    return Error::success();
  }

  /// Each temporary's scope: used by one template, a Step buffer; by
  /// several of one chunk (a forward's value its backward reads), a Slot
  /// buffer in the region of its chunk, the template that makes it and the
  /// last that reads it (so a forward's value its backward reads last is
  /// freed at the backward even when the weight gradient runs later); a
  /// parameter copy of the prologue or a sum over the microbatches, Whole.
  Error scopeBuffers(Program &P) {
    // (chunk, kind of the first and of the last template using it)
    std::map<std::tuple<int, int, int>, int> Regions;
    std::vector<int> First(P.Buffers.size(), -1), Last(P.Buffers.size(), -1);
    std::vector<int> Chunk(P.Buffers.size(), -2);
    std::vector<bool> Mixed(P.Buffers.size(), false);
    for (size_t T = 0; T < P.Templates.size(); ++T) {
      const ProgramTemplate &Tp = P.Templates[T];
      for (int I = Tp.Begin; I < Tp.End; ++I) {
        auto Touch = [&](int Id) {
          if (First[Id] < 0)
            First[Id] = T;
          Last[Id] = T;
          if (Chunk[Id] == -2)
            Chunk[Id] = Tp.Chunk;
          else if (Chunk[Id] != Tp.Chunk)
            Mixed[Id] = true;
        };
        for (int Id : P.Instrs[I].In)
          Touch(Id);
        for (int Id : P.Instrs[I].Out)
          Touch(Id);
      }
    }
    std::set<int> Sums;
    for (auto &[V, Id] : Accumulators)
      Sums.insert(Id);
    for (size_t Id = 0; Id < P.Buffers.size(); ++Id) {
      ProgramBuffer &Buf = P.Buffers[Id];
      if (Buf.K != ProgramBuffer::Temp)
        continue;
      if (Sums.count(Id) || (First[Id] == 0 && Last[Id] > 0)) {
        Buf.Scope = BufferScope::Whole;
      } else if (First[Id] == Last[Id]) {
        Buf.Scope = BufferScope::Step;
      } else if (!Mixed[Id] && Chunk[Id] >= 0) {
        Buf.Scope = BufferScope::Slot;
        auto Key = std::make_tuple(Chunk[Id], int(P.Templates[First[Id]].Kind),
                                   int(P.Templates[Last[Id]].Kind));
        auto [It, New] = Regions.try_emplace(Key, int(P.Slots.size()));
        if (New) {
          SlotRegion R;
          R.Chunk = Chunk[Id];
          P.Slots.push_back(R);
        }
        Buf.Region = It->second;
      } else {
        return lowerError(formatv("rank {0}: buffer {1} is used by the "
                                  "templates of several chunks",
                                  Rank, Buf.Name));
      }
    }
    return Error::success();
  }

  const Graph &G;
  const StageGraph &SG;
  const PipelineLayout &L;
  int Rank;
  ProgramBuilder B;
  std::vector<ProgramTemplate> Templates;
  std::map<std::pair<int, int>, int> TemplateOf; // (step kind, chunk)
  bool Split = false; // this rank's backwards run as two steps
  std::map<std::pair<int, const Value *>, int> Instances; // (stage, value)
  DenseMap<const Value *, int> Inputs, Accumulators, StepValues;
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

namespace {

/// A communicating instruction as a rank runs it: in a compact program, a
/// template's instruction in one step, its tag that step's.
struct CommEvent {
  const Instruction *I;
  int64_t Tag; // send and recv
  int Peer;    // send and recv
  int Index;   // the instruction
  int Step;    // the compact program's step; -1 in a flat program
};

bool isPipelineCollective(const Instruction &I) {
  return I.Op == OpKind::PipeBroadcast || I.Op == OpKind::PipeAllReduce ||
         (I.Op == OpKind::GradNorm && attrInt(I.Op, I.Attrs, "pipeline"));
}

std::vector<CommEvent> commEvents(const Program &P) {
  std::vector<CommEvent> Events;
  // Each instruction's tag and peer, read once (a template's instructions
  // run in many steps).
  std::vector<std::pair<int64_t, int>> TagPeer(P.Instrs.size(), {-1, -1});
  for (size_t K = 0; K < P.Instrs.size(); ++K) {
    const Instruction &I = P.Instrs[K];
    if (I.Op == OpKind::Send || I.Op == OpKind::Recv)
      TagPeer[K] = {attrInt(I.Op, I.Attrs, "tag"),
                    int(attrInt(I.Op, I.Attrs, "peer"))};
  }
  auto Add = [&](int Index, int Step, int64_t Mb) {
    const Instruction &I = P.Instrs[Index];
    if (I.Op == OpKind::Send || I.Op == OpKind::Recv)
      Events.push_back({&I,
                        TagPeer[Index].first +
                            std::max<int64_t>(Mb, 0) * P.TagStride,
                        TagPeer[Index].second, Index, Step});
    else if (isPipelineCollective(I))
      Events.push_back({&I, -1, -1, Index, Step});
  };
  if (!P.compact()) {
    for (size_t K = 0; K < P.Instrs.size(); ++K)
      Add(K, -1, 0);
    return Events;
  }
  for (size_t S = 0; S < P.Steps.size(); ++S) {
    const ProgramTemplate &T = P.Templates[P.Steps[S].Template];
    for (int K = T.Begin; K < T.End; ++K)
      Add(K, S, P.Steps[S].Microbatch);
  }
  return Events;
}

} // namespace

Error verifyPipelinePrograms(ArrayRef<Program> Programs) {
  int P = Programs.size();
  std::vector<std::vector<CommEvent>> Ev(P);
  parallelForEachN(0, P, [&](size_t R) { Ev[R] = commEvents(Programs[R]); });
  std::vector<size_t> PC(P, 0);
  // Messages sent and not yet received: (from, to, tag) -> count, the key
  // packed into 64 bits (ranks below 2^16, tags below 2^31: the lowering
  // refuses more microbatches than MPI's tags hold).
  // (DenseMap's own hash of a 64-bit key keeps only its low 32 bits' worth:
  // every (from, to) of one tag would collide.)
  struct MixedKey : DenseMapInfo<uint64_t> {
    static unsigned getHashValue(uint64_t K) {
      K ^= K >> 33;
      K *= 0xff51afd7ed558ccdULL;
      K ^= K >> 33;
      return unsigned(K);
    }
  };
  DenseMap<uint64_t, int, MixedKey> Inbox;
  auto Key = [](int From, int To, int64_t Tag) {
    return uint64_t(uint16_t(From)) << 48 | uint64_t(uint16_t(To)) << 32 |
           uint32_t(Tag);
  };
  assert(P <= 65536 && "ranks must fit the inbox key");
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
      const auto &Events = Ev[R];
      while (PC[R] < Events.size()) {
        const CommEvent &E = Events[PC[R]];
        const Instruction &I = *E.I;
        if (I.Op == OpKind::Send) {
          ++Inbox[Key(R, E.Peer, E.Tag)];
        } else if (I.Op == OpKind::Recv) {
          auto It = Inbox.find(Key(E.Peer, R, E.Tag));
          if (It == Inbox.end() || It->second == 0)
            break;
          --It->second;
        } else {
          // Passes once every participant stands at a collective of the
          // same kind; all of them then move on.
          auto Ranks = Participants(I);
          bool All = all_of(Ranks, [&](int Q) {
            if (Q < 0 || Q >= P || PC[Q] >= Ev[Q].size())
              return false;
            const Instruction &J = *Ev[Q][PC[Q]].I;
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
      Done &= PC[R] == Events.size();
    }
    if (Done)
      break;
    if (!Progress) {
      std::string Stuck;
      raw_string_ostream OS(Stuck);
      ListSeparator LS("; ");
      for (int R = 0; R < P; ++R) {
        if (PC[R] == Ev[R].size())
          continue;
        const CommEvent &E = Ev[R][PC[R]];
        const Program &Prog = Programs[R];
        OS << LS << "rank " << R;
        if (E.Step >= 0) {
          const ProgramStep &St = Prog.Steps[E.Step];
          const ProgramTemplate &T = Prog.Templates[St.Template];
          OS << " in step " << E.Step << " (" << templateKindName(T.Kind);
          if (T.Chunk >= 0)
            OS << " of chunk " << T.Chunk << ", microbatch " << St.Microbatch;
          OS << ")";
        }
        OS << " at instruction " << E.Index << " (" << opName(E.I->Op);
        if (E.I->Op == OpKind::Recv)
          OS << " from rank " << attrInt(E.I->Op, E.I->Attrs, "peer")
             << ", tag " << E.Tag;
        OS << ")";
      }
      return createStringError(inconvertibleErrorCode(),
                               "pipeline schedule deadlocks: %s",
                               OS.str().c_str());
    }
  }
  // The first message never received, in (from, to, tag) order.
  std::optional<uint64_t> Lost;
  for (auto &[K, Count] : Inbox)
    if (Count && (!Lost || K < *Lost))
      Lost = K;
  if (Lost)
    return createStringError(
        inconvertibleErrorCode(),
        "pipeline schedule: rank %d sends tag %lld to rank %d, which never "
        "receives it",
        int(*Lost >> 48), (long long)(*Lost & 0xffffffff),
        int((*Lost >> 32) & 0xffff));
  return Error::success();
}

} // namespace sp
