//===- CudaKernelsA.cu - First translation unit of the CUDA kernels -------===//
//
// The kernels live one family per file in kernels/*.cuh (each with its plain
// reference); they are compiled in three translation units, so nvcc runs
// three times for the whole backend (a short build on two cores, and one less
// device-link step than a file per kernel).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Convert.cuh"
#include "runtime/cuda/kernels/Elementwise.cuh"
#include "runtime/cuda/kernels/Embedding.cuh"
#include "runtime/cuda/kernels/Gelu.cuh"
#include "runtime/cuda/kernels/Heads.cuh"
#include "runtime/cuda/kernels/Dropout.cuh"
