//===- AdamW.cuh - Gradient norm and the AdamW update -----------*- CUDA -*-===//
//
// Reference (runtime/cpu/kernels/AdamW.cpp, and CpuBackend's
// grad_norm / adamw):
//   sumSquares(G) = sum_i double(G[i])^2
//   grad_norm = float(sqrt(split + whole)), the split part all-reduced over
//               the tensor group in float, the total over the pipeline in
//               float (Optimizer.cpp drives the collectives)
//   clip = max_norm > 0 ? min(1, (1 / (norm + 1e-6f)) * max_norm) : 1
//   AdamW, in float with torch's scalars computed in double:
//     g = G * clip; P = P * (1 - lr wd); M = b1 M + (1 - b1) g;
//     V = b2 V + (1 - b2) g g; P -= (lr / (1 - b1^t)) * (M /
//         (sqrt(V) / sqrt(1 - b2^t) + eps))
// lr, t and the norm are read from the plan's device buffers, so the update
// needs no host round trip. The multi-tensor form (adamwMultiTensor, the
// chunked table of MultiTensor.h) makes the same per-element arithmetic
// (adamwScalars, adamwElement: runtime/Numerics.h's, which the CPU calls)
// over many tensors in one launch. Elementwise, the update is the CPU's bits
// (CUDA's double pow is within 2 ulp of glibc's, far below float's
// resolution once rounded to float).
//
// The sum of squares is not in the CPU's order: a fixed grid of at most
// SumBlocks blocks, each thread a strided double sum, each block a tree in
// shared memory, the block sums added in block order. It is deterministic
// (the same N gives the same order), and as a double sum of non-negative
// float squares its relative difference from the CPU's is below
// N * 2^-52, so the float norm agrees to 1 ulp.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"
#include "runtime/cuda/MultiTensor.h"

namespace sp::cuda {
namespace {

__global__ void sumSquaresBlocksKernel(double *Partials, const float *G,
                                       int64_t N) {
  __shared__ double Part[BlockThreads];
  double S = 0;
  SP_GRID_LOOP(I, N) S += double(G[I]) * G[I];
  Part[threadIdx.x] = S;
  __syncthreads();
  for (int Width = BlockThreads / 2; Width > 0; Width /= 2) {
    if (int(threadIdx.x) < Width)
      Part[threadIdx.x] += Part[threadIdx.x + Width];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    Partials[blockIdx.x] = Part[0];
}

__global__ void sumPartialsKernel(double *Sum, const double *Partials,
                                  int64_t Blocks, bool Accumulate) {
  if (globalThread() != 0)
    return;
  double S = 0;
  for (int64_t B = 0; B < Blocks; ++B)
    S += Partials[B];
  *Sum = Accumulate ? *Sum + S : S;
}

__global__ void doubleToFloatKernel(float *Out, const double *In) {
  if (globalThread() == 0)
    *Out = float(*In);
}

__global__ void gradNormTotalKernel(double *Total, const double *SplitD,
                                    const float *SplitF, const double *Whole) {
  if (globalThread() == 0)
    *Total = (SplitF ? double(*SplitF) : *SplitD) + *Whole;
}

__global__ void gradNormFinishKernel(float *Norm, const double *Total,
                                     const float *TotalF, double Scale) {
  if (globalThread() == 0)
    *Norm = float(sqrt((TotalF ? double(*TotalF) : *Total) * Scale * Scale));
}

/// torch's scalars of one step, computed on the device from the plan's
/// buffers (lr, step, grad norm) in double, then rounded to float
/// (runtime/Numerics.h, as the CPU's adamw).
using AdamwScalars = numerics::AdamScalars<float>;

__device__ inline AdamwScalars adamwScalars(const float *GradNorm,
                                            const float *Lr,
                                            const float *StepP, double Beta1,
                                            double Beta2, double Eps,
                                            double WeightDecay,
                                            double MaxNorm, float GradScale) {
  float Clip = MaxNorm > 0
                   ? numerics::clipCoefficient(*GradNorm, float(MaxNorm))
                   : 1.0f;
  return numerics::adamScalars<float>(*Lr, double(int64_t(*StepP)), Beta1,
                                      Beta2, Eps, WeightDecay,
                                      Clip * GradScale);
}

/// The update of element I, in float (the CPU's, runtime/Numerics.h).
__device__ inline void adamwElement(float *P, const float *G, float *M,
                                    float *V, int64_t I,
                                    const AdamwScalars &C) {
  numerics::adamwElement(P[I], G[I], M[I], V[I], C);
}

__global__ void adamwKernel(float *P, const float *G, float *M, float *V,
                            int64_t N, const float *GradNorm, const float *Lr,
                            const float *StepP, double Beta1, double Beta2,
                            double Eps, double WeightDecay, double MaxNorm,
                            float GradScale) {
  const AdamwScalars C = adamwScalars(GradNorm, Lr, StepP, Beta1, Beta2, Eps,
                                      WeightDecay, MaxNorm, GradScale);
  SP_GRID_LOOP(I, N) adamwElement(P, G, M, V, I, C);
}

/// One launch's table (MultiTensor.h), passed by value as the kernel's
/// argument: per tensor its four arrays, size and weight decay; per block
/// its tensor's slot and chunk.
struct AdamwTable {
  float *P[MultiTensorMaxTensors];
  const float *G[MultiTensorMaxTensors];
  float *M[MultiTensorMaxTensors];
  float *V[MultiTensorMaxTensors];
  int64_t N[MultiTensorMaxTensors];
  double WeightDecay[MultiTensorMaxTensors];
  int BlockChunk[MultiTensorMaxBlocks];
  unsigned char BlockSlot[MultiTensorMaxBlocks];
};
static_assert(MultiTensorMaxTensors <= 256, "slots are bytes");
// Kernel arguments are limited to 4 KiB (with the scalars below).
static_assert(sizeof(AdamwTable) + 64 <= 4096, "the table is a kernel argument");

/// Block b updates chunk BlockChunk[b] of tensor BlockSlot[b], element for
/// element as adamwKernel (each block computes the step's scalars itself,
/// with its tensor's weight decay).
__global__ void adamwMultiTensorKernel(AdamwTable T, const float *GradNorm,
                                       const float *Lr, const float *StepP,
                                       double Beta1, double Beta2, double Eps,
                                       double MaxNorm, float GradScale) {
  const int Slot = T.BlockSlot[blockIdx.x];
  const int64_t Begin = int64_t(T.BlockChunk[blockIdx.x]) * MultiTensorChunk;
  const int64_t End = T.N[Slot] < Begin + MultiTensorChunk
                          ? T.N[Slot]
                          : Begin + MultiTensorChunk;
  const AdamwScalars C = adamwScalars(GradNorm, Lr, StepP, Beta1, Beta2, Eps,
                                      T.WeightDecay[Slot], MaxNorm, GradScale);
  float *P = T.P[Slot], *M = T.M[Slot], *V = T.V[Slot];
  const float *G = T.G[Slot];
  for (int64_t I = Begin + threadIdx.x; I < End; I += blockDim.x)
    adamwElement(P, G, M, V, I, C);
}

} // namespace

void sumSquares(double *Sum, const float *G, int64_t N, double *Partials,
                bool Accumulate, cudaStream_t S) {
  Launch L = sumSquaresLaunch(N);
  if (L.Blocks)
    SP_LAUNCH(sumSquaresBlocksKernel, L.Blocks, L.Threads, 0, S, Partials, G,
              N);
  SP_LAUNCH(sumPartialsKernel, 1, 32, 0, S, Sum, Partials, L.Blocks,
            Accumulate);
}

void doubleToFloat(float *Out, const double *In, cudaStream_t S) {
  SP_LAUNCH(doubleToFloatKernel, 1, 32, 0, S, Out, In);
}

void gradNormTotal(double *Total, const double *SplitD, const float *SplitF,
                   const double *Whole, cudaStream_t S) {
  SP_LAUNCH(gradNormTotalKernel, 1, 32, 0, S, Total, SplitD, SplitF, Whole);
}

void gradNormFinish(float *Norm, const double *Total, const float *TotalF,
                    double Scale, cudaStream_t S) {
  SP_LAUNCH(gradNormFinishKernel, 1, 32, 0, S, Norm, Total, TotalF, Scale);
}

void adamw(float *P, const float *G, float *M, float *V, int64_t N,
           const float *GradNorm, const float *Lr, const float *Step,
           double Beta1, double Beta2, double Eps, double WeightDecay,
           double MaxNorm, float GradScale, cudaStream_t S) {
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    SP_LAUNCH(adamwKernel, L.Blocks, L.Threads, 0, S, P, G, M, V, N, GradNorm,
              Lr, Step, Beta1, Beta2, Eps, WeightDecay, MaxNorm, GradScale);
}

void adamwMultiTensor(const AdamwTensor *Tensors, int Count,
                      const float *GradNorm, const float *Lr,
                      const float *Step, double Beta1, double Beta2,
                      double Eps, double MaxNorm, float GradScale,
                      cudaStream_t S) {
  std::vector<int64_t> Sizes(Count > 0 ? Count : 0);
  for (int K = 0; K < Count; ++K)
    Sizes[K] = Tensors[K].N;
  for (const MultiTensorLaunch &L : planMultiTensor(Sizes)) {
    AdamwTable T{};
    for (size_t Slot = 0; Slot < L.Tensors.size(); ++Slot) {
      const AdamwTensor &A = Tensors[L.Tensors[Slot]];
      T.P[Slot] = A.P;
      T.G[Slot] = A.G;
      T.M[Slot] = A.M;
      T.V[Slot] = A.V;
      T.N[Slot] = A.N;
      T.WeightDecay[Slot] = A.WeightDecay;
    }
    for (size_t B = 0; B < L.Blocks.size(); ++B) {
      T.BlockSlot[B] = static_cast<unsigned char>(L.Blocks[B].Slot);
      T.BlockChunk[B] = static_cast<int>(L.Blocks[B].Chunk);
    }
    SP_LAUNCH(adamwMultiTensorKernel, unsigned(L.Blocks.size()), BlockThreads,
              0, S, T, GradNorm, Lr, Step, Beta1, Beta2, Eps, MaxNorm,
              GradScale);
  }
}

} // namespace sp::cuda
