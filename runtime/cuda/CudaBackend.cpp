//===- CudaBackend.cpp - The CUDA backend
//----------------------------------===//
//
// Every instruction kind CpuBackend::run handles, on one GPU: the kernels of
// CudaKernels.h (one family per kernels/*.cuh file), cuBLAS for the GEMMs
// (fp32 math; TF32 only with CudaBackendOptions::AllowTF32), NCCL for the
// collectives and pipeline messages. Instructions run on the stream
// StreamPlan.h assigns them, waiting for the events it lists; every NCCL
// call of the backend is issued on one stream (the communication stream, or
// the compute stream without overlap), so the calls of a communicator are
// in program order on every rank. Computations that reduce a few values over
// a group (grad_norm) hop to that stream and back with a pair of events.
//
// Row-major GEMMs map to cuBLAS's column-major ones by computing C^T =
// op(B)^T op(A)^T. Activations are [batch, seq, hidden]; a sequence chunk is
// not contiguous, so gathers and scatters along an inner axis reorder
// through a rank-major scratch buffer (chunkCopy), as the CPU backend does.
//
// Pipeline sends are buffered as the CPU backend's are, so that no schedule
// the CPU runs deadlocks here: a send copies its data to a staging slot on
// the instruction's stream and is posted at once, on a stream of its own
// for the peer, over an NCCL communicator of just the two ranks for that
// direction (a channel, made with the backend); the rank's receives are
// posted on the NCCL stream, over the peer's channel to it. A send then
// waits for nothing but its receive, and nothing on the rank's other
// streams waits for a send (an NCCL send blocks its stream until it is
// received: posted on the NCCL stream, 1F1B's sends would deadlock, both
// stages sending first; held and posted with the next receive in one NCCL
// group, the interleaved schedule's did, on emulated GPUs,
// tests/gpu/EmulatedBackendTest.cpp). A staging slot is reused once its send
// has completed (cudaEventQuery), else another is made.
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
// Traced steps are timed on the device (Backend::timesOnDevice): a pair of
// timing events is recorded on each call's stream around what it enqueues,
// and collectTimes() reads them against an event recorded when timing
// started, so the trace shows what the streams ran at the same time (a
// collective beside its GEMM) without a host wait per call. An adamw call
// of a batch spans from its deferral to the batch's end; a pipeline send
// spans its copy aside (it is posted with the next receive).
//
// Device memory besides the arena: the data-error word, a few scalars of
// the gradient norm, the send staging slots, and two scratch buffers (one
// per stream) that grow to the largest reorder or per-row statistic needed;
// the arena itself is exactly the plan's.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaBackend.h"
#include "ir/OpDef.h"
#include "runtime/TensorLayout.h"
#include "runtime/cuda/AttentionPlan.h"
#include "runtime/cuda/CublasLt.h"
#include "runtime/cuda/CudaCheck.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/DeviceSelect.h"
#include "runtime/cuda/DynamicLibrary.h"
#include "runtime/cuda/LaunchGeometry.h"
#include "runtime/cuda/MixedPlan.h"
#include "runtime/cuda/MultiTensor.h"
#include "runtime/cuda/NcclComm.h"
#include "runtime/cuda/StreamPlan.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>

using namespace llvm;

namespace sp {

namespace {

Error planError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), Msg);
}

Error noKernel(OpKind Op) {
  return planError("the CUDA backend has no kernel for op " + opName(Op) +
                   " yet; run this plan with --device cpu");
}

/// The gradient-norm scalars in device memory.
struct NormScalars {
  double SplitD, Whole, Total;
  float SplitF, TotalF;
  double Partials[cuda::SumBlocks];
};

bool fitsInt(int64_t V) { return V >= 0 && V <= INT_MAX; }

/// numpy broadcasting strides of In read at Out's multi-indices (0 along
/// broadcast axes), as Kernels.cpp's broadcastStrides, with its errors.
Error broadcastStrides(const TensorType &In, const TensorType &Out,
                       cuda::DevShape &Strides) {
  int R = int(Out.rank());
  if (R > cuda::MaxRank)
    return planError("broadcast: rank above MaxRank");
  if (In.rank() > Out.rank())
    return planError("broadcast: input rank above output rank");
  int64_t InStrides[cuda::MaxRank];
  int64_t S = 1;
  for (int D = int(In.rank()) - 1; D >= 0; --D) {
    InStrides[D] = S;
    S *= In.Shape[D];
  }
  int Lead = R - int(In.rank());
  Strides.Rank = R;
  for (int D = 0; D < R; ++D) {
    int DI = D - Lead;
    if (DI < 0)
      Strides.Dim[D] = 0;
    else if (In.Shape[DI] == Out.Shape[D])
      Strides.Dim[D] = InStrides[DI];
    else if (In.Shape[DI] == 1)
      Strides.Dim[D] = 0;
    else
      return planError("broadcast: shapes do not broadcast");
  }
  return Error::success();
}

cuda::DevShape devShape(ArrayRef<int64_t> Dims) {
  cuda::DevShape S;
  S.Rank = int(Dims.size());
  for (size_t D = 0; D < Dims.size() && D < size_t(cuda::MaxRank); ++D)
    S.Dim[D] = Dims[D];
  return S;
}

/// The cuBLAS functions the backend calls, from libcublas loaded when the
/// first backend is made: linked, its (and cuBLASLt's) static
/// initialisation would cost every process that links the backend, sp-run
/// on the CPU included, about half a second at startup.
struct CublasApi {
  decltype(&cublasCreate_v2) Create;
  decltype(&cublasDestroy_v2) Destroy;
  decltype(&cublasSetStream_v2) SetStream;
  decltype(&cublasSetMathMode) SetMathMode;
  decltype(&cublasSgemm_v2) Sgemm;
  decltype(&cublasSgemmStridedBatched) SgemmStridedBatched;
  // The C entry points (the header also declares C++ overloads).
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t,
                           cublasOperation_t, int, int, int, const void *,
                           const void *, cudaDataType, int, const void *,
                           cudaDataType, int, const void *, void *,
                           cudaDataType, int, cublasComputeType_t,
                           cublasGemmAlgo_t);
  cublasStatus_t (*GemmStridedBatchedEx)(
      cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
      const void *, const void *, cudaDataType, int, long long, const void *,
      cudaDataType, int, long long, const void *, void *, cudaDataType, int,
      long long, int, cublasComputeType_t, cublasGemmAlgo_t);
};

Expected<const CublasApi *> loadCublas() {
  static std::mutex M;
  static std::optional<CublasApi> Api;
  static std::string Failure;
  std::lock_guard<std::mutex> Lock(M);
  if (Api)
    return &*Api;
  if (!Failure.empty())
    return planError(Failure);
  std::string Why, Missing;
  void *H = nullptr;
  if (!cuda::openLibrary({"libcublas.so.13", "libcublas.so"}, "cublasCreate_v2",
                         H, Why)) {
    Failure = "--device cuda: cannot load cuBLAS (" + Why +
              "); install the CUDA toolkit's libcublas or add its folder to "
              "LD_LIBRARY_PATH";
    return planError(Failure);
  }
  CublasApi A;
  auto Get = [&](auto &Fn, const char *Symbol) {
    cuda::bindSymbol(H, Fn, Symbol, Missing);
  };
  Get(A.Create, "cublasCreate_v2");
  Get(A.Destroy, "cublasDestroy_v2");
  Get(A.SetStream, "cublasSetStream_v2");
  Get(A.SetMathMode, "cublasSetMathMode");
  Get(A.Sgemm, "cublasSgemm_v2");
  Get(A.SgemmStridedBatched, "cublasSgemmStridedBatched");
  Get(A.GemmEx, "cublasGemmEx");
  Get(A.GemmStridedBatchedEx, "cublasGemmStridedBatchedEx");
  if (!Missing.empty()) {
    Failure = "--device cuda: the loaded cuBLAS has no " + Missing;
    return planError(Failure);
  }
  Api = A;
  return &*Api;
}

/// FNV-1a over what the stream plan depends on: the instructions' ops and
/// buffers and the buffers' places in the arena.
uint64_t fingerprint(const Program &P) {
  uint64_t H = 0xcbf29ce484222325ull;
  auto Mix = [&](uint64_t V) {
    H ^= V;
    H *= 0x100000001b3ull;
  };
  for (const Instruction &I : P.Instrs) {
    Mix(uint64_t(I.Op));
    for (int B : I.In)
      Mix(uint64_t(B));
    Mix(~0ull);
    for (int B : I.Out)
      Mix(uint64_t(B));
  }
  for (const ProgramBuffer &B : P.Buffers) {
    Mix(uint64_t(B.Offset));
    Mix(uint64_t(B.Type.numBytes()));
  }
  return H;
}

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

private:
  CudaBackend() = default;
  /// initDevice, then (every rank agreeing it succeeded) the NCCL
  /// communicators.
  Error init(const CudaBackendOptions &O);
  /// The rank's own part: device, streams, events, cuBLAS.
  Error initDevice(const CudaBackendOptions &O);
  Error dispatch(const KernelCall &C, cudaStream_t S);
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
  /// Whether I's kernel reads and writes its 16-bit buffers in place
  /// (cuda::runsIn16Bit; the attention core only by the blockwise
  /// kernels, when they are on).
  bool inPlace16(const Instruction &I,
                 const std::vector<ProgramBuffer> &Bufs) const {
    if ((I.Op == OpKind::Attention || I.Op == OpKind::AttentionGrad) &&
        !Blockwise)
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
  /// Waits for stream S (Name: which, for the error) for at most Timeout:
  /// past it the NCCL communicators are aborted (their kernels waiting for
  /// peers end) and the wait is an error, so that a dead or stuck peer
  /// fails this rank instead of hanging it.
  Error waitFor(cudaStream_t S, const char *Name);
  /// waitFor, then a wait for S to end (after an abort, its kernels do):
  /// for the backend's end, where nothing reports an error.
  void settle(cudaStream_t S, const char *Name);
  /// Row-major C = op(A) op(B) + Beta C with float32 C. A and B are float32,
  /// or both bf16 or both fp16 (AB): then tensor-core products summed in
  /// float32 (cublasGemmEx, CUBLAS_COMPUTE_32F), the mixed-precision path's
  /// GEMMs.
  Error gemm(cudaStream_t S, bool TA, bool TB, int64_t M, int64_t N, int64_t K,
             const void *A, int64_t Lda, const void *B, int64_t Ldb,
             float Beta, float *Cm, int64_t Ldc, DType AB = DType::F32);
  Error batchedGemm(cudaStream_t S, bool TA, bool TB, int64_t M, int64_t N,
                    int64_t K, const void *A, const void *B, float *Cm,
                    int64_t Batch, DType AB = DType::F32);
  /// The NCCL communicator of a host group of more than one rank.
  Expected<cuda::NcclComm *> nccl(Communicator &Host);
  /// The stream every NCCL call goes on.
  cudaStream_t ncclStream() const { return Overlap ? Comm : Compute; }
  /// Orders the NCCL stream after the work so far on S, and S after the
  /// NCCL stream's (a computation's inner collective).
  Error hopToNccl(cudaStream_t S);
  Error hopBack(cudaStream_t S);
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
  Error collective(const KernelCall &C, cudaStream_t S);
  /// ring_shift (an NCCL group of one send to the next rank and one receive
  /// from the previous) and ring_concat (strided copies), on bytes: the
  /// CPU's runRing.
  Error ring(const KernelCall &C, cudaStream_t S);
  /// ZeRO: the flat reduce-scatter of a bucket of gradients, and the
  /// in-place all-gather of an updated parameter's chunks.
  Error reduceScatterFlat(const KernelCall &C, Communicator &G,
                          cudaStream_t S);
  Error gatherParam(const KernelCall &C, cudaStream_t S);
  /// Scratch for the flat tensors of Counts elements that Parts does not
  /// divide: Parts x ceil(n / Parts) floats each, one region after another
  /// (null when none needs it).
  Expected<float *> paddedScratch(ArrayRef<int64_t> Counts, int64_t Parts,
                                  bool ForComm);
  Error pipelineMessage(const KernelCall &C, cudaStream_t S);
  /// Makes the channels of the pipeline group Pipe (collective over it): one
  /// for each direction between neighbouring stages, the last and the first
  /// included.
  Error makeChannels(Communicator &Pipe);
  /// A pipeline send of Bytes at Data to stage Peer, its data staged on S
  /// (see the file comment), and a receive on S (the NCCL stream).
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
               int64_t InF, const void *X, const void *W, const float *Bias,
               float *Out, DType AB);

  int Device = 0;
  bool Overlap = true, TF32 = false, Blockwise = false;
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
  /// The adamw calls not yet launched (see the file comment): their
  /// stream, shared operands and hyperparameters, their tensors, and the
  /// instructions whose events are to be recorded after the launch.
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

Expected<std::unique_ptr<CudaBackend>>
CudaBackend::create(const CudaBackendOptions &O) {
  std::unique_ptr<CudaBackend> B(new CudaBackend);
  if (auto E = B->init(O))
    return E;
  return B;
}

Error CudaBackend::init(const CudaBackendOptions &O) {
  Error Own = initDevice(O);
  if (O.AgreeBeforeCollectives)
    Own = O.AgreeBeforeCollectives(std::move(Own));
  if (Own)
    return Own;
  // The groups' NCCL communicators, collectively, in a fixed order.
  for (Communicator *G : {O.Tensor, O.Pipeline, O.Data})
    if (G && G->size() > 1)
      if (auto C = nccl(*G); !C)
        return C.takeError();
  if (O.Pipeline && O.Pipeline->size() > 1)
    if (auto E = makeChannels(*O.Pipeline))
      return E;
  return Error::success();
}

Error CudaBackend::initDevice(const CudaBackendOptions &O) {
  if (auto E = checkCudaDevice())
    return E;
  int Count = 0;
  SP_CUDA_TRY(cudaGetDeviceCount(&Count));
  auto Local = cuda::findLocalRank(
      [](const char *V) -> const char * { return std::getenv(V); }, O.World);
  if (!Local)
    return Local.takeError();
  auto Dev = cuda::chooseDevice(*Local, Count, O.Device);
  if (!Dev)
    return Dev.takeError();
  Device = *Dev;
  Overlap = O.Overlap;
  // The groups' timeout (sp-run's --comm-timeout), for waits on the device.
  for (Communicator *G : {O.World, O.Tensor, O.Pipeline, O.Data})
    if (G)
      Timeout = G->timeout();
  SP_CUDA_TRY(cudaSetDevice(Device));
  SP_CUDA_TRY(cudaStreamCreateWithFlags(&Compute, cudaStreamNonBlocking));
  SP_CUDA_TRY(cudaStreamCreateWithFlags(&Comm, cudaStreamNonBlocking));
  SP_CUDA_TRY(cudaEventCreateWithFlags(&ToNccl, cudaEventDisableTiming));
  SP_CUDA_TRY(cudaEventCreateWithFlags(&FromNccl, cudaEventDisableTiming));
  auto Api = loadCublas();
  if (!Api)
    return Api.takeError();
  Cublas = *Api;
  SP_CUBLAS_TRY(Cublas->Create(&Blas));
  TF32 = O.AllowTF32;
  Blockwise = O.BlockwiseAttention;
  if (O.CublasLtEpilogues) {
    auto L = cuda::CublasLt::create();
    if (!L)
      return L.takeError();
    Lt = std::move(*L);
  }
  SP_CUBLAS_TRY(Cublas->SetMathMode(Blas, mathMode()));
  SP_CUDA_TRY(cudaMalloc(&Err, sizeof(cuda::DeviceError)));
  SP_CUDA_TRY(cudaMemset(Err, 0, sizeof(cuda::DeviceError)));
  SP_CUDA_TRY(cudaMalloc(&Norm, sizeof(NormScalars)));
  SP_CUDA_TRY(cudaMemset(Norm, 0, sizeof(NormScalars)));
  SP_CUDA_TRY(cudaDeviceSynchronize());
  return Error::success();
}

Error CudaBackend::makeChannels(Communicator &Pipe) {
  const int P = Pipe.size(), Me = Pipe.rank();
  // Every direction between neighbours, in one order on every stage.
  std::vector<std::pair<int, int>> Directions;
  for (int K = 0; K < P; ++K)
    for (auto D : {std::pair{K, (K + 1) % P}, std::pair{(K + 1) % P, K}})
      if (!is_contained(Directions, D))
        Directions.push_back(D);
  for (auto [From, To] : Directions) {
    auto C = cuda::NcclComm::createPair(Pipe, From, To);
    if (!C)
      return C.takeError();
    if (From == Me) {
      Channel &Ch = SendChannels[To];
      Ch.Comm = std::move(*C);
      SP_CUDA_TRY(cudaStreamCreateWithFlags(&Ch.Stream, cudaStreamNonBlocking));
    } else if (To == Me) {
      RecvChannels[From].Comm = std::move(*C);
    }
  }
  return Error::success();
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(Device);
  consumeError(flushAdamw());
  // The queued work, sends to peers included, ends or is given up (a peer
  // that failed never receives: waitFor aborts NCCL after the timeout, and
  // the aborted kernels end).
  for (auto &[Peer, Ch] : SendChannels)
    settle(Ch.Stream, "pipeline send");
  settle(Compute, "compute");
  settle(Comm, "communication");
  for (auto &[Peer, Ch] : SendChannels)
    cudaStreamDestroy(Ch.Stream);
  SendChannels.clear();
  RecvChannels.clear();
  Nccl.clear();
  for (cudaEvent_t E : Events)
    if (E)
      cudaEventDestroy(E);
  for (cudaEvent_t E : TimingPool)
    cudaEventDestroy(E);
  if (TimeBase)
    cudaEventDestroy(TimeBase);
  if (ToNccl)
    cudaEventDestroy(ToNccl);
  if (FromNccl)
    cudaEventDestroy(FromNccl);
  if (Blas)
    Cublas->Destroy(Blas);
  cudaFree(Err);
  cudaFree(Norm);
  // What allocateWhileRunning allocated, in the legacy stream's order.
  for (char *P : {Scratch[0], Scratch[1], Mixed[0], Mixed[1], AttentionWork[0],
                  AttentionWork[1]})
    if (P)
      cudaFreeAsync(P, nullptr);
  for (SendSlot &Slot : SendSlots) {
    cudaFreeAsync(Slot.Data, nullptr);
    cudaEventDestroy(Slot.Done);
    cudaEventDestroy(Slot.Staged);
  }
  for (void *P : Retired)
    cudaFreeAsync(P, nullptr);
  cudaStreamSynchronize(nullptr);
  if (Staging)
    cudaFreeHost(Staging);
  for (void *P : RetiredHost)
    cudaFreeHost(P);
  if (Compute)
    cudaStreamDestroy(Compute);
  if (Comm)
    cudaStreamDestroy(Comm);
}

Expected<char *> CudaBackend::allocate(size_t Bytes) {
  SP_CUDA_TRY(cudaSetDevice(Device));
  size_t Size = std::max<size_t>(alignTo(Bytes, 256), 256);
  void *P = nullptr;
  cudaError_t E = cudaMalloc(&P, Size);
  if (E != cudaSuccess)
    return createStringError(
        inconvertibleErrorCode(),
        "cannot allocate the %zu-byte arena on CUDA device %d: %s: %s", Size,
        Device, cudaGetErrorName(E), cudaGetErrorString(E));
  // cudaMemset runs on the legacy stream, which the backend's non-blocking
  // streams do not wait for: finish it here.
  SP_CUDA_TRY(cudaMemset(P, 0, Size));
  SP_CUDA_TRY(cudaDeviceSynchronize());
  return static_cast<char *>(P);
}

void CudaBackend::release(char *Arena) {
  cudaSetDevice(Device);
  consumeError(flushAdamw());
  settle(Compute, "compute");
  settle(Comm, "communication");
  cudaFree(Arena);
}

void CudaBackend::settle(cudaStream_t S, const char *Name) {
  if (!S)
    return;
  consumeError(waitFor(S, Name));
  cudaStreamSynchronize(S);
}

Error CudaBackend::drain() {
  SP_CUDA_TRY(cudaSetDevice(Device));
  if (auto E = flushAdamw())
    return E;
  if (auto E = waitFor(Comm, "communication"))
    return E;
  return waitFor(Compute, "compute");
}

Error CudaBackend::waitFor(cudaStream_t S, const char *Name) {
  auto Start = std::chrono::steady_clock::now();
  for (auto Pause = std::chrono::microseconds(20);;
       Pause = std::min(2 * Pause, std::chrono::microseconds(5000))) {
    cudaError_t Q = cudaStreamQuery(S);
    if (Q != cudaErrorNotReady) {
      SP_CUDA_TRY(Q);
      return Error::success();
    }
    auto Waited = std::chrono::steady_clock::now() - Start;
    if (Waited >= Timeout)
      break;
    std::this_thread::sleep_for(Pause);
  }
  // What the stream waits for never came: a peer's part of a collective or
  // of a pipeline message, most likely. Abort NCCL, so that the stream and
  // this rank can end.
  for (auto &[G, C] : Nccl)
    C->abort();
  for (auto *Channels : {&SendChannels, &RecvChannels})
    for (auto &[Peer, Ch] : *Channels)
      Ch.Comm->abort();
  return createStringError(
      inconvertibleErrorCode(),
      "timed out after %.1f s waiting for the %s stream of CUDA device %d "
      "(an NCCL collective or pipeline message whose other ranks never came?); "
      "NCCL aborted (raise the wait with --comm-timeout)",
      std::chrono::duration<double>(Timeout).count(), Name, Device);
}

/// Pinned staging of at most this many bytes; larger copies go in pieces.
constexpr size_t MaxStaging = size_t(64) << 20;

Error CudaBackend::copyToBackend(char *Dst, const void *Src, size_t Bytes) {
  if (auto E = drain())
    return E;
  size_t Want = std::min(Bytes, MaxStaging);
  if (Want > StagingBytes) {
    if (Staging)
      RetiredHost.push_back(Staging);
    Staging = nullptr;
    SP_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void **>(&Staging), Want,
                              cudaHostAllocDefault));
    StagingBytes = Want;
  }
  for (size_t Off = 0; Off < Bytes; Off += StagingBytes) {
    size_t N = std::min(StagingBytes, Bytes - Off);
    std::memcpy(Staging, static_cast<const char *>(Src) + Off, N);
    SP_CUDA_TRY(cudaMemcpyAsync(Dst + Off, Staging, N, cudaMemcpyHostToDevice,
                                Compute));
    SP_CUDA_TRY(cudaStreamSynchronize(Compute));
  }
  return Error::success();
}

Error CudaBackend::copyToHost(void *Dst, const char *Src, size_t Bytes) {
  if (auto E = drain())
    return E;
  size_t Want = std::min(Bytes, MaxStaging);
  if (Want > StagingBytes) {
    if (Staging)
      RetiredHost.push_back(Staging);
    Staging = nullptr;
    SP_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void **>(&Staging), Want,
                              cudaHostAllocDefault));
    StagingBytes = Want;
  }
  for (size_t Off = 0; Off < Bytes; Off += StagingBytes) {
    size_t N = std::min(StagingBytes, Bytes - Off);
    SP_CUDA_TRY(cudaMemcpyAsync(Staging, Src + Off, N, cudaMemcpyDeviceToHost,
                                Compute));
    SP_CUDA_TRY(cudaStreamSynchronize(Compute));
    std::memcpy(static_cast<char *>(Dst) + Off, Staging, N);
  }
  return Error::success();
}

double CudaBackend::peakFlops(StringRef Dtype) const {
  int Major = 0, Minor = 0, SMs = 0, ClockKHz = 0;
  if (cudaDeviceGetAttribute(&Major, cudaDevAttrComputeCapabilityMajor,
                             Device) != cudaSuccess ||
      cudaDeviceGetAttribute(&Minor, cudaDevAttrComputeCapabilityMinor,
                             Device) != cudaSuccess ||
      cudaDeviceGetAttribute(&SMs, cudaDevAttrMultiProcessorCount, Device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&ClockKHz, cudaDevAttrClockRate, Device) !=
          cudaSuccess)
    return 0;
  return cuda::gpuPeakFlops(Major, Minor, SMs, ClockKHz, Dtype, TF32);
}

Error CudaBackend::synchronize() {
  if (auto E = drain())
    return E;
  cuda::DeviceError Found;
  SP_CUDA_TRY(cudaMemcpy(&Found, Err, sizeof Found, cudaMemcpyDeviceToHost));
  if (!Found.Code)
    return Error::success();
  SP_CUDA_TRY(cudaMemset(Err, 0, sizeof(cuda::DeviceError)));
  switch (Found.Code) {
  case cuda::EmbeddingIdOutOfRange:
    return createStringError(inconvertibleErrorCode(),
                             "embedding id out of range (element %lld, value "
                             "%lld), found on the device",
                             Found.Index, Found.Value);
  case cuda::CrossEntropyTargetOutOfRange:
    return createStringError(inconvertibleErrorCode(),
                             "cross entropy target out of range (element "
                             "%lld, value %lld), found on the device",
                             Found.Index, Found.Value);
  default:
    return createStringError(inconvertibleErrorCode(),
                             "a CUDA kernel reported error code %d", Found.Code);
  }
}

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

Error CudaBackend::allocateWhileRunning(void **P, size_t Bytes) {
  SP_CUDA_TRY(cudaMallocAsync(P, Bytes, nullptr));
  SP_CUDA_TRY(cudaStreamSynchronize(nullptr));
  return Error::success();
}

Expected<char *> CudaBackend::grow(char *&Region, int64_t &Size,
                                   int64_t Bytes) {
  if (Bytes > Size) {
    // The old region may still be in use by queued work: retired.
    if (Region)
      Retired.push_back(Region);
    Region = nullptr;
    if (auto E = allocateWhileRunning(reinterpret_cast<void **>(&Region),
                                      size_t(Bytes)))
      return E;
    Size = Bytes;
  }
  return Region;
}

Expected<char *> CudaBackend::mixedScratch(int K, int64_t Bytes) {
  return grow(Mixed[K], MixedBytes[K], Bytes);
}

Error CudaBackend::attention(const KernelCall &C, cudaStream_t S) {
  if (Blockwise) {
    auto Plan = cuda::planBlockwise(C.I, C.Prog.Buffers);
    if (Plan)
      return attentionBlockwise(C, std::move(*Plan), S);
    consumeError(Plan.takeError()); // larger heads
  }
  // Unless asked for the blockwise kernels (or for larger heads): the
  // unfused ops. A 16-bit attention reaches here through
  // dispatchMixed, on float32 copies: every buffer below is float32 (or the
  // mask's bytes).
  auto Plan = cuda::planAttention(C.I, C.Prog.Buffers);
  if (!Plan)
    return Plan.takeError();
  int K = S == Comm ? 1 : 0;
  auto Work = grow(AttentionWork[K], AttentionWorkBytes[K],
                   Plan->WorkspaceBytes);
  if (!Work)
    return Work.takeError();
  const Program &L = Plan->Local;
  SmallVector<char *, 16> Where;
  for (size_t B = 0; B < L.Buffers.size(); ++B)
    Where.push_back(Plan->Outer[B] >= 0 ? C.buffer(Plan->Outer[B])
                                        : *Work + L.Buffers[B].Offset);
  for (size_t J = 0; J < L.Instrs.size(); ++J) {
    const Instruction &Sub = L.Instrs[J];
    if (cuda::touches16Bit(Sub, L.Buffers))
      return planError("attention on 16-bit buffers runs on float32 copies");
    KernelCall SC{Sub,       L,         nullptr,          C.Step,
                  C.Training, C.Dropout, C.Seed,          C.Tensor,
                  C.Pipeline, C.Data,    C.GradScale,     Where.data()};
    if (auto E = dispatch(SC, S))
      return E;
    if (int(J) == Plan->LseAfter)
      cuda::rowLogSumExp(reinterpret_cast<float *>(Where[Plan->Lse]),
                         reinterpret_cast<const float *>(Where[Plan->Scores]),
                         Plan->Batch * Plan->Heads * Plan->Sq, Plan->Sk,
                         Plan->Heads, Plan->Sq, Plan->LseMerged, S);
  }
  return Error::success();
}

static cuda::Elems elems(const KernelCall &C, int Id);

/// cuda::paddingMask's code of a keep mask's type.
static Expected<int> paddingKeepType(const TensorType &M) {
  if (std::optional<int> Code = cuda::paddingKeepCode(M.Dtype))
    return *Code;
  return planError("padding_mask: unsupported mask type " + M.str());
}

Error CudaBackend::attentionBlockwise(const KernelCall &C,
                                      cuda::BlockwisePlan Plan,
                                      cudaStream_t S) {
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  if (auto E = cuda::setBlockwiseDropout(
          Plan, I, Bufs, C.Training, C.Dropout, C.Seed, C.Step, C.Tensor.rank(),
          C.Data ? C.Data->rank() : 0, C.Data ? C.Data->size() : 1))
    return E;
  const cuda::AttentionGeometry &G = Plan.G;
  // Scratch: the padding bias [b, keys], then the backward's Delta.
  const int64_t BiasN = Plan.Keep >= 0 ? G.Batch * G.Sk : 0,
                DeltaN = Plan.Forward ? 0 : G.Batch * G.Heads * G.Sq;
  auto Tmp = scratch(S == Comm, BiasN + DeltaN + 1);
  if (!Tmp)
    return Tmp.takeError();
  float *Bias = BiasN ? *Tmp : nullptr, *Delta = *Tmp + BiasN;
  if (Bias) {
    // padding_mask's bias, added to zeros (its kernel; the same floats as
    // the CPU's keyBias).
    auto KeepType = paddingKeepType(Bufs[Plan.Keep].Type);
    if (!KeepType)
      return KeepType.takeError();
    SP_CUDA_TRY(cudaMemsetAsync(Bias, 0, size_t(BiasN) * sizeof(float), S));
    cuda::paddingMask(Bias, Bias, C.buffer(Plan.Keep), *KeepType, G.Batch, 1,
                      G.Sk, Plan.PadFill, Plan.PadWhere, S);
  }
  auto Op = [&](const cuda::BlockwiseOperand &X) {
    return cuda::at(elems(C, X.Id), X.Offset);
  };
  if (Plan.Forward)
    cuda::attentionForward(Op(Plan.O), Op(Plan.Lse), Op(Plan.Q), Op(Plan.K),
                           Op(Plan.V), Bias, G, S);
  else
    cuda::attentionBackward(Op(Plan.DQ), Op(Plan.DK), Op(Plan.DV), Op(Plan.DO),
                            Op(Plan.Q), Op(Plan.K), Op(Plan.V), Op(Plan.O),
                            Op(Plan.Lse), Bias, Delta, G, S);
  return Error::success();
}

Error CudaBackend::dispatchMixed(const KernelCall &C, cudaStream_t S) {
  // As CpuBackend's runMixed, by the host-side plan of MixedPlan.h: the
  // 16-bit buffers' float32 copies in this stream's region, the operands
  // widened, the float32 kernel run, each 16-bit result rounded once to
  // nearest even. Everything is queued on S, in that order, so the region
  // is free again for S's next instruction.
  const auto &Bufs = C.Prog.Buffers;
  cuda::MixedPlan M =
      cuda::planMixed(C.I, Bufs, opDef(C.I.Op).SideEffects);
  auto Region = mixedScratch(S == Comm ? 1 : 0, M.RegionBytes);
  if (!Region)
    return Region.takeError();
  SmallVector<char *, 8> Where;
  for (const cuda::MixedBuffer &B : M.Buffers)
    Where.push_back(B.Offset >= 0 ? *Region + B.Offset : C.buffer(B.Id));
  auto Convert = [&](size_t K, bool ToFloat) {
    int Id = M.Buffers[K].Id;
    bool Bf16 = Bufs[Id].Type.Dtype == DType::BF16;
    auto *H = reinterpret_cast<uint16_t *>(C.buffer(Id));
    auto *F = reinterpret_cast<float *>(Where[K]);
    int64_t N = Bufs[Id].Type.numElements();
    if (ToFloat)
      cuda::widen16(F, H, N, Bf16, S);
    else
      cuda::narrow16(H, F, N, Bf16, S);
  };
  for (size_t K = 0; K < M.Buffers.size(); ++K)
    if (M.Buffers[K].Widen)
      Convert(K, /*ToFloat=*/true);
  if (auto E = dispatch(KernelCall{M.Local, M.LocalProgram, nullptr, C.Step,
                                   C.Training, C.Dropout, C.Seed, C.Tensor,
                                   C.Pipeline, C.Data, C.GradScale,
                                   Where.data()},
                        S))
    return E;
  for (size_t K = 0; K < M.Buffers.size(); ++K)
    if (M.Buffers[K].Narrow)
      Convert(K, /*ToFloat=*/false);
  return Error::success();
}

Expected<float *> CudaBackend::scratch(bool ForComm, int64_t Floats) {
  auto R = grow(Scratch[ForComm], ScratchBytes[ForComm],
                Floats * int64_t(sizeof(float)));
  if (!R)
    return R.takeError();
  return reinterpret_cast<float *>(*R);
}

/// The cuBLAS type of a 16-bit float dtype.
static cudaDataType_t cudaType16(DType T) {
  return T == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

Error CudaBackend::gemm(cudaStream_t S, bool TA, bool TB, int64_t M, int64_t N,
                        int64_t K, const void *A, int64_t Lda, const void *B,
                        int64_t Ldb, float Beta, float *Cm, int64_t Ldc,
                        DType AB) {
  if (M == 0 || N == 0)
    return Error::success();
  if (!fitsInt(M) || !fitsInt(N) || !fitsInt(K) || !fitsInt(Lda) ||
      !fitsInt(Ldb) || !fitsInt(Ldc))
    return planError("gemm dimension above INT_MAX");
  float One = 1.0f;
  SP_CUBLAS_TRY(Cublas->SetStream(Blas, S));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  cublasOperation_t OpB = TB ? CUBLAS_OP_T : CUBLAS_OP_N,
                    OpA = TA ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (AB == DType::F32) {
    SP_CUBLAS_TRY(Cublas->Sgemm(Blas, OpB, OpA, int(N), int(M), int(K), &One,
                                static_cast<const float *>(B), int(Ldb),
                                static_cast<const float *>(A), int(Lda), &Beta,
                                Cm, int(Ldc)));
    return Error::success();
  }
  return tensorCoreCall([&] {
    return Cublas->GemmEx(Blas, OpB, OpA, int(N), int(M), int(K), &One, B,
                          cudaType16(AB), int(Ldb), A, cudaType16(AB),
                          int(Lda), &Beta, Cm, CUDA_R_32F, int(Ldc),
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
}

Error CudaBackend::linear(cudaStream_t S, bool TransW, int64_t Rows,
                          int64_t OutF, int64_t InF, const void *X,
                          const void *W, const float *Bias, float *Out,
                          DType AB) {
  if (Bias && Lt &&
      (AB == DType::F32 || AB == DType::BF16 || AB == DType::F16)) {
    auto Fused = Lt->linearBias(S, TransW, Rows, OutF, InF, X, W,
                                AB == DType::F32 ? CUDA_R_32F : cudaType16(AB),
                                Bias, Out, TF32);
    if (!Fused)
      return Fused.takeError();
    if (*Fused)
      return Error::success();
  }
  if (Bias)
    cuda::broadcastRows(Out, Bias, Rows, OutF, S);
  return gemm(S, false, TransW, Rows, OutF, InF, X, InF, W, TransW ? InF : OutF,
              Bias ? 1.0f : 0.0f, Out, OutF, AB);
}

Error CudaBackend::batchedGemm(cudaStream_t S, bool TA, bool TB, int64_t M,
                               int64_t N, int64_t K, const void *A,
                               const void *B, float *Cm, int64_t Batch,
                               DType AB) {
  if (M == 0 || N == 0 || Batch == 0)
    return Error::success();
  if (!fitsInt(M) || !fitsInt(N) || !fitsInt(K) || !fitsInt(Batch))
    return planError("batch_matmul dimension above INT_MAX");
  float One = 1.0f, Zero = 0.0f;
  SP_CUBLAS_TRY(Cublas->SetStream(Blas, S));
  cublasOperation_t OpB = TB ? CUBLAS_OP_T : CUBLAS_OP_N,
                    OpA = TA ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (AB == DType::F32) {
    SP_CUBLAS_TRY(Cublas->SgemmStridedBatched(
        Blas, OpB, OpA, int(N), int(M), int(K), &One,
        static_cast<const float *>(B), int(TB ? K : N), K * N,
        static_cast<const float *>(A), int(TA ? M : K), M * K, &Zero, Cm,
        int(N), M * N, int(Batch)));
    return Error::success();
  }
  return tensorCoreCall([&] {
    return Cublas->GemmStridedBatchedEx(
        Blas, OpB, OpA, int(N), int(M), int(K), &One, B, cudaType16(AB),
        int(TB ? K : N), K * N, A, cudaType16(AB), int(TA ? M : K), M * K,
        &Zero, Cm, CUDA_R_32F, int(N), M * N, int(Batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
  });
}

Error CudaBackend::run(const KernelCall &C) {
  for (const auto *List : {&C.I.Out, &C.I.In})
    for (int B : *List)
      if (C.Prog.Buffers[B].Type.Dtype == DType::F64)
        return planError("the CUDA backend runs float32 plans; this one "
                         "computes in float64");
  SP_CUDA_TRY(cudaSetDevice(Device));
  // An instruction with bf16 or fp16 buffers runs on float32 copies, unless
  // its kernel reads and writes them in place.
  bool Mixed = cuda::touches16Bit(C.I, C.Prog.Buffers) &&
               !inPlace16(C.I, C.Prog.Buffers);
  const Instruction *First = C.Prog.Instrs.data();
  size_t NumInstrs = C.Prog.Instrs.size();
  bool InProgram = &C.I >= First && &C.I < First + NumInstrs;
  if (!InProgram) {
    // A call on an instruction outside its program (tests): in order with
    // everything before it, on the compute stream.
    if (auto E = drain())
      return E;
    if (Timing)
      if (auto E = timeStart(Compute, 0))
        return E;
    if (auto E = Mixed ? dispatchMixed(C, Compute) : dispatch(C, Compute))
      return E;
    SP_CUDA_TRY(cudaGetLastError());
    if (Timing)
      if (auto E = timeEnd(Timed.size() - 1, Compute))
        return E;
    return drain();
  }
  size_t J = size_t(&C.I - First);
  // A run starts at instruction 0: check that the plan is this program's
  // (a program at a freed one's address must not reuse its plan).
  uint64_t Print = J == 0 ? fingerprint(C.Prog) : PlannedPrint;
  if (Planned != &C.Prog || PlannedInstrs != NumInstrs ||
      Print != PlannedPrint) {
    if (auto E = drain())
      return E;
    for (cudaEvent_t E : Events)
      if (E)
        SP_CUDA_TRY(cudaEventDestroy(E));
    Plan = cuda::planStreams(C.Prog, Overlap);
    Events.assign(NumInstrs, nullptr);
    for (size_t J = 0; J < NumInstrs; ++J)
      if (Plan.Steps[J].RecordEvent)
        SP_CUDA_TRY(
            cudaEventCreateWithFlags(&Events[J], cudaEventDisableTiming));
    Planned = &C.Prog;
    PlannedInstrs = NumInstrs;
    PlannedPrint = fingerprint(C.Prog);
  }
  const cuda::StreamStep &Step = Plan.Steps[J];
  cudaStream_t S = Step.Stream == cuda::StreamKind::Comm ? Comm : Compute;
  // A 16-bit adamw (the plans' masters and moments are f32) runs alone.
  bool IsAdamw = C.I.Op == OpKind::AdamW && !Mixed;
  if (!Adamw.Tensors.empty() && !(IsAdamw && adamwJoins(C, S, Step)))
    if (auto E = flushAdamw())
      return E;
  for (int W : Step.WaitFor)
    SP_CUDA_TRY(cudaStreamWaitEvent(S, Events[W], 0));
  if (Timing)
    if (auto E = timeStart(S, int(Step.Stream)))
      return E;
  if (IsAdamw) {
    auto Chunk = adamwChunk(C);
    if (!Chunk)
      return Chunk.takeError();
    deferAdamw(C, S, J, *Chunk, Step.RecordEvent);
    if (Timing) {
      Adamw.Timed.push_back(Timed.size() - 1);
      Adamw.TimedElements.push_back(Chunk->Count);
    }
    return Error::success();
  }
  if (auto E = Mixed ? dispatchMixed(C, S) : dispatch(C, S))
    return E;
  SP_CUDA_TRY(cudaGetLastError());
  if (Timing)
    if (auto E = timeEnd(Timed.size() - 1, S))
      return E;
  if (Step.RecordEvent)
    SP_CUDA_TRY(cudaEventRecord(Events[J], S));
  return Error::success();
}

Error CudaBackend::ring(const KernelCall &C, cudaStream_t S) {
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  std::string Name = collectiveGroup(I.Op, I.Attrs);
  Communicator *G = C.group(Name);
  if (!G)
    return planError("no communicator for group '" + Name + "'");
  if (std::string Why = ringProblem(I, Bufs, G->size()); !Why.empty())
    return planError(Why);
  int Parts = G->size(), Rank = G->rank();
  if (I.Op == OpKind::RingShift) {
    int64_t Bytes = Bufs[I.In[0]].Type.numBytes();
    if (Parts == 1) {
      SP_CUDA_TRY(cudaMemcpyAsync(C.buffer(I.Out[0]), C.buffer(I.In[0]),
                                  Bytes, cudaMemcpyDeviceToDevice, S));
      return Error::success();
    }
    auto N = nccl(*G);
    if (!N)
      return N.takeError();
    if (auto E = cuda::NcclComm::groupStart())
      return E;
    Error Err = (*N)->send(C.buffer(I.In[0]), Bytes, (Rank + 1) % Parts, S);
    if (!Err)
      Err = (*N)->recv(C.buffer(I.Out[0]), Bytes, (Rank + Parts - 1) % Parts,
                       S);
    return joinErrors(std::move(Err), cuda::NcclComm::groupEnd());
  }
  int Dim = int(attrInt(I.Op, I.Attrs, "dim"));
  for (int K = 0; K < Parts; ++K) {
    RingCopy R = ringCopy(Bufs[I.Out[0]].Type, Dim, Parts, Rank, K);
    SP_CUDA_TRY(cudaMemcpy2DAsync(
        C.buffer(I.Out[0]) + R.Slot * R.ChunkBytes,
        size_t(Parts * R.ChunkBytes), C.buffer(I.In[K]), size_t(R.ChunkBytes),
        size_t(R.ChunkBytes), size_t(R.Outer), cudaMemcpyDeviceToDevice, S));
  }
  return Error::success();
}

Error CudaBackend::collective(const KernelCall &C, cudaStream_t S) {
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  std::string Name = collectiveGroup(I.Op, I.Attrs);
  Communicator *G = C.group(Name);
  if (!G)
    return planError("no communicator for group '" + Name + "'");
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
    if (Nc && I.In.size() > 1)
      if (auto E = cuda::NcclComm::groupStart())
        return E;
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
      if (auto E = Nc->allReduceSum(O, X, Count, S)) {
        if (I.In.size() > 1)
          consumeError(cuda::NcclComm::groupEnd());
        return E;
      }
    }
    if (Nc && I.In.size() > 1)
      return cuda::NcclComm::groupEnd();
    return Error::success();
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

Expected<float *> CudaBackend::paddedScratch(ArrayRef<int64_t> Counts,
                                             int64_t Parts, bool ForComm) {
  int64_t Padded = 0;
  for (int64_t N : Counts) {
    int64_t Chunk = dataChunkElements(N, Parts);
    if (N != Chunk * Parts)
      Padded += Chunk * Parts;
  }
  if (!Padded)
    return nullptr;
  return scratch(ForComm, Padded);
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
    return planError(formatv("a flat reduce_scatter of {0} parts over a "
                             "group of {1}",
                             attrInt(I.Op, I.Attrs, "parts"), Parts));
  std::vector<int64_t> Counts;
  for (int B : I.In)
    Counts.push_back(Bufs[B].Type.numElements());
  auto T = paddedScratch(Counts, Parts, S == Comm);
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
  bool Group = I.In.size() > 1;
  if (Group)
    if (auto E = cuda::NcclComm::groupStart())
      return E;
  Error Failed = Error::success();
  for (unsigned K = 0; K < I.In.size() && !Failed; ++K)
    Failed = (*N)->reduceScatterSum(
        reinterpret_cast<float *>(C.buffer(I.Out[K])), Src[K],
        Bufs[I.Out[K]].Type.numElements(), S);
  if (Group) {
    Error Ended = cuda::NcclComm::groupEnd();
    if (Failed) {
      consumeError(std::move(Ended));
      return Failed;
    }
    return Ended;
  }
  return Failed;
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
    return planError(formatv("gather_param of {0} parts needs a "
                             "data-parallel group of that size",
                             Parts));
  int Rank = G->rank();
  std::vector<int64_t> Counts;
  for (int B : I.In)
    Counts.push_back(Bufs[B].Type.numElements());
  auto T = paddedScratch(Counts, Parts, S == Comm);
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
  bool Group = I.In.size() > 1;
  if (Group)
    if (auto E = cuda::NcclComm::groupStart())
      return E;
  Error Failed = Error::success();
  for (unsigned K = 0; K < I.In.size() && !Failed; ++K) {
    int64_t Chunk =
        dataChunkElements(Bufs[I.In[K]].Type.numElements(), Parts);
    Failed = (*N)->allGather(Into[K], Into[K] + Rank * Chunk, Chunk, S);
  }
  if (Group) {
    Error Ended = cuda::NcclComm::groupEnd();
    if (Failed) {
      consumeError(std::move(Ended));
      return Failed;
    }
    if (Ended)
      return Ended;
  } else if (Failed) {
    return Failed;
  }
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

Error CudaBackend::pipelineMessage(const KernelCall &C, cudaStream_t S) {
  const Instruction &I = C.I;
  Communicator *Pipe = C.Pipeline;
  if (!Pipe)
    return planError("a pipeline instruction in a plan run without pipeline "
                     "stages");
  const auto &Bufs = C.Prog.Buffers;
  int Stage = Pipe->rank();
  if (Pipe->size() == 1)
    return planError("a pipeline message in a one-stage pipeline group");
  auto N = nccl(*Pipe);
  if (!N)
    return N.takeError();
  if (S != ncclStream())
    return planError("a pipeline message off the NCCL stream");
  switch (I.Op) {
  case OpKind::Send:
    return sendTo(attrInt(I.Op, I.Attrs, "peer"), C.buffer(I.In[0]),
                  Bufs[I.In[0]].Type.numBytes(), S);
  case OpKind::Recv:
    return recvFrom(attrInt(I.Op, I.Attrs, "peer"), C.buffer(I.Out[0]),
                    Bufs[I.Out[0]].Type.numBytes(), S);
  case OpKind::PipeBroadcast: {
    int Root = attrInt(I.Op, I.Attrs, "root");
    int64_t Bytes = Bufs[I.Out[0]].Type.numBytes();
    if (Stage == Root)
      SP_CUDA_TRY(cudaMemcpyAsync(C.buffer(I.Out[0]), C.buffer(I.In[0]), Bytes,
                                  cudaMemcpyDeviceToDevice, S));
    return (*N)->broadcast(C.buffer(I.Out[0]), Bytes, Root, S);
  }
  case OpKind::PipeAllReduce: {
    // As the CPU: the first listed stage sums the parts in list order and
    // sends the sum back, so every stage gets the same bits.
    auto Ranks = attrInts(I.Op, I.Attrs, "ranks");
    float *Y = reinterpret_cast<float *>(C.buffer(I.Out[0]));
    int64_t Count = Bufs[I.Out[0]].Type.numElements(),
            Bytes = Count * int64_t(sizeof(float));
    if (Ranks.empty() || !is_contained(Ranks, int64_t(Stage)))
      return planError("pipe_all_reduce does not list this stage");
    SP_CUDA_TRY(cudaMemcpyAsync(Y, C.buffer(I.In[0]), Bytes,
                                cudaMemcpyDeviceToDevice, S));
    if (Stage != Ranks[0]) {
      if (auto E = sendTo(int(Ranks[0]), Y, Bytes, S))
        return E;
      return recvFrom(int(Ranks[0]), Y, Bytes, S);
    }
    auto Part = scratch(S == Comm, Count);
    if (!Part)
      return Part.takeError();
    for (size_t K = 1; K < Ranks.size(); ++K) {
      if (auto E = recvFrom(int(Ranks[K]), *Part, Bytes, S))
        return E;
      cuda::add(Y, Y, *Part, Count, S);
    }
    for (size_t K = 1; K < Ranks.size(); ++K)
      if (auto E = sendTo(int(Ranks[K]), Y, Bytes, S))
        return E;
    return Error::success();
  }
  default:
    llvm_unreachable("not a pipeline message");
  }
}

Expected<CudaBackend::Channel *>
CudaBackend::channelOf(std::map<int, Channel> &Of, int Peer, StringRef What) {
  auto It = Of.find(Peer);
  if (It == Of.end())
    return planError(formatv("a pipeline {0} stage {1}, which does not "
                             "neighbour this one",
                             What, Peer)
                         .str());
  return &It->second;
}

Error CudaBackend::sendTo(int Peer, const void *Data, int64_t Bytes,
                          cudaStream_t S) {
  auto Ch = channelOf(SendChannels, Peer, "send to");
  if (!Ch)
    return Ch.takeError();
  // A slot whose send has completed, large enough, else a new one.
  SendSlot *Slot = nullptr;
  for (SendSlot &K : SendSlots) {
    cudaError_t Q = cudaEventQuery(K.Done);
    if (Q == cudaErrorNotReady)
      continue;
    SP_CUDA_TRY(Q);
    if (K.Bytes >= Bytes) {
      Slot = &K;
      break;
    }
  }
  if (!Slot) {
    SendSlots.emplace_back();
    Slot = &SendSlots.back();
    if (auto E = allocateWhileRunning(reinterpret_cast<void **>(&Slot->Data),
                                      size_t(Bytes)))
      return E;
    Slot->Bytes = Bytes;
    SP_CUDA_TRY(cudaEventCreateWithFlags(&Slot->Done, cudaEventDisableTiming));
    SP_CUDA_TRY(
        cudaEventCreateWithFlags(&Slot->Staged, cudaEventDisableTiming));
  }
  SP_CUDA_TRY(cudaMemcpyAsync(Slot->Data, Data, size_t(Bytes),
                              cudaMemcpyDeviceToDevice, S));
  SP_CUDA_TRY(cudaEventRecord(Slot->Staged, S));
  SP_CUDA_TRY(cudaStreamWaitEvent((*Ch)->Stream, Slot->Staged, 0));
  if (auto E = (*Ch)->Comm->send(Slot->Data, Bytes, /*Peer=*/1, (*Ch)->Stream))
    return E;
  SP_CUDA_TRY(cudaEventRecord(Slot->Done, (*Ch)->Stream));
  return Error::success();
}

Error CudaBackend::recvFrom(int Peer, void *Data, int64_t Bytes,
                            cudaStream_t S) {
  auto Ch = channelOf(RecvChannels, Peer, "receive from");
  if (!Ch)
    return Ch.takeError();
  return (*Ch)->Comm->recv(Data, Bytes, /*Peer=*/0, S);
}

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
  if (C.Tensor.size() > 1) {
    auto N = nccl(C.Tensor);
    if (!N)
      return N.takeError();
    if (auto E = hopToNccl(S))
      return E;
    if (auto E = (*N)->allReduceSum(&Norm->SplitD, &Norm->SplitD, 1,
                                    ncclStream()))
      return E;
    if (auto E = hopBack(S))
      return E;
  }
  cuda::gradNormTotal(&Norm->Total, &Norm->SplitD, nullptr, &Norm->Whole, S);
  if (attrInt(I.Op, I.Attrs, "zero")) {
    // ZeRO: each replica holds a chunk of every gradient; the sum over them,
    // as CpuBackend.
    if (!C.Data)
      return planError("grad_norm {zero = 1} in a plan run without "
                       "data-parallel replicas");
    auto N = nccl(*C.Data);
    if (!N)
      return N.takeError();
    if (auto E = hopToNccl(S))
      return E;
    if (auto E = (*N)->allReduceSum(&Norm->Total, &Norm->Total, 1,
                                    ncclStream()))
      return E;
    if (auto E = hopBack(S))
      return E;
  }
  if (attrInt(I.Op, I.Attrs, "pipeline") && C.Pipeline) {
    if (C.Pipeline->size() > 1) {
      auto N = nccl(*C.Pipeline);
      if (!N)
        return N.takeError();
      if (auto E = hopToNccl(S))
        return E;
      if (auto E = (*N)->allReduceSum(&Norm->Total, &Norm->Total, 1,
                                      ncclStream()))
        return E;
      if (auto E = hopBack(S))
        return E;
    }
  }
  // Loss scaling: the norm of the unscaled gradients (C.GradScale is a
  // power of two: exact).
  cuda::gradNormFinish(reinterpret_cast<float *>(C.buffer(I.Out[0])),
                       &Norm->Total, nullptr, C.GradScale, S);
  return Error::success();
}

Error CudaBackend::vocabParallelLoss(const KernelCall &C, cudaStream_t S,
                                     bool Grad, int64_t N, int64_t V,
                                     int64_t Valid, int64_t Ignore) {
  // As CpuBackend: the row maximum, the sum of exponentials and the target
  // logit reduced over the tensor group, so no rank holds the full logits.
  const Instruction &I = C.I;
  int64_t Start = C.Tensor.rank() * V;
  int64_t Mine = std::clamp<int64_t>(Valid - Start, 0, V);
  int64_t CountAt = (3 * N + 1) / 2 * 2; // 8-byte aligned
  auto Tmp = scratch(false, CountAt + 2);
  if (!Tmp)
    return Tmp.takeError();
  float *Max = *Tmp, *Sum = Max + N, *Target = Sum + N;
  double *Count = reinterpret_cast<double *>(*Tmp + CountAt);
  const float *Logits = reinterpret_cast<const float *>(C.buffer(I.In[0]));
  const int64_t *Targets = reinterpret_cast<const int64_t *>(C.buffer(I.In[1]));
  float *Out = reinterpret_cast<float *>(C.buffer(I.Out[0]));
  cuda::vocabParallelMax(Max, Logits, Targets, N, V, Mine, Valid, true, Ignore,
                         Err, S);
  cuda::NcclComm *G = nullptr;
  if (C.Tensor.size() > 1) {
    auto NC = nccl(C.Tensor);
    if (!NC)
      return NC.takeError();
    G = *NC;
    if (auto E = hopToNccl(S))
      return E;
    if (auto E = G->allReduceMax(Max, Max, N, ncclStream()))
      return E;
    if (auto E = hopBack(S))
      return E;
  }
  cuda::vocabParallelSums(Sum, Target, Logits, Max, Targets, N, V, Mine, Start,
                          true, Ignore, S);
  if (G) {
    if (auto E = hopToNccl(S))
      return E;
    if (auto E = G->allReduceSum(Sum, Sum, N, ncclStream()))
      return E;
    if (!Grad)
      if (auto E = G->allReduceSum(Target, Target, N, ncclStream()))
        return E;
    if (auto E = hopBack(S))
      return E;
  }
  if (Grad)
    cuda::vocabParallelGrad(Out, Logits, Max, Sum, Targets,
                            reinterpret_cast<const float *>(C.buffer(I.In[2])),
                            N, V, Mine, Start, true, Ignore, Count, S);
  else
    cuda::vocabParallelLoss(Out, Sum, Max, Target, Targets, N, true, Ignore, S);
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

Error CudaBackend::timeStart(cudaStream_t S, int Kind) {
  size_t Need = 2 * (Timed.size() + 1);
  while (TimingPool.size() < Need) {
    cudaEvent_t E;
    SP_CUDA_TRY(cudaEventCreate(&E));
    TimingPool.push_back(E);
  }
  TimedCall T{TimingPool[Need - 2], TimingPool[Need - 1], Kind};
  SP_CUDA_TRY(cudaEventRecord(T.Start, S));
  Timed.push_back(T);
  return Error::success();
}

Error CudaBackend::startTiming() {
  if (auto E = drain())
    return E;
  if (!TimeBase)
    SP_CUDA_TRY(cudaEventCreate(&TimeBase));
  // Both streams are idle: the base is now on the device's clock.
  SP_CUDA_TRY(cudaEventRecord(TimeBase, Compute));
  Timed.clear();
  AdamwLaunches.clear();
  Timing = true;
  return Error::success();
}

Expected<std::vector<Backend::DeviceTime>> CudaBackend::collectTimes() {
  if (!Timing)
    return std::vector<DeviceTime>();
  Timing = false;
  if (auto E = drain())
    return E;
  std::vector<DeviceTime> R;
  R.reserve(Timed.size());
  for (const TimedCall &T : Timed) {
    float StartMs = 0, Ms = 0;
    SP_CUDA_TRY(cudaEventElapsedTime(&StartMs, TimeBase, T.Start));
    SP_CUDA_TRY(cudaEventElapsedTime(&Ms, T.Start, T.End));
    R.push_back({1e3 * StartMs, 1e3 * Ms, T.Stream});
  }
  // Each instruction of a multi-tensor AdamW launch was timed to the
  // launch's end: share the launch among them instead.
  for (const auto &[Calls, Elements] : AdamwLaunches) {
    double Start = INFINITY, End = -INFINITY;
    for (size_t K : Calls)
      if (K < R.size()) {
        Start = std::min(Start, R[K].StartUs);
        End = std::max(End, R[K].StartUs + R[K].DurationUs);
      }
    if (!(End >= Start))
      continue;
    auto Slices = cuda::shareLaunch(Start, End - Start, Elements);
    for (size_t I = 0; I < Calls.size(); ++I)
      if (Calls[I] < R.size()) {
        R[Calls[I]].StartUs = Slices[I].Start;
        R[Calls[I]].DurationUs = Slices[I].Duration;
      }
  }
  AdamwLaunches.clear();
  Timed.clear();
  return R;
}

/// Buffer Id as a kernel operand of its own storage (cuda::Elems).
static cuda::Elems elems(const KernelCall &C, int Id) {
  DType T = C.Prog.Buffers[Id].Type.Dtype;
  return cuda::Elems(C.buffer(Id), T == DType::BF16  ? cuda::Storage::BF16
                                   : T == DType::F16 ? cuda::Storage::F16
                                                     : cuda::Storage::F32);
}

Error CudaBackend::dropout(const KernelCall &C, cudaStream_t S) {
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  auto Key = attrInts(I.Op, I.Attrs, "key");
  if (Key.size() != 2)
    return planError("dropout has no Philox key; recompile the plan");
  double Ratio =
      C.Training ? C.Dropout.value_or(attrFloat(I.Op, I.Attrs, "ratio")) : 0.0;
  if (!(Ratio >= 0.0 && Ratio <= 1.0))
    return planError("dropout ratio outside [0, 1]");
  if (Key[0] < 0 || Key[0] > 0xFFFF)
    return planError("dropout key layer above 65535");
  if (Key[1] < 0 || Key[1] > 0xFFFF)
    return planError("dropout key site above 65535");
  const TensorType &Local = Bufs[I.In[0]].Type;
  if (Local.rank() > size_t(cuda::MaxRank))
    return planError("global index: rank above MaxRank");
  const Sharding &Sh = Bufs[I.In[0]].Shard;
  // The element's index in the whole tensor (as CpuBackend's).
  GlobalBlock GB = globalBlock(
      Local.Shape, Sh, C.Tensor.rank(), attrInt(I.Op, I.Attrs, "microbatch"),
      attrInt(I.Op, I.Attrs, "microbatches"), C.Data ? C.Data->rank() : 0,
      C.Data ? C.Data->size() : 1);
  uint8_t *Mask = I.Out.size() > 1
                      ? reinterpret_cast<uint8_t *>(C.buffer(I.Out[1]))
                      : nullptr;
  // causal (lower/CausalProducts.h): the input is zero above the diagonal
  // of its last two dimensions, so the output is 0 there whatever the draw;
  // the mask is set to 0 there as the CPU leaves it (the draw is not
  // skipped here).
  bool Causal = I.Op == OpKind::Dropout &&
                attrInt(I.Op, I.Attrs, "causal");
  if (Causal && (Local.rank() < 2 ||
                 (Sh.K == Sharding::Split && Sh.Dim >= int(Local.rank()) - 2)))
    return planError("dropout {causal} needs its last two dimensions whole "
                     "on the rank; the plan is corrupt");
  cuda::dropout(elems(C, I.Out[0]), Mask, elems(C, I.In[0]), Ratio, C.Seed,
                uint32_t(Key[0]), uint32_t(Key[1]), uint32_t(C.Step),
                devShape(GB.Full), devShape(Local.Shape), devShape(GB.Offset),
                S);
  if (Causal && Mask) {
    int64_t Sq = Local.dim(-2), Sk = Local.dim(-1);
    if (Sq > 0 && Sk > 0)
      cuda::causalMaskBytes(Mask, Local.numElements() / (Sq * Sk), Sq, Sk, S);
  }
  return Error::success();
}

Error CudaBackend::dispatch(const KernelCall &C, cudaStream_t S) {
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  auto In = [&](unsigned K) {
    return reinterpret_cast<float *>(C.buffer(I.In[K]));
  };
  auto Out = [&](unsigned K) {
    return reinterpret_cast<float *>(C.buffer(I.Out[K]));
  };
  auto InT = [&](unsigned K) -> const TensorType & {
    return Bufs[I.In[K]].Type;
  };
  auto OutT = [&](unsigned K) -> const TensorType & {
    return Bufs[I.Out[K]].Type;
  };
  // A float operand as the kernels taking cuda::Elems see it: float32, or
  // bf16/fp16 read and written in place (cuda::runsIn16Bit).
  auto InE = [&](unsigned K) { return elems(C, I.In[K]); };
  auto OutE = [&](unsigned K) { return elems(C, I.Out[K]); };
  auto Ids = [&](unsigned K) {
    return reinterpret_cast<const int64_t *>(C.buffer(I.In[K]));
  };
  // Doubles of the stream's scratch (the column sums' block sums).
  auto Doubles = [&](int64_t N) -> Expected<double *> {
    auto T = scratch(S == Comm, 2 * N);
    if (!T)
      return T.takeError();
    return reinterpret_cast<double *>(*T);
  };
  auto Zero = [&](unsigned K) -> Error {
    SP_CUDA_TRY(cudaMemsetAsync(Out(K), 0, OutT(K).numBytes(), S));
    return Error::success();
  };
  auto AInt = [&](StringRef Name) { return attrInt(I.Op, I.Attrs, Name); };
  auto AFloat = [&](StringRef Name) { return attrFloat(I.Op, I.Attrs, Name); };
  auto Tanh = [&] {
    return attrString(I.Op, I.Attrs, "approximate") == "tanh";
  };
  int Rank = C.Tensor.rank();

  switch (I.Op) {
  case OpKind::Embedding: {
    const TensorType &Table = InT(0);
    int64_t N = InT(1).numElements(), V = Table.Shape[0], H = Table.Shape[1];
    bool VP = AInt("vocab_parallel");
    cuda::embedding(Out(0), In(0), Ids(1), N, V, H, VP ? Rank * V : 0, VP, Err,
                    S);
    return Error::success();
  }
  case OpKind::EmbeddingGrad: {
    if (auto E = Zero(0))
      return E;
    const TensorType &Table = OutT(0);
    int64_t N = InT(0).numElements(), V = Table.Shape[0], H = Table.Shape[1];
    bool VP = AInt("vocab_parallel");
    cuda::embeddingBackward(Out(0), In(1), Ids(0), N, V, H, VP ? Rank * V : 0,
                            VP, Err, S);
    return Error::success();
  }
  case OpKind::Send:
  case OpKind::Recv:
  case OpKind::PipeBroadcast:
  case OpKind::PipeAllReduce:
    return pipelineMessage(C, S);
  case OpKind::AllReduce:
  case OpKind::AllGather:
  case OpKind::ReduceScatter:
  case OpKind::SpSplit:
    return collective(C, S);
  case OpKind::RingShift:
  case OpKind::RingConcat:
    return ring(C, S);
  case OpKind::GatherParam:
    return gatherParam(C, S);
  case OpKind::Cast: {
    // float32 to or from bf16/fp16 (cuda::runsIn16Bit), else a copy (on
    // float32 copies, dispatchMixed rounding the result).
    DType From = InT(0).Dtype, To = OutT(0).Dtype;
    auto *Half = reinterpret_cast<uint16_t *>(
        C.buffer(From == DType::F32 ? I.Out[0] : I.In[0]));
    int64_t N = InT(0).numElements();
    if (From == DType::F32 && To != DType::F32)
      cuda::narrow16(Half, In(0), N, To == DType::BF16, S);
    else if (To == DType::F32 && From != DType::F32)
      cuda::widen16(Out(0), Half, N, From == DType::BF16, S);
    else
      SP_CUDA_TRY(cudaMemcpyAsync(Out(0), In(0), InT(0).numBytes(),
                                  cudaMemcpyDeviceToDevice, S));
    return Error::success();
  }
  case OpKind::Add:
  case OpKind::Mul: {
    bool Multiply = I.Op == OpKind::Mul;
    if (InT(0).Shape == InT(1).Shape) {
      (Multiply ? cuda::mul : cuda::add)(OutE(0), InE(0), InE(1),
                                         OutT(0).numElements(), S);
      return Error::success();
    }
    cuda::DevShape SA, SB;
    if (auto E = broadcastStrides(InT(0), OutT(0), SA))
      return E;
    if (auto E = broadcastStrides(InT(1), OutT(0), SB))
      return E;
    cuda::broadcastBinary(Out(0), devShape(OutT(0).Shape), In(0), SA, In(1),
                          SB, Multiply, S);
    return Error::success();
  }
  case OpKind::ReduceTo: {
    const TensorType &X = OutT(0), &Y = InT(0);
    cuda::DevShape SX;
    if (auto E = broadcastStrides(X, Y, SX))
      return E;
    int R = int(Y.rank());
    int64_t SY[cuda::MaxRank];
    int64_t Acc = 1;
    for (int D = R - 1; D >= 0; --D) {
      SY[D] = Acc;
      Acc *= Y.Shape[D];
    }
    cuda::DevShape Kept, KeptSX, KeptSY, Red, RedSY;
    for (int D = 0; D < R; ++D) {
      if (SX.Dim[D] == 0 && Y.Shape[D] != 1) {
        Red.Dim[Red.Rank] = Y.Shape[D];
        RedSY.Dim[Red.Rank++] = SY[D];
        RedSY.Rank = Red.Rank;
      } else {
        Kept.Dim[Kept.Rank] = Y.Shape[D];
        KeptSX.Dim[Kept.Rank] = SX.Dim[D];
        KeptSY.Dim[Kept.Rank++] = SY[D];
        KeptSX.Rank = KeptSY.Rank = Kept.Rank;
      }
    }
    cuda::reduceTo(Out(0), In(0), Kept, KeptSX, KeptSY, Red, RedSY,
                   X.numElements(), S);
    return Error::success();
  }
  case OpKind::LayerNorm: {
    int64_t H = InT(0).dim(-1), Rows = InT(0).numElements() / H;
    bool Stats = I.Out.size() == 3;
    cuda::layerNorm(OutE(0), Stats ? Out(1) : nullptr,
                    Stats ? Out(2) : nullptr, InE(0), InE(1), InE(2), Rows, H,
                    AFloat("epsilon"), S);
    return Error::success();
  }
  case OpKind::LayerNormGrad: {
    int64_t H = InT(1).dim(-1), Rows = InT(1).numElements() / H;
    if (auto E = Zero(1))
      return E;
    if (auto E = Zero(2))
      return E;
    auto Tmp = Doubles(2 * cuda::columnParts(Rows) * H);
    if (!Tmp)
      return Tmp.takeError();
    cuda::layerNormBackward(OutE(0), Out(1), Out(2), InE(0), InE(1), InE(2),
                            In(3), In(4), Rows, H, *Tmp, S);
    return Error::success();
  }
  case OpKind::Linear: {
    int64_t InF = InT(0).dim(-1), OutF = OutT(0).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    return linear(S, AInt("trans_w"), Rows, OutF, InF, In(0), In(1),
                  I.In.size() > 2 ? In(2) : nullptr, Out(0), InT(0).Dtype);
  }
  case OpKind::LinearGelu: { // the linear, then the GELU of its result
    int64_t InF = InT(0).dim(-1), OutF = OutT(0).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    if (auto E =
            linear(S, AInt("trans_w"), Rows, OutF, InF, In(0), In(1),
                   I.In.size() > 2 ? In(2) : nullptr, Out(0), InT(0).Dtype))
      return E;
    cuda::gelu(OutE(1), OutE(0), OutT(0).numElements(), Tanh(), S);
    return Error::success();
  }
  case OpKind::LinearGeluGrad: { // the linear, then the GELU's gradient in
                                 // place
    int64_t InF = InT(0).dim(-1), OutF = OutT(0).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    if (auto E = linear(S, AInt("trans_w"), Rows, OutF, InF, In(0), In(1),
                        nullptr, Out(0), InT(0).Dtype))
      return E;
    cuda::geluBackward(OutE(0), InE(2), OutE(0), OutT(0).numElements(),
                       Tanh(), S);
    return Error::success();
  }
  case OpKind::LinearGradW: {
    int64_t InF = InT(0).dim(-1), OutF = InT(1).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    if (auto E = Zero(0))
      return E;
    if (AInt("trans_w")) // DW[Out, In] += DY^T X
      return gemm(S, true, false, OutF, InF, Rows, In(1), OutF, In(0), InF,
                  1.0f, Out(0), InF, InT(0).Dtype);
    return gemm(S, true, false, InF, OutF, Rows, In(0), InF, In(1), OutF, 1.0f,
                Out(0), OutF, InT(0).Dtype);
  }
  case OpKind::BiasGrad: {
    int64_t OutF = InT(0).dim(-1);
    if (auto E = Zero(0))
      return E;
    int64_t Rows = InT(0).numElements() / OutF;
    auto Tmp = Doubles(cuda::columnParts(Rows) * OutF);
    if (!Tmp)
      return Tmp.takeError();
    cuda::biasBackward(Out(0), InE(0), Rows, OutF, *Tmp, S);
    return Error::success();
  }
  case OpKind::Gelu:
    cuda::gelu(OutE(0), InE(0), InT(0).numElements(), Tanh(), S);
    return Error::success();
  case OpKind::GeluGrad:
    cuda::geluBackward(OutE(0), InE(0), InE(1), InT(0).numElements(), Tanh(),
                       S);
    return Error::success();
  case OpKind::RmsNorm: {
    int64_t H = InT(0).dim(-1), Rows = InT(0).numElements() / H;
    cuda::rmsNorm(Out(0), I.Out.size() > 1 ? Out(1) : nullptr, In(0), In(1),
                  Rows, H, AFloat("epsilon"), S);
    return Error::success();
  }
  case OpKind::RmsNormGrad: {
    int64_t H = InT(1).dim(-1), Rows = InT(1).numElements() / H;
    if (auto E = Zero(1))
      return E;
    auto Tmp = Doubles(cuda::columnParts(Rows) * H);
    if (!Tmp)
      return Tmp.takeError();
    cuda::rmsNormBackward(Out(0), Out(1), In(0), In(1), In(2), In(3), Rows, H,
                          *Tmp, S);
    return Error::success();
  }
  case OpKind::Silu:
  case OpKind::Relu:
    cuda::activation(I.Op == OpKind::Silu ? 0 : 1, Out(0), In(0),
                     InT(0).numElements(), S);
    return Error::success();
  case OpKind::SiluGrad:
  case OpKind::ReluGrad:
    cuda::activationBackward(I.Op == OpKind::SiluGrad ? 0 : 1, Out(0), In(0),
                             In(1), InT(0).numElements(), S);
    return Error::success();
  case OpKind::Rope:
  case OpKind::RopeGrad: {
    const TensorType &X = InT(0);
    if (X.Shape[3] % 2)
      return planError("rope needs an even head dimension");
    int64_t CB = InT(1).Shape[0];
    if (CB != 1 && CB != X.Shape[0])
      return planError("rope tables must have batch dimension 1 or B");
    cuda::rope(Out(0), In(0), In(1), In(2), X.Shape[0], X.Shape[1], X.Shape[2],
               X.Shape[3], CB, AInt("interleaved"), I.Op == OpKind::RopeGrad,
               S);
    return Error::success();
  }
  case OpKind::RepeatHeads: {
    const TensorType &X = InT(0);
    cuda::repeatHeads(Out(0), In(0), X.Shape[0], X.Shape[1], AInt("repeats"),
                      X.Shape[2], X.Shape[3], S);
    return Error::success();
  }
  case OpKind::RepeatHeadsGrad: {
    const TensorType &X = OutT(0);
    cuda::repeatHeadsBackward(Out(0), In(0), X.Shape[0], X.Shape[1],
                              AInt("repeats"), X.Shape[2], X.Shape[3], S);
    return Error::success();
  }
  case OpKind::ToHeads:
  case OpKind::MergeHeadsGrad: {
    const TensorType &X = OutT(0);
    cuda::mergeHeadsBackward(Out(0), In(0), X.Shape[0], X.Shape[2], X.Shape[1],
                             X.Shape[3], S);
    return Error::success();
  }
  case OpKind::SplitHeads: {
    const TensorType &Q = OutT(0);
    cuda::splitHeads(Out(0), Out(1), Out(2), In(0), Q.Shape[0], Q.Shape[2],
                     Q.Shape[1], Q.Shape[3], S);
    return Error::success();
  }
  case OpKind::SplitHeadsGrad: {
    const TensorType &Q = InT(0);
    cuda::splitHeadsBackward(Out(0), In(0), In(1), In(2), Q.Shape[0],
                             Q.Shape[2], Q.Shape[1], Q.Shape[3], S);
    return Error::success();
  }
  case OpKind::MergeHeads: {
    const TensorType &X = InT(0);
    cuda::mergeHeads(Out(0), In(0), X.Shape[0], X.Shape[2], X.Shape[1],
                     X.Shape[3], S);
    return Error::success();
  }
  case OpKind::BatchMatMul: {
    bool TA = AInt("trans_a"), TB = AInt("trans_b");
    const TensorType &CT = OutT(0);
    int64_t M = CT.dim(-2), N = CT.dim(-1);
    int64_t K = TA ? InT(0).dim(-2) : InT(0).dim(-1);
    int64_t Batch = CT.numElements() / (M * N);
    if (InT(0).numElements() != Batch * M * K ||
        InT(1).numElements() != Batch * K * N)
      return planError("batch_matmul with broadcast batch dimensions is not "
                       "supported by the CUDA backend");
    // causal_a only says A holds zeros the product may skip: the whole
    // product is the same. causal keeps the causal triangle of the result
    // and zeroes the rest, as the CPU's row blocks do.
    bool Causal = AInt("causal");
    if (Causal && CT.Dtype != DType::F32)
      return planError("batch_matmul {causal} on " + CT.str() +
                       ": the CUDA backend masks float32 results only "
                       "(sp-compile marks float32 and float64 plans)");
    if (auto E = batchedGemm(S, TA, TB, M, N, K, In(0), In(1), Out(0), Batch,
                             InT(0).Dtype))
      return E;
    if (Causal)
      cuda::causalMask(Out(0), Out(0), Batch, M, N, 0.0, S);
    return Error::success();
  }
  case OpKind::Scale:
    cuda::scale(Out(0), In(0), InT(0).numElements(), AFloat("alpha"), S);
    return Error::success();
  case OpKind::CausalMask: {
    const TensorType &X = InT(0);
    int64_t Sq = X.dim(-2), Sk = X.dim(-1);
    cuda::causalMask(Out(0), In(0), X.numElements() / (Sq * Sk), Sq, Sk,
                     AFloat("fill"), S);
    return Error::success();
  }
  case OpKind::PaddingMask: {
    const TensorType &X = InT(0);
    int64_t B = X.Shape[0], K = X.dim(-1);
    auto KeepType = paddingKeepType(InT(1));
    if (!KeepType)
      return KeepType.takeError();
    cuda::paddingMask(Out(0), In(0), C.buffer(I.In[1]), *KeepType, B,
                      X.numElements() / (B * K), K, AFloat("fill"),
                      AInt("where"), S);
    return Error::success();
  }
  case OpKind::Softmax:
  case OpKind::SoftmaxGrad: {
    // With the attention core's scale and causal mask fused in
    // (lower/FuseAttention.cpp), or plain (alpha 1, not causal).
    const TensorType &X = InT(0);
    int64_t N = X.dim(-1);
    bool Causal = AInt("causal");
    if (Causal && X.rank() < 2)
      return planError("a causal softmax expects rank >= 2 scores");
    int64_t Sq = Causal ? X.dim(-2) : 1;
    if (I.Op == OpKind::Softmax)
      cuda::softmax(OutE(0), InE(0), X.numElements() / N, N, AFloat("alpha"),
                    Causal, Sq, AFloat("fill"), S);
    else
      cuda::softmaxBackward(OutE(0), InE(0), InE(1), X.numElements() / N, N,
                            AFloat("alpha"), Causal, Sq, AFloat("fill"), S);
    return Error::success();
  }
  case OpKind::Dropout:
    return dropout(C, S);
  case OpKind::DropoutAdd: // the dropout, then the residual added in place
    if (auto E = dropout(C, S))
      return E;
    cuda::add(OutE(0), OutE(0), InE(1), OutT(0).numElements(), S);
    return Error::success();
  case OpKind::Attention:
  case OpKind::AttentionGrad:
    return attention(C, S);
  case OpKind::DropoutGrad: {
    double Ratio =
        C.Training ? C.Dropout.value_or(AFloat("ratio")) : 0.0;
    cuda::dropoutBackward(OutE(0), InE(0),
                          reinterpret_cast<const uint8_t *>(In(1)),
                          InT(0).numElements(), Ratio, S);
    return Error::success();
  }
  case OpKind::CrossEntropy:
  case OpKind::CrossEntropyGrad: {
    int64_t V = InT(0).dim(-1), N = InT(1).numElements();
    int64_t Valid = AInt("valid_vocab");
    if (!Valid)
      Valid = V;
    int64_t Ignore = AInt("ignore_index");
    bool Grad = I.Op == OpKind::CrossEntropyGrad;
    if (AInt("vocab_parallel"))
      return vocabParallelLoss(C, S, Grad, N, V, Valid, Ignore);
    if (N <= 0)
      return planError("cross entropy over no rows");
    if (Valid < 1 || Valid > V)
      return planError("cross entropy valid vocabulary not in [1, V]");
    // Scratch: N row losses (doubles) or the count.
    auto Tmp = scratch(false, 2 * N + 2);
    if (!Tmp)
      return Tmp.takeError();
    double *D = reinterpret_cast<double *>(*Tmp);
    if (Grad)
      cuda::crossEntropyBackward(Out(0), In(0), Ids(1), In(2), N, V, Valid,
                                 true, Ignore, D, Err, S);
    else
      cuda::crossEntropy(Out(0), In(0), Ids(1), N, V, Valid, true, Ignore, D,
                         Err, S);
    return Error::success();
  }
  case OpKind::GradNorm:
    return gradNorm(C, S);
  case OpKind::Accumulate: {
    int64_t N = InT(1).numElements();
    if (AInt("first"))
      SP_CUDA_TRY(cudaMemcpyAsync(In(0), In(1), N * sizeof(float),
                                  cudaMemcpyDeviceToDevice, S));
    else
      cuda::add(In(0), In(0), In(1), N, S);
    return Error::success();
  }
  case OpKind::AdamW: {
    auto Chunk = adamwChunk(C); // with ZeRO, g, m, v are this rank's chunk
    if (!Chunk)
      return Chunk.takeError();
    cuda::adamw(In(0) + Chunk->Begin, In(1), In(2), In(3), Chunk->Count, In(4),
                In(5), In(6), AFloat("beta1"), AFloat("beta2"), AFloat("eps"),
                AFloat("weight_decay"), AFloat("max_norm"),
                float(C.GradScale), S);
    return Error::success();
  }
  default:
    return noKernel(I.Op);
  }
}

} // namespace

bool cudaBackendBuilt() { return true; }

Error loadCudaLibraries() {
  auto Api = loadCublas();
  return Api ? Error::success() : Api.takeError();
}

int cudaDeviceCount() {
  int Count = 0;
  if (cudaGetDeviceCount(&Count) != cudaSuccess) {
    cudaGetLastError(); // clear the sticky status of the failed query
    return 0;
  }
  return Count;
}

Error checkCudaDevice() {
  int Count = 0;
  cudaError_t E = cudaGetDeviceCount(&Count);
  if (E != cudaSuccess) {
    cudaGetLastError();
    return createStringError(
        inconvertibleErrorCode(), "%s",
        cuda::noDeviceMessage(formatv("{0}: {1}", cudaGetErrorName(E),
                                      cudaGetErrorString(E))
                                  .str())
            .c_str());
  }
  if (Count == 0)
    return createStringError(inconvertibleErrorCode(), "%s",
                             cuda::noDeviceMessage("0 devices").c_str());
  return Error::success();
}

Expected<std::unique_ptr<Backend>>
createCudaBackend(const CudaBackendOptions &Opts) {
  auto B = CudaBackend::create(Opts);
  if (!B)
    return B.takeError();
  return std::unique_ptr<Backend>(std::move(*B));
}

} // namespace sp
