//===- AdamW.cuh - Gradient norm and the AdamW update -----------*- CUDA -*-===//
//
// Reference (runtime/cpu/Kernels.cpp, section 13, and CpuBackend's
// grad_norm / adamw):
//   sumSquares(G) = sum_i double(G[i])^2
//   grad_norm = float(sqrt(split + whole)), the split part all-reduced over
//               the tensor group in float, the total over the pipeline in
//               float (CudaBackend.cpp drives the collectives)
//   clip = max_norm > 0 ? min(1, (1 / (norm + 1e-6f)) * max_norm) : 1
//   AdamW, in float with torch's scalars computed in double:
//     g = G * clip; P = P * (1 - lr wd); M = b1 M + (1 - b1) g;
//     V = b2 V + (1 - b2) g g; P -= (lr / (1 - b1^t)) * (M /
//         (sqrt(V) / sqrt(1 - b2^t) + eps))
// lr, t and the norm are read from the plan's device buffers, so the update
// needs no host round trip. Elementwise, the update is the CPU's bits
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
                                     const float *TotalF) {
  if (globalThread() == 0)
    *Norm = float(sqrt(TotalF ? double(*TotalF) : *Total));
}

__global__ void adamwKernel(float *P, const float *G, float *M, float *V,
                            int64_t N, const float *GradNorm, const float *Lr,
                            const float *StepP, double Beta1, double Beta2,
                            double Eps, double WeightDecay, double MaxNorm) {
  float Clip = 1.0f;
  if (MaxNorm > 0) {
    float Coef = (1.0f / (*GradNorm + 1e-6f)) * float(MaxNorm);
    Clip = Coef < 1.0f ? Coef : 1.0f;
  }
  double LrD = *Lr;
  double Step = double(int64_t(*StepP));
  double Bc1 = 1.0 - pow(Beta1, Step);
  double Bc2 = 1.0 - pow(Beta2, Step);
  const float Decay = float(1.0 - LrD * WeightDecay), B1 = float(Beta1),
              OneMinusB1 = float(1.0 - Beta1), B2 = float(Beta2),
              OneMinusB2 = float(1.0 - Beta2), StepSize = float(LrD / Bc1),
              Bc2Sqrt = float(sqrt(Bc2)), E = float(Eps),
              Scale = float(double(Clip));
  SP_GRID_LOOP(I, N) {
    float Grad = G[I] * Scale;
    float PI = P[I] * Decay;
    float MI = B1 * M[I] + OneMinusB1 * Grad;
    float VI = B2 * V[I] + OneMinusB2 * Grad * Grad;
    float Denom = sqrtf(VI) / Bc2Sqrt + E;
    P[I] = PI - StepSize * (MI / Denom);
    M[I] = MI;
    V[I] = VI;
  }
}

} // namespace

void sumSquares(double *Sum, const float *G, int64_t N, double *Partials,
                bool Accumulate, cudaStream_t S) {
  Launch L = sumSquaresLaunch(N);
  if (L.Blocks)
    sumSquaresBlocksKernel<<<L.Blocks, L.Threads, 0, S>>>(Partials, G, N);
  sumPartialsKernel<<<1, 32, 0, S>>>(Sum, Partials, L.Blocks, Accumulate);
}

void doubleToFloat(float *Out, const double *In, cudaStream_t S) {
  doubleToFloatKernel<<<1, 32, 0, S>>>(Out, In);
}

void gradNormTotal(double *Total, const double *SplitD, const float *SplitF,
                   const double *Whole, cudaStream_t S) {
  gradNormTotalKernel<<<1, 32, 0, S>>>(Total, SplitD, SplitF, Whole);
}

void gradNormFinish(float *Norm, const double *Total, const float *TotalF,
                    cudaStream_t S) {
  gradNormFinishKernel<<<1, 32, 0, S>>>(Norm, Total, TotalF);
}

void adamw(float *P, const float *G, float *M, float *V, int64_t N,
           const float *GradNorm, const float *Lr, const float *Step,
           double Beta1, double Beta2, double Eps, double WeightDecay,
           double MaxNorm, cudaStream_t S) {
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    adamwKernel<<<L.Blocks, L.Threads, 0, S>>>(P, G, M, V, N, GradNorm, Lr,
                                               Step, Beta1, Beta2, Eps,
                                               WeightDecay, MaxNorm);
}

} // namespace sp::cuda
