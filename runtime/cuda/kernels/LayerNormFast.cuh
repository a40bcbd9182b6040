//===- LayerNormFast.cuh - LayerNorm's fast forward and backward -*- CUDA
//-*-===//
//
// The Numerics::Fast form of LayerNorm (LayerNorm.cuh has the Exact form,
// the CPU's bits, and the launchers that choose). Same meaning, float32
// arithmetic in an order chosen for the GPU, still fixed (the order depends
// only on the shape and storage, never on scheduling: the same bits every
// run):
//
// forward, one group of RowThreads threads per row (a multiple of 32, at
// most FastMaxThreads = 512; whole groups to a block of up to FastBlockThreads when a row
// needs fewer):
//   - a row is V vectors of W elements: W = 16 bytes (8 bf16/fp16, 4 f32)
//     when every pointer is 16-byte aligned and H % W == 0, else W = 1
//     (scalar); thread t of the group holds vectors t + k RowThreads,
//     k < FastVecs, in registers (X read once; vectors beyond that, for
//     rows too wide, are read again from memory in each pass);
//   - mu = (sum x) / H, var = (sum (x - mu)^2) / H (two passes over the
//     registers), s = 1 / sqrt(var + eps), Y = (x - mu) s gamma + beta
//     rounded once to Y's storage; Mean = mu, Rstd = s (float32);
//   - each sum: the thread's terms in order, then a butterfly of xor
//     shuffles in the warp (every lane gets the same bits: float addition
//     commutes), then the group's warps' sums in warp order from shared
//     memory.
// backward, one block per FastChunkRows consecutive rows (the rows one
// after another, the block's threads over the row's vectors as above, the
// next row's registers loaded while the block sums this one's):
//   - g = dy gamma, xhat = (x - Mean) Rstd; A = (sum g) / H,
//     B = (sum g xhat) / H (the tree sums above);
//     DX = Rstd (g - A - xhat B);
//   - the parameter gradients by a two-stage column sum, no atomics:
//     stage 1, each thread adds dy xhat and dy of its columns over the
//     block's rows in order (registers) and writes them to the partials
//     PartG[c H + j], PartB[c H + j] of chunk c; stage 2, one thread per
//     column adds the chunks' partials in order from c = 0 and adds the
//     sum into DGamma[j], DBeta[j] (+=, as the exact form).
//   The partials are float32: 2 ceil(Rows / 32) H floats, which fit in the
//   exact form's scratch of 2 columnParts(Rows) H doubles.
//
// RMSNorm's fast form (RmsNorm.cuh) is the same kernels with Rms: mu = 0
// (no first sum), s = 1 / sqrt(sum x^2 / H + eps), Y = x s gamma; the
// backward with A = 0, DX = Rstd (g - xhat B), and DGamma alone.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_KERNELS_LAYERNORMFAST_CUH
#define SP_RUNTIME_CUDA_KERNELS_LAYERNORMFAST_CUH

#include "runtime/cuda/kernels/FastVectors.cuh"

namespace sp::cuda {
namespace {

/// Vectors a thread keeps in registers (forward, backward).
constexpr int FastVecs = 4;
constexpr int FastBackVecs = 2;
/// Rows of a backward block (a chunk of the column partials).
// (16 was slower on an H200 at [8192, 6144] bf16: 326 us against 300)
constexpr int64_t FastChunkRows = 32;
/// The most threads of a row: a block of them must get the registers the
/// kernels hold a row in (__launch_bounds__: at most 128 a thread; 1024
/// threads failed to launch on an H200 at H = 12288, "too many resources
/// requested"); wider rows read their other vectors again in each pass.
constexpr int FastMaxThreads = 512;
/// Threads of a forward block when a row needs one warp.
constexpr int FastBlockThreads = 256;
constexpr int64_t fastChunks(int64_t Rows) {
  return ceilDiv(Rows, FastChunkRows);
}

/// Gamma's vector V, or ones where there is no gamma (Beta: zeros).
template <Storage ST, int W>
__device__ inline void ldVecOr(Elems E, int64_t V, float Default,
                               float (&Out)[W]) {
  if (E.Data) {
    loadVec<ST, W>(E, V, Out);
  } else {
#pragma unroll
    for (int K = 0; K < W; ++K)
      Out[K] = Default;
  }
}

/// Sums each of V[0..N) over this thread's group of RowThreads threads
/// (RowThreads a multiple of 32, groups of consecutive threads): xor
/// butterfly in the warp, then the group's warps in order through Red
/// (N times blockDim / 32 floats of shared memory). Every thread of the
/// block must call it (shuffles, barriers); all of a group get the same
/// bits.
template <int N>
__device__ inline void groupSum(float (&V)[N], float *Red, int RowThreads) {
#pragma unroll
  for (int K = 0; K < N; ++K)
    for (int Off = 16; Off > 0; Off /= 2)
      V[K] += __shfl_xor_sync(0xffffffffu, V[K], Off);
  if (RowThreads <= 32)
    return;
  const int Warps = int(blockDim.x) / 32, Warp = int(threadIdx.x) / 32;
  __syncthreads(); // Red's previous sums are read
  if (threadIdx.x % 32 == 0)
#pragma unroll
    for (int K = 0; K < N; ++K)
      Red[K * Warps + Warp] = V[K];
  __syncthreads();
  const int First = int(threadIdx.x) / RowThreads * (RowThreads / 32);
#pragma unroll
  for (int K = 0; K < N; ++K) {
    float S = 0;
    for (int I = 0; I < RowThreads / 32; ++I)
      S += Red[K * Warps + First + I];
    V[K] = S;
  }
}

template <Storage ST, int W, bool Rms>
__global__ void __launch_bounds__(FastMaxThreads) layerNormFastKernel(Elems Y, float *Mean, float *Rstd, Elems X,
                                    Elems Gamma, Elems Beta, int64_t Rows,
                                    int64_t H, float Eps, int RowThreads) {
  SP_DYNAMIC_SHARED(float, Red);
  const int64_t NV = H / W;
  const int Groups = int(blockDim.x) / RowThreads;
  const int T = int(threadIdx.x) % RowThreads;
  const int64_t Stride = int64_t(gridDim.x) * Groups;
  const int64_t Iters = ceilDiv(Rows, Stride);
  for (int64_t It = 0; It < Iters; ++It) {
    const int64_t R =
        (It * gridDim.x + blockIdx.x) * Groups + threadIdx.x / RowThreads;
    const bool Active = R < Rows;
    Elems XR = at(X, (Active ? R : 0) * H), YR = at(Y, (Active ? R : 0) * H);
    float Xs[FastVecs][W] = {}; // (set where V < NV: = {} for the warning)
    float Sum[1] = {0};
#pragma unroll
    for (int K = 0; K < FastVecs; ++K) {
      const int64_t V = T + int64_t(K) * RowThreads;
      if (Active && V < NV) {
        loadVec<ST, W>(XR, V, Xs[K]);
#pragma unroll
        for (int E = 0; E < W; ++E)
          Sum[0] += Xs[K][E];
      }
    }
    for (int64_t V = T + int64_t(FastVecs) * RowThreads;
         !Rms && Active && V < NV; V += RowThreads) {
      float Xv[W];
      loadVec<ST, W>(XR, V, Xv);
#pragma unroll
      for (int E = 0; E < W; ++E)
        Sum[0] += Xv[E];
    }
    float Mu = 0;
    if constexpr (!Rms) {
      groupSum(Sum, Red, RowThreads);
      Mu = Sum[0] / float(H);
    }
    float Sq[1] = {0};
#pragma unroll
    for (int K = 0; K < FastVecs; ++K) {
      const int64_t V = T + int64_t(K) * RowThreads;
      if (Active && V < NV)
#pragma unroll
        for (int E = 0; E < W; ++E) {
          float D = Xs[K][E] - Mu;
          Sq[0] += D * D;
        }
    }
    for (int64_t V = T + int64_t(FastVecs) * RowThreads; Active && V < NV;
         V += RowThreads) {
      float Xv[W];
      loadVec<ST, W>(XR, V, Xv);
#pragma unroll
      for (int E = 0; E < W; ++E) {
        float D = Xv[E] - Mu;
        Sq[0] += D * D;
      }
    }
    groupSum(Sq, Red, RowThreads);
    if (!Active)
      continue;
    const float S = 1.0f / sqrtf(Sq[0] / float(H) + Eps);
    auto Out = [&](int64_t V, const float(&Xv)[W]) {
      float G[W], B[W], Yv[W];
      ldVecOr<ST, W>(Gamma, V, 1.0f, G);
      ldVecOr<ST, W>(Beta, V, 0.0f, B);
#pragma unroll
      for (int E = 0; E < W; ++E)
        Yv[E] = Rms ? Xv[E] * S * G[E] : (Xv[E] - Mu) * S * G[E] + B[E];
      storeVec<ST, W>(YR, V, Yv);
    };
#pragma unroll
    for (int K = 0; K < FastVecs; ++K) {
      const int64_t V = T + int64_t(K) * RowThreads;
      if (V < NV)
        Out(V, Xs[K]);
    }
    for (int64_t V = T + int64_t(FastVecs) * RowThreads; V < NV;
         V += RowThreads) {
      float Xv[W];
      loadVec<ST, W>(XR, V, Xv);
      Out(V, Xv);
    }
    if (T == 0) {
      if (Mean)
        Mean[R] = Mu;
      if (Rstd)
        Rstd[R] = S;
    }
  }
}

/// Rows [blockIdx.x FastChunkRows, ...) of DX, and the chunk's column
/// partials (PartG, PartB null: none wanted).
template <Storage ST, int W, bool Rms>
__global__ void __launch_bounds__(FastMaxThreads)
layerNormBackwardFastKernel(Elems DX, float *PartG, float *PartB, Elems DY,
                            Elems X, Elems Gamma, const float *Mean,
                            const float *Rstd, int64_t Rows, int64_t H) {
  SP_DYNAMIC_SHARED(float, Red);
  const int RowThreads = int(blockDim.x), T = int(threadIdx.x);
  const int64_t NV = H / W, R0 = int64_t(blockIdx.x) * FastChunkRows;
  const int64_t End = Rows - R0 < FastChunkRows ? Rows : R0 + FastChunkRows;
  const bool Parts = PartG != nullptr;
  float PG[FastBackVecs][W], PB[FastBackVecs][W];
#pragma unroll
  for (int K = 0; K < FastBackVecs; ++K)
#pragma unroll
    for (int E = 0; E < W; ++E)
      PG[K][E] = PB[K][E] = 0;
  // The partials of columns past the registers' accumulate in place.
  float *CG = Parts ? PartG + blockIdx.x * H : nullptr;
  float *CB = PartB ? PartB + blockIdx.x * H : nullptr;
  // The registers' vectors of row R (Xs, Dy), and of row R + 1 (Xn, Dn),
  // loaded before row R's barriers: one row's loads in flight while the
  // block sums the other's.
  float Xs[FastBackVecs][W] = {}, Dy[FastBackVecs][W] = {};
  float Xn[FastBackVecs][W] = {}, Dn[FastBackVecs][W] = {};
  auto Fetch = [&](int64_t R, float(&Xd)[FastBackVecs][W],
                   float(&Dd)[FastBackVecs][W]) {
#pragma unroll
    for (int K = 0; K < FastBackVecs; ++K) {
      const int64_t V = T + int64_t(K) * RowThreads;
      if (V < NV) {
        loadVec<ST, W>(at(X, R * H), V, Xd[K]);
        loadVec<ST, W>(at(DY, R * H), V, Dd[K]);
      }
    }
  };
  if (R0 < End)
    Fetch(R0, Xs, Dy);
  for (int64_t R = R0; R < End; ++R) {
    Elems XR = at(X, R * H), DYR = at(DY, R * H);
    const float Mu = Rms ? 0.0f : Mean[R], S = Rstd[R];
    float Sums[2] = {0, 0};
    auto Terms = [&](int64_t V, const float(&Xv)[W], const float(&Dv)[W]) {
      float G[W];
      ldVecOr<ST, W>(Gamma, V, 1.0f, G);
#pragma unroll
      for (int E = 0; E < W; ++E) {
        float Gv = Dv[E] * G[E];
        Sums[0] += Gv;
        Sums[1] += Gv * ((Xv[E] - Mu) * S);
      }
    };
#pragma unroll
    for (int K = 0; K < FastBackVecs; ++K) {
      const int64_t V = T + int64_t(K) * RowThreads;
      if (V < NV)
        Terms(V, Xs[K], Dy[K]);
    }
    for (int64_t V = T + int64_t(FastBackVecs) * RowThreads; V < NV;
         V += RowThreads) {
      float Xv[W], Dv[W];
      loadVec<ST, W>(XR, V, Xv);
      loadVec<ST, W>(DYR, V, Dv);
      Terms(V, Xv, Dv);
    }
    if (R + 1 < End)
      Fetch(R + 1, Xn, Dn);
    groupSum(Sums, Red, RowThreads);
    const float A = Rms ? 0.0f : Sums[0] / float(H), B = Sums[1] / float(H);
    auto Out = [&](int64_t V, const float(&Xv)[W], const float(&Dv)[W],
                   float(&Gs)[W], float(&Bs)[W]) {
      float G[W], Dx[W];
      ldVecOr<ST, W>(Gamma, V, 1.0f, G);
#pragma unroll
      for (int E = 0; E < W; ++E) {
        float XHat = (Xv[E] - Mu) * S;
        Dx[E] = Rms ? S * (Dv[E] * G[E] - XHat * B)
                    : S * (Dv[E] * G[E] - A - XHat * B);
        Gs[E] += Dv[E] * XHat;
        Bs[E] += Dv[E];
      }
      if (DX.Data)
        storeVec<ST, W>(at(DX, R * H), V, Dx);
    };
#pragma unroll
    for (int K = 0; K < FastBackVecs; ++K) {
      const int64_t V = T + int64_t(K) * RowThreads;
      if (V < NV)
        Out(V, Xs[K], Dy[K], PG[K], PB[K]);
    }
    for (int64_t V = T + int64_t(FastBackVecs) * RowThreads; V < NV;
         V += RowThreads) {
      float Xv[W], Dv[W], Gs[W], Bs[W];
      loadVec<ST, W>(XR, V, Xv);
      loadVec<ST, W>(DYR, V, Dv);
#pragma unroll
      for (int E = 0; E < W; ++E) {
        Gs[E] = Parts && R > R0 ? CG[V * W + E] : 0.0f;
        Bs[E] = CB && R > R0 ? CB[V * W + E] : 0.0f;
      }
      Out(V, Xv, Dv, Gs, Bs);
      if (Parts)
#pragma unroll
        for (int E = 0; E < W; ++E) {
          CG[V * W + E] = Gs[E];
          if (CB)
            CB[V * W + E] = Bs[E];
        }
    }
#pragma unroll
    for (int K = 0; K < FastBackVecs; ++K)
#pragma unroll
      for (int E = 0; E < W; ++E) {
        Xs[K][E] = Xn[K][E];
        Dy[K][E] = Dn[K][E];
      }
  }
  if (!Parts)
    return;
#pragma unroll
  for (int K = 0; K < FastBackVecs; ++K) {
    const int64_t V = T + int64_t(K) * RowThreads;
    if (V < NV)
#pragma unroll
      for (int E = 0; E < W; ++E) {
        CG[V * W + E] = PG[K][E];
        if (CB)
          CB[V * W + E] = PB[K][E];
      }
  }
}

/// Out[j] += the chunks' partials Part[c W + j] added in order from c = 0.
__global__ void fastColumnSumKernel(float *Out, const float *Part,
                                    int64_t Chunks, int64_t Cols) {
  SP_GRID_LOOP(J, Cols) {
    float S = 0;
    int64_t C = 0;
    for (; C + ColumnBatch <= Chunks; C += ColumnBatch) {
      float V[ColumnBatch];
#pragma unroll
      for (int K = 0; K < ColumnBatch; ++K)
        V[K] = Part[(C + K) * Cols + J];
#pragma unroll
      for (int K = 0; K < ColumnBatch; ++K)
        S += V[K];
    }
    for (; C < Chunks; ++C)
      S += Part[C * Cols + J];
    Out[J] += S;
  }
}

/// The threads of a row: a multiple of 32 covering the NV vectors with
/// Vecs each, at most FastMaxThreads.
inline int fastRowThreads(int64_t NV, int Vecs) {
  int64_t T = ceilDiv(ceilDiv(NV, Vecs), 32) * 32;
  return int(T < 32 ? 32 : T > FastMaxThreads ? FastMaxThreads : T);
}

/// Rms: RMSNorm's forward (RmsNorm.cuh), mu = 0, no mean, no beta.
template <bool Rms = false>
void layerNormFast(Elems Y, float *Mean, float *Rstd, Elems X, Elems Gamma,
                   Elems Beta, int64_t Rows, int64_t H, double Eps,
                   cudaStream_t S) {
  if (Rows <= 0 || H <= 0)
    return;
  withStorage(X.Kind, [&](auto ST) {
    constexpr int W = vecWidth<ST>();
    auto Go = [&](auto Kernel, int64_t NV) {
      int RowThreads = fastRowThreads(NV, FastVecs);
      // Whole groups only: a partial one would write part of a row's sums.
      int Threads = RowThreads < FastBlockThreads
                        ? FastBlockThreads / RowThreads * RowThreads
                        : RowThreads;
      int64_t Blocks = ceilDiv(Rows, Threads / RowThreads);
      Blocks = Blocks < MaxBlocks ? Blocks : MaxBlocks;
      SP_LAUNCH(Kernel, Blocks, Threads, size_t(Threads / 32) * sizeof(float),
                S, Y, Mean, Rstd, X, Gamma, Beta, Rows, H, float(Eps),
                RowThreads);
    };
    if (H % W == 0 && aligned16(X.Data) && aligned16(Y.Data) &&
        aligned16(Gamma.Data) && aligned16(Beta.Data))
      Go(layerNormFastKernel<ST, W, Rms>, H / W);
    else
      Go(layerNormFastKernel<ST, 1, Rms>, H);
  });
}

/// Scratch: 2 fastChunks(Rows) H floats (Rms, RMSNorm's backward: mu = 0,
/// A = 0, no DBeta and one fastChunks(Rows) H).
template <bool Rms = false>
void layerNormBackwardFast(Elems DX, float *DGamma, float *DBeta, Elems DY,
                           Elems X, Elems Gamma, const float *Mean,
                           const float *Rstd, int64_t Rows, int64_t H,
                           float *Scratch, cudaStream_t S) {
  if (Rows <= 0 || H <= 0 || (!DX.Data && !DGamma && !DBeta))
    return;
  const int64_t Chunks = fastChunks(Rows);
  const bool Parts = DGamma || DBeta;
  float *PartG = Parts ? Scratch : nullptr;
  float *PartB = DBeta ? Scratch + Chunks * H : nullptr;
  withStorage(X.Kind, [&](auto ST) {
    constexpr int W = vecWidth<ST>();
    auto Go = [&](auto Kernel, int64_t NV) {
      int Threads = fastRowThreads(NV, FastBackVecs);
      SP_LAUNCH(Kernel, Chunks, Threads,
                size_t(2 * Threads / 32) * sizeof(float), S, DX, PartG, PartB,
                DY, X, Gamma, Mean, Rstd, Rows, H);
    };
    if (H % W == 0 && aligned16(X.Data) && aligned16(DY.Data) &&
        aligned16(DX.Data) && aligned16(Gamma.Data))
      Go(layerNormBackwardFastKernel<ST, W, Rms>, H / W);
    else
      Go(layerNormBackwardFastKernel<ST, 1, Rms>, H);
  });
  if (Launch L = columnsLaunch(H); L.Blocks) {
    if (DGamma)
      SP_LAUNCH(fastColumnSumKernel, L.Blocks, L.Threads, 0, S, DGamma, PartG,
                Chunks, H);
    if (DBeta)
      SP_LAUNCH(fastColumnSumKernel, L.Blocks, L.Threads, 0, S, DBeta, PartB,
                Chunks, H);
  }
}

} // namespace
} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_KERNELS_LAYERNORMFAST_CUH
