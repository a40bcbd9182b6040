//===- CudaUnavailable.cpp - The CUDA entry points of a CPU-only build ----===//
//
// Built instead of CudaBackend.cpp when SP_ENABLE_CUDA is off, so that
// sp-run and the tests link the same entry points in every build.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaBackend.h"

using namespace llvm;

namespace sp {

static Error notBuilt() {
  return createStringError(
      inconvertibleErrorCode(),
      "--device cuda: this sp was built without the CUDA backend (no nvcc "
      "was found, or -DSP_ENABLE_CUDA=OFF); rebuild with the CUDA toolkit "
      "or use --device cpu");
}

bool cudaBackendBuilt() { return false; }
Error loadCudaLibraries() { return notBuilt(); }
Error checkCudaDevice() { return notBuilt(); }
int cudaDeviceCount() { return 0; }
Expected<std::unique_ptr<Backend>>
createCudaBackend(const CudaBackendOptions &) {
  return notBuilt();
}

} // namespace sp
