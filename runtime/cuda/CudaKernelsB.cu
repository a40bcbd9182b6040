//===- CudaKernelsB.cu - Second translation unit of the CUDA kernels ------===//
//
// The row reductions: norms, softmax, cross entropy, and the optimizer (see
// CudaKernelsA.cu for why two units).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/AdamW.cuh"
#include "runtime/cuda/kernels/AttentionSoftmax.cuh"
#include "runtime/cuda/kernels/CrossEntropy.cuh"
#include "runtime/cuda/kernels/LayerNorm.cuh"
#include "runtime/cuda/kernels/RmsNorm.cuh"
