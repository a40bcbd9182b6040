//===- CollectiveWalk.h - The message walks both backends run ---*- C++ -*-===//
//
// collective-matmul's ring (ring_shift, ring_concat) and the pipeline
// messages (send, recv, pipe_broadcast, pipe_all_reduce), written once for
// the CPU backend (runtime/cpu/CpuBackend.cpp, runtime/cpu/Collectives.h)
// and the CUDA one (runtime/cuda/Collectives.cpp, PipelineChannels.cpp):
// the checks, who sends what to whom, and the order of pipe_all_reduce's
// sum, which fixes the bits every stage gets (the backends are compared
// bitwise). A backend passes the steps that move and add bytes where its
// memory is, as an object (Steps) whose member functions the walks call.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_COLLECTIVEWALK_H
#define SP_RUNTIME_COLLECTIVEWALK_H

#include "ir/OpDef.h"
#include "runtime/Backend.h"
#include "runtime/TensorLayout.h"
#include "runtime/comm/Communicator.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"
#include <cstdint>
#include <string>

namespace sp {

/// The communicator of C's collective group (its "group" attribute, or
/// its op's default), or the error that this run has none by that name.
inline llvm::Expected<Communicator *> groupOf(const KernelCall &C) {
  std::string Name = collectiveGroup(C.I.Op, C.I.Attrs);
  if (Communicator *G = C.group(Name))
    return G;
  return makeError("no communicator for group '" + Name + "'");
}

/// ring_shift and ring_concat (passes/CollectiveMatmul.cpp) over the group
/// G, on bytes (whatever type the plan stores). ring_shift sends to the
/// next rank of the group and receives from the previous one; ring_concat
/// writes operand k at chunk (rank - k) mod parts (ringCopy). Steps has:
///
///   Error copy(void *Dst, const void *Src, int64_t Bytes)
///       ring_shift over one rank;
///   Error shift(const void *Send, int Next, void *Recv, int Prev,
///               int64_t Bytes)
///       the send of Send to rank Next and the receive into Recv from rank
///       Prev (buffered or grouped, so that the ring cannot deadlock);
///   Error place(void *Whole, const void *Chunk, const RingCopy &R,
///               int Parts)
///       ring_concat's copy of one operand into the result.
template <typename Steps>
llvm::Error ringWalk(const KernelCall &C, Communicator &G, Steps &&S) {
  const Instruction &I = C.I;
  if (std::string Why = ringProblem(I, C.Prog.Buffers, G.size()); !Why.empty())
    return makeError(Why);
  int Parts = G.size(), Rank = G.rank();
  if (I.Op == OpKind::RingShift) {
    int64_t Bytes = C.inType(0).numBytes();
    if (Parts == 1)
      return S.copy(C.buffer(I.Out[0]), C.buffer(I.In[0]), Bytes);
    return S.shift(C.buffer(I.In[0]), (Rank + 1) % Parts, C.buffer(I.Out[0]),
                   (Rank + Parts - 1) % Parts, Bytes);
  }
  int Dim = int(attrInt(I.Op, I.Attrs, "dim"));
  for (int K = 0; K < Parts; ++K) {
    RingCopy R = ringCopy(C.outType(0), Dim, Parts, Rank, K);
    if (auto E = S.place(C.buffer(I.Out[0]), C.buffer(I.In[K]), R, Parts))
      return E;
  }
  return llvm::Error::success();
}

/// The pipeline group of C, or the error that the plan runs without
/// pipeline stages.
inline llvm::Expected<Communicator *> pipelineGroup(const KernelCall &C) {
  if (!C.Pipeline)
    return makeError("a pipeline instruction in a plan run without pipeline "
                     "stages");
  return C.Pipeline;
}

/// The pipeline messages, between the stages of one tensor-parallel rank
/// through the pipeline group Pipe: whole buffers sent, received or
/// broadcast, and pipe_all_reduce, the sum of a weight's gradient parts
/// (T elements) over the stages that hold it: the first listed stage sums
/// the parts in list order and sends the sum back, so every stage gets the
/// same bits. Steps has:
///
///   Error send(int Peer, const void *Data, int64_t Bytes, int Tag)
///   Error recv(int Peer, void *Data, int64_t Bytes, int Tag)
///       a message to or from stage Peer (Tag: the instruction's; a backend
///       with a channel per peer may not need it);
///   Error copy(void *Dst, const void *Src, int64_t Bytes)
///   Error broadcast(void *Data, int64_t Bytes, int Root)
///   Expected<T *> scratch(int64_t Count)
///       room for one received part of Count elements;
///   void add(T *Y, const T *Part, int64_t Count)
///       Y += Part, element by element.
template <typename T, typename Steps>
llvm::Error pipelineWalk(const KernelCall &C, Communicator &Pipe, Steps &&S) {
  const Instruction &I = C.I;
  int Stage = Pipe.rank();
  auto Tag = [&] { return int(attrInt(I.Op, I.Attrs, "tag")); };
  switch (I.Op) {
  case OpKind::Send:
    return S.send(int(attrInt(I.Op, I.Attrs, "peer")), C.buffer(I.In[0]),
                  C.inType(0).numBytes(), Tag());
  case OpKind::Recv:
    return S.recv(int(attrInt(I.Op, I.Attrs, "peer")), C.buffer(I.Out[0]),
                  C.outType(0).numBytes(), Tag());
  case OpKind::PipeBroadcast: {
    int Root = int(attrInt(I.Op, I.Attrs, "root"));
    int64_t Bytes = C.outType(0).numBytes();
    if (Stage == Root)
      if (auto E = S.copy(C.buffer(I.Out[0]), C.buffer(I.In[0]), Bytes))
        return E;
    return S.broadcast(C.buffer(I.Out[0]), Bytes, Root);
  }
  case OpKind::PipeAllReduce: {
    auto Ranks = attrInts(I.Op, I.Attrs, "ranks");
    if (Ranks.empty() || !llvm::is_contained(Ranks, int64_t(Stage)))
      return makeError("pipe_all_reduce does not list this stage");
    T *Y = C.out<T>(0);
    int64_t N = C.outType(0).numElements(), Bytes = N * int64_t(sizeof(T));
    if (auto E = S.copy(Y, C.buffer(I.In[0]), Bytes))
      return E;
    if (Stage != Ranks[0]) {
      if (auto E = S.send(int(Ranks[0]), Y, Bytes, Tag()))
        return E;
      return S.recv(int(Ranks[0]), Y, Bytes, Tag());
    }
    llvm::Expected<T *> Part = S.scratch(N);
    if (!Part)
      return Part.takeError();
    for (size_t K = 1; K < Ranks.size(); ++K) {
      if (auto E = S.recv(int(Ranks[K]), *Part, Bytes, Tag()))
        return E;
      S.add(Y, *Part, N);
    }
    for (size_t K = 1; K < Ranks.size(); ++K)
      if (auto E = S.send(int(Ranks[K]), Y, Bytes, Tag()))
        return E;
    return llvm::Error::success();
  }
  default:
    llvm_unreachable("not a pipeline message");
  }
}

} // namespace sp

#endif // SP_RUNTIME_COLLECTIVEWALK_H
