//===- CudaBackendImpl.h - The CUDA backend's class -------------*- C++ -*-===//
//
// The class behind createCudaBackend (CudaBackend.h), private to
// runtime/cuda: its members are defined one concern a file,
//   CudaBackend.cpp       making and ending a backend, run()'s stream plan,
//                         waits, synchronize() and the entry points;
//   DeviceMemory.cpp      the arena, pinned staging of host copies, and the
//                         scratch regions grown while running;
//   Gemm.cpp              cuBLAS GEMMs and the linear layer;
//   Collectives.cpp       NCCL communicators and the collectives;
//   PipelineChannels.cpp  pipeline messages over two-rank channels;
//   Optimizer.cpp         grad_norm and the deferred multi-tensor AdamW;
//   Timing.cpp            device timing of traced steps;
//   Dispatch.cpp          an instruction's kernels (dispatch, dispatchMixed);
//   AttentionCore.cpp     the fused attention core, unfused or blockwise;
//   ContextAttention.cpp  the core over a cp group (ring, all-to-all), and
//                         cp_slice, cp_pad.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_CUDABACKENDIMPL_H
#define SP_RUNTIME_CUDA_CUDABACKENDIMPL_H

#include "runtime/cuda/AttentionPlan.h"
#include "runtime/cuda/CublasLoader.h"
#include "runtime/cuda/CublasLt.h"
#include "runtime/cuda/CudaBackend.h"
#include "runtime/cuda/CudaCheck.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/LaunchGeometry.h"
#include "runtime/cuda/MixedPlan.h"
#include "runtime/cuda/NcclComm.h"
#include "runtime/cuda/StreamPlan.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/Twine.h"
#include <chrono>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace sp::cuda {

using llvm::ArrayRef;
using llvm::Error;
using llvm::Expected;
using llvm::StringRef;

/// Buffer Id of C's program as a kernel operand of its own storage.
Elems elems(const KernelCall &C, int Id);

/// cuda::paddingMask's code of a keep mask's type.
Expected<int> paddingKeepType(const TensorType &M);

/// The gradient-norm scalars in device memory.
struct NormScalars {
  double SplitD, Whole, Total;
  float SplitF, TotalF;
  double Partials[cuda::SumBlocks];
};

class CudaBackend final : public Backend {
public:
  static Expected<std::unique_ptr<CudaBackend>>
  create(const CudaBackendOptions &O);
  ~CudaBackend() override;

  StringRef name() const override { return "cuda"; }
  Expected<char *> allocate(size_t Bytes) override;
  void release(char *Arena) override;
  Error copyToBackend(char *Dst, const void *Src, size_t Bytes) override;
  Error copyToHost(void *Dst, const char *Src, size_t Bytes) override;
  bool hostMemory() const override { return false; }
  Error run(const KernelCall &C) override;
  Error synchronize() override;
  bool timesOnDevice() const override { return true; }
  Error startTiming() override;
  Expected<std::vector<DeviceTime>> collectTimes() override;
  double peakFlops(StringRef Dtype) const override;
  bool runsMixedPrecision() const override { return true; }
  bool runsContextParallel() const override { return true; }
  bool runsHierarchicalContextParallel() const override { return true; }

private:
  CudaBackend() = default;
  /// initDevice, then (every rank agreeing it succeeded) the NCCL
  /// communicators.
  Error init(const CudaBackendOptions &O);
  /// The rank's own part: device, streams, events, cuBLAS.
  Error initDevice(const CudaBackendOptions &O);
  Error dispatch(const KernelCall &C, cudaStream_t S);
  /// C's kernels on S (on float32 copies when Mixed: dispatchMixed), their
  /// launch checked, and the end of its timing recorded (timeStart made
  /// its start).
  Error issue(const KernelCall &C, cudaStream_t S, bool Mixed);
  /// An instruction that touches a bf16 or fp16 buffer: dispatch on float32
  /// copies of its 16-bit buffers, as CpuBackend's runMixed.
  Error dispatchMixed(const KernelCall &C, cudaStream_t S);
  /// Device memory for those copies, one region per stream (K 1: the
  /// communication stream), grown as needed.
  Expected<char *> mixedScratch(int K, int64_t Bytes);
  /// The fused attention core (attention, attention_grad) as its unfused
  /// ops on a workspace (AttentionPlan.h), one region per stream.
  Error attention(const KernelCall &C, cudaStream_t S);
  /// The same by the blockwise kernels (kernels/Attention.cuh), by Plan.
  Error attentionBlockwise(const KernelCall &C, cuda::BlockwisePlan Plan,
                           cudaStream_t S);
  /// Context parallelism (ContextAttention.cpp): the attention core over
  /// the cp group (attention {cp > 1}) by the ring, the all-to-all or both,
  /// on the blockwise kernels; cp_slice and cp_pad.
  struct ContextCall;
  Error contextAttention(const KernelCall &C, cudaStream_t S);
  Error ringAttention(const ContextCall &X, cudaStream_t S);
  /// The all-to-all inside Inner; then the kernels on the traded tensors,
  /// or with Outer the ring across the groups.
  Error ulyssesAttention(const ContextCall &X, Communicator &Inner,
                         Communicator *Outer, cudaStream_t S);
  Error contextCopy(const KernelCall &C, cudaStream_t S);
  /// Whether I's kernel reads and writes its 16-bit buffers in place
  /// (cuda::runsIn16Bit; the attention core only by the blockwise
  /// kernels, when they are on).
  bool inPlace16(const Instruction &I,
                 const std::vector<ProgramBuffer> &Bufs) const {
    if ((I.Op == OpKind::Attention || I.Op == OpKind::AttentionGrad) &&
        !Blockwise && attrInt(I.Op, I.Attrs, "cp") <= 1)
      return false;
    return cuda::runsIn16Bit(I, Bufs);
  }
  /// Device memory while work may be queued: cudaMallocAsync on the legacy
  /// stream (which the backend's non-blocking streams do not wait for, nor
  /// it for them), then a wait for that stream alone. cudaMalloc may wait
  /// for the whole device, and so hang behind an NCCL kernel waiting for a
  /// dead peer, past any timeout.
  Error allocateWhileRunning(void **P, size_t Bytes);
  /// Region (at least Bytes) grown in place: the old one is retired (freed
  /// with the backend), as queued work may still use it.
  Expected<char *> grow(char *&Region, int64_t &Size, int64_t Bytes);
  /// Waits for both streams (host copies).
  Error drain();
  /// A host copy of Bytes through the pinned staging buffer (grown to at
  /// most MaxStaging), after drain: Piece(Off, N) copies bytes [Off, Off +
  /// N) through it, one piece after another.
  Error staged(size_t Bytes,
               llvm::function_ref<Error(size_t Off, size_t N)> Piece);
  /// Waits for stream S (Name: which, for the error) for at most Timeout:
  /// past it the NCCL communicators are aborted (their kernels waiting for
  /// peers end) and the wait is an error, so that a dead or stuck peer
  /// fails this rank instead of hanging it.
  Error waitFor(cudaStream_t S, const char *Name);
  /// waitFor, then a wait for S to end (after an abort, its kernels do):
  /// for the backend's end, where nothing reports an error.
  void settle(cudaStream_t S, const char *Name);
  /// Row-major C = op(A) op(B) + Beta C. A and B are float32, or both bf16
  /// or both fp16 (AB): then tensor-core products summed in float32
  /// (cublasGemmEx, CUBLAS_COMPUTE_32F), the mixed-precision path's GEMMs.
  /// C is float32, or (CT) of the 16-bit operands' type: the float32 sum
  /// rounded once by cuBLAS.
  Error gemm(cudaStream_t S, bool TA, bool TB, int64_t M, int64_t N, int64_t K,
             const void *A, int64_t Lda, const void *B, int64_t Ldb,
             float Beta, void *Cm, int64_t Ldc, DType AB = DType::F32,
             DType CT = DType::F32);
  Error batchedGemm(cudaStream_t S, bool TA, bool TB, int64_t M, int64_t N,
                    int64_t K, const void *A, const void *B, void *Cm,
                    int64_t Batch, DType AB = DType::F32,
                    DType CT = DType::F32);
  /// The NCCL communicator of a host group of more than one rank.
  Expected<cuda::NcclComm *> nccl(Communicator &Host);
  /// The stream every NCCL call goes on.
  cudaStream_t ncclStream() const { return Overlap ? Comm : Compute; }
  /// Orders the NCCL stream after the work so far on S, and S after the
  /// NCCL stream's (a computation's inner collective).
  Error hopToNccl(cudaStream_t S);
  Error hopBack(cudaStream_t S);
  /// Calls (on the NCCL stream) of G's communicator, ordered after the
  /// work so far on S and before S's next: a computation's inner
  /// collectives.
  Error onNccl(Communicator &G, cudaStream_t S,
               llvm::function_ref<Error(NcclComm &, cudaStream_t)> Calls);
  /// *X (one double in device memory) summed over G, in place, so.
  Error sumAside(Communicator &G, double *X, cudaStream_t S);
  Expected<float *> scratch(bool ForComm, int64_t Floats);
  /// The float32 GEMMs' math mode: TF32 tensor cores with --tf32, else
  /// float32 throughout.
  cublasMath_t mathMode() const {
    return TF32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH;
  }
  /// A cuBLAS call on 16-bit operands: the default math (tensor cores; the
  /// products are exact in float32) without reduced-precision split-K
  /// reductions, then the float32 GEMMs' mode again.
  template <typename Call> Error tensorCoreCall(Call &&Fn) {
    SP_CUBLAS_TRY(Cublas->SetMathMode(
        Blas, cublasMath_t(CUBLAS_DEFAULT_MATH |
                           CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    cublasStatus_t St = Fn();
    SP_CUBLAS_TRY(Cublas->SetMathMode(Blas, mathMode()));
    SP_CUBLAS_TRY(St);
    return Error::success();
  }
  /// all_reduce, all_gather, reduce_scatter and sp_split over G (C's
  /// group).
  Error collective(const KernelCall &C, Communicator *G, cudaStream_t S);
  /// ring_shift (an NCCL group of one send to the next rank and one receive
  /// from the previous) and ring_concat (strided copies), on bytes:
  /// runtime/CollectiveWalk.h's ringWalk, as the CPU's runRing.
  Error ring(const KernelCall &C, Communicator *G, cudaStream_t S);
  /// ZeRO: the flat reduce-scatter of a bucket of gradients, and the
  /// in-place all-gather of an updated parameter's chunks.
  Error reduceScatterFlat(const KernelCall &C, Communicator &G,
                          cudaStream_t S);
  Error gatherParam(const KernelCall &C, cudaStream_t S);
  /// Scratch for the inputs of C (flat tensors of n elements) that Parts
  /// does not divide: Parts x ceil(n / Parts) floats each, one region after
  /// another (null when none needs it).
  Expected<float *> paddedScratch(const KernelCall &C, int64_t Parts,
                                  bool ForComm);
  Error pipelineMessage(const KernelCall &C, cudaStream_t S);
  /// Makes the channels of the pipeline group Pipe (collective over it): one
  /// for each direction between neighbouring stages, the last and the first
  /// included.
  Error makeChannels(Communicator &Pipe);
  /// A pipeline send of Bytes at Data to stage Peer, its data staged on S
  /// (PipelineChannels.cpp's comment), and a receive on S (the NCCL
  /// stream).
  Error sendTo(int Peer, const void *Data, int64_t Bytes, cudaStream_t S);
  Error recvFrom(int Peer, void *Data, int64_t Bytes, cudaStream_t S);
  Error gradNorm(const KernelCall &C, cudaStream_t S);
  /// Whether the adamw call C, to run on stream S after Step's waits, may
  /// join the pending batch; deferAdamw adds it (instruction J).
  bool adamwJoins(const KernelCall &C, cudaStream_t S,
                  const cuda::StreamStep &Step) const;
  void deferAdamw(const KernelCall &C, cudaStream_t S, size_t J,
                  ParamChunk Chunk, bool RecordEvent);
  /// Launches the pending adamw calls (nothing when none).
  Error flushAdamw();
  Error dropout(const KernelCall &C, cudaStream_t S);
  Error vocabParallelLoss(const KernelCall &C, cudaStream_t S, bool Grad,
                          int64_t N, int64_t V, int64_t Valid, int64_t Ignore);

  /// A linear layer, Out[Rows, OutF] = X op(W) (+ Bias, when not null):
  /// with --cuda-epilogues one cublasLtMatmul with the bias in its epilogue
  /// (CublasLt.h), where cuBLASLt has an algorithm for it; else the bias
  /// written into every row, then gemm with beta = 1.
  Error linear(cudaStream_t S, bool TransW, int64_t Rows, int64_t OutF,
               int64_t InF, const void *X, const void *W, const void *Bias,
               void *Out, DType AB, DType OutT = DType::F32);

  int Device = 0;
  bool Overlap = true, TF32 = false, Blockwise = false;
  /// CudaBackendOptions::Numerics: the form of the kernels that have two.
  cuda::Numerics Num = cuda::Numerics::Fast;
  std::unique_ptr<cuda::CublasLt> Lt; // with --cuda-epilogues
  std::chrono::milliseconds Timeout = Communicator::DefaultTimeout;
  cudaStream_t Compute = nullptr, Comm = nullptr;
  cublasHandle_t Blas = nullptr;
  const CublasApi *Cublas = nullptr;
  cudaEvent_t ToNccl = nullptr, FromNccl = nullptr;
  cuda::DeviceError *Err = nullptr;
  NormScalars *Norm = nullptr;
  char *Scratch[2] = {nullptr, nullptr};
  int64_t ScratchBytes[2] = {0, 0};
  char *Mixed[2] = {nullptr, nullptr};
  int64_t MixedBytes[2] = {0, 0};
  char *AttentionWork[2] = {nullptr, nullptr};
  int64_t AttentionWorkBytes[2] = {0, 0};
  /// Per stream: the ring's region, then the all-to-all's; the padding
  /// bias.
  char *ContextWork[4] = {}, *ContextBias[2] = {};
  int64_t ContextWorkBytes[4] = {}, ContextBiasBytes[2] = {};
  char *Staging = nullptr;
  size_t StagingBytes = 0;
  std::map<Communicator *, std::unique_ptr<cuda::NcclComm>> Nccl;
  /// A direction of pipeline messages between this stage and Peer: its
  /// two-rank NCCL communicator, and for sends their stream.
  struct Channel {
    std::unique_ptr<cuda::NcclComm> Comm;
    cudaStream_t Stream = nullptr;
  };
  std::map<int, Channel> SendChannels, RecvChannels; // by peer stage
  /// The channel to or from Peer in Of (What: the message, for the error).
  static Expected<Channel *> channelOf(std::map<int, Channel> &Of, int Peer,
                                       StringRef What);
  /// Staging for sends in flight: a slot is free again once Done (recorded
  /// after its send) has completed.
  struct SendSlot {
    char *Data = nullptr;
    int64_t Bytes = 0;
    cudaEvent_t Done = nullptr;
    cudaEvent_t Staged = nullptr; // the copy into it, for the send stream
  };
  std::vector<SendSlot> SendSlots;
  /// Device and pinned host memory outgrown while running, freed with the
  /// backend: cudaFree and cudaFreeHost wait for the whole device, and so
  /// for pipeline sends in flight, which wait for their peers (NCCL's
  /// kernels block: a free while one waits for this rank's later work
  /// would hang).
  std::vector<void *> Retired, RetiredHost;
  /// What the adamw calls of one batch share: the stream, the grad norm,
  /// lr and step buffers, and the hyperparameters.
  struct AdamwShared {
    cudaStream_t Stream = nullptr;
    const float *Norm = nullptr, *Lr = nullptr, *Step = nullptr;
    double Beta1 = 0, Beta2 = 0, Eps = 0, MaxNorm = 0, GradScale = 1;
    bool operator==(const AdamwShared &O) const {
      return Stream == O.Stream && Norm == O.Norm && Lr == O.Lr &&
             Step == O.Step && Beta1 == O.Beta1 && Beta2 == O.Beta2 &&
             Eps == O.Eps && MaxNorm == O.MaxNorm && GradScale == O.GradScale;
    }
  };
  static AdamwShared adamwShared(const KernelCall &C, cudaStream_t S);
  struct AdamwBatch {
    AdamwShared Shared;
    std::vector<cuda::AdamwTensor> Tensors;
    std::vector<int> Events;
    std::vector<size_t> Timed; // their entries in Timed, while timing
    std::vector<int64_t> TimedElements; // and the elements each updates
  };
  /// The timed instructions of each launched batch, to share its span.
  std::vector<std::pair<std::vector<size_t>, std::vector<int64_t>>>
      AdamwLaunches;
  /// The adamw calls not yet launched (Optimizer.cpp's comment): what they
  /// share, their tensors, and the instructions whose events are to be
  /// recorded after the launch.
  AdamwBatch Adamw;
  // The stream plan of the program last run, and its events.
  const Program *Planned = nullptr;
  size_t PlannedInstrs = 0;
  uint64_t PlannedPrint = 0;
  cuda::StreamPlan Plan;
  std::vector<cudaEvent_t> Events;
  /// Device timing (startTiming to collectTimes): the calls' start and end
  /// events and streams, from a pool of timing events reused every step.
  struct TimedCall {
    cudaEvent_t Start, End;
    int Stream;
  };
  bool Timing = false;
  cudaEvent_t TimeBase = nullptr;
  std::vector<TimedCall> Timed;
  std::vector<cudaEvent_t> TimingPool;
  /// Starts timing a call on stream S (Kind: its row): records its start.
  Error timeStart(cudaStream_t S, int Kind);
  Error timeEnd(size_t K, cudaStream_t S) {
    SP_CUDA_TRY(cudaEventRecord(Timed[K].End, S));
    return Error::success();
  }
};

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_CUDABACKENDIMPL_H
