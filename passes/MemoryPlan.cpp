//===- MemoryPlan.cpp - Arena offsets from liveness -----------------------===//
#include "passes/MemoryPlan.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/MathExtras.h"
#include <algorithm>
#include <map>
#include <numeric>

using namespace llvm;

namespace sp {

/// Every temporary takes at least one aligned slot, so that distinct live
/// buffers never share an address.
static int64_t alignedSize(const ProgramBuffer &B) {
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

  // The placed temporaries, indexed by the stretches of instructions they
  // live over, so that finding the ones a new buffer's live range meets
  // costs what they are, not every placed buffer.
  constexpr int Stretch = 256;
  int NumInstrs = std::max<int>(P.Instrs.size(), 1) + 1;
  std::vector<std::vector<int>> Index((NumInstrs + Stretch - 1) / Stretch + 1);
  std::vector<int> Seen(P.Buffers.size(), -1);
  // The peak is the highest byte a buffer uses (alignment padding after the
  // topmost buffer is not counted).
  int64_t Peak = Top;
  std::vector<const ProgramBuffer *> Live;
  for (int Id : Temps) {
    ProgramBuffer &B = P.Buffers[Id];
    int64_t Size = alignedSize(B);
    Live.clear();
    for (int K = B.Def / Stretch; K <= B.LastUse / Stretch; ++K)
      for (int O : Index[K]) {
        const ProgramBuffer &Q = P.Buffers[O];
        if (Seen[O] == Id || Q.Def > B.LastUse || B.Def > Q.LastUse)
          continue;
        Seen[O] = Id;
        Live.push_back(&Q);
      }
    llvm::sort(Live, [](const ProgramBuffer *X, const ProgramBuffer *Y) {
      return X->Offset < Y->Offset;
    });
    // First fit between the live placed buffers (sorted by offset).
    int64_t Offset = Top;
    for (const ProgramBuffer *Q : Live) {
      if (Q->Offset >= Offset + Size)
        break;
      Offset = std::max(Offset, Q->Offset + alignedSize(*Q));
    }
    B.Offset = Offset;
    Peak = std::max(Peak, Offset + B.Bytes);
    for (int K = B.Def / Stretch; K <= B.LastUse / Stretch; ++K)
      Index[K].push_back(Id);
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

} // namespace sp
