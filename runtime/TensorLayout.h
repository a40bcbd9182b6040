//===- TensorLayout.h - A tensor seen around one axis ------------*- C++ -*-===//
#ifndef SP_RUNTIME_TENSORLAYOUT_H
#define SP_RUNTIME_TENSORLAYOUT_H

#include "ir/ContextLayout.h"
#include "ir/Types.h"
#include "plan/Program.h"
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace sp {

/// A row-major tensor as [Outer, the axis, Inner]: the elements before and
/// after the axis.
struct AxisView {
  int64_t Outer = 1, Inner = 1;
};

/// The source index along a split axis of local index J on rank R, or -1 for
/// padding. The axis of the whole tensor (padded to Padded when set) holds
/// Blocks blocks, each split in Parts equal parts; rank R holds part R of
/// every block.
inline int64_t sourceIndex(const Sharding &S, int64_t SourceSize,
                           int64_t LocalSize, int R, int64_t J) {
  int64_t Full = S.Padded ? S.Padded : SourceSize;
  int64_t BlockSize = Full / S.Blocks, PerBlock = LocalSize / S.Blocks;
  int64_t G = (J / PerBlock) * BlockSize + R * PerBlock + J % PerBlock;
  return G < SourceSize ? G : -1;
}

inline AxisView around(const TensorType &T, int Dim) {
  AxisView A;
  for (int I = 0; I < Dim; ++I)
    A.Outer *= T.Shape[I];
  for (int I = Dim + 1; I < int(T.rank()); ++I)
    A.Inner *= T.Shape[I];
  return A;
}

/// The whole shape of a parameter buffer: its source tensor's (a split
/// one's shard is part of it).
inline std::vector<int64_t> wholeShape(const ProgramBuffer &PB) {
  if (PB.Data)
    return std::vector<int64_t>(PB.Data->type().Shape.begin(),
                                PB.Data->type().Shape.end());
  std::vector<int64_t> W(PB.Type.Shape.begin(), PB.Type.Shape.end());
  if (PB.Shard.K == Sharding::Split && PB.Shard.Dim < int(W.size()))
    W[PB.Shard.Dim] = PB.Shard.Padded ? PB.Shard.Padded
                                      : W[PB.Shard.Dim] * PB.Shard.Parts;
  return W;
}

/// Where a local tensor sits in the whole one whose row-major indices key
/// dropout's Philox words (runtime/cpu/Philox.h): the block [Offset,
/// Offset + Local) of Full. The tensor is split as S over the tensor group
/// (this rank: TensorRank), and its first axis holds microbatch Microbatch
/// of Microbatches of data-parallel replica DataRank of DataSize, which
/// holds the step's microbatches [DataRank M, (DataRank + 1) M) of
/// DataSize M (the rows its data loader reads). Every backend's dropout and
/// fused attention core index their draws so, whatever the layout.
struct GlobalBlock {
  std::vector<int64_t> Full, Offset;
  /// Context parallelism (withContext): along an axis, the block may be
  /// two runs; from local index Seam on, the global index is Jump further
  /// (cpu::GlobalIndex's Seam and Jump). 0: one run.
  std::vector<int64_t> Seam, Jump;
};
inline GlobalBlock globalBlock(llvm::ArrayRef<int64_t> Local, const Sharding &S,
                               int TensorRank, int64_t Microbatch,
                               int64_t Microbatches, int DataRank,
                               int DataSize) {
  GlobalBlock G{std::vector<int64_t>(Local.begin(), Local.end()),
                std::vector<int64_t>(Local.size(), 0),
                std::vector<int64_t>(Local.size(), 0),
                std::vector<int64_t>(Local.size(), 0)};
  if (S.K == Sharding::Split) {
    G.Full[S.Dim] *= S.Parts;
    G.Offset[S.Dim] = int64_t(TensorRank) * Local[S.Dim];
  }
  if (!Local.empty()) {
    G.Full[0] *= Microbatches * DataSize;
    G.Offset[0] += (Microbatch + int64_t(DataRank) * Microbatches) * Local[0];
  }
  return G;
}

/// Context parallelism (ir/ContextLayout.h): axis Dim of G's whole tensor
/// is context-parallel rank CpRank's positions of a sequence Parts times
/// longer; G becomes the block in that sequence (a zigzag block, or a
/// tensor-parallel rank's slice of one, may be two runs). Local is the
/// block's shape. Errors (as a message) when the sizes do not divide.
inline std::string withContext(GlobalBlock &G, llvm::ArrayRef<int64_t> Local,
                               int Dim, int CpRank, int Parts, bool Zigzag) {
  if (Dim < 0 || Dim >= int(Local.size()))
    return "its context-parallel axis is outside the tensor";
  ContextLayout L{Parts, Zigzag, G.Full[Dim] * Parts};
  if (!L.divides())
    return "its sequence does not divide into the context-parallel chunks";
  auto Runs = L.runs(CpRank, G.Offset[Dim], Local[Dim]);
  G.Full[Dim] = L.Seq;
  if (Runs.empty())
    return "";
  G.Offset[Dim] = Runs[0].Global;
  if (Runs.size() == 2) {
    G.Seam[Dim] = Runs[1].Local - Runs[0].Local;
    G.Jump[Dim] = Runs[1].Global - (Runs[0].Global + Runs[0].Length);
  }
  return "";
}

/// cp_slice and cp_pad (ir/ops/ParallelOps.cpp) on bytes: with Slice, Local
/// = context-parallel rank CpRank's positions of Whole along axis Dim (of
/// the whole tensor's shape WholeType); without, Whole = Local at those
/// positions and zero elsewhere.
inline void contextCopy(char *Whole, char *Local, const TensorType &WholeType,
                        int Dim, const ContextLayout &L, int CpRank,
                        bool Slice) {
  AxisView A = around(WholeType, Dim);
  const int64_t E = dtypeSize(WholeType.Dtype) * A.Inner;
  const int64_t WholeRow = WholeType.Shape[Dim] * E, LocalRow = L.local() * E;
  if (!Slice)
    std::memset(Whole, 0, size_t(A.Outer * WholeRow));
  for (const ContextLayout::Run &R : L.runs(CpRank))
    for (int64_t O = 0; O < A.Outer; ++O) {
      char *W = Whole + O * WholeRow + R.Global * E;
      char *Lc = Local + O * LocalRow + R.Local * E;
      if (Slice)
        std::memcpy(Lc, W, size_t(R.Length * E));
      else
        std::memcpy(W, Lc, size_t(R.Length * E));
    }
}

/// Puts one chunk of a tensor split along an axis into the whole: Outer
/// blocks of ChunkBytes, block O to byte (O * Parts + Slot) * ChunkBytes of
/// Whole (all_gather's reorder, ring_concat).
inline void placeChunk(void *Whole, const void *Chunk, int64_t Outer,
                       int64_t ChunkBytes, int Parts, int64_t Slot) {
  char *W = static_cast<char *>(Whole);
  const char *C = static_cast<const char *>(Chunk);
  for (int64_t O = 0; O < Outer; ++O)
    std::memcpy(W + (O * Parts + Slot) * ChunkBytes, C + O * ChunkBytes,
                ChunkBytes);
}

/// collective-matmul's ring (passes/CollectiveMatmul.cpp), as both backends
/// run it, on bytes. What is wrong with ring_shift or ring_concat I over a
/// group of GroupSize ranks, or "": its parts must be the group's size and
/// every operand of its result's type (the bytes are copied as they are).
inline std::string ringProblem(const Instruction &I,
                               const std::vector<ProgramBuffer> &Bufs,
                               int GroupSize) {
  std::string Op = opName(I.Op).str();
  int64_t Parts = attrInt(I.Op, I.Attrs, "parts");
  if (Parts != GroupSize)
    return Op + " of " + std::to_string(Parts) + " parts over a group of " +
           std::to_string(GroupSize);
  DType Out = Bufs[I.Out[0]].Type.Dtype;
  for (int B : I.In)
    if (Bufs[B].Type.Dtype != Out)
      return Op + " copies bytes, but its operand is " +
             dtypeName(Bufs[B].Type.Dtype).str() + " and its result " +
             dtypeName(Out).str();
  return "";
}

/// ring_concat: on rank Rank, operand K is chunk (Rank - K) mod Parts of
/// the result along Dim, copied as Outer blocks of ChunkBytes, block O to
/// byte (O * Parts + Slot) * ChunkBytes of the result.
struct RingCopy {
  int64_t Outer, ChunkBytes, Slot;
};
inline RingCopy ringCopy(const TensorType &Whole, int Dim, int Parts,
                         int Rank, int K) {
  AxisView A = around(Whole, Dim);
  int64_t Elem = Whole.numBytes() / std::max<int64_t>(1, Whole.numElements());
  return {A.Outer, Whole.Shape[Dim] / Parts * A.Inner * Elem,
          ((Rank - K) % Parts + Parts) % Parts};
}

} // namespace sp

#endif // SP_RUNTIME_TENSORLAYOUT_H
