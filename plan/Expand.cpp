//===- Expand.cpp - A compact program's steps written out ------------------===//
#include "plan/Program.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>
#include <map>
#include <queue>

using namespace llvm;

namespace sp {

static Error expandError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(),
                           "compact program: " + Msg);
}

namespace {
/// A buffer (or instance) live over instructions [From, Until] in bytes
/// [Begin, End).
struct Live {
  int64_t Begin, End;
  int From, Until;
  int Id;
};
} // namespace

/// Fails when two of All share a byte while both live; Name(Id) names one.
static Error checkDisjoint(std::vector<Live> &All,
                           function_ref<std::string(int)> Name) {
  llvm::stable_sort(All, [](const Live &A, const Live &B) {
    return A.From < B.From;
  });
  // The live buffers by offset (disjoint), and when each dies.
  std::map<int64_t, const Live *> ByOffset;
  using Death = std::pair<int, int64_t>; // (last use, offset)
  std::priority_queue<Death, std::vector<Death>, std::greater<Death>> Deaths;
  auto Clash = [&](const Live &A, const Live &B) {
    return expandError(formatv(
        "buffers '{0}' and '{1}' are live together (instructions {2}-{3} and "
        "{4}-{5}) but share bytes {6}-{7}; the plan is corrupt",
        Name(A.Id), Name(B.Id), A.From, A.Until, B.From, B.Until,
        std::max(A.Begin, B.Begin), std::min(A.End, B.End)));
  };
  for (const Live &L : All) {
    while (!Deaths.empty() && Deaths.top().first < L.From) {
      ByOffset.erase(Deaths.top().second);
      Deaths.pop();
    }
    auto Next = ByOffset.lower_bound(L.Begin);
    if (Next != ByOffset.end() && Next->second->Begin < L.End)
      return Clash(*Next->second, L);
    if (Next != ByOffset.begin() && std::prev(Next)->second->End > L.Begin)
      return Clash(*std::prev(Next)->second, L);
    ByOffset[L.Begin] = &L;
    Deaths.push({L.Until, L.Begin});
  }
  return Error::success();
}

Error checkNoOverlap(const Program &P) {
  int End = P.Instrs.size();
  std::vector<Live> All;
  for (size_t Id = 0; Id < P.Buffers.size(); ++Id) {
    const ProgramBuffer &B = P.Buffers[Id];
    bool Temp = B.K == ProgramBuffer::Temp;
    All.push_back({B.Offset, B.Offset + std::max<int64_t>(B.Bytes, 1),
                   Temp ? B.Def : 0, Temp ? B.LastUse : End, int(Id)});
  }
  return checkDisjoint(All, [&](int Id) { return P.Buffers[Id].Name; });
}

Error checkCompactProgram(const Program &C) {
  int NumInstrs = C.Instrs.size(), At = 0;
  int Regions = C.Slots.size(), Chunks = 0;
  for (const ProgramTemplate &T : C.Templates)
    Chunks = std::max(Chunks, T.Chunk + 1);
  std::vector<int> StepTemplate(C.Buffers.size(), -1);
  if (C.Microbatches < 1 || C.TagStride < 1)
    return expandError("microbatches and tag stride must be positive");
  for (size_t T = 0; T < C.Templates.size(); ++T) {
    const ProgramTemplate &Tp = C.Templates[T];
    if (Tp.Begin != At || Tp.End < Tp.Begin || Tp.End > NumInstrs)
      return expandError(formatv("template {0} covers instructions {1}-{2}, "
                                 "not the next ones from {3}",
                                 T, Tp.Begin, Tp.End, At));
    At = Tp.End;
    bool PerMicrobatch = Tp.Kind != TemplateKind::Prologue &&
                         Tp.Kind != TemplateKind::Epilogue;
    if (PerMicrobatch ? Tp.Chunk < 0 || Tp.Chunk >= Chunks : Tp.Chunk != -1)
      return expandError(formatv("template {0} ({1}) has chunk {2} of {3}", T,
                                 templateKindName(Tp.Kind), Tp.Chunk, Chunks));
    for (int I = Tp.Begin; I < Tp.End; ++I) {
      if (C.Instrs[I].Beside >= Tp.End)
        return expandError(formatv("instruction {0} runs beside instruction "
                                   "{1}, outside its template",
                                   I, C.Instrs[I].Beside));
      for (const auto *Ids : {&C.Instrs[I].In, &C.Instrs[I].Out})
        for (int Id : *Ids) {
          const ProgramBuffer &B = C.Buffers[Id];
          if ((B.Scope == BufferScope::Slot &&
               (B.Region < 0 || B.Region >= Regions ||
                C.Slots[B.Region].Chunk != Tp.Chunk)) ||
              (!PerMicrobatch && B.Scope == BufferScope::Microbatch))
            return expandError(formatv("template {0} ({1}) uses buffer '{2}' "
                                       "of another chunk or microbatch",
                                       T, templateKindName(Tp.Kind), B.Name));
          if (B.Scope == BufferScope::Step) {
            if (StepTemplate[Id] >= 0 && StepTemplate[Id] != int(T))
              return expandError(formatv("step buffer '{0}' is used by "
                                         "templates {1} and {2}",
                                         B.Name, StepTemplate[Id], T));
            StepTemplate[Id] = T;
          }
        }
    }
  }
  if (At != NumInstrs)
    return expandError("instructions after the last template");
  for (size_t Id = 0; Id < C.Buffers.size(); ++Id) {
    const ProgramBuffer &B = C.Buffers[Id];
    bool Ok = true;
    switch (B.Scope) {
    case BufferScope::Whole:
      break;
    case BufferScope::Step:
      Ok = B.K == ProgramBuffer::Temp;
      break;
    case BufferScope::Slot: {
      Ok = B.K == ProgramBuffer::Temp && B.Region >= 0 && B.Region < Regions;
      if (Ok) {
        const SlotRegion &S = C.Slots[B.Region];
        int64_t All;
        Ok = S.Count >= 1 && B.Offset + B.Bytes <= S.Stride &&
             !__builtin_mul_overflow(S.Stride, int64_t(S.Count), &All) &&
             All <= C.ArenaBytes - S.Offset;
      }
      break;
    }
    case BufferScope::Microbatch: {
      int64_t Last;
      Ok = B.K == ProgramBuffer::Input && B.Stride >= B.Bytes &&
           !__builtin_mul_overflow(B.Stride, int64_t(C.Microbatches - 1),
                                   &Last) &&
           Last <= C.PersistentBytes - B.Offset - B.Bytes;
      break;
    }
    }
    if (!Ok)
      return expandError(formatv("buffer '{0}' has a scope its kind, chunk or "
                                 "place does not allow",
                                 B.Name));
  }
  for (size_t K = 0; K < C.Steps.size(); ++K) {
    const ProgramStep &S = C.Steps[K];
    if (S.Template < 0 || S.Template >= int(C.Templates.size()))
      return expandError(formatv("step {0} runs template {1} of {2}", K,
                                 S.Template, C.Templates.size()));
    const ProgramTemplate &Tp = C.Templates[S.Template];
    bool Once = Tp.Chunk < 0;
    if (Once ? S.Microbatch != -1
             : S.Microbatch < 0 || S.Microbatch >= C.Microbatches)
      return expandError(formatv("step {0} ({1}) has microbatch {2} of {3}", K,
                                 templateKindName(Tp.Kind), S.Microbatch,
                                 C.Microbatches));
  }
  for (const SlotRegion &R : C.Slots)
    if (R.Chunk < 0 || R.Chunk >= Chunks)
      return expandError(formatv("a slot region of chunk {0} of {1}", R.Chunk,
                                 Chunks));
  return Error::success();
}

Expected<SlotAssignment> assignSlots(const Program &C, bool CheckCounts) {
  int Regions = C.Slots.size();
  // The regions each template uses.
  std::vector<SmallVector<int, 3>> Uses(C.Templates.size());
  for (size_t T = 0; T < C.Templates.size(); ++T)
    for (int I = C.Templates[T].Begin; I < C.Templates[T].End; ++I)
      for (const auto *Ids : {&C.Instrs[I].In, &C.Instrs[I].Out})
        for (int Id : *Ids)
          if (C.Buffers[Id].Scope == BufferScope::Slot &&
              !is_contained(Uses[T], C.Buffers[Id].Region))
            Uses[T].push_back(C.Buffers[Id].Region);
  // Per (region, microbatch) a step uses: its last step, and the slot it
  // holds (-1: none).
  auto At = [&](int R, size_t K) {
    return uint64_t(uint32_t(R)) << 32 | uint32_t(C.Steps[K].Microbatch);
  };
  DenseMap<uint64_t, int> Last, Held;
  for (size_t K = 0; K < C.Steps.size(); ++K)
    for (int R : Uses[C.Steps[K].Template])
      Last[At(R, K)] = K;
  SlotAssignment A;
  A.Slot.resize(C.Steps.size());
  A.Counts.assign(Regions, 0);
  std::vector<std::vector<bool>> Busy(Regions);
  for (size_t K = 0; K < C.Steps.size(); ++K) {
    for (int R : Uses[C.Steps[K].Template]) {
      auto [It, New] = Held.try_emplace(At(R, K), -1);
      int &Slot = It->second;
      if (New) {
        std::vector<bool> &B = Busy[R];
        int Free = std::find(B.begin(), B.end(), false) - B.begin();
        if (Free == int(B.size()))
          B.push_back(false);
        B[Free] = true;
        Slot = Free;
        A.Counts[R] = std::max<int>(A.Counts[R], B.size());
        if (CheckCounts && Free >= C.Slots[R].Count)
          return expandError(formatv("step {0} needs slot {1} of region {2}, "
                                     "which has {3}",
                                     K, Free, R, C.Slots[R].Count));
      }
      A.Slot[K].push_back({R, Slot});
    }
    for (int R : Uses[C.Steps[K].Template])
      if (Last[At(R, K)] == int(K)) {
        auto It = Held.find(At(R, K));
        Busy[R][It->second] = false;
        Held.erase(It);
      }
  }
  return A;
}

void setUseRanges(Program &P, function_ref<bool(const ProgramBuffer &)> Pick) {
  int End = P.Instrs.size();
  auto Picked = [&](const ProgramBuffer &B) {
    return B.K == ProgramBuffer::Temp && Pick(B);
  };
  for (ProgramBuffer &B : P.Buffers)
    if (Picked(B))
      B.Def = B.LastUse = -1;
  for (int I = 0; I < End; ++I) {
    const Instruction &X = P.Instrs[I];
    int Until = std::max(I, X.Beside);
    for (const auto *Ids : {&X.In, &X.Out})
      for (int Id : *Ids) {
        ProgramBuffer &B = P.Buffers[Id];
        if (!Picked(B))
          continue;
        if (B.Def < 0)
          B.Def = I;
        B.LastUse = std::max(B.LastUse, Until);
      }
  }
  for (size_t Id = 0; Id < P.Buffers.size(); ++Id) {
    ProgramBuffer &B = P.Buffers[Id];
    if (B.K != ProgramBuffer::Temp)
      continue;
    B.Name = "%" + std::to_string(Id);
    if (Picked(B) && B.Def < 0)
      B.Def = B.LastUse = 0; // never used
  }
  for (auto &[Name, Id] : P.Outputs)
    if (Picked(P.Buffers[Id]))
      P.Buffers[Id].LastUse = End;
}

Expected<std::vector<int>>
walkSteps(const Program &C, function_ref<void(const InstanceInfo &)> Made,
          function_ref<void(const StepInstr &)> Visit) {
  if (auto E = checkCompactProgram(C))
    return E;
  auto Slots = assignSlots(C);
  if (!Slots)
    return Slots.takeError();
  size_t NB = C.Buffers.size();
  int Count = 0;
  auto Make = [&](int Id, int Mb, int64_t Offset) {
    Made({Id, Mb, Offset});
    return Count++;
  };
  std::vector<int> WholeId(NB, -1);
  std::vector<std::vector<int>> Instance(NB); // Microbatch and Slot scopes
  for (size_t Id = 0; Id < NB; ++Id) {
    const ProgramBuffer &B = C.Buffers[Id];
    if (B.Scope == BufferScope::Whole)
      WholeId[Id] = Make(Id, -1, B.Offset);
    else if (B.Scope == BufferScope::Microbatch)
      for (int K = 0; K < C.Microbatches; ++K)
        Instance[Id].push_back(Make(Id, K, B.Offset + K * B.Stride));
    else if (B.Scope == BufferScope::Slot)
      Instance[Id].assign(C.Microbatches, -1);
  }
  std::vector<int> StepId(NB, -1), LastStepId(NB, -1);
  std::vector<int> Touched;
  int Position = 0;
  for (size_t K = 0; K < C.Steps.size(); ++K) {
    const ProgramStep &S = C.Steps[K];
    const ProgramTemplate &T = C.Templates[S.Template];
    int Mb = S.Microbatch;
    Touched.clear();
    auto Map = [&](int Id) {
      const ProgramBuffer &B = C.Buffers[Id];
      switch (B.Scope) {
      case BufferScope::Whole:
        break;
      case BufferScope::Microbatch:
        return Instance[Id][Mb];
      case BufferScope::Slot: {
        // A microbatch keeps its slot from its first step in the region to
        // its last, so the instance made at the first is the one to use.
        int &I = Instance[Id][Mb];
        if (I < 0) {
          int Slot = -1;
          for (auto [R, X] : Slots->Slot[K])
            if (R == B.Region)
              Slot = X;
          const SlotRegion &R = C.Slots[B.Region];
          I = Make(Id, Mb, R.Offset + Slot * R.Stride + B.Offset);
        }
        return I;
      }
      case BufferScope::Step:
        if (StepId[Id] < 0) {
          StepId[Id] = Make(Id, Mb, B.Offset);
          Touched.push_back(Id);
        }
        return StepId[Id];
      }
      return WholeId[Id];
    };
    for (int I = T.Begin; I < T.End; ++I, ++Position)
      Visit({int(K), I, Position, Map});
    for (int Id : Touched) {
      LastStepId[Id] = StepId[Id];
      StepId[Id] = -1;
    }
  }
  std::vector<int> Outputs;
  for (auto &[Name, Id] : C.Outputs) {
    int Out = C.Buffers[Id].Scope == BufferScope::Whole ? WholeId[Id]
              : C.Buffers[Id].Scope == BufferScope::Step ? LastStepId[Id]
                                                          : -1;
    if (Out < 0)
      return expandError("output '" + Name + "' is not a buffer of the "
                         "whole run or of its last step");
    Outputs.push_back(Out);
  }
  return Outputs;
}

bool bindsPerStep(const Instruction &T) {
  return T.Op == OpKind::Send || T.Op == OpKind::Recv ||
         T.Op == OpKind::Accumulate || T.Attrs.has("microbatches");
}

void bindStep(const Instruction &T, int Microbatch, int64_t TagStride,
              bool FirstStep, Instruction &X) {
  if (Microbatch >= 0) {
    if (T.Op == OpKind::Send || T.Op == OpKind::Recv)
      X.Attrs.set("tag", T.Attrs.getInt("tag", 0) + Microbatch * TagStride);
    if (T.Attrs.has("microbatches"))
      X.Attrs.set("microbatch", int64_t(Microbatch));
  }
  if (T.Op == OpKind::Accumulate)
    X.Attrs.set("first", int64_t(FirstStep));
}

Expected<CompactRun> prepareCompactRun(const Program &C, bool CheckPlaces) {
  CompactRun R;
  R.WholeInstance.assign(C.Buffers.size(), -1);
  R.FirstStep.assign(C.Templates.size(), -1);
  for (size_t K = 0; K < C.Steps.size(); ++K) {
    int &First = R.FirstStep[C.Steps[K].Template];
    if (First < 0)
      First = K;
  }
  auto Made = [&](const InstanceInfo &N) {
    if (C.Buffers[N.Buffer].Scope == BufferScope::Whole)
      R.WholeInstance[N.Buffer] = R.Instances.size();
    R.Instances.push_back({N.Buffer, N.Microbatch, N.Offset, -1, -1});
  };
  // Steps K..Step begin at Position (a step of an empty template visits
  // nothing).
  auto Enter = [&](size_t Step, int Position) {
    while (R.StepBegin.size() <= Step) {
      R.StepBegin.push_back(Position);
      R.UseBegin.push_back(R.Uses.size());
    }
  };
  // The last step that listed each buffer in Uses (a buffer has one
  // instance in a step).
  std::vector<int> ListedIn(C.Buffers.size(), -1);
  auto Visit = [&](const StepInstr &S) {
    Enter(S.Step, S.Position);
    const Instruction &X = C.Instrs[S.Instr];
    int Until = std::max(S.Position, X.Beside + S.Position - S.Instr);
    for (const auto *Ids : {&X.In, &X.Out})
      for (int Id : *Ids) {
        int N = S.Instance(Id);
        CompactRun::Instance &I = R.Instances[N];
        if (C.Buffers[Id].Scope != BufferScope::Whole &&
            ListedIn[Id] != S.Step) {
          ListedIn[Id] = S.Step;
          R.Uses.push_back({Id, N});
        }
        if (I.Def < 0)
          I.Def = S.Position;
        I.LastUse = std::max(I.LastUse, Until);
      }
  };
  auto Outputs = walkSteps(C, Made, Visit);
  if (!Outputs)
    return Outputs.takeError();
  int End = 0;
  for (const ProgramStep &S : C.Steps)
    End += C.Templates[S.Template].End - C.Templates[S.Template].Begin;
  Enter(C.Steps.size(), End); // and the end
  R.Outputs = std::move(*Outputs);
  for (CompactRun::Instance &I : R.Instances) {
    if (C.Buffers[I.Buffer].K != ProgramBuffer::Temp)
      I.Def = 0, I.LastUse = End;
    else if (I.Def < 0)
      I.Def = I.LastUse = 0; // never used
  }
  for (int N : R.Outputs)
    R.Instances[N].LastUse = End;
  if (!CheckPlaces)
    return R;
  std::vector<Live> All;
  for (size_t N = 0; N < R.Instances.size(); ++N) {
    const CompactRun::Instance &I = R.Instances[N];
    int64_t Bytes = C.Buffers[I.Buffer].Bytes;
    if (I.Offset < 0 || I.Offset + Bytes > C.ArenaBytes)
      return expandError("buffer '" + C.Buffers[I.Buffer].Name +
                         "' lies outside the arena; the plan is corrupt");
    All.push_back({I.Offset, I.Offset + std::max<int64_t>(Bytes, 1), I.Def,
                   I.LastUse, int(N)});
  }
  if (auto E = checkDisjoint(All, [&](int N) {
        const CompactRun::Instance &I = R.Instances[N];
        std::string Name = C.Buffers[I.Buffer].Name;
        return I.Microbatch < 0 ? Name
                                : Name + " of microbatch " +
                                      std::to_string(I.Microbatch);
      }))
    return E;
  return R;
}

Expected<Program> expandProgram(const Program &C) {
  if (!C.compact())
    return C;
  // The walk places and checks every instance; writing the steps out is
  // then a renaming of each template's buffers to the step's instances.
  auto Run = prepareCompactRun(C);
  if (!Run)
    return Run.takeError();
  Program F;
  F.PersistentBytes = C.PersistentBytes;
  F.ArenaBytes = C.ArenaBytes;
  F.Microbatches = C.Microbatches;
  for (size_t N = 0; N < Run->Instances.size(); ++N) {
    const CompactRun::Instance &I = Run->Instances[N];
    ProgramBuffer X = C.Buffers[I.Buffer];
    if (X.Scope == BufferScope::Microbatch) {
      X.Name += "." + std::to_string(I.Microbatch);
      X.Microbatch = I.Microbatch;
    }
    if (X.K == ProgramBuffer::Temp) {
      X.Name = "%" + std::to_string(N);
      X.Def = I.Def;
      X.LastUse = I.LastUse;
    }
    X.Offset = I.Offset;
    X.Scope = BufferScope::Whole;
    X.Region = -1;
    X.Stride = 0;
    F.Buffers.push_back(std::move(X));
  }
  std::vector<int> InstanceOf = Run->WholeInstance;
  for (size_t K = 0; K < C.Steps.size(); ++K) {
    for (int U = Run->UseBegin[K]; U < Run->UseBegin[K + 1]; ++U)
      InstanceOf[Run->Uses[U].first] = Run->Uses[U].second;
    const ProgramStep &S = C.Steps[K];
    const ProgramTemplate &T = C.Templates[S.Template];
    for (int I = T.Begin; I < T.End; ++I) {
      Instruction X = C.Instrs[I];
      for (auto *Ids : {&X.In, &X.Out})
        for (int &Id : *Ids)
          Id = InstanceOf[Id];
      if (X.Beside >= 0)
        X.Beside += Run->StepBegin[K] - T.Begin;
      bindStep(C.Instrs[I], S.Microbatch, C.TagStride,
               Run->FirstStep[S.Template] == int(K), X);
      F.Instrs.push_back(std::move(X));
    }
  }
  for (size_t K = 0; K < C.Outputs.size(); ++K)
    F.Outputs.push_back({C.Outputs[K].first, Run->Outputs[K]});
  return F;
}

} // namespace sp
