//===- CudaCheck.h - Checked CUDA, cuBLAS and NCCL calls ---------*- C++ -*-===//
//
// Every CUDA runtime, cuBLAS and NCCL call of the backend goes through one
// of these macros, in a function returning llvm::Error (or Expected): a
// failure returns an error naming the call, its file:line and the library's
// own name and description of the status, e.g.
//   runtime/cuda/CudaBackend.cpp:120: cudaMalloc(&P, Bytes):
//   cudaErrorMemoryAllocation: out of memory
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_CUDACHECK_H
#define SP_RUNTIME_CUDA_CUDACHECK_H

#include "llvm/Support/Error.h"
#include <cstdint>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

namespace sp::cuda {

/// Whether V fits a cuBLAS or cuBLASLt dimension, count or leading
/// dimension (a non-negative int).
inline bool fitsBlasInt(int64_t V) { return V >= 0 && V <= INT32_MAX; }

inline llvm::Error callFailure(const char *Call, const char *Name,
                               const char *What, const char *File, int Line) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "%s:%d: %s: %s: %s", File, Line, Call, Name,
                                 What);
}

inline llvm::Error cudaFailure(const char *Call, cudaError_t E,
                               const char *File, int Line) {
  return callFailure(Call, cudaGetErrorName(E), cudaGetErrorString(E), File,
                     Line);
}

/// cuBLAS is loaded only when a backend is made (CublasLoader.h: its
/// static initialisation costs every process half a second), so its status
/// names are spelled here rather than asked of the library.
inline const char *cublasStatusName(cublasStatus_t S) {
  switch (S) {
  case CUBLAS_STATUS_SUCCESS:
    return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED:
    return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED:
    return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE:
    return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH:
    return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_MAPPING_ERROR:
    return "CUBLAS_STATUS_MAPPING_ERROR";
  case CUBLAS_STATUS_EXECUTION_FAILED:
    return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_INTERNAL_ERROR:
    return "CUBLAS_STATUS_INTERNAL_ERROR";
  case CUBLAS_STATUS_NOT_SUPPORTED:
    return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_LICENSE_ERROR:
    return "CUBLAS_STATUS_LICENSE_ERROR";
  default:
    return "cublasStatus (unknown)";
  }
}

inline llvm::Error cublasFailure(const char *Call, cublasStatus_t S,
                                 const char *File, int Line) {
  return callFailure(Call, cublasStatusName(S), "cuBLAS call failed", File,
                     Line);
}

inline llvm::Error ncclFailure(const char *Call, ncclResult_t R,
                               const char *File, int Line) {
  return callFailure(Call, "ncclResult", ncclGetErrorString(R), File, Line);
}

} // namespace sp::cuda

#define SP_CUDA_TRY(Call)                                                      \
  do {                                                                         \
    cudaError_t SpErr_ = (Call);                                               \
    if (SpErr_ != cudaSuccess)                                                 \
      return ::sp::cuda::cudaFailure(#Call, SpErr_, __FILE__, __LINE__);       \
  } while (0)

#define SP_CUBLAS_TRY(Call)                                                    \
  do {                                                                         \
    cublasStatus_t SpStatus_ = (Call);                                         \
    if (SpStatus_ != CUBLAS_STATUS_SUCCESS)                                    \
      return ::sp::cuda::cublasFailure(#Call, SpStatus_, __FILE__, __LINE__);  \
  } while (0)

#define SP_NCCL_TRY(Call)                                                      \
  do {                                                                         \
    ncclResult_t SpResult_ = (Call);                                           \
    if (SpResult_ != ncclSuccess)                                              \
      return ::sp::cuda::ncclFailure(#Call, SpResult_, __FILE__, __LINE__);    \
  } while (0)

#endif // SP_RUNTIME_CUDA_CUDACHECK_H
