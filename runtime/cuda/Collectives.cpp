//===- Collectives.cpp - The CUDA backend's collectives -------------------===//
//
// NCCL for the collectives of the tensor, pipeline and data groups (one
// communicator a group, made with the backend or at its first use), every
// call on the NCCL stream (the communication stream, or the compute stream
// without overlap), so the calls of a communicator are in program order on
// every rank. Computations that reduce a few values over a group
// (grad_norm, the vocabulary-parallel loss) hop to that stream and back
// with a pair of events.
//
// Activations are [batch, seq, hidden]; a sequence chunk is not
// contiguous, so gathers and scatters along an inner axis reorder through
// a rank-major scratch buffer (chunkCopy), as the CPU backend does.
//
//===----------------------------------------------------------------------===//
#include "runtime/CollectiveWalk.h"
#include "runtime/TensorLayout.h"
#include "runtime/cuda/CudaBackendImpl.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>

using namespace llvm;

namespace sp::cuda {

namespace {

/// Calls (NCCL calls) in one NCCL group when Group, so that they launch
/// as one.
Error inGroup(bool Group, function_ref<Error()> Calls) {
  return Group ? NcclComm::grouped(Calls) : Calls();
}

} // namespace

Expected<cuda::NcclComm *> CudaBackend::nccl(Communicator &Host) {
  auto It = Nccl.find(&Host);
  if (It != Nccl.end())
    return It->second.get();
  // (Creation waits for the group's other ranks on the host; what they may
  // wait for on the device, this rank's pipeline sends, is posted.)
  auto C = cuda::NcclComm::create(Host);
  if (!C)
    return C.takeError();
  cuda::NcclComm *Raw = C->get();
  Nccl[&Host] = std::move(*C);
  return Raw;
}

Error CudaBackend::hopToNccl(cudaStream_t S) {
  if (S == ncclStream())
    return Error::success();
  SP_CUDA_TRY(cudaEventRecord(ToNccl, S));
  SP_CUDA_TRY(cudaStreamWaitEvent(ncclStream(), ToNccl, 0));
  return Error::success();
}

Error CudaBackend::hopBack(cudaStream_t S) {
  if (S == ncclStream())
    return Error::success();
  SP_CUDA_TRY(cudaEventRecord(FromNccl, ncclStream()));
  SP_CUDA_TRY(cudaStreamWaitEvent(S, FromNccl, 0));
  return Error::success();
}

Error CudaBackend::onNccl(
    Communicator &G, cudaStream_t S,
    function_ref<Error(NcclComm &, cudaStream_t)> Calls) {
  auto N = nccl(G);
  if (!N)
    return N.takeError();
  if (auto E = hopToNccl(S))
    return E;
  if (auto E = Calls(**N, ncclStream()))
    return E;
  return hopBack(S);
}

Error CudaBackend::sumAside(Communicator &G, double *X, cudaStream_t S) {
  return onNccl(G, S, [&](NcclComm &N, cudaStream_t NS) {
    return N.allReduceSum(X, X, 1, NS);
  });
}

Error CudaBackend::ring(const KernelCall &C, Communicator *G,
                         cudaStream_t S) {
  struct Steps {
    CudaBackend &B;
    Communicator &G;
    cudaStream_t S;
    Error copy(void *Dst, const void *Src, int64_t Bytes) {
      SP_CUDA_TRY(
          cudaMemcpyAsync(Dst, Src, Bytes, cudaMemcpyDeviceToDevice, S));
      return Error::success();
    }
    Error shift(const void *Send, int Next, void *Recv, int Prev,
                int64_t Bytes) {
      auto N = B.nccl(G);
      if (!N)
        return N.takeError();
      return inGroup(true, [&] {
        if (auto E = (*N)->send(Send, Bytes, Next, S))
          return E;
        return (*N)->recv(Recv, Bytes, Prev, S);
      });
    }
    Error place(void *Whole, const void *Chunk, const RingCopy &R, int Parts) {
      SP_CUDA_TRY(cudaMemcpy2DAsync(
          static_cast<char *>(Whole) + R.Slot * R.ChunkBytes,
          size_t(Parts * R.ChunkBytes), Chunk, size_t(R.ChunkBytes),
          size_t(R.ChunkBytes), size_t(R.Outer), cudaMemcpyDeviceToDevice, S));
      return Error::success();
    }
  };
  return ringWalk(C, *G, Steps{*this, *G, S});
}

Error CudaBackend::collective(const KernelCall &C, Communicator *G,
                               cudaStream_t S) {
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  float *Out = reinterpret_cast<float *>(C.buffer(I.Out[0]));
  const float *In = reinterpret_cast<const float *>(C.buffer(I.In[0]));
  const TensorType &InT = Bufs[I.In[0]].Type;
  if (I.Op == OpKind::AllReduce) {
    // One operand, or a bucket of gradient sums: its operands' all-reduces
    // in one NCCL group (one launch).
    cuda::NcclComm *Nc = nullptr;
    if (G->size() > 1) {
      auto N = nccl(*G);
      if (!N)
        return N.takeError();
      Nc = *N;
    }
    return inGroup(Nc && I.In.size() > 1, [&]() -> Error {
      for (unsigned K = 0; K < I.In.size(); ++K) {
        float *O = reinterpret_cast<float *>(C.buffer(I.Out[K]));
        const float *X = reinterpret_cast<const float *>(C.buffer(I.In[K]));
        int64_t Count = Bufs[I.Out[K]].Type.numElements();
        if (!Nc) {
          if (O != X)
            SP_CUDA_TRY(cudaMemcpyAsync(O, X, Count * sizeof(float),
                                        cudaMemcpyDeviceToDevice, S));
          continue;
        }
        if (auto E = Nc->allReduceSum(O, X, Count, S))
          return E;
      }
      return Error::success();
    });
  }
  int Dim = attrInt(I.Op, I.Attrs, "dim"), Parts = attrInt(I.Op, I.Attrs, "parts");
  if (I.Op == OpKind::ReduceScatter && attrInt(I.Op, I.Attrs, "flat"))
    return reduceScatterFlat(C, *G, S);
  if (I.Op == OpKind::SpSplit) {
    // This rank's chunk along Dim: a strided copy, no communication.
    AxisView A = around(InT, Dim);
    int64_t Chunk = InT.Shape[Dim] / Parts * A.Inner;
    cuda::chunkCopy(Out, Chunk, In + G->rank() * Chunk, Parts * Chunk, Chunk,
                    A.Outer, S);
    return Error::success();
  }
  if (G->size() == 1) {
    SP_CUDA_TRY(cudaMemcpyAsync(Out, In, InT.numBytes(),
                                cudaMemcpyDeviceToDevice, S));
    return Error::success();
  }
  auto N = nccl(*G);
  if (!N)
    return N.takeError();
  if (I.Op == OpKind::AllGather) {
    int64_t Count = InT.numElements();
    AxisView A = around(InT, Dim);
    if (A.Outer == 1)
      return (*N)->allGather(Out, In, Count, S);
    auto Tmp = scratch(S == Comm, Count * Parts); // [rank][outer][local][inner]
    if (!Tmp)
      return Tmp.takeError();
    if (auto E = (*N)->allGather(*Tmp, In, Count, S))
      return E;
    int64_t Chunk = InT.Shape[Dim] * A.Inner;
    for (int R = 0; R < Parts; ++R)
      cuda::chunkCopy(Out + R * Chunk, Parts * Chunk, *Tmp + R * Count, Chunk,
                      Chunk, A.Outer, S);
    return Error::success();
  }
  // ReduceScatter.
  int64_t Count = InT.numElements() / Parts;
  AxisView A = around(InT, Dim);
  if (A.Outer == 1)
    return (*N)->reduceScatterSum(Out, In, Count, S);
  auto Tmp = scratch(S == Comm, Count * Parts); // rank-major
  if (!Tmp)
    return Tmp.takeError();
  int64_t Chunk = InT.Shape[Dim] / Parts * A.Inner;
  for (int R = 0; R < Parts; ++R)
    cuda::chunkCopy(*Tmp + R * Count, Chunk, In + R * Chunk, Parts * Chunk,
                    Chunk, A.Outer, S);
  return (*N)->reduceScatterSum(Out, *Tmp, Count, S);
}

Error CudaBackend::reduceScatterFlat(const KernelCall &C, Communicator &G,
                                     cudaStream_t S) {
  // As CpuBackend: each operand flat, zero-padded to Parts chunks; rank r
  // keeps the sum of chunk r. A bucket is one NCCL group. An operand whose
  // size Parts divides is its own rank-major layout; the others go through
  // a padded copy in scratch (one region each, so that the group's calls do
  // not share bytes).
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  int Parts = G.size();
  if (Parts != attrInt(I.Op, I.Attrs, "parts"))
    return makeError(formatv("a flat reduce_scatter of {0} parts over a "
                             "group of {1}",
                             attrInt(I.Op, I.Attrs, "parts"), Parts));
  auto T = paddedScratch(C, Parts, S == Comm);
  if (!T)
    return T.takeError();
  float *Tmp = *T;
  // The padded copies first, on S before the group's calls.
  std::vector<const float *> Src(I.In.size());
  for (unsigned K = 0; K < I.In.size(); ++K) {
    Src[K] = reinterpret_cast<const float *>(C.buffer(I.In[K]));
    int64_t Count = Bufs[I.In[K]].Type.numElements(),
            Chunk = Bufs[I.Out[K]].Type.numElements();
    if (Count == Chunk * Parts)
      continue;
    SP_CUDA_TRY(cudaMemsetAsync(Tmp, 0, Chunk * Parts * sizeof(float), S));
    SP_CUDA_TRY(cudaMemcpyAsync(Tmp, Src[K], Count * sizeof(float),
                                cudaMemcpyDeviceToDevice, S));
    Src[K] = Tmp;
    Tmp += Chunk * Parts;
  }
  auto N = nccl(G);
  if (!N)
    return N.takeError();
  return inGroup(I.In.size() > 1, [&]() -> Error {
    for (unsigned K = 0; K < I.In.size(); ++K)
      if (auto E = (*N)->reduceScatterSum(
              reinterpret_cast<float *>(C.buffer(I.Out[K])), Src[K],
              Bufs[I.Out[K]].Type.numElements(), S))
        return E;
    return Error::success();
  });
}

Error CudaBackend::gatherParam(const KernelCall &C, cudaStream_t S) {
  // As CpuBackend: every rank's flat chunk of each parameter, in place; a
  // bucket is one NCCL group. NCCL's in-place all-gather (sendbuff =
  // recvbuff + rank * count) where Parts divides the parameter; through a
  // padded copy in scratch (a region each) otherwise.
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  Communicator *G = C.group(collectiveGroup(I.Op, I.Attrs));
  int64_t Parts = attrInt(I.Op, I.Attrs, "parts");
  if (!G || G->size() != Parts)
    return makeError(formatv("gather_param of {0} parts needs a "
                             "data-parallel group of that size",
                             Parts));
  int Rank = G->rank();
  auto T = paddedScratch(C, Parts, S == Comm);
  if (!T)
    return T.takeError();
  float *Tmp = *T;
  // Where each parameter is gathered: in place, or its scratch region
  // (filled with this rank's chunk first).
  std::vector<float *> Into(I.In.size());
  for (unsigned K = 0; K < I.In.size(); ++K) {
    float *P = reinterpret_cast<float *>(C.buffer(I.In[K]));
    int64_t Count = Bufs[I.In[K]].Type.numElements(),
            Chunk = dataChunkElements(Count, Parts);
    Into[K] = P;
    if (Count == Chunk * Parts)
      continue;
    int64_t Begin = std::min(Count, Rank * Chunk);
    SP_CUDA_TRY(cudaMemsetAsync(Tmp, 0, Chunk * Parts * sizeof(float), S));
    SP_CUDA_TRY(cudaMemcpyAsync(Tmp + Rank * Chunk, P + Begin,
                                std::min(Chunk, Count - Begin) * sizeof(float),
                                cudaMemcpyDeviceToDevice, S));
    Into[K] = Tmp;
    Tmp += Chunk * Parts;
  }
  auto N = nccl(*G);
  if (!N)
    return N.takeError();
  if (auto E = inGroup(I.In.size() > 1, [&]() -> Error {
        for (unsigned K = 0; K < I.In.size(); ++K) {
          int64_t Chunk =
              dataChunkElements(Bufs[I.In[K]].Type.numElements(), Parts);
          if (auto E =
                  (*N)->allGather(Into[K], Into[K] + Rank * Chunk, Chunk, S))
            return E;
        }
        return Error::success();
      }))
    return E;
  // The padded ones back into their parameters.
  for (unsigned K = 0; K < I.In.size(); ++K) {
    float *P = reinterpret_cast<float *>(C.buffer(I.In[K]));
    if (Into[K] != P)
      SP_CUDA_TRY(cudaMemcpyAsync(P, Into[K],
                                  Bufs[I.In[K]].Type.numBytes(),
                                  cudaMemcpyDeviceToDevice, S));
  }
  return Error::success();
}

} // namespace sp::cuda
