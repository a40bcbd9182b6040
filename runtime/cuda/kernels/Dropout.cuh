//===- Dropout.cuh - Philox dropout, forward and backward -------*- CUDA -*-===//
//
// Reference (runtime/cpu/Kernels.cpp, section 11, and runtime/cpu/Philox.h,
// shared here: its functions are __host__ __device__ under nvcc):
//   g     = the row-major index in Global of local element e (the local
//           tensor is the block [Offset, Offset + Local) of Global)
//   word  = philox::dropoutWord(Seed, Layer, Site, Stream, g)
//   keep  = word >= philox::dropoutThreshold(Ratio)   (Ratio 1: none)
//   Y[e]  = keep ? X[e] * float(1 / (1 - Ratio)) : 0,  Mask[e] = keep
//   backward: DX = Mask ? DY * float(1 / (1 - Ratio)) : 0
// One Philox evaluation per element (the CPU shares one between four
// consecutive global elements; the words are the same), so the masks are
// the CPU's bit for bit on any sharding.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/Philox.h"
#include "runtime/cuda/kernels/Common.cuh"

namespace sp::cuda {
namespace {

struct DropoutGeometry {
  int Rank;
  int64_t Local[MaxRank], Offset[MaxRank], GlobalStride[MaxRank];
};

__global__ void dropoutKernel(float *Y, uint8_t *Mask, const float *X,
                              int64_t N, DropoutGeometry G, uint64_t Seed,
                              uint32_t Layer, uint32_t Site, uint32_t Stream,
                              uint64_t Threshold, float Scale) {
  SP_GRID_LOOP(E, N) {
    int64_t Rest = E, Global = 0;
    for (int D = G.Rank - 1; D >= 0; --D) {
      Global += (G.Offset[D] + Rest % G.Local[D]) * G.GlobalStride[D];
      Rest /= G.Local[D];
    }
    bool Keep = false;
    if (Threshold <= 0xFFFFFFFFull)
      Keep = philox::dropoutWord(Seed, Layer, Site, Stream, uint64_t(Global)) >=
             uint32_t(Threshold);
    if (Mask)
      Mask[E] = Keep;
    Y[E] = Keep ? X[E] * Scale : 0.0f;
  }
}

__global__ void dropoutBackwardKernel(float *DX, const float *DY,
                                      const uint8_t *Mask, int64_t N,
                                      float Scale) {
  SP_GRID_LOOP(I, N) DX[I] = Mask[I] ? DY[I] * Scale : 0.0f;
}

} // namespace

void dropout(float *Y, uint8_t *Mask, const float *X, double Ratio,
             uint64_t Seed, uint32_t Layer, uint32_t Site, uint32_t Stream,
             DevShape Global, DevShape Local, DevShape Offset,
             cudaStream_t S) {
  DropoutGeometry G{};
  G.Rank = Global.Rank;
  int64_t N = 1, Stride = 1;
  for (int D = G.Rank - 1; D >= 0; --D) {
    G.Local[D] = Local.Dim[D];
    G.Offset[D] = Offset.Dim[D];
    G.GlobalStride[D] = Stride;
    Stride *= Global.Dim[D];
    N *= Local.Dim[D];
  }
  float Scale = Ratio >= 1.0 ? 0.0f : float(1.0 / (1.0 - Ratio));
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    dropoutKernel<<<L.Blocks, L.Threads, 0, S>>>(
        Y, Mask, X, N, G, Seed, Layer, Site, Stream,
        philox::dropoutThreshold(Ratio), Scale);
}

void dropoutBackward(float *DX, const float *DY, const uint8_t *Mask,
                     int64_t N, double Ratio, cudaStream_t S) {
  float Scale = Ratio >= 1.0 ? 0.0f : float(1.0 / (1.0 - Ratio));
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    dropoutBackwardKernel<<<L.Blocks, L.Threads, 0, S>>>(DX, DY, Mask, N,
                                                         Scale);
}

} // namespace sp::cuda
