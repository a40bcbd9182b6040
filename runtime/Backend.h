//===- Backend.h - Where a plan's instructions run ---------------*- C++ -*-===//
//
// The executor keeps the instruction loop, the feeding of inputs, the
// statistics, the measured memory and tracing; a backend owns the rest:
//
//   - memory: the arena (one allocation of the plan's ArenaBytes; its
//     pointers are the backend's, host or device), and the copies between
//     it and the host (parameters in, inputs in, results and dumps out);
//   - the kernels: one call per instruction, including the tensor-parallel
//     collectives and the vocabulary-parallel loss, which reduce over the
//     call's tensor group, and the pipeline messages (send, recv,
//     pipe_all_reduce, pipe_broadcast) over its pipeline group;
//   - ordering: calls take effect in program order, as on one queue;
//     synchronize() waits for all of them. Streams and events are the
//     backend's own: a device backend may run collectives on a second stream
//     and order it with events (overlapping communication with compute), as
//     long as each call sees the effects of the calls before it.
//
// The CPU backend (runtime/cpu/CpuBackend.h) runs each call to completion on
// the calling thread. The executor touches backend memory only through the
// copies: its tensor views read a host mirror of a device arena
// (Executor::download and upload).
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_BACKEND_H
#define SP_RUNTIME_BACKEND_H

#include "plan/Program.h"
#include "runtime/comm/Communicator.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <optional>
#include <vector>

namespace sp {

/// The communicator of a group named in the IR ("tp", "pp", "dp", "cp")
/// among a rank's tensor, pipeline, data-parallel and context-parallel
/// groups, or null when the rank has none by that name.
inline Communicator *resolveGroup(llvm::StringRef Name, Communicator *Tensor,
                                  Communicator *Pipeline, Communicator *Data,
                                  Communicator *Context = nullptr) {
  return Name == "tp"   ? Tensor
         : Name == "pp" ? Pipeline
         : Name == "dp" ? Data
         : Name == "cp" ? Context
                        : nullptr;
}

/// One instruction to run, and everything it may read besides its buffers.
struct KernelCall {
  const Instruction &I;
  /// The buffers' types, shardings and arena offsets.
  const Program &Prog;
  /// The arena the offsets are into (the backend's memory).
  char *Arena;
  /// 1-based training step (dropout streams); 0 when evaluating.
  int64_t Step;
  /// Training: dropout is on (at the plan's ratio, or Dropout when set).
  bool Training;
  std::optional<double> Dropout;
  /// The run's seed (dropout masks).
  uint64_t Seed;
  /// The tensor-parallel group (one rank when the plan has no tensor
  /// parallelism), the pipeline group (null without stages) and the
  /// data-parallel group (null without replicas or context parallelism;
  /// with both, the ranks of every replica's context group, ordered by
  /// replica, then context rank: runtime/comm/ProcessGrid.h).
  Communicator &Tensor;
  Communicator *Pipeline;
  Communicator *Data;

  /// The factor the optimizer multiplies the gradients by (grad_norm, adamw):
  /// 1 / the loss scale, or 1.
  double GradScale = 1;
  /// Where each buffer is, when not at its offset in Arena (the CPU
  /// backend's mixed-precision path: float32 copies of 16-bit buffers).
  char *const *Where = nullptr;
  /// The context-parallel group (null without --cp).
  Communicator *Context = nullptr;
  /// Hierarchical context parallelism (attention {cp_comm = "a2a+ring"}):
  /// the cp group's all-to-all group of cp_a2a consecutive ranks and the
  /// ring across them (runtime/comm/ProcessGrid.h splitContext); null
  /// otherwise.
  Communicator *ContextInner = nullptr, *ContextOuter = nullptr;

  /// This rank's data-parallel replica and the replicas: the rows of the
  /// step's batch it trains on.
  int replica() const {
    return Data ? Data->rank() / (Context ? Context->size() : 1) : 0;
  }
  int replicas() const {
    return Data ? Data->size() / (Context ? Context->size() : 1) : 1;
  }

  char *buffer(int Id) const {
    return Where ? Where[Id] : Arena + Prog.Buffers[Id].Offset;
  }
  /// The instruction's K-th operand and result, as T elements, and their
  /// types.
  template <typename T> T *in(unsigned K) const {
    return reinterpret_cast<T *>(buffer(I.In[K]));
  }
  template <typename T> T *out(unsigned K) const {
    return reinterpret_cast<T *>(buffer(I.Out[K]));
  }
  const TensorType &inType(unsigned K) const {
    return Prog.Buffers[I.In[K]].Type;
  }
  const TensorType &outType(unsigned K) const {
    return Prog.Buffers[I.Out[K]].Type;
  }
  /// The communicator of a group named in the IR ("tp", "pp", "dp",
  /// "cp"), or null when this run has none by that name.
  Communicator *group(llvm::StringRef Name) const {
    return resolveGroup(Name, &Tensor, Pipeline, Data, Context);
  }
};

/// The elements of its parameter an adamw instruction updates: all of them,
/// or with ZeRO (zero_parts = D) this data-parallel rank's flat chunk
/// [r c, min(n, (r + 1) c)), c = ceil(n / D), which its gradient and
/// moments hold (the last chunk's padding is never written back).
struct ParamChunk {
  int64_t Begin = 0, Count = 0;
};
llvm::Expected<ParamChunk> adamwChunk(const KernelCall &C);

class Backend {
public:
  virtual ~Backend();
  virtual llvm::StringRef name() const = 0;

  /// Bytes of zeroed backend memory for the arena; release() frees it.
  virtual llvm::Expected<char *> allocate(size_t Bytes) = 0;
  virtual void release(char *Arena) = 0;
  /// Copies between the host and backend memory.
  virtual llvm::Error copyToBackend(char *Dst, const void *Src,
                                    size_t Bytes) = 0;
  virtual llvm::Error copyToHost(void *Dst, const char *Src, size_t Bytes) = 0;
  /// Whether backend memory is host memory. The executor loads parameters,
  /// feeds inputs and reads the loss through the copies above; its tensor
  /// views (parameters(), gradient(), logits()) point into the arena when
  /// it is host memory, else into a host mirror.
  virtual bool hostMemory() const = 0;
  /// Whether it runs a compact program's steps over their templates, with
  /// every buffer's address in KernelCall::Where. A backend that plans per
  /// instruction of the whole program (the CUDA one: its streams and
  /// events) runs compact programs written out.
  virtual bool runsCompactPrograms() const { return false; }
  /// Whether it runs mixed-precision plans (bf16 or fp16 activations).
  virtual bool runsMixedPrecision() const { return false; }
  /// Whether it runs context-parallel plans (attention {cp > 1}: the ring,
  /// cp_slice, cp_pad, dropout at a rank's zigzag positions).
  virtual bool runsContextParallel() const { return false; }
  /// Whether it runs hierarchical context parallelism (--cp-comm
  /// a2a+ring: KernelCall::ContextInner and ContextOuter).
  virtual bool runsHierarchicalContextParallel() const { return false; }

  /// The dense GEMM throughput (FLOP/s) this rank's device peaks at when
  /// the plan computes in Dtype ("f32", "bf16", "f16", "f64"), the
  /// denominator of the model FLOP utilization (MFU) sp-run logs; 0 when
  /// the backend does not know it.
  virtual double peakFlops(llvm::StringRef Dtype) const { return 0; }

  /// Runs (or enqueues) the kernel of one instruction. The error says what
  /// is wrong with the instruction, without naming it (the executor does).
  virtual llvm::Error run(const KernelCall &C) = 0;
  /// Waits for every call made so far.
  virtual llvm::Error synchronize() = 0;

  /// Timing on the device, for a trace that shows what ran at the same time
  /// (a collective beside a GEMM) without a host wait after every call. A
  /// backend that times its calls where they run says so; the executor then
  /// calls startTiming() when no call is pending, makes its calls, and
  /// collectTimes() returns one DeviceTime per run() since, in call order.
  struct DeviceTime {
    double StartUs, DurationUs; // the start: after startTiming()'s moment
    int Stream;                 // the stream it ran on (0: compute, 1: comm)
  };
  virtual bool timesOnDevice() const { return false; }
  virtual llvm::Error startTiming() { return llvm::Error::success(); }
  virtual llvm::Expected<std::vector<DeviceTime>> collectTimes() {
    return std::vector<DeviceTime>();
  }
};

} // namespace sp

#endif // SP_RUNTIME_BACKEND_H
