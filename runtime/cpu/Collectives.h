//===- Collectives.h - The CPU backend's collective instructions -*- C++ -*-===//
//
// What the CPU backend (CpuBackend.cpp) does for the instructions that
// communicate: the all-reduce, the all-gather and reduce-scatter of
// sequence parallelism and of ZeRO-1's chunks over a Communicator, the
// vocabulary-parallel cross entropy (each rank's logits are a vocabulary
// slice: the row maxima and sums of exponentials are reduced over the
// group), and the pipeline messages (send, recv, and the broadcast of a
// tied weight's gradient over its stages: runtime/CollectiveWalk.h's walk,
// with the steps here). Included by CpuBackend.cpp alone.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CPU_COLLECTIVES_H
#define SP_RUNTIME_CPU_COLLECTIVES_H

#include "ir/OpDef.h"
#include "runtime/Backend.h"
#include "runtime/CollectiveWalk.h"
#include "runtime/TensorLayout.h"
#include "runtime/comm/Communicator.h"
#include "runtime/cpu/Kernels.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace sp::cpu::comm {

using namespace llvm;

template <typename T>
inline Error allGather(Communicator &Comm, T *Out, const T *In,
                       const TensorType &Local, int Dim, int Parts) {
  int64_t N = Local.numElements();
  AxisView A = around(Local, Dim);
  if (A.Outer == 1)
    return Comm.allGather(Out, In, N);
  std::vector<T> Scratch(N * Parts); // [rank][outer][local][inner]
  if (auto E = Comm.allGather(Scratch.data(), In, N))
    return E;
  int64_t Chunk = Local.Shape[Dim] * A.Inner;
  for (int R = 0; R < Parts; ++R)
    placeChunk(Out, &Scratch[R * N], A.Outer, Chunk * int64_t(sizeof(T)),
               Parts, R);
  return Error::success();
}

template <typename T>
inline Error reduceScatter(Communicator &Comm, T *Out, const T *In,
                           const TensorType &Full, int Dim, int Parts) {
  int64_t N = Full.numElements() / Parts;
  AxisView A = around(Full, Dim);
  if (A.Outer == 1)
    return Comm.reduceScatterSum(Out, In, N);
  std::vector<T> Scratch(N * Parts); // rank-major
  int64_t Chunk = Full.Shape[Dim] / Parts * A.Inner;
  for (int R = 0; R < Parts; ++R)
    for (int64_t O = 0; O < A.Outer; ++O)
      std::memcpy(&Scratch[R * N + O * Chunk], In + (O * Parts + R) * Chunk,
                  Chunk * sizeof(T));
  return Comm.reduceScatterSum(Out, Scratch.data(), N);
}

/// ZeRO's gradient sums (reduce_scatter {flat = 1}): each operand read flat
/// and zero-padded to Parts chunks; all of them packed rank-major (rank r's
/// chunks of every operand together) into one reduce-scatter, so that a
/// bucket is one call.
template <typename T>
inline Error reduceScatterFlat(Communicator &Comm, const KernelCall &C) {
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  int Parts = Comm.size();
  int64_t Packed = 0; // this rank's elements: its chunk of every operand
  for (unsigned K = 0; K < I.Out.size(); ++K)
    Packed += Bufs[I.Out[K]].Type.numElements();
  std::vector<T> In(Packed * Parts, T(0)), Out(Packed);
  int64_t At = 0;
  for (unsigned K = 0; K < I.In.size(); ++K) {
    const T *X = reinterpret_cast<const T *>(C.buffer(I.In[K]));
    int64_t N = Bufs[I.In[K]].Type.numElements(),
            Chunk = Bufs[I.Out[K]].Type.numElements();
    for (int R = 0; R < Parts; ++R) {
      int64_t Begin = std::min(N, R * Chunk), End = std::min(N, Begin + Chunk);
      std::copy(X + Begin, X + End, &In[R * Packed + At]);
    }
    At += Chunk;
  }
  if (auto E = Comm.reduceScatterSum(Out.data(), In.data(), Packed))
    return E;
  At = 0;
  for (unsigned K = 0; K < I.Out.size(); ++K) {
    int64_t Chunk = Bufs[I.Out[K]].Type.numElements();
    std::copy(&Out[At], &Out[At] + Chunk,
              reinterpret_cast<T *>(C.buffer(I.Out[K])));
    At += Chunk;
  }
  return Error::success();
}

/// ZeRO's gather of updated parameters: every rank's flat chunk of each, in
/// place; a bucket's chunks packed into one all-gather.
template <typename T>
inline Error gatherParams(Communicator &Comm, const KernelCall &C) {
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  int Parts = Comm.size(), Rank = Comm.rank();
  int64_t Packed = 0; // one rank's chunks of every parameter
  for (int B : I.In)
    Packed += dataChunkElements(Bufs[B].Type.numElements(), Parts);
  std::vector<T> Mine(Packed, T(0)), All(Packed * Parts);
  int64_t At = 0;
  for (int B : I.In) {
    const T *P = reinterpret_cast<const T *>(C.buffer(B));
    int64_t N = Bufs[B].Type.numElements(), Chunk = dataChunkElements(N, Parts);
    int64_t Begin = std::min(N, Rank * Chunk), End = std::min(N, Begin + Chunk);
    std::copy(P + Begin, P + End, &Mine[At]);
    At += Chunk;
  }
  if (auto E = Comm.allGather(All.data(), Mine.data(), Packed))
    return E;
  At = 0;
  for (int B : I.In) {
    T *P = reinterpret_cast<T *>(C.buffer(B));
    int64_t N = Bufs[B].Type.numElements(), Chunk = dataChunkElements(N, Parts);
    for (int R = 0; R < Parts; ++R) {
      int64_t Begin = std::min(N, R * Chunk), End = std::min(N, Begin + Chunk);
      std::copy(&All[R * Packed + At], &All[R * Packed + At] + (End - Begin),
                P + Begin);
    }
    At += Chunk;
  }
  return Error::success();
}

template <typename T>
inline void takeChunk(int Rank, T *Out, const T *In, const TensorType &Full,
                      int Dim, int Parts) {
  AxisView A = around(Full, Dim);
  int64_t Chunk = Full.Shape[Dim] / Parts * A.Inner;
  for (int64_t O = 0; O < A.Outer; ++O)
    std::memcpy(Out + O * Chunk, In + (O * Parts + Rank) * Chunk,
                Chunk * sizeof(T));
}

/// all_reduce (one operand, or a bucket of them), all_gather,
/// reduce_scatter (along an axis, or ZeRO's flat one) and sp_split over
/// C's group.
template <typename T> inline Error collective(const KernelCall &C) {
  const Instruction &I = C.I;
  auto Group = groupOf(C);
  if (!Group)
    return Group.takeError();
  Communicator *G = *Group;
  if (I.Op == OpKind::AllReduce) {
    if (I.In.size() == 1) {
      std::memcpy(C.out<T>(0), C.in<T>(0), C.inType(0).numBytes());
      return G->allReduceSum(C.out<T>(0), C.outType(0).numElements());
    }
    // A bucket: its operands packed into one sum, elementwise as theirs.
    std::vector<T> Packed;
    for (unsigned K = 0; K < I.In.size(); ++K)
      Packed.insert(Packed.end(), C.in<T>(K),
                    C.in<T>(K) + C.inType(K).numElements());
    if (auto E = G->allReduceSum(Packed.data(), int64_t(Packed.size())))
      return E;
    const T *From = Packed.data();
    for (unsigned K = 0; K < I.Out.size(); ++K) {
      std::copy(From, From + C.outType(K).numElements(), C.out<T>(K));
      From += C.outType(K).numElements();
    }
    return Error::success();
  }
  int Dim = attrInt(I.Op, I.Attrs, "dim"),
      Parts = attrInt(I.Op, I.Attrs, "parts");
  if (I.Op == OpKind::ReduceScatter && attrInt(I.Op, I.Attrs, "flat")) {
    if (G->size() != Parts)
      return makeError(formatv("a flat reduce_scatter of {0} parts over a "
                               "group of {1}",
                               Parts, G->size()));
    return reduceScatterFlat<T>(*G, C);
  }
  T *Out = C.out<T>(0);
  const T *In = C.in<T>(0);
  const TensorType &InT = C.inType(0);
  switch (I.Op) {
  case OpKind::AllGather:
    return allGather(*G, Out, In, InT, Dim, Parts);
  case OpKind::ReduceScatter:
    return reduceScatter(*G, Out, In, InT, Dim, Parts);
  default:
    takeChunk(G->rank(), Out, In, InT, Dim, Parts);
    return Error::success();
  }
}

/// Each rank holds the logits of vocabulary rows [r V, (r + 1) V); columns
/// at or past Valid (global) are padding. The row maximum, the sum of
/// exponentials and the target logit are reduced over the group, so no rank
/// holds the full logits. Computes the mean loss over the rows whose target
/// is not Ignore (Loss) or its gradient (DLogits), whichever is non-null.
/// The maximum is only a shift (any value near it gives the same loss), so
/// it is reduced in float32 whatever T is.
template <typename T>
inline Error vocabParallelCrossEntropy(Communicator &Comm, T *Loss,
                                       T *DLogits, const T *Logits,
                                       const int64_t *Targets, int64_t N,
                                       int64_t V, int64_t Valid,
                                       std::optional<int64_t> Ignore,
                                       double DLoss) {
  int64_t Start = Comm.rank() * V;
  int64_t Mine = std::clamp<int64_t>(Valid - Start, 0, V);
  std::vector<float> Max(N, -std::numeric_limits<float>::infinity());
  std::vector<T> Sum(N, T(0)), Target(N, T(0));
  auto Counted = [&](int64_t I) { return !Ignore || Targets[I] != *Ignore; };
  int64_t NumCounted = 0;
  for (int64_t I = 0; I < N; ++I) {
    if (Counted(I) && (Targets[I] < 0 || Targets[I] >= Valid))
      return createStringError(inconvertibleErrorCode(),
                               "target %lld of row %lld is outside the "
                               "vocabulary",
                               (long long)Targets[I], (long long)I);
    NumCounted += Counted(I);
    for (int64_t J = 0; J < Mine; ++J)
      Max[I] = std::max(Max[I], float(Logits[I * V + J]));
  }
  if (auto E = Comm.allReduceMax(Max.data(), N))
    return E;
  for (int64_t I = 0; I < N; ++I) {
    double S = 0;
    for (int64_t J = 0; J < Mine; ++J)
      S += std::exp(double(Logits[I * V + J]) - Max[I]);
    Sum[I] = T(S);
    int64_t Col = Targets[I] - Start;
    if (Counted(I) && Col >= 0 && Col < Mine)
      Target[I] = Logits[I * V + Col];
  }
  if (auto E = Comm.allReduceSum(Sum.data(), N))
    return E;
  // As the one-device kernel: the mean over the counted rows, 0 (and zero
  // gradients) when none is counted.
  if (Loss) {
    if (auto E = Comm.allReduceSum(Target.data(), N))
      return E;
    double L = 0;
    for (int64_t I = 0; I < N; ++I)
      if (Counted(I))
        L += std::log(double(Sum[I])) + Max[I] - Target[I];
    *Loss = NumCounted ? T(L / NumCounted) : T(0);
    return Error::success();
  }
  double Scale = NumCounted ? DLoss / NumCounted : 0.0;
  for (int64_t I = 0; I < N; ++I)
    for (int64_t J = 0; J < V; ++J) {
      if (!Counted(I)) {
        DLogits[I * V + J] = T(0);
        continue;
      }
      double P = J < Mine ? std::exp(double(Logits[I * V + J]) - Max[I]) / Sum[I]
                          : 0.0;
      if (Start + J == Targets[I])
        P -= 1;
      DLogits[I * V + J] = T(P * Scale);
    }
  return Error::success();
}

/// The pipeline messages (runtime/CollectiveWalk.h's pipelineWalk) through
/// the pipeline group's point-to-point calls, which buffer their sends.
template <typename T> inline Error pipelineMessage(const KernelCall &C) {
  auto Pipe = pipelineGroup(C);
  if (!Pipe)
    return Pipe.takeError();
  struct Steps {
    Communicator &Pipe;
    std::vector<T> Part;
    Error send(int Peer, const void *Data, int64_t Bytes, int Tag) {
      return Pipe.send(Data, Bytes, Peer, Tag);
    }
    Error recv(int Peer, void *Data, int64_t Bytes, int Tag) {
      return Pipe.recv(Data, Bytes, Peer, Tag);
    }
    Error copy(void *Dst, const void *Src, int64_t Bytes) {
      std::memcpy(Dst, Src, Bytes);
      return Error::success();
    }
    Error broadcast(void *Data, int64_t Bytes, int Root) {
      return Pipe.broadcast(Data, Bytes, Root);
    }
    Expected<T *> scratch(int64_t Count) {
      Part.resize(Count);
      return Part.data();
    }
    void add(T *Y, const T *X, int64_t Count) {
      for (int64_t J = 0; J < Count; ++J)
        Y[J] += X[J];
    }
  };
  return pipelineWalk<T>(C, **Pipe, Steps{**Pipe, {}});
}

} // namespace sp::cpu::comm

#endif // SP_RUNTIME_CPU_COLLECTIVES_H
