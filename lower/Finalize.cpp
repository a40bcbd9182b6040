//===- Finalize.cpp - The last steps of lowering a program -----------------===//
#include "lower/Finalize.h"
#include "lower/CausalProducts.h"
#include "lower/MemoryPlan.h"
#include "lower/ProgramPass.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/MathExtras.h"

using namespace llvm;

namespace sp {

namespace {

/// The rewrites of lower/ProgramPasses.def, in order. None of them fails (a
/// rewrite that can must make finalizeProgram return its error).
void runRewrites(Program &P) {
  if (Error E = runProgramPasses(P))
    report_fatal_error(std::move(E));
}

/// A compact program's arena, bottom up: the persistent buffers, the
/// per-microbatch inputs (every microbatch's), the Whole temporaries (the
/// sums over microbatches, the parameter copies), each chunk's slots, and
/// the scratch region every step's Step buffers share (their offsets are
/// relative to it on entry; ScratchBytes is its size).
void planCompactMemory(Program &P, int64_t ScratchBytes) {
  int64_t Top = 0;
  for (ProgramBuffer &B : P.Buffers)
    if (B.isPersistent() && B.Scope != BufferScope::Microbatch) {
      B.Offset = Top;
      Top += alignedSize(B);
    }
  for (ProgramBuffer &B : P.Buffers)
    if (B.Scope == BufferScope::Microbatch) {
      B.Offset = Top;
      B.Stride = alignedSize(B);
      Top += B.Stride * P.Microbatches;
    }
  P.PersistentBytes = Top;
  for (ProgramBuffer &B : P.Buffers)
    if (!B.isPersistent() && B.Scope == BufferScope::Whole) {
      B.Offset = Top;
      Top += alignedSize(B);
    }
  // A slot holds one microbatch's values of its chunk, which live along
  // the chunk's templates (forward, backward, weight gradient: the order
  // the microbatch's steps run them, and the order of the compact
  // program's instructions): placed by those live ranges, as a flat
  // program's temporaries, a backward's value for the weight gradient
  // reuses the bytes of forward values the backward read last.
  std::vector<std::vector<int>> InRegion(P.Slots.size());
  for (size_t Id = 0; Id < P.Buffers.size(); ++Id)
    if (P.Buffers[Id].Scope == BufferScope::Slot)
      InRegion[P.Buffers[Id].Region].push_back(Id);
  for (size_t R = 0; R < P.Slots.size(); ++R) {
    Program Slot;
    for (int Id : InRegion[R])
      Slot.Buffers.push_back(P.Buffers[Id]);
    planMemory(Slot, PlanOrder::BySize);
    for (size_t K = 0; K < InRegion[R].size(); ++K)
      P.Buffers[InRegion[R][K]].Offset = Slot.Buffers[K].Offset;
    P.Slots[R].Stride = alignTo(Slot.ArenaBytes, ArenaAlignment);
  }
  for (SlotRegion &S : P.Slots) {
    S.Offset = Top;
    Top += S.Stride * S.Count;
  }
  for (ProgramBuffer &B : P.Buffers)
    if (B.Scope == BufferScope::Step)
      B.Offset += Top;
  P.ArenaBytes = Top + ScratchBytes;
}

/// Finalizes each template of a compact program on its own: the template's
/// instructions as a program of their own, in which only its Step buffers
/// are temporaries (the rest stand still, as constants), so that the
/// fusions, the buckets and the collective placement stay inside the step
/// and the memory plan places its scratch.
void finalizeCompact(Program &P) {
  std::vector<int> NewId(P.Buffers.size(), -1);
  Program Out;
  for (size_t Id = 0; Id < P.Buffers.size(); ++Id)
    if (P.Buffers[Id].Scope != BufferScope::Step) {
      NewId[Id] = Out.Buffers.size();
      Out.Buffers.push_back(P.Buffers[Id]);
    }
  int64_t Scratch = 0;
  for (ProgramTemplate &T : P.Templates) {
    // The sub-program's buffers are named "#<id in P>": the fusion drops
    // and renumbers buffers, and keeps names other than "%N".
    Program Sub;
    DenseMap<int, int> Local;
    auto Map = [&](int Id) {
      auto [It, New] = Local.try_emplace(Id, int(Sub.Buffers.size()));
      if (New) {
        ProgramBuffer B = P.Buffers[Id];
        B.Name = "#" + std::to_string(Id);
        if (B.Scope != BufferScope::Step)
          B.K = ProgramBuffer::Const;
        Sub.Buffers.push_back(std::move(B));
      }
      return It->second;
    };
    for (int I = T.Begin; I < T.End; ++I) {
      Instruction In = P.Instrs[I];
      for (int &Id : In.In)
        Id = Map(Id);
      for (int &Id : In.Out)
        Id = Map(Id);
      Sub.Instrs.push_back(std::move(In));
    }
    for (auto &[Name, Id] : P.Outputs)
      if (P.Buffers[Id].Scope == BufferScope::Step && Local.count(Id))
        Sub.Outputs.push_back({Name, Local[Id]});
    runRewrites(Sub);
    computeLiveRanges(Sub);
    planMemory(Sub);
    Scratch = std::max(Scratch, Sub.ArenaBytes - Sub.PersistentBytes);
    // Back into the whole: the Step buffers that remain, renumbered.
    int Begin = Out.Instrs.size();
    std::vector<int> ToOut(Sub.Buffers.size());
    for (size_t K = 0; K < Sub.Buffers.size(); ++K) {
      const ProgramBuffer &SB = Sub.Buffers[K];
      int G = std::stoi(SB.Name.substr(1));
      if (P.Buffers[G].Scope != BufferScope::Step) {
        ToOut[K] = NewId[G];
        continue;
      }
      ProgramBuffer B = P.Buffers[G];
      B.Def = SB.Def + Begin;
      B.LastUse = SB.LastUse + Begin;
      B.Offset = SB.Offset - Sub.PersistentBytes; // within the scratch
      ToOut[K] = NewId[G] = Out.Buffers.size();
      Out.Buffers.push_back(std::move(B));
    }
    for (Instruction &In : Sub.Instrs) {
      for (int &Id : In.In)
        Id = ToOut[Id];
      for (int &Id : In.Out)
        Id = ToOut[Id];
      if (In.Beside >= 0)
        In.Beside += Begin;
      Out.Instrs.push_back(std::move(In));
    }
    T.Begin = Begin;
    T.End = Out.Instrs.size();
  }
  for (auto &[Name, Id] : P.Outputs)
    Out.Outputs.push_back({Name, NewId[Id]});
  // The causal marks a template cannot see alone: a backward's products
  // of the probabilities its chunk's forward made (in the slots), and the
  // forward's dropout whose mask only that backward reads. A template
  // precedes the later ones of its chunk in the instructions, as its
  // steps precede theirs for each microbatch, and a slot value is written
  // by its chunk's forward alone.
  markCausalProducts(Out);
  // The other temporaries' live ranges, along the templates (the slot
  // plan reads them): the compact program's instructions that touch them.
  setUseRanges(Out, [](const ProgramBuffer &B) {
    return B.Scope != BufferScope::Step;
  });
  Out.Templates = std::move(P.Templates);
  Out.Steps = std::move(P.Steps);
  Out.Slots = std::move(P.Slots);
  Out.Microbatches = P.Microbatches;
  Out.TagStride = P.TagStride;
  planCompactMemory(Out, Scratch);
  P = std::move(Out);
}

} // namespace

void finalizeProgram(Program &P) {
  if (P.compact()) {
    finalizeCompact(P);
    return;
  }
  runRewrites(P);
  planMemory(P);
}

} // namespace sp
