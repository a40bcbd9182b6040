//===- Elementwise.cuh - Add, mul, scale, broadcasts, copies ---*- CUDA -*-===//
//
// Reference (runtime/cpu/kernels/Elementwise.cpp; the activations are
// Activations.cuh's):
//
//   add:    Y[i] = A[i] + B[i]          mul: Y[i] = A[i] * B[i]
//   scale:  Y[i] = float(Alpha) * X[i]
//   broadcast: Y[idx] = A[idx . SA] (+ or *) B[idx . SB], strides 0 along
//           the broadcast axes (the caller computes the strides)
//   reduce_to: DX[kept] = float(sum over the reduced multi-indices, in
//           row-major order, of DY) in double, one thread per DX element
//   chunk copy: Dst[o * DstPitch + c] = Src[o * SrcPitch + c], c < Chunk
//
// Every element is computed by the same operations as on the CPU, so the
// results are bitwise equal.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"
#include "runtime/cuda/kernels/FastVectors.cuh"

namespace sp::cuda {
namespace {

template <Storage ST>
__global__ void addKernel(Elems Y, Elems A, Elems B, int64_t N) {
  SP_GRID_LOOP(I, N) stAs<ST>(Y, I, ldAs<ST>(A, I) + ldAs<ST>(B, I));
}
template <Storage ST>
__global__ void mulKernel(Elems Y, Elems A, Elems B, int64_t N) {
  SP_GRID_LOOP(I, N) stAs<ST>(Y, I, ldAs<ST>(A, I) * ldAs<ST>(B, I));
}
/// add and mul eight elements at a time (16-byte aligned operands, N a
/// multiple of eight): the same operation on each element.
template <Storage ST, bool Multiply>
__global__ void binaryOctKernel(Elems Y, Elems A, Elems B, int64_t Octs) {
  SP_GRID_LOOP(O, Octs) {
    float VA[8], VB[8];
    load8<ST>(A, O, VA);
    load8<ST>(B, O, VB);
#pragma unroll
    for (int K = 0; K < 8; ++K)
      VA[K] = Multiply ? VA[K] * VB[K] : VA[K] + VB[K];
    store8<ST>(Y, O, VA);
  }
}
inline bool octAligned(int64_t N, std::initializer_list<const void *> Ptrs) {
  if (N % 8)
    return false;
  for (const void *P : Ptrs)
    if (reinterpret_cast<uintptr_t>(P) % 16)
      return false;
  return true;
}
__global__ void scaleKernel(float *Y, const float *X, int64_t N, float A) {
  SP_GRID_LOOP(I, N) Y[I] = A * X[I];
}

__device__ inline void unravel(int64_t E, const DevShape &Shape,
                               int64_t *Idx) {
  for (int D = Shape.Rank - 1; D >= 0; --D) {
    Idx[D] = E % Shape.Dim[D];
    E /= Shape.Dim[D];
  }
}

/// sum_d Idx[d] Strides[d] over d < Rank: a multi-index's offset.
__device__ inline int64_t offsetOf(const int64_t *Idx, int Rank,
                                   const DevShape &Strides) {
  int64_t Off = 0;
  for (int D = 0; D < Rank; ++D)
    Off += Idx[D] * Strides.Dim[D];
  return Off;
}

__global__ void broadcastKernel(float *Y, DevShape YShape, const float *A,
                                DevShape SA, const float *B, DevShape SB,
                                bool Multiply, int64_t N) {
  SP_GRID_LOOP(E, N) {
    int64_t Idx[MaxRank];
    unravel(E, YShape, Idx);
    const int64_t OA = offsetOf(Idx, YShape.Rank, SA),
                  OB = offsetOf(Idx, YShape.Rank, SB);
    Y[E] = Multiply ? A[OA] * B[OB] : A[OA] + B[OB];
  }
}

__global__ void reduceToKernel(float *DX, const float *DY, DevShape Kept,
                               DevShape KeptSX, DevShape KeptSY,
                               DevShape Red, DevShape RedSY, int64_t NKept,
                               int64_t NRed) {
  SP_GRID_LOOP(E, NKept) {
    int64_t Idx[MaxRank];
    unravel(E, Kept, Idx);
    const int64_t Base = offsetOf(Idx, Kept.Rank, KeptSY),
                  Out = offsetOf(Idx, Kept.Rank, KeptSX);
    double Sum = columnSum(NRed, [&](int64_t R) {
      int64_t RIdx[MaxRank];
      unravel(R, Red, RIdx);
      return double(DY[Base + offsetOf(RIdx, Red.Rank, RedSY)]);
    });
    DX[Out] = float(Sum);
  }
}

__global__ void chunkCopyKernel(float *Dst, int64_t DstPitch,
                                const float *Src, int64_t SrcPitch,
                                int64_t Chunk, int64_t Outer) {
  SP_GRID_LOOP(E, Chunk * Outer) {
    int64_t O = E / Chunk, C = E % Chunk;
    Dst[O * DstPitch + C] = Src[O * SrcPitch + C];
  }
}

template <Storage ST>
__global__ void broadcastRowsKernel(Elems Y, Elems Bias, int64_t Rows,
                                    int64_t Out) {
  SP_GRID_LOOP(E, Rows * Out) stAs<ST>(Y, E, ldAs<ST>(Bias, E % Out));
}

} // namespace

void add(Elems Y, Elems A, Elems B, int64_t N, cudaStream_t S) {
  if (octAligned(N, {Y.Data, A.Data, B.Data})) {
    if (Launch L = elementwiseLaunch(N / 8); L.Blocks)
      withStorage(Y.Kind, [&](auto ST) {
        SP_LAUNCH((binaryOctKernel<ST, false>), L.Blocks, L.Threads, 0, S, Y,
                  A, B, N / 8);
      });
    return;
  }
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    withStorage(Y.Kind, [&](auto ST) {
      SP_LAUNCH(addKernel<ST>, L.Blocks, L.Threads, 0, S, Y, A, B, N);
    });
}
void mul(Elems Y, Elems A, Elems B, int64_t N, cudaStream_t S) {
  if (octAligned(N, {Y.Data, A.Data, B.Data})) {
    if (Launch L = elementwiseLaunch(N / 8); L.Blocks)
      withStorage(Y.Kind, [&](auto ST) {
        SP_LAUNCH((binaryOctKernel<ST, true>), L.Blocks, L.Threads, 0, S, Y,
                  A, B, N / 8);
      });
    return;
  }
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    withStorage(Y.Kind, [&](auto ST) {
      SP_LAUNCH(mulKernel<ST>, L.Blocks, L.Threads, 0, S, Y, A, B, N);
    });
}
void scale(float *Y, const float *X, int64_t N, double Alpha, cudaStream_t S) {
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    SP_LAUNCH(scaleKernel, L.Blocks, L.Threads, 0, S, Y, X, N, float(Alpha));
}
void broadcastBinary(float *Y, DevShape YShape, const float *A, DevShape SA,
                     const float *B, DevShape SB, bool Multiply,
                     cudaStream_t S) {
  int64_t N = 1;
  for (int D = 0; D < YShape.Rank; ++D)
    N *= YShape.Dim[D];
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    SP_LAUNCH(broadcastKernel, L.Blocks, L.Threads, 0, S, Y, YShape, A, SA, B,
              SB, Multiply, N);
}
void reduceTo(float *DX, const float *DY, DevShape Kept, DevShape KeptSX,
              DevShape KeptSY, DevShape Red, DevShape RedSY, int64_t NX,
              cudaStream_t S) {
  int64_t NKept = 1, NRed = 1;
  for (int D = 0; D < Kept.Rank; ++D)
    NKept *= Kept.Dim[D];
  for (int D = 0; D < Red.Rank; ++D)
    NRed *= Red.Dim[D];
  // A reduction over an empty dimension (or an empty DX) leaves zeros.
  cudaMemsetAsync(DX, 0, size_t(NX) * sizeof(float), S);
  if (NRed == 0)
    return;
  if (Launch L = elementwiseLaunch(NKept); L.Blocks)
    SP_LAUNCH(reduceToKernel, L.Blocks, L.Threads, 0, S, DX, DY, Kept, KeptSX,
              KeptSY, Red, RedSY, NKept, NRed);
}
void chunkCopy(float *Dst, int64_t DstPitch, const float *Src,
               int64_t SrcPitch, int64_t Chunk, int64_t Outer,
               cudaStream_t S) {
  if (Launch L = elementwiseLaunch(Chunk * Outer); L.Blocks)
    SP_LAUNCH(chunkCopyKernel, L.Blocks, L.Threads, 0, S, Dst, DstPitch, Src,
              SrcPitch, Chunk, Outer);
}
void broadcastRows(Elems Y, Elems Bias, int64_t Rows, int64_t Out,
                   cudaStream_t S) {
  if (Launch L = elementwiseLaunch(Rows * Out); L.Blocks)
    withStorage(Y.Kind, [&](auto ST) {
      SP_LAUNCH(broadcastRowsKernel<ST>, L.Blocks, L.Threads, 0, S, Y, Bias,
                Rows, Out);
    });
}

} // namespace sp::cuda
