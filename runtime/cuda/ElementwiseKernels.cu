//===- ElementwiseKernels.cu - The CUDA kernels of one thread an element --===//
//
// The kernels live one family per file in kernels/*.cuh (each with its plain
// reference); they are compiled in three translation units, so nvcc runs
// three times for the whole backend (a short build on two cores, and one less
// device-link step than a file per kernel). This one: the kernels whose
// threads each compute elements on their own (grid-stride loops): the
// elementwise arithmetic, the activations and GELU, the 16-bit conversions,
// dropout, the embedding and the head layouts. The row reductions are
// RowReductionKernels.cu's, the blockwise attention core
// AttentionKernels.cu's.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Activations.cuh"
#include "runtime/cuda/kernels/Convert.cuh"
#include "runtime/cuda/kernels/Dropout.cuh"
#include "runtime/cuda/kernels/Elementwise.cuh"
#include "runtime/cuda/kernels/Embedding.cuh"
#include "runtime/cuda/kernels/Gelu.cuh"
#include "runtime/cuda/kernels/Heads.cuh"
