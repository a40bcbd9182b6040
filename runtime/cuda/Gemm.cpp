//===- Gemm.cpp - The CUDA backend's GEMMs --------------------------------===//
//
// cuBLAS (CublasLoader.h) for the matmuls: fp32 math, TF32 only with
// CudaBackendOptions::AllowTF32; bf16 and fp16 operands on tensor cores
// summed in float32. Row-major GEMMs map to cuBLAS's column-major ones by
// computing C^T = op(B)^T op(A)^T. The linear layer's bias goes in
// cuBLASLt's epilogue with --cuda-epilogues (CublasLt.h).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaBackendImpl.h"
#include "support/Diagnostics.h"

using namespace llvm;

namespace sp::cuda {

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
  if (!fitsBlasInt(M) || !fitsBlasInt(N) || !fitsBlasInt(K) ||
      !fitsBlasInt(Lda) || !fitsBlasInt(Ldb) || !fitsBlasInt(Ldc))
    return makeError("gemm dimension above INT_MAX");
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
  if (!fitsBlasInt(M) || !fitsBlasInt(N) || !fitsBlasInt(K) ||
      !fitsBlasInt(Batch))
    return makeError("batch_matmul dimension above INT_MAX");
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

} // namespace sp::cuda
