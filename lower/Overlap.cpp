//===- Overlap.cpp - Collectives placed beside the GEMMs they overlap -----===//
//
// The program pass place-collectives; where a collective moves and why:
// lower/Overlap.h.
//
//===----------------------------------------------------------------------===//
#include "lower/Overlap.h"
#include "lower/MemoryPlan.h"
#include "lower/ProgramPass.h"
#include "llvm/ADT/SmallVector.h"
#include <algorithm>

namespace sp {

bool communicates(OpKind Op) {
  return isCommunicationOp(Op) || Op == OpKind::CrossEntropy ||
         Op == OpKind::CrossEntropyGrad || Op == OpKind::GradNorm;
}

namespace {

/// The collectives that move: the tensor-parallel ones.
bool movable(const Instruction &I) {
  return isCollectiveOp(I.Op) && collectiveGroup(I.Op, I.Attrs) == "tp";
}

int64_t microbatch(const Instruction &I) {
  return I.Attrs.getInt("microbatch", -1);
}

/// Whether B must stay after A: B reads what A writes, or either writes
/// what the other reads or writes (buffer ids: the memory plan has not run).
bool dependsOn(const Instruction &B, const Instruction &A) {
  auto Has = [](llvm::ArrayRef<int> L, int X) {
    return std::find(L.begin(), L.end(), X) != L.end();
  };
  for (int W : A.Out)
    if (Has(B.In, W) || Has(B.Out, W))
      return true;
  for (int W : B.Out)
    if (Has(A.In, W))
      return true;
  return false;
}

} // namespace

void placeCollectives(Program &P) {
  // Order holds original instruction indices; Beside is kept as an original
  // index until the end.
  std::vector<int> Order(P.Instrs.size());
  for (size_t K = 0; K < Order.size(); ++K)
    Order[K] = K;
  std::vector<int> BesideOf(P.Instrs.size(), -1);
  bool Moved = false;
  for (size_t Pos = 0; Pos < Order.size(); ++Pos) {
    const Instruction &C = P.Instrs[Order[Pos]];
    if (!movable(C))
      continue;
    // Walk up to the nearest independent GEMM, stopping at anything that
    // must stay before the collective.
    int Target = -1;
    for (int J = int(Pos) - 1; J >= 0; --J) {
      const Instruction &A = P.Instrs[Order[J]];
      if (communicates(A.Op) || A.Ph != C.Ph ||
          microbatch(A) != microbatch(C) || dependsOn(C, A))
        break;
      if (isGemmOp(A.Op)) {
        Target = J;
        break;
      }
    }
    if (Target < 0)
      continue;
    int Id = Order[Pos];
    BesideOf[Id] = Order[Target];
    std::rotate(Order.begin() + Target, Order.begin() + Pos,
                Order.begin() + Pos + 1);
    Moved = true;
  }
  if (!Moved)
    return;
  std::vector<int> NewIndex(Order.size());
  for (size_t K = 0; K < Order.size(); ++K)
    NewIndex[Order[K]] = K;
  std::vector<Instruction> Instrs;
  Instrs.reserve(Order.size());
  for (int Id : Order) {
    Instrs.push_back(std::move(P.Instrs[Id]));
    Instrs.back().Beside = BesideOf[Id] >= 0 ? NewIndex[BesideOf[Id]] : -1;
  }
  P.Instrs = std::move(Instrs);
  computeLiveRanges(P);
}

std::unique_ptr<ProgramPass> createPlaceCollectivesPass() {
  return rewritePass("place-collectives", placeCollectives);
}

} // namespace sp
