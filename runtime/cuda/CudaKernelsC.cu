//===- CudaKernelsC.cu - Third translation unit of the CUDA kernels -------===//
//
// The blockwise attention core (kernels/Attention.cuh), the largest
// kernels, on their own so that the three units compile side by side (see
// CudaKernelsA.cu).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Attention.cuh"
