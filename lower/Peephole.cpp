//===- Peephole.cpp - Rewriting a lowered program in place -----------------===//
#include "lower/Peephole.h"
#include "lower/MemoryPlan.h"
#include <string>

namespace sp {

Peephole::Peephole(Program &P)
    : P(P), NI(P.Instrs.size()), NB(P.Buffers.size()), Producer(NB, -1),
      Uses(NB, 0), User(NB, -1), DeadInstr(NI, false), DeadBuf(NB, false) {
  for (size_t K = 0; K < NI; ++K) {
    for (int B : P.Instrs[K].In) {
      ++Uses[B];
      User[B] = int(K);
    }
    for (int B : P.Instrs[K].Out)
      if (Producer[B] < 0)
        Producer[B] = int(K);
  }
  for (const auto &[Name, Id] : P.Outputs)
    ++Uses[Id];
}

bool Peephole::isLink(int K, OpKind Op, Phase Ph) const {
  const Instruction &I = P.Instrs[K];
  return I.Op == Op && I.Ph == Ph && !DeadInstr[K] && I.In.size() == 1 &&
         I.Out.size() == 1;
}

bool Peephole::writtenBetween(int B, int From, int To) const {
  for (int K = From + 1; K < To; ++K) {
    const Instruction &I = P.Instrs[K];
    if (DeadInstr[K])
      continue;
    for (int O : I.Out)
      if (O == B)
        return true;
    if (I.Op == OpKind::Accumulate && !I.In.empty() && I.In[0] == B)
      return true;
  }
  return false;
}

bool Peephole::readBetween(int B, int From, int To) const {
  for (int K = From + 1; K < To; ++K)
    if (!DeadInstr[K])
      for (int I : P.Instrs[K].In)
        if (I == B)
          return true;
  return false;
}

int Peephole::forEachLive(llvm::function_ref<int(int K)> Rule) {
  int Changes = 0;
  for (size_t K = 0; K < NI; ++K)
    if (!DeadInstr[K])
      Changes += Rule(int(K));
  return Changes;
}

int Peephole::compact() {
  std::vector<int> NewId(NB, -1);
  size_t Kept = 0;
  for (size_t B = 0; B < NB; ++B) {
    if (DeadBuf[B])
      continue;
    NewId[B] = int(Kept);
    ProgramBuffer &PB = P.Buffers[B];
    if (Kept != B && PB.K == ProgramBuffer::Temp &&
        PB.Name == "%" + std::to_string(B))
      PB.Name = "%" + std::to_string(Kept);
    if (Kept != B)
      P.Buffers[Kept] = std::move(PB);
    ++Kept;
  }
  P.Buffers.resize(Kept);
  size_t Before = NI;
  Kept = 0;
  for (size_t K = 0; K < NI; ++K) {
    if (DeadInstr[K])
      continue;
    Instruction &I = P.Instrs[K];
    for (int &B : I.In)
      B = NewId[B];
    for (int &B : I.Out)
      B = NewId[B];
    if (Kept != K)
      P.Instrs[Kept] = std::move(I);
    ++Kept;
  }
  P.Instrs.resize(Kept);
  for (auto &[Name, Id] : P.Outputs)
    Id = NewId[Id];
  computeLiveRanges(P);
  return int(Before - Kept);
}

} // namespace sp
