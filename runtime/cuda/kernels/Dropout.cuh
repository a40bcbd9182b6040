//===- Dropout.cuh - Philox dropout, forward and backward -------*- CUDA
//-*-===//
//
// Reference (runtime/cpu/kernels/Dropout.cpp, and runtime/cpu/Philox.h,
// shared here: its functions are __host__ __device__ under nvcc):
//   g     = the row-major index in Global of local element e (the local
//           tensor is the block [Offset, Offset + Local) of Global, along
//           an axis perhaps two runs: context parallelism's Seam, Jump)
//   word  = philox::dropoutWord(Seed, Layer, Site, Stream, g)
//   keep  = word >= philox::dropoutThreshold(Ratio)   (Ratio 1: none)
//   Y[e]  = keep ? X[e] * float(1 / (1 - Ratio)) : 0,  Mask[e] = keep
//   backward: DX = Mask ? DY * float(1 / (1 - Ratio)) : 0
// One Philox evaluation per element (the CPU shares one between four
// consecutive global elements; the words are the same), so the masks are
// the CPU's bit for bit on any sharding; where four consecutive local
// elements are one block (dropoutQuadKernel), one evaluation per four, and
// where eight are two (dropoutOctKernel), 16-byte loads and stores.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/Philox.h"
#include "runtime/cuda/kernels/Common.cuh"
#include "runtime/cuda/kernels/FastVectors.cuh"

namespace sp::cuda {
namespace {

struct DropoutGeometry {
  /// The local tensor is the global one (no shard, no offset, no seam):
  /// an element's global index is its own, no division needed.
  bool Whole;
  int Rank;
  int64_t Local[MaxRank], Offset[MaxRank], GlobalStride[MaxRank];
  int64_t Seam[MaxRank], Jump[MaxRank]; // context parallelism's runs
};

/// The global row-major index of local element E.
__device__ inline int64_t dropoutIndex(const DropoutGeometry &G, int64_t E) {
  if (G.Whole)
    return E;
  int64_t Rest = E, Global = 0;
  for (int D = G.Rank - 1; D >= 0; --D) {
    const int64_t L = Rest % G.Local[D];
    const int64_t J = G.Seam[D] > 0 && L >= G.Seam[D] ? G.Jump[D] : 0;
    Global += (G.Offset[D] + L + J) * G.GlobalStride[D];
    Rest /= G.Local[D];
  }
  return Global;
}

template <Storage ST>
__global__ void dropoutKernel(Elems Y, uint8_t *Mask, Elems X, int64_t N,
                              DropoutGeometry G, uint64_t Seed,
                              uint32_t Layer, uint32_t Site, uint32_t Stream,
                              uint64_t Threshold, float Scale) {
  SP_GRID_LOOP(E, N) {
    const int64_t Global = dropoutIndex(G, E);
    bool Keep = false;
    if (Threshold <= 0xFFFFFFFFull)
      Keep = philox::dropoutWord(Seed, Layer, Site, Stream, uint64_t(Global)) >=
             uint32_t(Threshold);
    if (Mask)
      Mask[E] = Keep;
    stAs<ST>(Y, E, Keep ? ldAs<ST>(X, E) * Scale : 0.0f);
  }
}

/// The same in groups of four: when a tensor's innermost local extent, its
/// offset there and every outer global stride are multiples of four, four
/// consecutive local elements are one Philox block's four words, so one
/// thread evaluates Philox once for them and moves them (as a float4 when
/// both are float32).
template <Storage ST>
__global__ void dropoutQuadKernel(Elems Y, uchar4 *Mask, Elems X,
                                  int64_t Quads, DropoutGeometry G,
                                  uint64_t Seed, uint32_t Layer, uint32_t Site,
                                  uint32_t Stream, uint64_t Threshold,
                                  float Scale) {
  SP_GRID_LOOP(Q, Quads) {
    const int64_t Global = dropoutIndex(G, Q * 4);
    philox::Words4 W = philox::philox4x32_10(
        philox::dropoutCounter(Layer, Site, Stream, uint64_t(Global)),
        uint32_t(Seed), uint32_t(Seed >> 32));
    bool Keep[4];
#pragma unroll
    for (int K = 0; K < 4; ++K)
      Keep[K] = Threshold <= 0xFFFFFFFFull && W.V[K] >= uint32_t(Threshold);
    if constexpr (ST == Storage::F32) {
      float4 In = static_cast<const float4 *>(X.Data)[Q];
      static_cast<float4 *>(Y.Data)[Q] = {
          Keep[0] ? In.x * Scale : 0.0f, Keep[1] ? In.y * Scale : 0.0f,
          Keep[2] ? In.z * Scale : 0.0f, Keep[3] ? In.w * Scale : 0.0f};
    } else {
#pragma unroll
      for (int E = 0; E < 4; ++E)
        stAs<ST>(Y, Q * 4 + E, Keep[E] ? ldAs<ST>(X, Q * 4 + E) * Scale : 0.0f);
    }
    if (Mask)
      Mask[Q] = make_uchar4(Keep[0], Keep[1], Keep[2], Keep[3]);
  }
}

/// Two quads at once (the common case: an innermost extent of a multiple of
/// eight, 16-byte aligned tensors): two Philox blocks, one index, 16-byte
/// loads and stores, the eight mask bytes in one store.
template <Storage ST>
__global__ void dropoutOctKernel(Elems Y, uint2 *Mask, Elems X, int64_t Octs,
                                 DropoutGeometry G, uint64_t Seed,
                                 uint32_t Layer, uint32_t Site,
                                 uint32_t Stream, uint64_t Threshold,
                                 float Scale) {
  SP_GRID_LOOP(O, Octs) {
    // The eight lie in one innermost row (its extent a multiple of eight),
    // so the second quad's global index is the first's plus four.
    const int64_t Global = dropoutIndex(G, O * 8);
    bool Keep[8];
#pragma unroll
    for (int H = 0; H < 2; ++H) {
      philox::Words4 W = philox::philox4x32_10(
          philox::dropoutCounter(Layer, Site, Stream, uint64_t(Global + 4 * H)),
          uint32_t(Seed), uint32_t(Seed >> 32));
#pragma unroll
      for (int K = 0; K < 4; ++K)
        Keep[4 * H + K] =
            Threshold <= 0xFFFFFFFFull && W.V[K] >= uint32_t(Threshold);
    }
    float V[8];
    load8<ST>(X, O, V);
#pragma unroll
    for (int K = 0; K < 8; ++K)
      V[K] = Keep[K] ? V[K] * Scale : 0.0f;
    store8<ST>(Y, O, V);
    if (Mask) {
      uint32_t Lo = 0, Hi = 0;
#pragma unroll
      for (int K = 0; K < 4; ++K) {
        Lo |= uint32_t(Keep[K]) << (8 * K);
        Hi |= uint32_t(Keep[4 + K]) << (8 * K);
      }
      uint2 M;
      M.x = Lo, M.y = Hi;
      Mask[O] = M;
    }
  }
}

/// dropoutBackwardKernel eight elements at a time (16-byte aligned
/// tensors, an 8-byte aligned mask).
template <Storage ST>
__global__ void dropoutBackwardOctKernel(Elems DX, Elems DY, const uint2 *Mask,
                                         int64_t Octs, float Scale) {
  SP_GRID_LOOP(O, Octs) {
    uint2 M = Mask[O];
    float V[8];
    load8<ST>(DY, O, V);
#pragma unroll
    for (int K = 0; K < 8; ++K) {
      uint32_t Byte = ((K < 4 ? M.x : M.y) >> (8 * (K % 4))) & 0xFFu;
      V[K] = Byte ? V[K] * Scale : 0.0f;
    }
    store8<ST>(DX, O, V);
  }
}

template <Storage ST>
__global__ void dropoutBackwardKernel(Elems DX, Elems DY, const uint8_t *Mask,
                                      int64_t N, float Scale) {
  SP_GRID_LOOP(I, N) stAs<ST>(DX, I, Mask[I] ? ldAs<ST>(DY, I) * Scale : 0.0f);
}

} // namespace

void dropout(Elems Y, uint8_t *Mask, Elems X, double Ratio, uint64_t Seed,
             uint32_t Layer, uint32_t Site, uint32_t Stream, DevShape Global,
             DevShape Local, DevShape Offset, cudaStream_t S, DevShape Seam,
             DevShape Jump) {
  DropoutGeometry G{};
  G.Rank = Global.Rank;
  G.Whole = true;
  int64_t N = 1, Stride = 1;
  for (int D = G.Rank - 1; D >= 0; --D) {
    G.Local[D] = Local.Dim[D];
    G.Offset[D] = Offset.Dim[D];
    G.Seam[D] = D < Seam.Rank ? Seam.Dim[D] : 0;
    G.Jump[D] = D < Jump.Rank ? Jump.Dim[D] : 0;
    G.GlobalStride[D] = Stride;
    G.Whole = G.Whole && G.Local[D] == Global.Dim[D] && G.Offset[D] == 0 &&
              G.Seam[D] == 0;
    Stride *= Global.Dim[D];
    N *= Local.Dim[D];
  }
  float Scale = float(philox::dropoutScale(Ratio));
  bool Quads = G.Rank > 0 && G.Local[G.Rank - 1] % 4 == 0 &&
               G.Offset[G.Rank - 1] % 4 == 0 && G.Seam[G.Rank - 1] % 4 == 0 &&
               G.Jump[G.Rank - 1] % 4 == 0 &&
               reinterpret_cast<uintptr_t>(Y.Data) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(X.Data) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(Mask) % 4 == 0;
  for (int D = 0; D + 1 < G.Rank; ++D)
    Quads = Quads && G.GlobalStride[D] % 4 == 0;
  bool Octs = Quads && G.Local[G.Rank - 1] % 8 == 0 &&
              G.Seam[G.Rank - 1] % 8 == 0 &&
              reinterpret_cast<uintptr_t>(Mask) % 8 == 0;
  if (Octs) {
    if (Launch L = elementwiseLaunch(N / 8); L.Blocks)
      withStorage(Y.Kind, [&](auto ST) {
        SP_LAUNCH(dropoutOctKernel<ST>, L.Blocks, L.Threads, 0, S, Y,
                  reinterpret_cast<uint2 *>(Mask), X, N / 8, G, Seed, Layer,
                  Site, Stream, philox::dropoutThreshold(Ratio), Scale);
      });
    return;
  }
  if (Quads) {
    if (Launch L = elementwiseLaunch(N / 4); L.Blocks)
      withStorage(Y.Kind, [&](auto ST) {
        SP_LAUNCH(dropoutQuadKernel<ST>, L.Blocks, L.Threads, 0, S, Y,
                  reinterpret_cast<uchar4 *>(Mask), X, N / 4, G, Seed, Layer,
                  Site, Stream, philox::dropoutThreshold(Ratio), Scale);
      });
    return;
  }
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    withStorage(Y.Kind, [&](auto ST) {
      SP_LAUNCH(dropoutKernel<ST>, L.Blocks, L.Threads, 0, S, Y, Mask, X, N, G,
                Seed, Layer, Site, Stream, philox::dropoutThreshold(Ratio),
                Scale);
    });
}

void dropoutBackward(Elems DX, Elems DY, const uint8_t *Mask, int64_t N,
                     double Ratio, cudaStream_t S) {
  float Scale = float(philox::dropoutScale(Ratio));
  if (N % 8 == 0 && reinterpret_cast<uintptr_t>(DX.Data) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(DY.Data) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(Mask) % 8 == 0) {
    if (Launch L = elementwiseLaunch(N / 8); L.Blocks)
      withStorage(DX.Kind, [&](auto ST) {
        SP_LAUNCH(dropoutBackwardOctKernel<ST>, L.Blocks, L.Threads, 0, S, DX,
                  DY, reinterpret_cast<const uint2 *>(Mask), N / 8, Scale);
      });
    return;
  }
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    withStorage(DX.Kind, [&](auto ST) {
      SP_LAUNCH(dropoutBackwardKernel<ST>, L.Blocks, L.Threads, 0, S, DX, DY,
                Mask, N, Scale);
    });
}

} // namespace sp::cuda
