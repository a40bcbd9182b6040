//===- AutoPlan.cpp - sp-compile --auto: the fastest plan that fits -------===//
#include "planner/AutoPlan.h"
#include "analysis/ModelInfo.h"
#include "driver/LowerTraining.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Parallel.h"
#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <set>

using namespace llvm;

namespace sp {

/// Bytes in GiB, or in MiB or KiB below one GiB.
static std::string gib(double Bytes) {
  const char *Units[] = {"B", "KiB", "MiB", "GiB"};
  int U = 0;
  while (Bytes >= 1024 && U < 3) {
    Bytes /= 1024;
    ++U;
  }
  return formatv("{0:F1} {1}", Bytes, Units[U]).str();
}

/// A level of recomputation, as printed: "full every K" for groups.
static std::string levelName(RecomputeMode M, int K) {
  std::string S = recomputeModeName(M).str();
  if (M == RecomputeMode::Full && K > 1)
    S += formatv(" every {0}", K).str();
  return S;
}

std::string AutoCandidate::rankLevel(int R) const {
  return levelName(RankModes[R], RankGroups.empty() ? 1 : RankGroups[R]);
}

std::string AutoCandidate::describe() const {
  std::string S = formatv("t {0}{1}, ", T, SP ? " SP" : "").str();
  if (Cp > 1)
    S += formatv("c {0}, ", Cp).str();
  S += formatv("p {0}", P).str();
  if (M > 1)
    S += formatv(" x m {0}", M).str();
  S += formatv(", d {0}{1}, {2} microbatch{3}, recompute {4}", D,
               Zero ? " ZeRO-1" : "", Microbatches,
               Microbatches == 1 ? "" : "es", Recompute)
           .str();
  if (FullEvery > 1)
    S += formatv(" every {0} layers", FullEvery).str();
  if (staged()) {
    // The runs of ranks whose mode is not the last rank's: "full on ranks
    // 0-1, selective on ranks 2-5 of 8".
    std::string Runs;
    int Last = RankModes.size() - 1;
    for (int A = 0, B; A <= Last; A = B) {
      for (B = A; B <= Last && rankLevel(B) == rankLevel(A);)
        ++B;
      if (rankLevel(A) == rankLevel(Last))
        continue;
      Runs += formatv("{0}{1} on rank{2} {3}{4}", Runs.empty() ? "" : ", ",
                      rankLevel(A), B - A > 1 ? "s" : "", A,
                      B - A > 1 ? formatv("-{0}", B - 1).str() : "")
                  .str();
    }
    S += formatv(" ({0} of {1})", Runs, P).str();
  }
  return S;
}

/// The pipeline rank of each layer of a compiled graph (where the passes
/// placed its forward nodes); empty when a layer has none.
static std::vector<int> layerRanks(const Graph &G, int P) {
  std::vector<int> Ranks;
  for (const Node &N : G.nodes()) {
    const Tags &T = N.tags();
    if (T.Layer < 0 || T.Ph != Phase::Forward)
      continue;
    if (T.Layer >= int(Ranks.size()))
      Ranks.resize(T.Layer + 1, -1);
    Ranks[T.Layer] = std::max(T.Stage, 0) % P;
  }
  if (llvm::is_contained(Ranks, -1))
    return {};
  return Ranks;
}

/// The model's facts, from the import clean-up and detection alone.
static Expected<ModelInfo> modelFacts(const Graph &G, const PassContext &Base) {
  std::unique_ptr<Graph> Copy = G.clone();
  PassContext Ctx = Base;
  CompileOptions CO;
  CO.Passes = "constant-fold,canonicalize,dce,detect-transformer";
  if (auto E = runPasses(*Copy, Ctx, CO))
    return E;
  return summarizeModel(*Copy);
}

/// The pass options of a layout: Base's, with the layout's parallelism and
/// recomputation.
PassContext layoutContext(const PassContext &Base, const AutoCandidate &C) {
  PassContext Ctx = Base;
  Ctx.TensorParallel = C.T;
  Ctx.SequenceParallel = C.SP;
  Ctx.TpCommOverlap = Base.TpCommOverlap && C.SP && C.T > 1;
  Ctx.DataParallel = C.D;
  Ctx.ContextParallel = C.Cp;
  Ctx.Zero = C.Zero;
  Ctx.Recompute = RecomputeOptions();
  Ctx.Recompute.LayerModes = C.LayerModes;
  Ctx.Recompute.LayerGroups = C.LayerGroups;
  Ctx.Recompute.Layers = C.FullEvery;
  // Selective recomputation is of the unfused core's scores; the rest use
  // the fused core unless Base asks for the unfused one.
  Ctx.FusedAttention = Base.FusedAttention && C.Recompute != "selective" &&
                       !is_contained(C.LayerModes, RecomputeMode::Selective);
  Ctx.Recompute.Mode = C.Recompute == "selective" ? RecomputeMode::Selective
                       : C.Recompute == "full"    ? RecomputeMode::Full
                                                  : RecomputeMode::None;
  Ctx.Pipeline = PipelineOptions();
  if (C.P > 1 || C.Microbatches > 1) {
    Ctx.Pipeline.Stages = C.P;
    Ctx.Pipeline.Interleave = C.M;
    Ctx.Pipeline.Microbatches = C.Microbatches;
    Ctx.Pipeline.Schedule = C.M > 1 ? PipelineSchedule::Interleaved
                                    : PipelineSchedule::OneFOneB;
  }
  return Ctx;
}

Expected<AutoResult> searchLayouts(const Graph &G, const PassContext &Base,
                                   const AutoOptions &O) {
  auto Start = std::chrono::steady_clock::now();
  if (O.Gpus < 1)
    return makeError("--auto needs --gpus N (N >= 1)");
  if (!(O.GpuMemory > 0))
    return makeError("--auto needs --gpu-memory BYTES (e.g. 80GiB)");
  auto Info = modelFacts(G, Base);
  if (!Info)
    return Info.takeError();
  int64_t B = Info->Batch; // the microbatch: the model's batch
  int64_t Global = O.GlobalBatch ? O.GlobalBatch : O.Gpus * B;
  if (B < 1)
    return makeError("the model's batch is not known; bind it with --batch");
  if (Global % B)
    return makeError(formatv("--global-batch {0} is not a multiple of the "
                             "model's batch {1} (the microbatch)",
                             Global, B));
  int Node = O.Cluster.GpusPerNode;
  AutoResult R;
  R.FusedAttention = Base.FusedAttention;
  // Bytes per parameter element of the model state on its rank: the f32
  // parameter, gradient and AdamW moments, and a 16-bit copy; with ZeRO-1
  // the gradient and moments are the replica's chunk.
  bool Half = Base.ActivationDtype != DType::F32;
  auto StateBytes = [&](int D, int Zero) {
    return 4.0 + (Half ? 2 : 0) + (Zero ? 12.0 / D : 12.0);
  };
  // The layouts to compile, and those whose parameters and optimizer state
  // alone exceed the memory (with that floor).
  std::vector<AutoCandidate> Todo;
  std::vector<std::pair<double, AutoCandidate>> Pruned;
  std::vector<int> NotHeads;
  std::map<int, std::vector<std::pair<int, int>>> Unsplit; // d -> (t, p)
  for (int T = 1; T <= std::min(Node, O.Gpus); ++T) {
    if (O.Gpus % T)
      continue;
    if (Info->Heads % T || (Info->KvHeads && Info->KvHeads % T)) {
      NotHeads.push_back(T);
      continue;
    }
    for (int P = 1; P <= O.Gpus / T; ++P) {
      if ((O.Gpus / T) % P || P > Info->Layers)
        continue;
      for (int Cp = 1; Cp <= O.Gpus / (T * P); ++Cp) {
        // Context parallelism: long sequences only, the fused core, each
        // rank's positions two zigzag chunks (split again over t with SP).
        if ((O.Gpus / (T * P)) % Cp ||
            (Cp > 1 && (Info->Seq < ContextMinSeq || !Base.FusedAttention ||
                        Info->Seq % (2 * Cp))))
          continue;
        int D = O.Gpus / (T * P * Cp);
        if (Global % (int64_t(D) * B)) {
          Unsplit[D].push_back({T, P});
          continue;
        }
        int N = int(Global / (int64_t(D) * B));
        for (int Zero : {0, 1}) {
          if (Zero && D * Cp == 1)
            continue;
          double Floor =
              double(Info->Params) * StateBytes(D * Cp, Zero) / (T * P);
          bool Over = Floor > O.GpuMemory;
          if (Over)
            R.Rejected.push_back(formatv(
                "t {0} x p {1} (c {5}, d {2}{3}): the parameters and optimizer "
                "state alone need at least {4} per GPU",
                T, P, D, Zero ? ", ZeRO-1" : "", gib(Floor), Cp));
          for (int M = 1; M <= 4; ++M) {
            if (M > 1 && (P == 1 || P * M > Info->Layers || N % P))
              continue;
            for (bool SP : {true, false}) {
              if (SP && T == 1)
                continue;
              if (SP && Cp > 1 && (Info->Seq / Cp) % T)
                continue;
              for (const char *Rc : {"none", "selective", "full"}) {
                if (Cp > 1 && StringRef(Rc) == "selective")
                  continue; // the unfused core's
                AutoCandidate C;
                C.T = T, C.P = P, C.M = M, C.D = D, C.Microbatches = N;
                C.Zero = Zero, C.SP = SP, C.Recompute = Rc, C.Cp = Cp;
                if (Over)
                  Pruned.push_back({Floor, C});
                else
                  Todo.push_back(C);
              }
            }
          }
        }
      }
    }
  }
  for (auto &[D, Layouts] : Unsplit) {
    std::string List;
    for (auto [T, P] : Layouts)
      List += formatv("{0}t {1} x p {2}", List.empty() ? "" : ", ", T, P).str();
    R.Rejected.push_back(formatv("d {0} ({1}): the global batch {2} is not a "
                                 "multiple of d x {3} (the model's batch)",
                                 D, List, Global, B));
  }
  if (!NotHeads.empty()) {
    std::string List;
    for (int T : NotHeads)
      List += (List.empty() ? "" : ", ") + std::to_string(T);
    R.Rejected.push_back(formatv("t {0}: do not divide the {1} heads{2}", List,
                                 Info->Heads,
                                 Info->KvHeads && Info->KvHeads != Info->Heads
                                     ? formatv(" and {0} key/value heads",
                                               Info->KvHeads)
                                           .str()
                                     : std::string()));
  }
  if (O.Gpus > Node)
    R.Rejected.push_back(formatv("t > {0}: a tensor group would cross nodes "
                                 "({0} GPUs per node)",
                                 Node));
  // Compile each: exact memory, and the cost model on the programs. The
  // families below are independent: they compile concurrently, each into
  // its own Outcome, merged in the families' order so that the result
  // (the tables, their order, the counts) is the serial search's.
  const AutoCandidate *Smallest = nullptr;
  std::vector<AutoCandidate> &TooBig = R.TooBig;
  // Each round's outcomes are merged in a fixed order: Round (0 the
  // families, 1 the stage-aware members, 2 the last resort) and Index
  // within it.
  struct Outcome {
    int Round = 0;
    size_t Index = 0;
    std::vector<AutoCandidate> Fits, TooBig;
    std::vector<std::string> Rejected;
    int Compiled = 0, Skipped = 0;
  };
  // The fastest fit so far, compiled: its graph, options and programs, kept
  // so that the answer is not compiled again (only its reports are made).
  // Ties go to the earlier fit in the merged order, as the final stable
  // sort breaks them, so the kept one is R.Fits.front() however the
  // threads ran.
  using FitKey = std::tuple<double, int, size_t, size_t>;
  struct Kept {
    FitKey Key;
    std::unique_ptr<Graph> G;
    PassContext Ctx;
    Compilation Comp;
  };
  std::optional<Kept> Fastest;
  std::mutex FastestMutex;
  auto Merge = [&](Outcome &Out) {
    append_range(R.Fits, Out.Fits);
    append_range(TooBig, Out.TooBig);
    append_range(R.Rejected, Out.Rejected);
    R.Compiled += Out.Compiled;
    R.Skipped += Out.Skipped;
  };
  // The passes no layout option changes run once; each layout compiles a
  // copy of their result (as DefaultPasses would: they are its first part).
  assert(StringRef(DefaultPasses) ==
             (Twine(LayoutFreePasses) + "," + LayoutPasses).str() &&
         "DefaultPasses is LayoutFreePasses then LayoutPasses");
  std::unique_ptr<Graph> Prepared = G.clone();
  {
    PassContext Ctx = Base;
    CompileOptions CO;
    CO.Passes = LayoutFreePasses;
    CO.Source = O.Source;
    if (auto E = runPasses(*Prepared, Ctx, CO))
      return E;
  }
  // Compiles C; its peak, or -1 when it does not compile.
  auto Try = [&](AutoCandidate C, Outcome &Out) -> int64_t {
    std::unique_ptr<Graph> Copy = Prepared->clone();
    PassContext Ctx = layoutContext(Base, C);
    // Layouts compile concurrently, and their remarks would interleave.
    Ctx.Remarks = nullptr;
    CompileOptions CO;
    CO.Passes = LayoutPasses;
    CO.Source = O.Source;
    CO.PlanOnly = true;
    auto Comp = compileToPlan(*Copy, Ctx, CO);
    ++Out.Compiled;
    if (!Comp) {
      std::string Why = toString(Comp.takeError());
      Out.Rejected.push_back(C.describe() + ": " +
                             StringRef(Why).split('\n').first.str());
      return -1;
    }
    if (!Comp->P) {
      Out.Rejected.push_back(C.describe() + ": the passes made no training "
                                            "graph");
      return -1;
    }
    if (C.P > 1)
      C.LayerRanks = layerRanks(*Copy, C.P);
    for (int K = 0; K < Comp->P->numStages(); ++K) {
      C.RankBytes.push_back(Comp->P->stage(K).ArenaBytes);
      C.PersistentBytes =
          std::max(C.PersistentBytes, Comp->P->stage(K).PersistentBytes);
      C.PeakBytes = std::max(C.PeakBytes, C.RankBytes.back());
    }
    auto E = estimatePlan(O.Cluster, Ctx, *Comp->P);
    if (!E) {
      Out.Rejected.push_back(C.describe() + ": " + toString(E.takeError()));
      return -1;
    }
    C.Step = *E;
    if (double(C.PeakBytes) > O.GpuMemory) {
      Out.TooBig.push_back(C);
      return C.PeakBytes;
    }
    FitKey Key{C.Step.Seconds, Out.Round, Out.Index, Out.Fits.size()};
    Out.Fits.push_back(C);
    std::lock_guard<std::mutex> Lock(FastestMutex);
    if (!Fastest || Key < Fastest->Key)
      Fastest = Kept{Key, std::move(Copy), Ctx, std::move(*Comp)};
    return C.PeakBytes;
  };
  // Full recomputation of groups of K layers stores only each group's
  // input (and, while a group's backward runs, its activations): the last
  // resort of a family whose smallest member, Least, does not fit. The
  // fewest K that fits (K = 2, 4, 8; a stage holds whole groups); 0 when
  // none does.
  auto TryGroups = [&](const AutoCandidate &Least, Outcome &Out) {
    // Grouping changes only the temporaries: a rank whose persistent region
    // alone exceeds the memory stays over it.
    if (double(Least.PersistentBytes) > O.GpuMemory)
      return 0;
    int PerStage = Info->Layers / (Least.P * Least.M);
    for (int K = 2; K <= std::min(PerStage, 8); K *= 2) {
      AutoCandidate C = Least;
      C.FullEvery = K;
      int64_t Peak = Try(C, Out);
      if (Peak >= 0 && double(Peak) <= O.GpuMemory)
        return K;
    }
    return 0;
  };
  // A family (t, p, m, d, ZeRO) is tried with its smallest member first:
  // SP (when t > 1) and full recomputation store the least. When that does
  // not fit, no other member does, and they are not compiled.
  using FamilyKey = std::tuple<int, int, int, int, int, int>;
  std::map<FamilyKey, std::vector<AutoCandidate>> Families;
  for (const AutoCandidate &C : Todo)
    Families[{C.T, C.P, C.M, C.D, C.Zero, C.Cp}].push_back(C);
  std::vector<std::vector<AutoCandidate> *> Order;
  for (auto &Family : Families)
    Order.push_back(&Family.second);
  std::vector<Outcome> Outcomes(Order.size());
  parallelForEachN(0, Order.size(), [&](size_t F) {
    std::vector<AutoCandidate> &Members = *Order[F];
    Outcome &Out = Outcomes[F];
    Out.Index = F;
    auto Least = std::find_if(Members.begin(), Members.end(),
                              [](const AutoCandidate &C) {
                                return C.SP == (C.T > 1) &&
                                       C.Recompute == "full";
                              });
    if (Least != Members.end()) {
      Try(*Least, Out);
      if (!Out.TooBig.empty()) {
        int Skipped = Members.size() - 1;
        // When groups fit a pipeline, the members storing more are the
        // lower levels of stage-aware members (below): they are compiled,
        // not to fit (they do not), for their step and ranks' arenas.
        if (TryGroups(*Least, Out) && Least->P > 1)
          for (const AutoCandidate &C : Members)
            if (C.SP == (C.T > 1) &&
                (C.Recompute == "none" ||
                 (C.Recompute == "selective" && !Base.FusedAttention))) {
              Try(C, Out);
              --Skipped;
            }
        Out.Skipped += Skipped;
        return;
      }
      Members.erase(Least);
    }
    for (const AutoCandidate &C : Members)
      Try(C, Out);
  });
  for (Outcome &Out : Outcomes)
    Merge(Out);
  // Stage-aware recomputation (the paper's Section 7). The first pipeline
  // ranks hold the most microbatches, so uniform recomputation wastes FLOPs
  // on the later ones. The levels store less from one to the next: none,
  // the paper's selective (with the unfused core: with the fused one, a
  // selective layer would make every layer unfused), full. For a pipelined
  // family whose uniform member at a lower level does not fit and at an
  // upper one does: the upper level on ranks 0 .. k - 1 and the lower on
  // the rest, the fewest k that fit by bisection (more ranks recomputing
  // never raises the peak); and each rank at the cheapest level whose
  // uniform member fits on that rank (the ranks' arenas are known from the
  // uniform compiles). Such a member does at least its lower member's work,
  // so a lower member no faster than the fastest fit of the first round is
  // not tried: it cannot give the answer. Where only groups of K layers fit
  // (the last resort above), full recomputation in groups of K is the
  // family's top level, and the lower levels pair with it (full with it
  // would recompute as much as the uniform groups). The families run
  // concurrently.
  double FastestSeconds = std::numeric_limits<double>::infinity();
  for (const AutoCandidate &C : R.Fits)
    FastestSeconds = std::min(FastestSeconds, C.Step.Seconds);
  struct Level {
    RecomputeMode Mode;
    int K = 1; // full recomputation of groups of K layers
  };
  SmallVector<Level, 4> BaseLevels = {{RecomputeMode::None}};
  if (!Base.FusedAttention)
    BaseLevels.push_back({RecomputeMode::Selective});
  BaseLevels.push_back({RecomputeMode::Full});
  // A family's stage-aware work: Lower's level on the last ranks and Upper
  // on the first k, k by bisection; or, with PerRank, each rank's level;
  // of the family's Levels.
  struct StagedWork {
    AutoCandidate Lower;
    size_t Rest = 0, Upper = 0;
    std::vector<size_t> PerRank;
    SmallVector<Level, 4> Levels;
  };
  std::vector<StagedWork> Work;
  for (auto &Family : Families) {
    const FamilyKey &Key = Family.first;
    int P = std::get<1>(Key);
    if (P < 2)
      continue;
    // The family's levels: the base ones, and the groups of layers that
    // fit when nothing else of the family does.
    SmallVector<Level, 4> Levels = BaseLevels;
    auto Ours = [&](const AutoCandidate &C) {
      return std::make_tuple(C.T, C.P, C.M, C.D, C.Zero, C.Cp) == Key &&
             C.SP == (C.T > 1) && !C.staged();
    };
    for (const AutoCandidate &C : R.Fits)
      if (Ours(C) && C.FullEvery > 1)
        Levels.push_back({RecomputeMode::Full, C.FullEvery});
    // The family's uniform member at each level, as compiled.
    std::vector<const AutoCandidate *> Uniform(Levels.size(), nullptr);
    for (const auto *List : {&R.Fits, &TooBig})
      for (const AutoCandidate &C : *List)
        for (size_t L = 0; L < Levels.size(); ++L)
          if (Ours(C) && C.Recompute == recomputeModeName(Levels[L].Mode) &&
              C.FullEvery == Levels[L].K)
            Uniform[L] = &C;
    auto Fits = [&](size_t L) {
      return Uniform[L] && double(Uniform[L]->PeakBytes) <= O.GpuMemory;
    };
    auto Lowers = [&](size_t L) {
      return Uniform[L] && !Fits(L) &&
             Uniform[L]->Step.Seconds < FastestSeconds &&
             !Uniform[L]->LayerRanks.empty();
    };
    SmallVector<std::pair<size_t, size_t>, 3> Pairs; // (lower, upper)
    for (size_t Lo = 0; Lo < Levels.size(); ++Lo)
      for (size_t Up = Lo + 1; Up < Levels.size() && Lowers(Lo) &&
                               Levels[Lo].Mode != RecomputeMode::Full;
           ++Up)
        if (Fits(Up)) {
          Work.push_back({*Uniform[Lo], Lo, Up, {}, Levels});
          Pairs.push_back({Lo, Up});
        }
    if (!Lowers(0))
      continue;
    std::vector<size_t> PerRank;
    for (int Rank = 0; Rank < P; ++Rank) {
      size_t L = 0;
      while (L < Levels.size() &&
             (!Uniform[L] || int(Uniform[L]->RankBytes.size()) <= Rank ||
              double(Uniform[L]->RankBytes[Rank]) > O.GpuMemory))
        ++L;
      if (L == Levels.size())
        break; // no level fits this rank
      PerRank.push_back(L);
    }
    // An upper level on the first ranks and a lower one on the rest is what
    // the bisection of that pair finds.
    bool Bisected =
        is_sorted(PerRank, std::greater<size_t>()) &&
        std::set<size_t>(PerRank.begin(), PerRank.end()).size() == 2 &&
        is_contained(Pairs, std::make_pair(PerRank.back(), PerRank.front()));
    // Where every rank recomputes fully (with or without groups), the
    // member recomputes as much as the uniform ones.
    bool Saves = any_of(PerRank, [&](size_t L) {
      return Levels[L].Mode != RecomputeMode::Full;
    });
    if (int(PerRank.size()) == P && !is_splat(PerRank) && !Bisected && Saves &&
        !Uniform[PerRank.back()]->LayerRanks.empty())
      Work.push_back(
          {*Uniform[PerRank.back()], PerRank.back(), 0, PerRank, Levels});
  }
  std::vector<Outcome> Staged(Work.size());
  parallelForEachN(0, Work.size(), [&](size_t F) {
    const StagedWork &W = Work[F];
    Outcome &Out = Staged[F];
    Out.Round = 1, Out.Index = F;
    // The member whose rank R takes level Level(R); its layers are placed
    // as in the lower member (the partition then moves them).
    auto Member = [&](function_ref<size_t(int)> Level) {
      AutoCandidate C = W.Lower;
      C.PeakBytes = 0;
      C.RankBytes.clear();
      C.FullEvery = 1; // the groups are per layer
      for (int Rank = 0; Rank < C.P; ++Rank) {
        C.RankModes.push_back(W.Levels[Level(Rank)].Mode);
        C.RankGroups.push_back(W.Levels[Level(Rank)].K);
      }
      for (int Rank : W.Lower.LayerRanks) {
        C.LayerModes.push_back(C.RankModes[Rank]);
        C.LayerGroups.push_back(C.RankGroups[Rank]);
      }
      if (all_of(C.RankGroups, [](int K) { return K == 1; }))
        C.RankGroups.clear(), C.LayerGroups.clear();
      return C;
    };
    if (!W.PerRank.empty()) {
      Try(Member([&](int Rank) { return W.PerRank[Rank]; }), Out);
      return;
    }
    auto Staging = [&](int K) {
      return Member([&](int Rank) { return Rank < K ? W.Upper : W.Rest; });
    };
    // With the layers placed alike, recomputing on more ranks never
    // shortens the simulated step (every step's cost only grows). So the
    // member recomputing on rank 0 alone is tried first: when it fits, it is
    // the fewest k; when it is no faster than the first round's fastest
    // fit, no k gives the answer, and none is tried.
    int64_t OnePeak = Try(Staging(1), Out);
    if (OnePeak < 0 || double(OnePeak) <= O.GpuMemory ||
        Out.TooBig.back().Step.Seconds >= FastestSeconds)
      return;
    int Lo = 2, Hi = W.Lower.P - 1;
    if (Lo > Hi)
      return;
    int64_t HiPeak = Try(Staging(Hi), Out);
    if (HiPeak < 0 || double(HiPeak) > O.GpuMemory)
      return;
    while (Lo < Hi) {
      int Mid = (Lo + Hi) / 2;
      int64_t Peak = Try(Staging(Mid), Out);
      if (Peak >= 0 && double(Peak) <= O.GpuMemory)
        Hi = Mid;
      else
        Lo = Mid + 1;
    }
  });
  for (Outcome &Out : Staged)
    Merge(Out);
  // Nothing fit and nothing was small enough to compile: compile the
  // layouts of the smallest floor, to name the memory they need.
  if (R.Fits.empty() && TooBig.empty() && !Pruned.empty()) {
    double Least = std::min_element(Pruned.begin(), Pruned.end(),
                                    [](const auto &A, const auto &B) {
                                      return A.first < B.first;
                                    })
                       ->first;
    Outcome Out;
    Out.Round = 2;
    for (auto &[Floor, C] : Pruned)
      if (Floor == Least) {
        Try(C, Out);
        if (C.SP == (C.T > 1) && C.Recompute == "full")
          TryGroups(C, Out);
      }
    Merge(Out);
  }
  for (const AutoCandidate &C : TooBig)
    if (!Smallest || C.PeakBytes < Smallest->PeakBytes)
      Smallest = &C;
  // The layouts that compiled but do not fit, grouped by (t, c, p, m, d)
  // where none of the group fits: the smallest peak of each.
  using Key = std::tuple<int, int, int, int, int>;
  std::map<Key, const AutoCandidate *> Groups;
  for (const AutoCandidate &C : TooBig) {
    auto &Best = Groups[{C.T, C.Cp, C.P, C.M, C.D}];
    if (!Best || C.PeakBytes < Best->PeakBytes)
      Best = &C;
  }
  for (const AutoCandidate &C : R.Fits)
    Groups.erase(Key{C.T, C.Cp, C.P, C.M, C.D});
  for (auto &[K, C] : Groups)
    R.Rejected.push_back(formatv(
        "t {0}, {6}p {1}{2}, d {3}: the largest rank "
        "needs at least {4} (as {5})",
        C->T, C->P, C->M > 1 ? formatv(" x m {0}", C->M).str() : std::string(),
        C->D, gib(C->PeakBytes), C->describe(),
        C->Cp > 1 ? formatv("c {0}, ", C->Cp).str() : std::string()));
  std::stable_sort(R.Fits.begin(), R.Fits.end(),
                   [](const AutoCandidate &A, const AutoCandidate &B) {
                     return A.Step.Seconds < B.Step.Seconds;
                   });
  if (!R.Fits.empty()) {
    // The best, with the reports and chart sp-compile makes of a plan: what
    // it prints and writes. Its compilation was kept, unless remarks were
    // asked for (the search compiles without them): then it is compiled
    // again, as sp-compile compiles a plan.
    CompileOptions CO;
    CO.Source = O.Source;
    assert(Fastest &&
           Fastest->Key == std::make_tuple(R.Fits.front().Step.Seconds,
                                           std::get<1>(Fastest->Key),
                                           std::get<2>(Fastest->Key),
                                           std::get<3>(Fastest->Key)) &&
           "the kept compilation is the fastest fit's");
    if (Base.Remarks) {
      R.BestGraph = G.clone();
      PassContext Ctx = layoutContext(Base, R.Fits.front());
      auto Comp = compileToPlan(*R.BestGraph, Ctx, CO);
      if (!Comp)
        return Comp.takeError();
      R.Best = std::move(*Comp);
    } else {
      if (auto E = finishPlan(*Fastest->G, Fastest->Ctx, CO, Fastest->Comp))
        return E;
      R.BestGraph = std::move(Fastest->G);
      R.Best = std::move(Fastest->Comp);
    }
  }
  R.Seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                            Start)
                  .count();
  if (R.Fits.empty()) {
    std::string Need =
        Smallest ? formatv("the smallest compiled layout needs {0} per GPU "
                           "({1})",
                           gib(Smallest->PeakBytes), Smallest->describe())
                       .str()
                 : "no layout compiled";
    return makeError(formatv("no layout of this model on {0} GPUs fits {1} "
                             "per GPU (global batch {2}): {3}",
                             O.Gpus, gib(O.GpuMemory), Global, Need));
  }
  return R;
}

/// What, besides the GEMMs, takes the most time in a step.
static std::string boundBy(const AutoCandidate &C, double Memory) {
  const StepEstimate &E = C.Step;
  double Bubble = E.PipelineSeconds * E.BubbleFraction / (1 + E.BubbleFraction);
  std::pair<double, const char *> Parts[] = {
      {Bubble, "pipeline bubble"},
      {E.TensorCommSeconds, "tensor collectives"},
      {E.MemoryBoundSeconds, "memory-bound ops"},
      {E.DataParallelSeconds, "data-parallel sum"},
      {E.OptimizerSeconds, "optimizer"}};
  auto Max = std::max_element(
      std::begin(Parts), std::end(Parts),
      [](const auto &A, const auto &B) { return A.first < B.first; });
  std::string S = formatv("{0} {1:F1}%", Max->second,
                          100 * Max->first / E.Seconds)
                      .str();
  if (double(C.PeakBytes) > 0.95 * Memory)
    S = "memory; " + S;
  return S;
}

void printSearch(const AutoResult &R, const AutoOptions &O, raw_ostream &OS) {
  OS << formatv("auto: {0} GPUs of {1} ({2} per GPU); {3} layouts compiled "
                "in {4:F1} s ({5} more skipped: their family's smallest did "
                "not fit), {6} fit\n",
                O.Gpus, O.Cluster.Name, gib(O.GpuMemory), R.Compiled,
                R.Seconds, R.Skipped, R.Fits.size());
  OS << (R.FusedAttention
             ? "attention core: fused where nothing recomputes it "
               "selectively (--attention unfused searches the unfused core, "
               "which the CUDA backend runs)\n"
             : "attention core: unfused (--attention unfused)\n");
  OS << formatv("{0,4}  {1,-64} {2,10} {3,6} {4,10}  {5}\n", "rank", "layout",
                "step", "MFU", "memory", "beyond the GEMMs");
  for (size_t K = 0; K < R.Fits.size() && int(K) < O.Top; ++K) {
    const AutoCandidate &C = R.Fits[K];
    OS << formatv("{0,4}  {1,-64} {2,8:F3} s {3,5:F1}% {4,10}  {5}\n", K + 1,
                  C.describe(), C.Step.Seconds, 100 * C.Step.Mfu,
                  gib(C.PeakBytes), boundBy(C, O.GpuMemory));
  }
  if (int(R.Fits.size()) > O.Top)
    OS << formatv("  ... and {0} more that fit\n", R.Fits.size() - O.Top);
  if (!R.Rejected.empty()) {
    OS << "not taken:\n";
    for (const std::string &Line : R.Rejected)
      OS << "  " << Line << "\n";
  }
  OS << "best: " << R.Fits.front().describe() << "\n";
}

nlohmann::json searchToJson(const AutoResult &R, const AutoOptions &O) {
  nlohmann::json Fits = nlohmann::json::array();
  for (const AutoCandidate &C : R.Fits) {
    // Each pipeline rank's recomputation (empty: uniform).
    nlohmann::json RankModes = nlohmann::json::array();
    for (size_t R = 0; R < C.RankModes.size(); ++R)
      RankModes.push_back(C.rankLevel(R));
    Fits.push_back({{"layout", C.describe()},
                    {"tp", C.T},
                    {"sp", C.SP},
                    {"pp", C.P},
                    {"interleave", C.M},
                    {"dp", C.D},
                    {"cp", C.Cp},
                    {"zero", C.Zero},
                    {"microbatches", C.Microbatches},
                    {"recompute", C.Recompute},
                    {"full_every", C.FullEvery},
                    {"rank_recompute", RankModes},
                    {"fused_attention",
                     R.FusedAttention && C.Recompute != "selective" &&
                         !is_contained(C.RankModes, RecomputeMode::Selective)},
                    {"peak_bytes", C.PeakBytes},
                    {"step_seconds", C.Step.Seconds},
                    {"mfu", C.Step.Mfu},
                    {"bubble", C.Step.BubbleFraction}});
  }
  // The compiled layouts that need more than the memory.
  nlohmann::json Over = nlohmann::json::array();
  for (const AutoCandidate &C : R.TooBig)
    Over.push_back({{"layout", C.describe()},
                    {"peak_bytes", C.PeakBytes},
                    {"step_seconds", C.Step.Seconds}});
  return {{"gpus", O.Gpus},
          {"attention", R.FusedAttention ? "fused" : "unfused"},
          {"gpu_memory_bytes", O.GpuMemory},
          {"cluster", O.Cluster.Name},
          {"compiled", R.Compiled},
          {"skipped", R.Skipped},
          {"seconds", R.Seconds},
          {"fits", Fits},
          {"too_big", Over},
          {"rejected", R.Rejected}};
}

} // namespace sp
