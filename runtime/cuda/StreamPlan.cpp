//===- StreamPlan.cpp - Which stream each instruction runs on -------------===//
//
// See StreamPlan.h. The scan per instruction walks back over the other
// stream's instructions only as far as its stream's last wait there, so a
// program of mostly computation costs about one pass.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/StreamPlan.h"
#include "ir/OpDef.h"

namespace sp::cuda {

bool isCommunication(OpKind Op) { return isCommunicationOp(Op); }

int StreamPlan::numWaits() const {
  int N = 0;
  for (const StreamStep &S : Steps)
    N += int(S.WaitFor.size());
  return N;
}

int StreamPlan::numEvents() const {
  int N = 0;
  for (const StreamStep &S : Steps)
    N += S.RecordEvent;
  return N;
}

void instructionRanges(const Program &P, const Instruction &I,
                       std::vector<ByteRange> &Reads,
                       std::vector<ByteRange> &Writes) {
  Reads.clear();
  Writes.clear();
  auto Range = [&](int B) {
    const ProgramBuffer &PB = P.Buffers[B];
    return ByteRange{PB.Offset, PB.Offset + PB.Type.numBytes()};
  };
  bool InPlace = opDef(I.Op).SideEffects; // adamw, gather_param
  for (int B : I.In)
    (InPlace ? Writes : Reads).push_back(Range(B));
  for (int B : I.Out)
    Writes.push_back(Range(B));
}

static bool anyOverlap(const std::vector<ByteRange> &A,
                       const std::vector<ByteRange> &B) {
  for (const ByteRange &X : A)
    for (const ByteRange &Y : B)
      if (X.overlaps(Y))
        return true;
  return false;
}

StreamPlan planStreams(const Program &P, bool Overlap) {
  StreamPlan Plan;
  size_t N = P.Instrs.size();
  Plan.Steps.resize(N);
  if (!Overlap)
    return Plan;
  std::vector<std::vector<ByteRange>> Reads(N), Writes(N);
  // Instructions of each stream, in order.
  std::vector<int> OnStream[NumStreams];
  // Covered[s][t]: stream s has waited for stream t up to this instruction.
  int Covered[NumStreams][NumStreams];
  for (auto &Row : Covered)
    for (int &C : Row)
      C = -1;
  for (size_t J = 0; J < N; ++J) {
    const Instruction &I = P.Instrs[J];
    instructionRanges(P, I, Reads[J], Writes[J]);
    StreamKind K =
        isCommunication(I.Op) ? StreamKind::Comm : StreamKind::Compute;
    int S = int(K);
    Plan.Steps[J].Stream = K;
    for (int T = 0; T < NumStreams; ++T) {
      if (T == S)
        continue;
      const std::vector<int> &Other = OnStream[T];
      for (auto It = Other.rbegin(); It != Other.rend(); ++It) {
        int Prev = *It;
        if (Prev <= Covered[S][T])
          break;
        bool Conflict = anyOverlap(Writes[Prev], Reads[J]) ||
                        anyOverlap(Writes[Prev], Writes[J]) ||
                        anyOverlap(Reads[Prev], Writes[J]);
        if (!Conflict)
          continue;
        Plan.Steps[J].WaitFor.push_back(Prev);
        Plan.Steps[Prev].RecordEvent = true;
        Covered[S][T] = Prev;
        break;
      }
    }
    OnStream[S].push_back(int(J));
  }
  return Plan;
}

} // namespace sp::cuda
