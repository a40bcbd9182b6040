//===- MemoryPlan.cpp - Arena offsets from liveness -----------------------===//
#include "passes/MemoryPlan.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/MathExtras.h"
#include <algorithm>
#include <numeric>

using namespace llvm;

namespace sp {

/// Every temporary takes at least one aligned slot, so that distinct live
/// buffers never share an address.
static int64_t alignedSize(const ProgramBuffer &B) {
  return alignTo(std::max<int64_t>(B.Bytes, 1), ArenaAlignment);
}

void planMemory(Program &P) {
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
