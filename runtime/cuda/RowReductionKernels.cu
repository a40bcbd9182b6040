//===- RowReductionKernels.cu - The CUDA kernels that reduce rows ---------===//
//
// The row reductions: the norms, softmax and the attention core's masks,
// cross entropy, and the optimizer's sums and updates (see
// ElementwiseKernels.cu for why the kernels are in three units).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/AdamW.cuh"
#include "runtime/cuda/kernels/AttentionSoftmax.cuh"
#include "runtime/cuda/kernels/CrossEntropy.cuh"
#include "runtime/cuda/kernels/LayerNorm.cuh"
#include "runtime/cuda/kernels/RmsNorm.cuh"
