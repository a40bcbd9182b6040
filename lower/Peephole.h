//===- Peephole.h - Rewriting a lowered program in place --------*- C++ -*-===//
//
// What the peephole rewrites of a lowered program share (the program passes
// of lower/FuseSoftmax.h, lower/FuseEpilogue.h, lower/CausalProducts.h):
// each buffer's producer and readers, marks for the instructions and buffers
// a fusion removes, and compact(), which drops them and renumbers the rest.
// They run before the memory plan (offsets are left as they are).
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_PEEPHOLE_H
#define SP_LOWER_PEEPHOLE_H

#include "plan/Program.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include <vector>

namespace sp {

struct Peephole {
  Program &P;
  size_t NI, NB;
  /// The instruction defining each buffer, how many times it is read (a
  /// program output counts as a read) and by which instruction (the last).
  std::vector<int> Producer, Uses, User;
  std::vector<bool> DeadInstr, DeadBuf;

  explicit Peephole(Program &P);

  /// An intermediate a fusion may drop: a temporary read once.
  bool isIntermediate(int B) const {
    return P.Buffers[B].K == ProgramBuffer::Temp && Uses[B] == 1 &&
           Producer[B] >= 0;
  }
  /// A one-operand, one-result instruction of kind Op in phase Ph, not yet
  /// fused.
  bool isLink(int K, OpKind Op, Phase Ph) const;
  /// A 32- or 64-bit float buffer; all of an instruction's buffers so. (In
  /// a bf16 or fp16 plan the fusions' intermediates are rounded to 16
  /// bits, which the fused ops would skip, and the GEMMs take the bf16
  /// path, so those are left alone.)
  bool isWide(int B) const {
    DType D = P.Buffers[B].Type.Dtype;
    return D == DType::F32 || D == DType::F64;
  }
  bool allWide(const Instruction &I) const {
    for (const auto *List : {&I.In, &I.Out})
      for (int B : *List)
        if (!isWide(B))
          return false;
    return true;
  }
  /// Whether an instruction strictly between From and To writes buffer B
  /// (a result, or an accumulate's operand).
  bool writtenBetween(int B, int From, int To) const;
  /// Whether an instruction strictly between From and To reads B.
  bool readBetween(int B, int From, int To) const;

  /// Drops the dead instructions and buffers in place (each kept one moves
  /// down at most once, nothing is reallocated), renumbering the rest (a
  /// temporary named "%N" is renamed after its new number), and recomputes
  /// the live ranges for the new indices. Returns how many instructions
  /// were removed.
  int compact();

  /// Calls Rule(K) on each instruction K, in order, that no earlier call
  /// marked dead; returns the sum of what it returned (its changes).
  int forEachLive(llvm::function_ref<int(int K)> Rule);
  /// The same for rules that fuse, then compact() if any did; returns how
  /// many instructions the fusions removed.
  int fuseEachLive(llvm::function_ref<int(int K)> Rule) {
    return forEachLive(Rule) ? compact() : 0;
  }
};

} // namespace sp

#endif // SP_LOWER_PEEPHOLE_H
