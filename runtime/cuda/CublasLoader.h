//===- CublasLoader.h - The cuBLAS entry points of the backend --*- C++ -*-===//
//
// The cuBLAS functions the CUDA backend calls (Gemm.cpp), from libcublas
// loaded when the first backend is made (DynamicLibrary.h): linked, its
// (and cuBLASLt's) static initialisation would cost every process that
// links the backend, sp-run on the CPU included, about half a second at
// startup.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_CUBLASLOADER_H
#define SP_RUNTIME_CUDA_CUBLASLOADER_H

#include "llvm/Support/Error.h"
#include <cublas_v2.h>

namespace sp::cuda {

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

/// cuBLAS's entry points, loaded once per process; an error (every call
/// after a failure returns it again) names what is missing.
llvm::Expected<const CublasApi *> loadCublas();

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_CUBLASLOADER_H
