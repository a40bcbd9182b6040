//===- TensorLayout.h - A tensor seen around one axis ------------*- C++ -*-===//
#ifndef SP_RUNTIME_TENSORLAYOUT_H
#define SP_RUNTIME_TENSORLAYOUT_H

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
};
inline GlobalBlock globalBlock(llvm::ArrayRef<int64_t> Local, const Sharding &S,
                               int TensorRank, int64_t Microbatch,
                               int64_t Microbatches, int DataRank,
                               int DataSize) {
  GlobalBlock G{std::vector<int64_t>(Local.begin(), Local.end()),
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
