//===- MemoryPlan.cpp - Arena offsets from liveness -----------------------===//
#include "lower/MemoryPlan.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/MathExtras.h"
#include <algorithm>
#include <map>
#include <numeric>

using namespace llvm;

namespace sp {

int64_t alignedSize(const ProgramBuffer &B) {
  return alignTo(std::max<int64_t>(B.Bytes, 1), ArenaAlignment);
}

/// Places temporaries in program order into the free holes of the arena
/// (best fit, holes merged when freed): each buffer looks at the holes
/// rather than at every placed buffer its live range meets, which is what
/// makes the greedy-by-size placement slow on very large programs.
static int64_t placeInProgramOrder(Program &P, ArrayRef<int> Temps,
                                   int64_t Top) {
  std::vector<int> ByDef(Temps.begin(), Temps.end());
  llvm::stable_sort(ByDef, [&](int A, int B) {
    return P.Buffers[A].Def < P.Buffers[B].Def;
  });
  std::map<int64_t, int64_t> Holes; // offset -> size, above Top
  std::multimap<int, int> Frees;     // instruction after last use -> buffer
  int64_t End = Top, Peak = Top;
  auto Release = [&](int Id) {
    const ProgramBuffer &B = P.Buffers[Id];
    int64_t Off = B.Offset, Size = alignedSize(B);
    auto Next = Holes.lower_bound(Off);
    if (Next != Holes.end() && Off + Size == Next->first) {
      Size += Next->second;
      Next = Holes.erase(Next);
    }
    if (Next != Holes.begin()) {
      auto Prev = std::prev(Next);
      if (Prev->first + Prev->second == Off) {
        Prev->second += Size;
        return;
      }
    }
    Holes[Off] = Size;
  };
  for (int Id : ByDef) {
    ProgramBuffer &B = P.Buffers[Id];
    for (auto It = Frees.begin(); It != Frees.end() && It->first <= B.Def;
         It = Frees.erase(It))
      Release(It->second);
    int64_t Size = alignedSize(B);
    auto Best = Holes.end();
    for (auto It = Holes.begin(); It != Holes.end(); ++It)
      if (It->second >= Size &&
          (Best == Holes.end() || It->second < Best->second))
        Best = It;
    if (Best != Holes.end()) {
      B.Offset = Best->first;
      int64_t Rest = Best->second - Size;
      int64_t RestOff = Best->first + Size;
      Holes.erase(Best);
      if (Rest > 0)
        Holes[RestOff] = Rest;
    } else if (!Holes.empty() &&
               std::prev(Holes.end())->first + std::prev(Holes.end())->second ==
                   End) {
      // Grow the topmost hole.
      auto Last = std::prev(Holes.end());
      B.Offset = Last->first;
      End = B.Offset + Size;
      Holes.erase(Last);
    } else {
      B.Offset = End;
      End += Size;
    }
    Peak = std::max(Peak, B.Offset + B.Bytes);
    Frees.insert({B.LastUse + 1, Id});
  }
  return Peak;
}

/// Programs with more temporaries than this (unrolled pipeline schedules)
/// are placed in program order: on the 175B model with p 8, m 3 and 64
/// microbatches that takes 2 s instead of 25 s for a peak 1% higher.
constexpr size_t LargeProgram = 20000;

void planMemory(Program &P) { planMemory(P, PlanOrder::Auto); }

void planMemory(Program &P, PlanOrder Order) {
  int64_t Top = 0;
  for (ProgramBuffer &B : P.Buffers)
    if (B.isPersistent()) {
      B.Offset = Top;
      Top += alignedSize(B);
    }
  P.PersistentBytes = Top;

  std::vector<int> Temps;
  for (size_t I = 0; I < P.Buffers.size(); ++I)
    if (!P.Buffers[I].isPersistent())
      Temps.push_back(I);
  std::stable_sort(Temps.begin(), Temps.end(), [&](int A, int B) {
    const ProgramBuffer &X = P.Buffers[A], &Y = P.Buffers[B];
    if (X.Bytes != Y.Bytes)
      return X.Bytes > Y.Bytes;
    return X.Def < Y.Def;
  });
  if (Order == PlanOrder::Program ||
      (Order == PlanOrder::Auto && Temps.size() > LargeProgram)) {
    P.ArenaBytes = placeInProgramOrder(P, Temps, Top);
    return;
  }

  // The placed temporaries sorted by offset, compact so that one scan per
  // new buffer is cheap: first fit walks them upwards and skips those whose
  // live range misses the new buffer's. (Collecting the live ones and
  // sorting them per buffer cost 0.2 s on the 175B model.)
  struct Placed {
    int64_t Start, End;
    int Def, LastUse;
  };
  std::vector<Placed> ByOffset;
  ByOffset.reserve(Temps.size());
  // The peak is the highest byte a buffer uses (alignment padding after the
  // topmost buffer is not counted).
  int64_t Peak = Top;
  for (int Id : Temps) {
    ProgramBuffer &B = P.Buffers[Id];
    int64_t Size = alignedSize(B);
    int64_t Offset = Top;
    for (const Placed &Q : ByOffset) {
      if (Q.Start >= Offset + Size)
        break;
      if (Q.Def > B.LastUse || B.Def > Q.LastUse)
        continue;
      Offset = std::max(Offset, Q.End);
    }
    B.Offset = Offset;
    Peak = std::max(Peak, Offset + B.Bytes);
    Placed New{Offset, Offset + Size, B.Def, B.LastUse};
    ByOffset.insert(llvm::upper_bound(ByOffset, New,
                                      [](const Placed &A, const Placed &B) {
                                        return A.Start < B.Start;
                                      }),
                    New);
  }
  P.ArenaBytes = Peak;
}

int64_t peakLiveBytes(const Program &P,
                      function_ref<bool(const ProgramBuffer &)> Pick) {
  std::vector<int64_t> Delta(P.Instrs.size() + 2, 0);
  for (const ProgramBuffer &B : P.Buffers)
    if (!B.isPersistent() && Pick(B)) {
      Delta[B.Def] += B.Bytes;
      Delta[B.LastUse + 1] -= B.Bytes;
    }
  int64_t Cur = 0, Peak = 0;
  for (int64_t D : Delta)
    Peak = std::max(Peak, Cur += D);
  return Peak;
}

int64_t peakLiveTempBytes(const Program &P) {
  return peakLiveBytes(P, [](const ProgramBuffer &) { return true; });
}

void computeLiveRanges(Program &P) {
  int End = P.Instrs.size();
  std::vector<bool> Written(P.Buffers.size(), false);
  for (int I = 0; I < End; ++I)
    for (int B : P.Instrs[I].Out)
      if (P.Buffers[B].K == ProgramBuffer::Temp && !Written[B]) {
        Written[B] = true;
        P.Buffers[B].Def = P.Buffers[B].LastUse = I;
      }
  for (int I = 0; I < End; ++I) {
    const Instruction &In = P.Instrs[I];
    int Until = In.Beside >= 0 ? std::max(I, In.Beside) : I;
    for (int B : In.In)
      if (P.Buffers[B].K == ProgramBuffer::Temp)
        P.Buffers[B].LastUse = std::max(P.Buffers[B].LastUse, Until);
    for (int B : In.Out)
      if (P.Buffers[B].K == ProgramBuffer::Temp)
        P.Buffers[B].LastUse = std::max(P.Buffers[B].LastUse, Until);
  }
  for (auto &[Name, Id] : P.Outputs)
    if (P.Buffers[Id].K == ProgramBuffer::Temp)
      P.Buffers[Id].LastUse = End; // read after the last instruction
}

} // namespace sp
