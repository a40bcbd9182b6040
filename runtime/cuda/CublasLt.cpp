//===- CublasLt.cpp - A linear layer's bias in the GEMM's epilogue --------===//
//
// See CublasLt.h.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CublasLt.h"
#include "runtime/cuda/CudaCheck.h"
#include "runtime/cuda/DynamicLibrary.h"

using namespace llvm;

namespace sp::cuda {

struct CublasLtApi {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtDestroy) Destroy;
  decltype(&cublasLtMatmulDescCreate) DescCreate;
  decltype(&cublasLtMatmulDescDestroy) DescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) DescSet;
  decltype(&cublasLtMatrixLayoutCreate) LayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) LayoutDestroy;
  decltype(&cublasLtMatmulPreferenceCreate) PrefCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) PrefDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) PrefSet;
  decltype(&cublasLtMatmulAlgoGetHeuristic) Heuristic;
  decltype(&cublasLtMatmul) Matmul;
};

namespace {

/// cuBLASLt's entry points (DynamicLibrary.h), loaded once.
Expected<const CublasLtApi *> loadCublasLt() {
  static const LibrarySpec Spec{
      {"libcublasLt.so.13", "libcublasLt.so"}, "cublasLtCreate",
      "--cuda-epilogues", "cuBLASLt",
      "install the CUDA toolkit's libcublasLt, add its folder to "
      "LD_LIBRARY_PATH, or run without --cuda-epilogues"};
  return loadOnce<CublasLtApi>(Spec, [](CublasLtApi &A, auto Get) {
    Get(A.Create, "cublasLtCreate");
    Get(A.Destroy, "cublasLtDestroy");
    Get(A.DescCreate, "cublasLtMatmulDescCreate");
    Get(A.DescDestroy, "cublasLtMatmulDescDestroy");
    Get(A.DescSet, "cublasLtMatmulDescSetAttribute");
    Get(A.LayoutCreate, "cublasLtMatrixLayoutCreate");
    Get(A.LayoutDestroy, "cublasLtMatrixLayoutDestroy");
    Get(A.PrefCreate, "cublasLtMatmulPreferenceCreate");
    Get(A.PrefDestroy, "cublasLtMatmulPreferenceDestroy");
    Get(A.PrefSet, "cublasLtMatmulPreferenceSetAttribute");
    Get(A.Heuristic, "cublasLtMatmulAlgoGetHeuristic");
    Get(A.Matmul, "cublasLtMatmul");
  });
}

/// The largest power of two up to 256 bytes that P is aligned to. The
/// heuristic assumes 256 unless told (the plan's arena aligns buffers to
/// 64), and its algorithm may need what it assumed.
uint32_t alignmentOf(const void *P) {
  uintptr_t U = reinterpret_cast<uintptr_t>(P);
  uint32_t A = 1;
  while (A < 256 && !(U & uintptr_t(A)))
    A *= 2;
  return A;
}

} // namespace

Expected<std::unique_ptr<CublasLt>> CublasLt::create() {
  auto Api = loadCublasLt();
  if (!Api)
    return Api.takeError();
  std::unique_ptr<CublasLt> L(new CublasLt);
  L->Api = *Api;
  SP_CUBLAS_TRY(L->Api->Create(&L->Handle));
  return L;
}

CublasLt::~CublasLt() {
  for (auto &[K, P] : Plans) {
    for (cublasLtMatrixLayout_t M : {P.A, P.B, P.D})
      if (M)
        Api->LayoutDestroy(M);
    if (P.Desc)
      Api->DescDestroy(P.Desc);
  }
  if (Handle)
    Api->Destroy(Handle);
}

Expected<CublasLt::Plan *> CublasLt::planOf(const Key &K, const void *Bias) {
  auto [It, New] = Plans.try_emplace(K);
  Plan &P = It->second;
  if (!New)
    return &P;
  // Column-major D [OutF, Rows] = op(W^T) [OutF, InF] X^T [InF, Rows]: the
  // row-major W [InF, OutF] is W^T column-major with leading dimension
  // OutF (no transpose), [OutF, InF] is W column-major (transposed).
  cublasOperation_t OpA = K.TransW ? CUBLAS_OP_T : CUBLAS_OP_N,
                    OpB = CUBLAS_OP_N;
  cublasComputeType_t Compute = K.AB == CUDA_R_32F && K.TF32
                                    ? CUBLAS_COMPUTE_32F_FAST_TF32
                                    : CUBLAS_COMPUTE_32F;
  SP_CUBLAS_TRY(Api->DescCreate(&P.Desc, Compute, CUDA_R_32F));
  cublasLtEpilogue_t Epi = CUBLASLT_EPILOGUE_BIAS;
  cudaDataType_t BiasType = K.DT; // the result's type
  SP_CUBLAS_TRY(
      Api->DescSet(P.Desc, CUBLASLT_MATMUL_DESC_TRANSA, &OpA, sizeof OpA));
  SP_CUBLAS_TRY(
      Api->DescSet(P.Desc, CUBLASLT_MATMUL_DESC_TRANSB, &OpB, sizeof OpB));
  SP_CUBLAS_TRY(
      Api->DescSet(P.Desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &Epi, sizeof Epi));
  SP_CUBLAS_TRY(Api->DescSet(P.Desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                             &BiasType, sizeof BiasType));
  SP_CUBLAS_TRY(Api->DescSet(P.Desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &Bias,
                             sizeof Bias));
  if (K.TransW)
    SP_CUBLAS_TRY(Api->LayoutCreate(&P.A, K.AB, K.InF, K.OutF, K.InF));
  else
    SP_CUBLAS_TRY(Api->LayoutCreate(&P.A, K.AB, K.OutF, K.InF, K.OutF));
  SP_CUBLAS_TRY(Api->LayoutCreate(&P.B, K.AB, K.InF, K.Rows, K.InF));
  SP_CUBLAS_TRY(Api->LayoutCreate(&P.D, K.DT, K.OutF, K.Rows, K.OutF));
  cublasLtMatmulPreference_t Pref = nullptr;
  SP_CUBLAS_TRY(Api->PrefCreate(&Pref));
  size_t NoWorkspace = 0;
  cublasStatus_t St =
      Api->PrefSet(Pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &NoWorkspace,
                   sizeof NoWorkspace);
  for (auto [Attr, Align] :
       {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, K.AlignW},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, K.AlignX},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, K.AlignOut},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, K.AlignOut}})
    if (St == CUBLAS_STATUS_SUCCESS)
      St = Api->PrefSet(Pref, Attr, &Align, sizeof Align);
  cublasLtMatmulHeuristicResult_t Result{};
  int Count = 0;
  if (St == CUBLAS_STATUS_SUCCESS)
    St = Api->Heuristic(Handle, P.Desc, P.A, P.B, P.D, P.D, Pref, 1, &Result,
                        &Count);
  Api->PrefDestroy(Pref);
  // No algorithm is an answer (the caller runs the pair); other failures
  // are errors.
  if (St != CUBLAS_STATUS_SUCCESS && St != CUBLAS_STATUS_NOT_SUPPORTED)
    return cublasFailure("cublasLtMatmulAlgoGetHeuristic", St, __FILE__,
                         __LINE__);
  P.Found = St == CUBLAS_STATUS_SUCCESS && Count > 0 &&
            Result.state == CUBLAS_STATUS_SUCCESS;
  if (P.Found)
    P.Algo = Result.algo;
  return &P;
}

Expected<bool> CublasLt::linearBias(cudaStream_t S, bool TransW, int64_t Rows,
                                    int64_t OutF, int64_t InF, const void *X,
                                    const void *W, cudaDataType_t AB,
                                    const void *Bias, void *Out,
                                    cudaDataType_t DT, bool TF32) {
  if (Rows == 0 || OutF == 0)
    return true;
  if (!fitsBlasInt(Rows) || !fitsBlasInt(OutF) || !fitsBlasInt(InF))
    return false;
  Key K{Rows,
        OutF,
        InF,
        TransW,
        AB,
        TF32,
        alignmentOf(X),
        alignmentOf(W),
        alignmentOf(Bias),
        alignmentOf(Out),
        DT};
  auto P = planOf(K, Bias);
  if (!P)
    return P.takeError();
  if (!(*P)->Found)
    return false;
  SP_CUBLAS_TRY(Api->DescSet((*P)->Desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                             &Bias, sizeof Bias));
  float One = 1.0f, Zero = 0.0f;
  cublasStatus_t St =
      Api->Matmul(Handle, (*P)->Desc, &One, W, (*P)->A, X, (*P)->B, &Zero, Out,
                  (*P)->D, Out, (*P)->D, &(*P)->Algo, nullptr, 0, S);
  if (St == CUBLAS_STATUS_NOT_SUPPORTED) { // the algorithm refuses it after all
    (*P)->Found = false;
    return false;
  }
  SP_CUBLAS_TRY(St);
  return true;
}

} // namespace sp::cuda
