//===- CublasLoader.cpp - Loading cuBLAS when a backend is made -----------===//
//
// See CublasLoader.h; the loading itself is DynamicLibrary.h's.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CublasLoader.h"
#include "runtime/cuda/DynamicLibrary.h"

namespace sp::cuda {

llvm::Expected<const CublasApi *> loadCublas() {
  static const LibrarySpec Spec{
      {"libcublas.so.13", "libcublas.so"}, "cublasCreate_v2", "--device cuda",
      "cuBLAS",
      "install the CUDA toolkit's libcublas or add its folder to "
      "LD_LIBRARY_PATH"};
  return loadOnce<CublasApi>(Spec, [](CublasApi &A, auto Get) {
    Get(A.Create, "cublasCreate_v2");
    Get(A.Destroy, "cublasDestroy_v2");
    Get(A.SetStream, "cublasSetStream_v2");
    Get(A.SetMathMode, "cublasSetMathMode");
    Get(A.Sgemm, "cublasSgemm_v2");
    Get(A.SgemmStridedBatched, "cublasSgemmStridedBatched");
    Get(A.GemmEx, "cublasGemmEx");
    Get(A.GemmStridedBatchedEx, "cublasGemmStridedBatchedEx");
  });
}

} // namespace sp::cuda
