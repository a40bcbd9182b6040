//===- Gemm.cpp - The CUDA backend's GEMMs --------------------------------===//
//
// cuBLAS (CublasLoader.h) for the matmuls: fp32 math, TF32 only with
// CudaBackendOptions::AllowTF32; bf16 and fp16 operands on tensor cores
// summed in float32, their result written in float32 or, where the
// instruction's result is of the operands' 16-bit type (MixedPlan.h's
// runsIn16Bit), in that type by cuBLAS (the float32 sum rounded once, as
// the widened path's narrowing rounds it, without the float32 copy's
// traffic). Row-major GEMMs map to cuBLAS's column-major ones by
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
                        int64_t Ldb, float Beta, void *Cm, int64_t Ldc,
                        DType AB, DType CT) {
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
  if (AB == DType::F32 && CT != DType::F32)
    return makeError("gemm: a " + dtypeName(CT).str() + " result of " +
                     dtypeName(AB).str() + " operands (16-bit results need 16-bit "
                     "operands of their type)");
  if (AB == DType::F32) {
    SP_CUBLAS_TRY(Cublas->Sgemm(Blas, OpB, OpA, int(N), int(M), int(K), &One,
                                static_cast<const float *>(B), int(Ldb),
                                static_cast<const float *>(A), int(Lda), &Beta,
                                static_cast<float *>(Cm), int(Ldc)));
    return Error::success();
  }
  return tensorCoreCall([&] {
    return Cublas->GemmEx(Blas, OpB, OpA, int(N), int(M), int(K), &One, B,
                          cudaType16(AB), int(Ldb), A, cudaType16(AB),
                          int(Lda), &Beta, Cm,
                          CT == DType::F32 ? CUDA_R_32F : cudaType16(CT),
                          int(Ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
}

Error CudaBackend::linear(cudaStream_t S, bool TransW, int64_t Rows,
                          int64_t OutF, int64_t InF, const void *X,
                          const void *W, const void *Bias, void *Out,
                          DType AB, DType OutT) {
  if (Bias && Lt &&
      (AB == DType::F32 || AB == DType::BF16 || AB == DType::F16)) {
    auto Fused = Lt->linearBias(
        S, TransW, Rows, OutF, InF, X, W,
        AB == DType::F32 ? CUDA_R_32F : cudaType16(AB), Bias, Out,
        OutT == DType::F32 ? CUDA_R_32F : cudaType16(OutT), TF32);
    if (!Fused)
      return Fused.takeError();
    if (*Fused)
      return Error::success();
  }
  if (Bias) { // a 16-bit result's bias is of its type (runsIn16Bit)
    cuda::Storage K = OutT == DType::BF16  ? cuda::Storage::BF16
                      : OutT == DType::F16 ? cuda::Storage::F16
                                           : cuda::Storage::F32;
    cuda::broadcastRows(cuda::Elems(Out, K),
                        cuda::Elems(const_cast<void *>(Bias), K), Rows, OutF,
                        S);
  }
  return gemm(S, false, TransW, Rows, OutF, InF, X, InF, W, TransW ? InF : OutF,
              Bias ? 1.0f : 0.0f, Out, OutF, AB, OutT);
}

Error CudaBackend::batchedGemm(cudaStream_t S, bool TA, bool TB, int64_t M,
                               int64_t N, int64_t K, const void *A,
                               const void *B, void *Cm, int64_t Batch,
                               DType AB, DType CT) {
  if (M == 0 || N == 0 || Batch == 0)
    return Error::success();
  if (!fitsBlasInt(M) || !fitsBlasInt(N) || !fitsBlasInt(K) ||
      !fitsBlasInt(Batch))
    return makeError("batch_matmul dimension above INT_MAX");
  float One = 1.0f, Zero = 0.0f;
  SP_CUBLAS_TRY(Cublas->SetStream(Blas, S));
  cublasOperation_t OpB = TB ? CUBLAS_OP_T : CUBLAS_OP_N,
                    OpA = TA ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (AB == DType::F32 && CT != DType::F32)
    return makeError("batch_matmul: a 16-bit result needs 16-bit operands");
  if (AB == DType::F32) {
    SP_CUBLAS_TRY(Cublas->SgemmStridedBatched(
        Blas, OpB, OpA, int(N), int(M), int(K), &One,
        static_cast<const float *>(B), int(TB ? K : N), K * N,
        static_cast<const float *>(A), int(TA ? M : K), M * K, &Zero,
        static_cast<float *>(Cm), int(N), M * N, int(Batch)));
    return Error::success();
  }
  return tensorCoreCall([&] {
    return Cublas->GemmStridedBatchedEx(
        Blas, OpB, OpA, int(N), int(M), int(K), &One, B, cudaType16(AB),
        int(TB ? K : N), K * N, A, cudaType16(AB), int(TA ? M : K), M * K,
        &Zero, Cm, CT == DType::F32 ? CUDA_R_32F : cudaType16(CT), int(N),
        M * N, int(Batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
  });
}

} // namespace sp::cuda
