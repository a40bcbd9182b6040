//===- CudaBackend.h - The CUDA backend's entry points -----------*- C++ -*-===//
//
// What sp-run (--device cuda) and the tests call; plain C++, no CUDA headers,
// and present in every build: without the CUDA toolkit (SP_ENABLE_CUDA off)
// the functions below report that sp was built without CUDA.
//
// The backend (CudaBackend.cpp) runs a plan's instructions on one GPU per
// rank: the arena is one cudaMalloc at the plan's offsets, host copies go
// through pinned staging, kernels and cuBLAS GEMMs (fp32; TF32 only when
// asked) run on a compute stream, NCCL collectives and pipeline messages on
// a communication stream ordered against it by events (StreamPlan.h). Data
// errors a kernel finds (an id or target out of range) are reported by the
// next synchronize().
//
// Use (sp-run --device cuda does this): checkCudaDevice() once, before
// anything is read or written; then on every rank, after its groups are
// split, createCudaBackend with the rank's groups (collective over each
// group) and hand the backend to the executor:
//
//   auto B = createCudaBackend(Opts);        // error: report, every rank
//   auto Held = std::make_shared<std::unique_ptr<Backend>>(std::move(*B));
//   RunOptions R; R.MakeBackend = [Held] { return std::move(*Held); };
//
// Thread ranks (several ranks in one process) must each set Device: the
// launcher's local rank is the process's.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_CUDABACKEND_H
#define SP_RUNTIME_CUDA_CUDABACKEND_H

#include "runtime/Backend.h"
#include "runtime/cuda/NumericsMode.h"
#include "llvm/Support/Error.h"
#include <functional>
#include <memory>
#include <optional>

namespace sp {

struct CudaBackendOptions {
  /// The device to use (--device cuda:N); unset: the local rank's
  /// (DeviceSelect.h: OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID,
  /// MPI_LOCALRANKID, else host names gathered over World).
  std::optional<int> Device;
  /// The job's world communicator, for the local-rank fallback; null for a
  /// single process.
  Communicator *World = nullptr;
  /// The rank's groups. Their NCCL communicators are created by
  /// createCudaBackend (collective over each group of more than one rank:
  /// every rank must create its backend); a group met later that is not
  /// one of these gets its communicator at its first collective.
  Communicator *Tensor = nullptr, *Pipeline = nullptr, *Data = nullptr;
  /// The context-parallel group (--cp; ContextAttention.cpp's ring and
  /// all-to-all), or null.
  Communicator *Context = nullptr;
  /// GEMMs in TF32 (tensor cores, 10-bit mantissa inputs). Off: full fp32,
  /// the mode the comparisons with the CPU backend use.
  bool AllowTF32 = false;
  /// Collectives on a communication stream beside the compute stream
  /// (ordered by events); off: everything on the compute stream.
  bool Overlap = true;
  /// The fused attention core (attention, attention_grad) by the blockwise
  /// kernels (kernels/Attention.cuh: no scores stored, 16-bit tensors read
  /// in place), the default since they ran on an H200 (faster than the
  /// expansion in fp32, TF32 and bf16). Off: as the unfused ops
  /// (AttentionPlan.h), as heads above 128 always run.
  bool BlockwiseAttention = true;
  /// A linear layer's bias added in the GEMM's epilogue (cuBLASLt's
  /// CUBLASLT_EPILOGUE_BIAS, CublasLt.h) instead of written into the output
  /// before the GEMM. Off by default: it has run on one H200 (the kernel
  /// test, sp-run's default model), not yet been measured against the pair.
  bool CublasLtEpilogues = false;
  /// The memory-bound kernels' arithmetic (CudaKernels.h, Numerics): Fast,
  /// the default, in float32 in the GPU's order; Exact, the CPU backend's
  /// bits (the mode the bitwise comparisons with the CPU use).
  cuda::Numerics Numerics = cuda::Numerics::Fast;
  /// Called on every rank between the backend's own set-up (the device, its
  /// streams, cuBLAS) and its collective part (the groups' NCCL
  /// communicators), with the outcome of the first; what it returns is the
  /// outcome. sp-run agrees on it over the world, so that a rank that could
  /// not set up its GPU (a local rank without one) fails every rank instead
  /// of leaving the others waiting in ncclCommInitRank for it. Unset: the
  /// rank's own outcome.
  std::function<llvm::Error(llvm::Error)> AgreeBeforeCollectives;
};

/// Whether this build has the CUDA backend.
bool cudaBackendBuilt();

/// Success if a CUDA device can be used; else a one-line error, e.g.
/// "--device cuda: no CUDA device is visible (cudaGetDeviceCount:
/// cudaErrorInsufficientDriver: ...); run on a machine with an NVIDIA GPU or
/// use --device cpu". Safe without a driver (libcuda.so absent).
llvm::Error checkCudaDevice();

/// Number of visible CUDA devices, 0 when none can be used (no driver, no
/// device, or a build without CUDA).
int cudaDeviceCount();

/// Loads the libraries the backend opens only when it is made (cuBLAS,
/// whose start-up cost every process would pay if it were linked); an error
/// names what is missing. Needs no GPU.
llvm::Error loadCudaLibraries();

/// The backend of this rank: picks and sets its device, creates its streams,
/// cuBLAS handle and NCCL communicators.
llvm::Expected<std::unique_ptr<Backend>>
createCudaBackend(const CudaBackendOptions &Opts);

} // namespace sp

#endif // SP_RUNTIME_CUDA_CUDABACKEND_H
