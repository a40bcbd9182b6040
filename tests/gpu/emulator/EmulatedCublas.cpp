//===- EmulatedCublas.cpp - cuBLAS and cuBLASLt on OpenBLAS ---------------===//
//
// See EmulatedRuntime.h: column-major GEMMs on OpenBLAS in float32 (16-bit
// operands widened exactly, TF32 rounding both operands in TF32 mode), on
// the handle's stream; cublasLtMatmul with the default and bias epilogues.
//
//===----------------------------------------------------------------------===//
#include "EmulatedCommon.h"
#include "ir/Float16.h"
#include <algorithm>
#include <atomic>
#include <cblas.h>
#include <cstdint>
#include <cstring>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <vector>

using namespace sp::emu;

//===----------------------------------------------------------------------===//
// cuBLAS
//===----------------------------------------------------------------------===//

struct cublasContext {
  cudaStream_t Stream = nullptr;
  cublasMath_t Mode = CUBLAS_DEFAULT_MATH;
};

namespace {

/// X rounded to TF32 (8 exponent bits, 10 mantissa bits), to nearest even.
float toTf32(float X) {
  uint32_t U;
  std::memcpy(&U, &X, 4);
  if ((U & 0x7f800000u) != 0x7f800000u) {
    U += 0xfffu + ((U >> 13) & 1u);
    U &= ~0x1fffu;
  }
  std::memcpy(&X, &U, 4);
  return X;
}

/// The Rows x Cols column-major operand at P (leading dimension Ld) of
/// type T as float32, packed (leading dimension Rows), into Out.
void widen(const void *P, cudaDataType T, int Rows, int Cols, int Ld, bool Tf32,
           std::vector<float> &Out) {
  Out.resize(size_t(Rows) * Cols);
  for (int C = 0; C < Cols; ++C)
    for (int R = 0; R < Rows; ++R) {
      size_t At = size_t(C) * Ld + R;
      float V;
      if (T == CUDA_R_32F)
        V = static_cast<const float *>(P)[At];
      else if (T == CUDA_R_16BF)
        V = sp::bfloat16ToFloat(static_cast<const uint16_t *>(P)[At]);
      else if (T == CUDA_R_16F)
        V = sp::halfToFloat(static_cast<const uint16_t *>(P)[At]);
      else
        fail("a GEMM operand type the emulation does not implement");
      Out[size_t(C) * Rows + R] = Tf32 ? toTf32(V) : V;
    }
}

bool validGemm(cublasOperation_t TA, cublasOperation_t TB, int M, int N, int K,
               int Lda, int Ldb, int Ldc, int Batch) {
  return M >= 0 && N >= 0 && K >= 0 && Batch >= 0 &&
         (TA == CUBLAS_OP_N || TA == CUBLAS_OP_T) &&
         (TB == CUBLAS_OP_N || TB == CUBLAS_OP_T) && Ldc >= std::max(1, M) &&
         Lda >= std::max(1, TA == CUBLAS_OP_N ? M : K) &&
         Ldb >= std::max(1, TB == CUBLAS_OP_N ? K : N);
}

/// C = alpha op(A) op(B) + beta C, column-major, C float32, now (on the
/// calling stream's worker).
void gemmNow(cublasOperation_t TA, cublasOperation_t TB, int M, int N, int K,
             float Alpha, const void *A, cudaDataType AT, int Lda, long long SA,
             const void *B, cudaDataType BT, int Ldb, long long SB, float Beta,
             float *C, int Ldc, long long SC, int Batch, bool Tf32) {
  size_t ABytes = AT == CUDA_R_32F ? 4 : 2, BBytes = BT == CUDA_R_32F ? 4 : 2;
  const int ARows = TA == CUBLAS_OP_N ? M : K,
            ACols = TA == CUBLAS_OP_N ? K : M,
            BRows = TB == CUBLAS_OP_N ? K : N,
            BCols = TB == CUBLAS_OP_N ? N : K;
  // float32 operands as they are; 16-bit or TF32 ones widened first.
  std::vector<float> Af, Bf;
  for (int I = 0; I < Batch; ++I) {
    const char *Ai = static_cast<const char *>(A) + I * SA * ABytes;
    const char *Bi = static_cast<const char *>(B) + I * SB * BBytes;
    const float *Ap = reinterpret_cast<const float *>(Ai),
                *Bp = reinterpret_cast<const float *>(Bi);
    int La = Lda, Lb = Ldb;
    if (AT != CUDA_R_32F || Tf32) {
      widen(Ai, AT, ARows, ACols, Lda, Tf32, Af);
      Ap = Af.data();
      La = std::max(1, ARows);
    }
    if (BT != CUDA_R_32F || Tf32) {
      widen(Bi, BT, BRows, BCols, Ldb, Tf32, Bf);
      Bp = Bf.data();
      Lb = std::max(1, BRows);
    }
    cblas_sgemm(CblasColMajor, TA == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                TB == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, M, N, K, Alpha,
                Ap, La, Bp, Lb, Beta, C + I * SC, Ldc);
  }
}

/// gemmNow on H's stream. A 16-bit C (CT, the operands' type) is computed
/// as cuBLAS does: beta C widened, the float32 result rounded once to
/// nearest even.
cublasStatus_t gemmOn(cublasHandle_t H, cublasOperation_t TA,
                      cublasOperation_t TB, int M, int N, int K, float Alpha,
                      const void *A, cudaDataType AT, int Lda, long long SA,
                      const void *B, cudaDataType BT, int Ldb, long long SB,
                      float Beta, void *C, int Ldc, long long SC, int Batch,
                      cudaDataType CT = CUDA_R_32F) {
  if (!validGemm(TA, TB, M, N, K, Lda, Ldb, Ldc, Batch))
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool Tf32 =
      AT == CUDA_R_32F && (H->Mode & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH;
  if (CT == CUDA_R_32F) {
    enqueue(H->Stream, [=] {
      gemmNow(TA, TB, M, N, K, Alpha, A, AT, Lda, SA, B, BT, Ldb, SB, Beta,
              static_cast<float *>(C), Ldc, SC, Batch, Tf32);
    });
    return CUBLAS_STATUS_SUCCESS;
  }
  enqueue(H->Stream, [=] {
    const bool Bf16 = CT == CUDA_R_16BF;
    std::vector<float> Cf;
    for (int I = 0; I < Batch; ++I) {
      uint16_t *Ci = static_cast<uint16_t *>(C) + I * SC;
      widen(Ci, CT, M, N, Ldc, false, Cf);
      gemmNow(TA, TB, M, N, K, Alpha, static_cast<const char *>(A) + I * SA * 2,
              AT, Lda, 0, static_cast<const char *>(B) + I * SB * 2, BT, Ldb,
              0, Beta, Cf.data(), std::max(1, M), 0, 1, false);
      for (int Col = 0; Col < N; ++Col)
        for (int R = 0; R < M; ++R) {
          float V = Cf[size_t(Col) * M + R];
          Ci[size_t(Col) * Ldc + R] =
              Bf16 ? sp::floatToBFloat16(V) : sp::floatToHalf(V);
        }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

/// CT is float32, or 16-bit with operands of its type.
bool emulatedGemmTypes(cudaDataType AT, cudaDataType BT, cudaDataType CT,
                       cublasComputeType_t Compute) {
  return Compute == CUBLAS_COMPUTE_32F && AT == BT &&
         (CT == CUDA_R_32F ||
          (CT == AT && (CT == CUDA_R_16BF || CT == CUDA_R_16F)));
}

} // namespace

cublasStatus_t cublasCreate_v2(cublasHandle_t *H) {
  *H = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t H) {
  delete H;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t H, cudaStream_t S) {
  H->Stream = S;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t H, cublasMath_t Mode) {
  H->Mode = Mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t H, cublasOperation_t TA,
                              cublasOperation_t TB, int M, int N, int K,
                              const float *Alpha, const float *A, int Lda,
                              const float *B, int Ldb, const float *Beta,
                              float *C, int Ldc) {
  return gemmOn(H, TA, TB, M, N, K, *Alpha, A, CUDA_R_32F, Lda, 0, B,
                CUDA_R_32F, Ldb, 0, *Beta, C, Ldc, 0, 1);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t H, cublasOperation_t TA,
                                         cublasOperation_t TB, int M, int N,
                                         int K, const float *Alpha,
                                         const float *A, int Lda, long long SA,
                                         const float *B, int Ldb, long long SB,
                                         const float *Beta, float *C, int Ldc,
                                         long long SC, int Batch) {
  return gemmOn(H, TA, TB, M, N, K, *Alpha, A, CUDA_R_32F, Lda, SA, B,
                CUDA_R_32F, Ldb, SB, *Beta, C, Ldc, SC, Batch);
}

cublasStatus_t cublasGemmEx(cublasHandle_t H, cublasOperation_t TA,
                            cublasOperation_t TB, int M, int N, int K,
                            const void *Alpha, const void *A, cudaDataType AT,
                            int Lda, const void *B, cudaDataType BT, int Ldb,
                            const void *Beta, void *C, cudaDataType CT, int Ldc,
                            cublasComputeType_t Compute, cublasGemmAlgo_t) {
  if (!emulatedGemmTypes(AT, BT, CT, Compute))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemmOn(H, TA, TB, M, N, K, *static_cast<const float *>(Alpha), A, AT,
                Lda, 0, B, BT, Ldb, 0, *static_cast<const float *>(Beta), C,
                Ldc, 0, 1, CT);
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t H, cublasOperation_t TA, cublasOperation_t TB, int M, int N,
    int K, const void *Alpha, const void *A, cudaDataType AT, int Lda,
    long long SA, const void *B, cudaDataType BT, int Ldb, long long SB,
    const void *Beta, void *C, cudaDataType CT, int Ldc, long long SC,
    int Batch, cublasComputeType_t Compute, cublasGemmAlgo_t) {
  if (!emulatedGemmTypes(AT, BT, CT, Compute))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemmOn(H, TA, TB, M, N, K, *static_cast<const float *>(Alpha), A, AT,
                Lda, SA, B, BT, Ldb, SB, *static_cast<const float *>(Beta), C,
                Ldc, SC, Batch, CT);
}

//===----------------------------------------------------------------------===//
// cuBLASLt: cublasLtMatmul with the default and the bias epilogues
//===----------------------------------------------------------------------===//

struct cublasLtContext {};

namespace {
std::atomic<int64_t> LtMatmuls{0}, LtRefused{0};
} // namespace

int64_t sp::emu::ltMatmuls() { return LtMatmuls.load(); }
int64_t sp::emu::ltRefused() { return LtRefused.load(); }

namespace {

/// What cublasLtMatmulDescCreate and SetAttribute describe.
struct LtDesc {
  cublasComputeType_t Compute;
  cudaDataType_t Scale;
  cublasOperation_t TA = CUBLAS_OP_N, TB = CUBLAS_OP_N;
  cublasLtEpilogue_t Epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void *Bias = nullptr;
  cudaDataType_t BiasType = CUDA_R_32F;
};

struct LtLayout {
  cudaDataType_t Type;
  uint64_t Rows, Cols;
  int64_t Ld;
};

/// A heuristic's preferences: its workspace, and the alignments in bytes
/// the pointers of A, B, C and D will have (cuBLASLt assumes 256 unless
/// told, and an algorithm chosen for an alignment may need it).
struct LtPref {
  size_t Workspace = 0;
  uint32_t Align[4] = {256, 256, 256, 256};
};

/// Whether P is aligned to A bytes.
bool alignedTo(const void *P, uint32_t A) {
  return reinterpret_cast<uintptr_t>(P) % A == 0;
}

LtDesc &descOf(cublasLtMatmulDesc_t D) {
  return *reinterpret_cast<LtDesc *>(D);
}
const LtLayout &layoutOf(cublasLtMatrixLayout_t L) {
  return *reinterpret_cast<const LtLayout *>(L);
}

template <typename T> bool setFrom(T &Field, const void *Buf, size_t Bytes) {
  if (Bytes != sizeof(T))
    return false;
  std::memcpy(&Field, Buf, sizeof(T));
  return true;
}

/// Whether cublasLtMatmul can run D = op(A) op(B) (+ bias) as described:
/// the combinations the emulation implements, which are the backend's.
cublasStatus_t checkLt(const LtDesc &D, const LtLayout &A, const LtLayout &B,
                       const LtLayout &C, const LtLayout &Dl) {
  if ((D.Compute != CUBLAS_COMPUTE_32F &&
       D.Compute != CUBLAS_COMPUTE_32F_FAST_TF32) ||
      D.Scale != CUDA_R_32F || A.Type != B.Type ||
      (A.Type != CUDA_R_32F && A.Type != CUDA_R_16BF && A.Type != CUDA_R_16F) ||
      C.Type != Dl.Type ||
      (Dl.Type != CUDA_R_32F && Dl.Type != A.Type))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // The bias of a float32 result is float32; of a 16-bit one, its type.
  if (D.Epilogue != CUBLASLT_EPILOGUE_DEFAULT &&
      (D.Epilogue != CUBLASLT_EPILOGUE_BIAS || D.BiasType != Dl.Type))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  uint64_t M = Dl.Rows, N = Dl.Cols;
  uint64_t K = D.TA == CUBLAS_OP_N ? A.Cols : A.Rows;
  bool Shapes = (D.TA == CUBLAS_OP_N ? A.Rows : A.Cols) == M &&
                (D.TB == CUBLAS_OP_N ? B.Rows : B.Cols) == K &&
                (D.TB == CUBLAS_OP_N ? B.Cols : B.Rows) == N && C.Rows == M &&
                C.Cols == N && A.Ld >= int64_t(A.Rows) &&
                B.Ld >= int64_t(B.Rows) && Dl.Ld >= int64_t(M) && C.Ld == Dl.Ld;
  return Shapes ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

} // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t *H) {
  *H = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t H) {
  delete H;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *D,
                                        cublasComputeType_t Compute,
                                        cudaDataType_t Scale) {
  auto *Desc = new LtDesc;
  Desc->Compute = Compute;
  Desc->Scale = Scale;
  *D = reinterpret_cast<cublasLtMatmulDesc_t>(Desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t D) {
  delete &descOf(D);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t D,
                                              cublasLtMatmulDescAttributes_t A,
                                              const void *Buf, size_t Bytes) {
  LtDesc &Desc = descOf(D);
  bool Ok = false;
  switch (A) {
  case CUBLASLT_MATMUL_DESC_TRANSA:
    Ok = setFrom(Desc.TA, Buf, Bytes);
    break;
  case CUBLASLT_MATMUL_DESC_TRANSB:
    Ok = setFrom(Desc.TB, Buf, Bytes);
    break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE:
    Ok = setFrom(Desc.Epilogue, Buf, Bytes);
    break;
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
    Ok = setFrom(Desc.Bias, Buf, Bytes);
    break;
  case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
    Ok = setFrom(Desc.BiasType, Buf, Bytes);
    break;
  default: // an attribute the emulation does not model
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return Ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *L,
                                          cudaDataType Type, uint64_t Rows,
                                          uint64_t Cols, int64_t Ld) {
  *L = reinterpret_cast<cublasLtMatrixLayout_t>(
      new LtLayout{Type, Rows, Cols, Ld});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t L) {
  delete &layoutOf(L);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *P) {
  *P = reinterpret_cast<cublasLtMatmulPreference_t>(new LtPref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t P) {
  delete reinterpret_cast<LtPref *>(P);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t
cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t P,
                                     cublasLtMatmulPreferenceAttributes_t A,
                                     const void *Buf, size_t Bytes) {
  LtPref &Pref = *reinterpret_cast<LtPref *>(P);
  bool Ok = false;
  switch (A) {
  case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
    Ok = setFrom(Pref.Workspace, Buf, Bytes);
    break;
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
    Ok = setFrom(Pref.Align[A - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES],
                 Buf, Bytes);
    break;
  default: // a preference the emulation does not model
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return Ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t, cublasLtMatmulDesc_t D, cublasLtMatrixLayout_t A,
    cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
    cublasLtMatrixLayout_t Dl, cublasLtMatmulPreference_t P, int Requested,
    cublasLtMatmulHeuristicResult_t *Results, int *Count) {
  *Count = 0;
  if (Requested < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  cublasStatus_t St =
      checkLt(descOf(D), layoutOf(A), layoutOf(B), layoutOf(C), layoutOf(Dl));
  if (St != CUBLAS_STATUS_SUCCESS)
    return St;
  std::memset(&Results[0], 0, sizeof Results[0]);
  // The algorithm needs the alignments it was chosen for.
  const LtPref &Pref = *reinterpret_cast<const LtPref *>(P);
  for (int K = 0; K < 4; ++K)
    Results[0].algo.data[K] = Pref.Align[K];
  Results[0].state = CUBLAS_STATUS_SUCCESS;
  Results[0].wavesCount = 1.0f;
  *Count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t D,
                              const void *Alpha, const void *A,
                              cublasLtMatrixLayout_t Al, const void *B,
                              cublasLtMatrixLayout_t Bl, const void *Beta,
                              const void *C, cublasLtMatrixLayout_t Cl,
                              void *Dp, cublasLtMatrixLayout_t Dl,
                              const cublasLtMatmulAlgo_t *Algo, void *, size_t,
                              cudaStream_t S) {
  const LtDesc Desc = descOf(D); // as it is now: later changes are later calls
  const LtLayout AL = layoutOf(Al), BL = layoutOf(Bl), CL = layoutOf(Cl),
                 DL = layoutOf(Dl);
  if (!Algo)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (cublasStatus_t St = checkLt(Desc, AL, BL, CL, DL);
      St != CUBLAS_STATUS_SUCCESS)
    return St;
  if (Desc.Epilogue == CUBLASLT_EPILOGUE_BIAS && !Desc.Bias)
    return CUBLAS_STATUS_INVALID_VALUE;
  const float Al0 = *static_cast<const float *>(Alpha),
              Be0 = *static_cast<const float *>(Beta);
  const int M = int(DL.Rows), N = int(DL.Cols),
            K = int(Desc.TA == CUBLAS_OP_N ? AL.Cols : AL.Rows);
  if (C != Dp && Be0 != 0.0f) // the backend passes C = D
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const void *Ptrs[4] = {A, B, C, Dp};
  for (int K = 0; K < 4; ++K)
    if (!alignedTo(Ptrs[K], uint32_t(Algo->data[K]))) {
      ++LtRefused; // less aligned than the algorithm was chosen for
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  ++LtMatmuls;
  enqueue(S, [=] {
    // A 16-bit D: the float32 result in Tmp, rounded once into D at the end.
    const bool F32 = DL.Type == CUDA_R_32F;
    std::vector<float> Tmp;
    float *Out = static_cast<float *>(Dp);
    int Ld = int(DL.Ld);
    if (!F32) {
      widen(Dp, DL.Type, M, N, Ld, false, Tmp);
      Out = Tmp.data();
      Ld = std::max(1, M);
    }
    gemmNow(Desc.TA, Desc.TB, M, N, K, Al0, A, AL.Type, int(AL.Ld), 0, B,
            BL.Type, int(BL.Ld), 0, Be0, Out, Ld, 0, 1,
            Desc.Compute == CUBLAS_COMPUTE_32F_FAST_TF32 &&
                AL.Type == CUDA_R_32F);
    // The accumulator, a float, plus the bias, rounded once.
    if (Desc.Epilogue == CUBLASLT_EPILOGUE_BIAS) {
      std::vector<float> Bias;
      widen(Desc.Bias, Desc.BiasType, M, 1, M, false, Bias);
      for (int J = 0; J < N; ++J)
        for (int I = 0; I < M; ++I)
          Out[size_t(J) * Ld + I] += Bias[I];
    }
    if (!F32)
      for (int J = 0; J < N; ++J)
        for (int I = 0; I < M; ++I) {
          float V = Out[size_t(J) * Ld + I];
          static_cast<uint16_t *>(Dp)[size_t(J) * DL.Ld + I] =
              DL.Type == CUDA_R_16BF ? sp::floatToBFloat16(V)
                                     : sp::floatToHalf(V);
        }
  });
  return CUBLAS_STATUS_SUCCESS;
}
