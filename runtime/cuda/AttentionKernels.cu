//===- AttentionKernels.cu - The blockwise attention core's kernels -------===//
//
// The blockwise attention core (kernels/Attention.cuh), the largest
// kernels, on their own so that the three units compile side by side (see
// ElementwiseKernels.cu).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Attention.cuh"
#include "runtime/cuda/kernels/ContextParallel.cuh"
