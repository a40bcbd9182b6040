//===- Optimizer.cpp - grad_norm and AdamW on the GPU ---------------------===//
//
// grad_norm: the squares of the gradients summed in double on the device,
// reduced over the groups the op names (CpuBackend's order of sums).
//
// The optimizer's run of adamw calls (one per parameter) is deferred and
// launched as one multi-tensor kernel (flushAdamw; MultiTensor.h), as
// apex's multi_tensor_apply: consecutive adamw calls on one stream sharing
// the grad norm, lr, step and hyperparameters are collected, and the batch
// is launched before any other call runs, before a call that waits for one
// of its events, and on every host wait (drain: synchronize, the host
// copies, release), so every call still sees the effects of the calls
// before it (Backend.h). The events the stream plan records after those
// adamw calls are recorded after the batch.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaBackendImpl.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"

using namespace llvm;

namespace sp::cuda {

Error CudaBackend::gradNorm(const KernelCall &C, cudaStream_t S) {
  // As CpuBackend: split gradients' squares summed over the tensor group (in
  // double), replicated ones counted once, with ZeRO the total over the
  // replicas (in double), the total over the pipeline (in double) when the
  // op says so.
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  bool AnySplit = false, AnyWhole = false;
  for (int B : I.In) {
    bool Split = Bufs[B].Shard.K == Sharding::Split;
    double *Sum = Split ? &Norm->SplitD : &Norm->Whole;
    bool &Any = Split ? AnySplit : AnyWhole;
    cuda::sumSquares(Sum, reinterpret_cast<const float *>(C.buffer(B)),
                     Bufs[B].Type.numElements(), Norm->Partials, Any, S);
    Any = true;
  }
  if (!AnySplit)
    SP_CUDA_TRY(cudaMemsetAsync(&Norm->SplitD, 0, sizeof(double), S));
  if (!AnyWhole)
    SP_CUDA_TRY(cudaMemsetAsync(&Norm->Whole, 0, sizeof(double), S));
  if (C.Tensor.size() > 1)
    if (auto E = sumAside(C.Tensor, &Norm->SplitD, S))
      return E;
  cuda::gradNormTotal(&Norm->Total, &Norm->SplitD, nullptr, &Norm->Whole, S);
  if (attrInt(I.Op, I.Attrs, "zero")) {
    // ZeRO: each replica holds a chunk of every gradient; the sum over them,
    // as CpuBackend.
    if (!C.Data)
      return makeError("grad_norm {zero = 1} in a plan run without "
                       "data-parallel replicas");
    if (auto E = sumAside(*C.Data, &Norm->Total, S))
      return E;
  }
  if (attrInt(I.Op, I.Attrs, "pipeline") && C.Pipeline &&
      C.Pipeline->size() > 1)
    if (auto E = sumAside(*C.Pipeline, &Norm->Total, S))
      return E;
  // Loss scaling: the norm of the unscaled gradients (C.GradScale is a
  // power of two: exact).
  cuda::gradNormFinish(reinterpret_cast<float *>(C.buffer(I.Out[0])),
                       &Norm->Total, nullptr, C.GradScale, S);
  return Error::success();
}

CudaBackend::AdamwShared CudaBackend::adamwShared(const KernelCall &C,
                                                 cudaStream_t S) {
  const Instruction &I = C.I;
  auto F = [&](unsigned K) {
    return reinterpret_cast<const float *>(C.buffer(I.In[K]));
  };
  auto A = [&](StringRef Name) { return attrFloat(I.Op, I.Attrs, Name); };
  return {S,          F(4),     F(5),          F(6),
          A("beta1"), A("beta2"), A("eps"), A("max_norm"), C.GradScale};
}

bool CudaBackend::adamwJoins(const KernelCall &C, cudaStream_t S,
                             const cuda::StreamStep &Step) const {
  // A wait for an event of the batch needs the batch launched first.
  for (int W : Step.WaitFor)
    if (is_contained(Adamw.Events, W))
      return false;
  return adamwShared(C, S) == Adamw.Shared;
}

void CudaBackend::deferAdamw(const KernelCall &C, cudaStream_t S, size_t J,
                             ParamChunk Chunk, bool RecordEvent) {
  const Instruction &I = C.I;
  auto F = [&](unsigned K) {
    return reinterpret_cast<float *>(C.buffer(I.In[K]));
  };
  if (Adamw.Tensors.empty())
    Adamw.Shared = adamwShared(C, S);
  // With ZeRO, this rank's chunk of the parameter (g, m, v are that chunk).
  if (Chunk.Count)
    Adamw.Tensors.push_back({F(0) + Chunk.Begin, F(1), F(2), F(3), Chunk.Count,
                             attrFloat(I.Op, I.Attrs, "weight_decay")});
  if (RecordEvent)
    Adamw.Events.push_back(int(J));
}

Error CudaBackend::flushAdamw() {
  if (Adamw.Tensors.empty())
    return Error::success();
  AdamwBatch B = std::move(Adamw);
  Adamw = AdamwBatch();
  const AdamwShared &Sh = B.Shared;
  cuda::adamwMultiTensor(B.Tensors.data(), int(B.Tensors.size()), Sh.Norm,
                         Sh.Lr, Sh.Step, Sh.Beta1, Sh.Beta2, Sh.Eps,
                         Sh.MaxNorm, float(Sh.GradScale), Sh.Stream);
  SP_CUDA_TRY(cudaGetLastError());
  for (int J : B.Events)
    SP_CUDA_TRY(cudaEventRecord(Events[J], Sh.Stream));
  for (size_t K : B.Timed)
    if (K < Timed.size())
      if (auto E = timeEnd(K, Sh.Stream))
        return E;
  if (!B.Timed.empty())
    AdamwLaunches.emplace_back(std::move(B.Timed),
                               std::move(B.TimedElements));
  return Error::success();
}

} // namespace sp::cuda
