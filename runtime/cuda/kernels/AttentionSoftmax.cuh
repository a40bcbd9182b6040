//===- AttentionSoftmax.cuh - Scale, masks and softmax of attention -*- CUDA
//-*-===//
//
// Reference (runtime/cpu/kernels/AttentionSoftmax.cpp, CpuBackend's
// padding_mask), rows of N = Sk keys, query i = row mod Sq:
//   causal_mask: Y[r, j] = j < i + 1 ? X[r, j] : float(fill)
//   padding_mask: bias[b, k] = where ? ((1 - keep) != 0 ? fill : 0)
//                                    : (1 - keep) * fill   (in float)
//                 Y[b, ..., k] = X[b, ..., k] + bias[b, k]
//   softmax: m = max_j x_j; if m == -inf the row is 0; else
//            e_j = expD(x_j - m) (double), Y_j = float(e_j),
//            Y_j = float(double(Y_j) * (1 / sum_j e_j))
//   softmax_grad: DX = float(Y * (DY - sum_j DY_j Y_j))
//   row log-sum-exp (the fused core's statistic, AttentionPlan.h):
//            m = max_j x_j; lse = m == -inf ? -inf
//                               : float(m + log(sum_j expD(x_j - m)))
// The fused forward evaluates x_j = causal(float(alpha) * X[r, j]) on the
// fly: the same roundings as scale, causal_mask and softmax run one after
// the other, without the two intermediate tensors. The fused backward
// (softmax_grad {alpha, causal, fill}, lower/FuseAttention.cpp) is
// DX_j = float(alpha) * (j < i + 1 ? float(Y_j * (DY_j - dot)) : float(fill)),
// the CPU's softmax_grad, causal_mask and scale in that order (a scale by 1
// is skipped, as the CPU backend skips it). Sums and maxima are the
// CPU's lane order (Common.cuh), so the results are the CPU's bits. That
// is the Exact form (Numerics::Exact).
//
// The Fast form (Numerics::Fast) of softmax and softmax_grad, the same
// semantics (alpha, the causal fill, a row whose max is -inf gives zeros,
// Y may be X and DX may be DY) in float32: a group of G threads per row
// (G = 32, a warp, eight rows to a block of 256; G = 64 .. 512 for
// longer rows, a block per row), G the least power of two whose threads
// hold the row in registers (FastSoftmaxCache floats a thread forward,
// two arrays of FastSoftmaxGradCache backward), so X (Y, DY) is read once;
// rows longer than 512 such shares are read again in each pass. Loads and
// stores are 16-byte vectors (FastVectors.cuh) when N is a multiple of
// the vector and the pointers are 16-byte aligned, scalar otherwise.
//   forward:  x_j = causal(alpha * X_j) (float, as above); m = max_j x_j;
//             m == -inf: the row is 0; else e_j = expf(x_j - m) (CUDA's
//             expf, within 2 ulp; the argument's float rounding adds
//             |x_j - m| u), s = sum_j e_j, Y_j = e_j * (1 / s)
//   backward: d = sum_j DY_j Y_j, DX_j = alpha * (j < i + 1 ? Y_j (DY_j - d)
//             : fill) (the scale skipped when alpha is 1)
// Sums and maxima are fixed trees: each thread folds its own elements in
// order, then a butterfly of warp shuffles (every lane gets the same bits:
// float addition commutes), then the warps' partials in ascending order
// through shared memory. The same bits every run; no atomics. The bounds
// from float32's rounding are derived in tests/gpu/KernelTest.cpp
// (FastSoftmaxAndGeluAreWithinFloat32RoundingOfExact).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"
#include "runtime/cuda/kernels/FastVectors.cuh"

namespace sp::cuda {
namespace {

/// Y = causal_mask(X) (Y may be X); on bytes with fill 0, dropout {causal}'s
/// mask above the diagonal (lower/CausalProducts.h).
template <typename T>
__global__ void causalMaskKernel(T *Y, const T *X, int64_t Rows, int64_t Sq,
                                 int64_t Sk, T Fill) {
  SP_GRID_LOOP(E, Rows * Sk) {
    int64_t R = E / Sk, J = E % Sk;
    int64_t I = R % (Sq > 0 ? Sq : 1);
    Y[E] = J < I + 1 ? X[E] : Fill;
  }
}

__device__ inline float keepValue(const void *Keep, int Type, int64_t E) {
  switch (Type) {
  case 0:
    return float(static_cast<const int64_t *>(Keep)[E]);
  case 1:
    return float(static_cast<const int32_t *>(Keep)[E]);
  case 2:
    return static_cast<const char *>(Keep)[E] ? 1.0f : 0.0f;
  default:
    return static_cast<const float *>(Keep)[E];
  }
}

__global__ void paddingMaskKernel(float *Y, const float *X, const void *Keep,
                                  int KeepType, int64_t Inner, int64_t K,
                                  int64_t N, float Fill, bool Where) {
  SP_GRID_LOOP(E, N) {
    int64_t J = E % K, Bi = E / (Inner * K);
    float Inv = 1.0f - keepValue(Keep, KeepType, Bi * K + J);
    float Bias = Where ? (Inv != 0.0f ? Fill : 0.0f) : Inv * Fill;
    Y[E] = X[E] + Bias;
  }
}

/// One row's input element j: float(alpha) * X, then the causal fill.
template <Storage ST> struct SoftmaxInput {
  Elems XR;
  float Alpha;
  bool Scaled, Causal;
  int64_t Keep;
  float Fill;
  __device__ float operator()(int64_t J) const {
    if (Causal && J >= Keep)
      return Fill;
    return Scaled ? Alpha * ldAs<ST>(XR, J) : ldAs<ST>(XR, J);
  }
};

template <Storage ST>
__global__ void softmaxKernel(Elems Y, Elems X, int64_t Rows, int64_t N,
                              float Alpha, bool Scaled, bool Causal,
                              int64_t Sq, float Fill) {
  const float NegInf = -__int_as_float(0x7f800000);
  forLaneRows(Rows, [&](int64_t R, bool Active, int64_t RR) {
    int64_t I = RR % (Sq > 0 ? Sq : 1);
    SoftmaxInput<ST> In{at(X, RR * N), Alpha, Scaled, Causal,
                    I + 1 < N ? I + 1 : N, Fill};
    float Max = laneMax(N, Active, In);
    Elems YR = at(Y, RR * N);
    // A float32 Y holds the exps between the two passes; a 16-bit one
    // cannot (they would be rounded twice), so they are evaluated again.
    constexpr bool Keep32 = ST == Storage::F32;
    float *Exps = static_cast<float *>(YR.Data);
    bool Masked = Max == NegInf;
    double Sum = laneSum(N, Active && !Masked, [&](int64_t J) {
      double E = expD(double(In(J)) - double(Max));
      if constexpr (Keep32)
        Exps[J] = float(E);
      return E;
    });
    if (!Active)
      return;
    // Each lane rescales the elements it wrote itself: no other thread
    // touched them, so no barrier is needed (and Y may alias X: every lane
    // finished reading X for the sum before the shuffles returned).
    if (Masked) {
      for (int64_t J = laneOf(); J < N; J += RowLanes)
        stAs<ST>(YR, J, 0.0f);
      return;
    }
    double Inv = 1.0 / Sum;
    for (int64_t J = laneOf(); J < N; J += RowLanes) {
      float E;
      if constexpr (Keep32)
        E = Exps[J];
      else
        E = float(expD(double(In(J)) - double(Max)));
      stAs<ST>(YR, J, float(double(E) * Inv));
    }
  });
}

template <Storage ST>
__global__ void softmaxBackwardKernel(Elems DX, Elems Y, Elems DY,
                                      int64_t Rows, int64_t N, float Alpha,
                                      bool Scaled, bool Causal, int64_t Sq,
                                      float Fill) {
  forLaneRows(Rows, [&](int64_t R, bool Active, int64_t RR) {
    Elems YR = at(Y, RR * N), DYR = at(DY, RR * N);
    double Dot = laneSum(N, Active, [&](int64_t J) {
      return double(ldAs<ST>(DYR, J)) * ldAs<ST>(YR, J);
    });
    if (!Active)
      return;
    // Each lane reads only the DY elements it overwrites (DX may alias DY),
    // and all lanes finished reading for Dot before the shuffles returned.
    // Fused: columns past the causal boundary get the fill (the CPU's
    // causal_mask overwrites them), then everything is scaled.
    int64_t I = R % (Sq > 0 ? Sq : 1);
    int64_t Keep = Causal ? (I + 1 < N ? I + 1 : N) : N;
    Elems DXR = at(DX, R * N);
    for (int64_t J = laneOf(); J < N; J += RowLanes) {
      float V = J < Keep ? float(ldAs<ST>(YR, J) * (ldAs<ST>(DYR, J) - Dot))
                         : Fill;
      stAs<ST>(DXR, J, Scaled ? Alpha * V : V);
    }
  });
}

/// Lse of each row of X [Rows, N]; row r = (b Heads + a) Sq + i goes to
/// (b Sq + i) Heads + a when Merged.
__global__ void rowLogSumExpKernel(float *Lse, const float *X, int64_t Rows,
                                   int64_t N, int64_t Heads, int64_t Sq,
                                   bool Merged) {
  const float NegInf = -__int_as_float(0x7f800000);
  forLaneRows(Rows, [&](int64_t R, bool Active, int64_t RR) {
    const float *XR = X + RR * N;
    float Max = laneMax(N, Active, [&](int64_t J) { return XR[J]; });
    bool Masked = Max == NegInf;
    double Sum = laneSum(N, Active && !Masked, [&](int64_t J) {
      return expD(double(XR[J]) - double(Max));
    });
    if (!Active || laneOf() != 0)
      return;
    int64_t At = R;
    if (Merged) {
      int64_t I = R % Sq, BA = R / Sq;
      At = ((BA / Heads) * Sq + I) * Heads + BA % Heads;
    }
    Lse[At] = Masked ? NegInf : float(double(Max) + log(Sum));
  });
}

/// Floats of a row a thread holds in registers: the forward's x (then
/// its exps), and each of the backward's Y and DY.
constexpr int FastSoftmaxCache = 64;
constexpr int FastSoftmaxGradCache = 32;

/// The group's reduction of V (a max, or a sum): a butterfly of shuffles
/// within the warp, then (G > 32: the group is the block) the warps'
/// values in ascending order. Every thread of the group gets the same bits.
template <bool IsMax>
__device__ inline float groupReduce(float V, int G, float *Sh) {
  auto Op = [](float A, float B) {
    if constexpr (IsMax)
      return A < B ? B : A;
    else
      return A + B;
  };
#pragma unroll
  for (int O = 16; O > 0; O >>= 1)
    V = Op(V, __shfl_xor_sync(0xffffffffu, V, O));
  if (G == 32)
    return V;
  if (threadIdx.x % 32 == 0)
    Sh[threadIdx.x / 32] = V;
  __syncthreads();
  float T = Sh[0];
  for (int K = 1; K < G / 32; ++K)
    T = Op(T, Sh[K]);
  __syncthreads(); // every thread read Sh before the next reduction writes
  return T;
}

/// Fn(K, V) for the vectors V = T + K G (< NV) that thread T of a group of
/// G owns: K < Per unrolled (the register cache's index) when Cached.
template <bool Cached, int Per, typename F>
__device__ inline void forOwned(int T, int G, int64_t NV, F &&Fn) {
  if constexpr (Cached) {
#pragma unroll
    for (int K = 0; K < Per; ++K)
      if (int64_t V = T + int64_t(K) * G; V < NV)
        Fn(K, V);
  } else {
    for (int64_t V = T; V < NV; V += G)
      Fn(0, V);
  }
}

/// The most threads of a row's group (a block of them must get the
/// registers a row is held in; longer rows are read again in each pass).
constexpr int FastSoftmaxMaxThreads = 512;

template <Storage ST, int Vec, bool Cached>
__global__ void __launch_bounds__(FastSoftmaxMaxThreads) fastSoftmaxKernel(Elems Y, Elems X, int64_t Rows, int64_t N,
                                  int G, float Alpha, bool Scaled, bool Causal,
                                  int64_t Sq, float Fill) {
  constexpr int Per = FastSoftmaxCache / Vec;
  __shared__ float Sh[32];
  const float NegInf = -__int_as_float(0x7f800000);
  const int T = int(threadIdx.x) % G;
  const int64_t RowsPerBlock = blockDim.x / G, NV = N / Vec;
  for (int64_t R = blockIdx.x * RowsPerBlock + threadIdx.x / G; R < Rows;
       R += gridDim.x * RowsPerBlock) {
    int64_t I = R % (Sq > 0 ? Sq : 1);
    int64_t Keep = Causal ? (I + 1 < N ? I + 1 : N) : N;
    Elems XR = at(X, R * N), YR = at(Y, R * N);
    [[maybe_unused]] float C[Cached ? Per : 1][Vec];
    // Vector V of x = causal(alpha * X).
    auto LoadX = [&](int64_t V, float(&O)[Vec]) {
      loadVec<ST, Vec>(XR, V, O);
#pragma unroll
      for (int E = 0; E < Vec; ++E)
        O[E] = Causal && V * Vec + E >= Keep ? Fill
               : Scaled                      ? Alpha * O[E]
                                             : O[E];
    };
    float M = NegInf;
    forOwned<Cached, Per>(T, G, NV, [&](int K, int64_t V) {
      float O[Vec];
      LoadX(V, O);
#pragma unroll
      for (int E = 0; E < Vec; ++E) {
        if constexpr (Cached)
          C[K][E] = O[E];
        M = M < O[E] ? O[E] : M;
      }
    });
    M = groupReduce<true>(M, G, Sh);
    if (M == NegInf) {
      forOwned<Cached, Per>(T, G, NV, [&](int, int64_t V) {
        float O[Vec] = {};
        storeVec<ST, Vec>(YR, V, O);
      });
      continue;
    }
    float S = 0;
    forOwned<Cached, Per>(T, G, NV, [&](int K, int64_t V) {
      float O[Vec];
      if constexpr (!Cached)
        LoadX(V, O);
#pragma unroll
      for (int E = 0; E < Vec; ++E) {
        float Ex;
        if constexpr (Cached)
          Ex = C[K][E] = expf(C[K][E] - M);
        else
          Ex = expf(O[E] - M);
        S += Ex;
      }
    });
    float Inv = 1.0f / groupReduce<false>(S, G, Sh);
    // Each thread writes only the vectors it read: Y may be X.
    forOwned<Cached, Per>(T, G, NV, [&](int K, int64_t V) {
      float O[Vec];
      if constexpr (!Cached)
        LoadX(V, O);
#pragma unroll
      for (int E = 0; E < Vec; ++E) {
        if constexpr (Cached)
          O[E] = C[K][E] * Inv;
        else
          O[E] = expf(O[E] - M) * Inv;
      }
      storeVec<ST, Vec>(YR, V, O);
    });
  }
}

template <Storage ST, int Vec, bool Cached>
__global__ void __launch_bounds__(FastSoftmaxMaxThreads) fastSoftmaxBackwardKernel(Elems DX, Elems Y, Elems DY,
                                          int64_t Rows, int64_t N, int G,
                                          float Alpha, bool Scaled, bool Causal,
                                          int64_t Sq, float Fill) {
  constexpr int Per = FastSoftmaxGradCache / Vec;
  __shared__ float Sh[32];
  const int T = int(threadIdx.x) % G;
  const int64_t RowsPerBlock = blockDim.x / G, NV = N / Vec;
  for (int64_t R = blockIdx.x * RowsPerBlock + threadIdx.x / G; R < Rows;
       R += gridDim.x * RowsPerBlock) {
    int64_t I = R % (Sq > 0 ? Sq : 1);
    int64_t Keep = Causal ? (I + 1 < N ? I + 1 : N) : N;
    Elems YR = at(Y, R * N), DYR = at(DY, R * N), DXR = at(DX, R * N);
    [[maybe_unused]] float CY[Cached ? Per : 1][Vec], CD[Cached ? Per : 1][Vec];
    float D = 0;
    forOwned<Cached, Per>(T, G, NV, [&](int K, int64_t V) {
      float A[Vec], B[Vec];
      loadVec<ST, Vec>(YR, V, A);
      loadVec<ST, Vec>(DYR, V, B);
#pragma unroll
      for (int E = 0; E < Vec; ++E) {
        if constexpr (Cached)
          CY[K][E] = A[E], CD[K][E] = B[E];
        D += B[E] * A[E];
      }
    });
    D = groupReduce<false>(D, G, Sh);
    // Each thread writes only the vectors it read: DX may be DY.
    forOwned<Cached, Per>(T, G, NV, [&](int K, int64_t V) {
      float A[Vec], B[Vec], O[Vec];
      if constexpr (Cached) {
#pragma unroll
        for (int E = 0; E < Vec; ++E)
          A[E] = CY[K][E], B[E] = CD[K][E];
      } else {
        loadVec<ST, Vec>(YR, V, A);
        loadVec<ST, Vec>(DYR, V, B);
      }
#pragma unroll
      for (int E = 0; E < Vec; ++E) {
        float W = V * Vec + E < Keep ? A[E] * (B[E] - D) : Fill;
        O[E] = Scaled ? Alpha * W : W;
      }
      storeVec<ST, Vec>(DXR, V, O);
    });
  }
}

/// The fast kernels' launch: groups of G threads a row (a block of 256 for
/// G = 32, else a block per row), Cached when the row fits in registers.
struct FastRows {
  int64_t Blocks = 0;
  int Threads = 0, G = 32;
  bool Cached = true;
};

inline FastRows fastRowsLaunch(int64_t Rows, int64_t NV, int Per) {
  FastRows L;
  while (L.G < FastSoftmaxMaxThreads && int64_t(L.G) * Per < NV)
    L.G *= 2;
  L.Cached = int64_t(L.G) * Per >= NV;
  L.Threads = L.G == 32 ? BlockThreads : L.G;
  int64_t B = ceilDiv(Rows, L.Threads / L.G);
  L.Blocks = B < MaxBlocks ? B : MaxBlocks;
  return L;
}

/// Vec = ST's 16-byte vector when N is its multiple and every pointer is
/// aligned, else 1: Fn(integral_constant<int, Vec>).
template <Storage ST, typename F>
inline void withVec(int64_t N, std::initializer_list<const void *> Ps, F &&Fn) {
  bool Ok = N % vecWidth<ST>() == 0;
  for (const void *P : Ps)
    Ok = Ok && aligned16(P);
  if (Ok)
    Fn(std::integral_constant<int, vecWidth<ST>()>());
  else
    Fn(std::integral_constant<int, 1>());
}

void fastSoftmax(Elems Y, Elems X, int64_t Rows, int64_t N, float Alpha,
                 bool Scaled, bool Causal, int64_t Sq, float Fill,
                 cudaStream_t S) {
  withStorage(X.Kind, [&](auto STC) {
    constexpr Storage ST = decltype(STC)::value;
    withVec<ST>(N, {X.Data, Y.Data}, [&](auto VC) {
      constexpr int Vec = decltype(VC)::value;
      FastRows L = fastRowsLaunch(Rows, N / Vec, FastSoftmaxCache / Vec);
      auto *K = L.Cached ? &fastSoftmaxKernel<ST, Vec, true>
                         : &fastSoftmaxKernel<ST, Vec, false>;
      SP_LAUNCH(K, L.Blocks, L.Threads, 0, S, Y, X, Rows, N, L.G, Alpha, Scaled,
                Causal, Sq, Fill);
    });
  });
}

void fastSoftmaxBackward(Elems DX, Elems Y, Elems DY, int64_t Rows, int64_t N,
                         float Alpha, bool Scaled, bool Causal, int64_t Sq,
                         float Fill, cudaStream_t S) {
  withStorage(Y.Kind, [&](auto STC) {
    constexpr Storage ST = decltype(STC)::value;
    withVec<ST>(N, {DX.Data, Y.Data, DY.Data}, [&](auto VC) {
      constexpr int Vec = decltype(VC)::value;
      FastRows L = fastRowsLaunch(Rows, N / Vec, FastSoftmaxGradCache / Vec);
      auto *K = L.Cached ? &fastSoftmaxBackwardKernel<ST, Vec, true>
                         : &fastSoftmaxBackwardKernel<ST, Vec, false>;
      SP_LAUNCH(K, L.Blocks, L.Threads, 0, S, DX, Y, DY, Rows, N, L.G, Alpha,
                Scaled, Causal, Sq, Fill);
    });
  });
}

} // namespace

void rowLogSumExp(float *Lse, const float *X, int64_t Rows, int64_t N,
                  int64_t Heads, int64_t Sq, bool Merged, cudaStream_t S) {
  if (Launch L = laneRowsLaunch(Rows); L.Blocks && N > 0)
    SP_LAUNCH(rowLogSumExpKernel, L.Blocks, L.Threads, 0, S, Lse, X, Rows, N,
              Heads, Sq, Merged);
}

void causalMask(float *Y, const float *X, int64_t Batch, int64_t Sq,
                int64_t Sk, double Fill, cudaStream_t S) {
  if (Launch L = elementwiseLaunch(Batch * Sq * Sk); L.Blocks)
    SP_LAUNCH(causalMaskKernel<float>, L.Blocks, L.Threads, 0, S, Y, X, Batch * Sq, Sq,
              Sk, float(Fill));
}

void causalMaskBytes(uint8_t *Mask, int64_t Batch, int64_t Sq, int64_t Sk,
                     cudaStream_t S) {
  if (Launch L = elementwiseLaunch(Batch * Sq * Sk); L.Blocks)
    SP_LAUNCH(causalMaskKernel<uint8_t>, L.Blocks, L.Threads, 0, S, Mask, Mask,
              Batch * Sq, Sq, Sk, uint8_t(0));
}

void paddingMask(float *Y, const float *X, const void *Keep, int KeepType,
                 int64_t B, int64_t Inner, int64_t K, double Fill, bool Where,
                 cudaStream_t S) {
  int64_t N = B * Inner * K;
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    SP_LAUNCH(paddingMaskKernel, L.Blocks, L.Threads, 0, S, Y, X, Keep,
              KeepType, Inner, K, N, float(Fill), Where);
}

void softmax(Elems Y, Elems X, int64_t Rows, int64_t N, double Alpha,
             bool Causal, int64_t Sq, double Fill, Numerics Num,
             cudaStream_t S) {
  if (Rows > 0 && N > 0 && Num == Numerics::Fast)
    return fastSoftmax(Y, X, Rows, N, float(Alpha), Alpha != 1.0, Causal, Sq,
                       float(Fill), S);
  if (Launch L = laneRowsLaunch(Rows); L.Blocks && N > 0)
    withStorage(X.Kind, [&](auto ST) {
      SP_LAUNCH(softmaxKernel<ST>, L.Blocks, L.Threads, 0, S, Y, X, Rows, N,
                float(Alpha), Alpha != 1.0, Causal, Sq, float(Fill));
    });
}

void softmaxBackward(Elems DX, Elems Y, Elems DY, int64_t Rows, int64_t N,
                     double Alpha, bool Causal, int64_t Sq, double Fill,
                     Numerics Num, cudaStream_t S) {
  if (Rows > 0 && N > 0 && Num == Numerics::Fast)
    return fastSoftmaxBackward(DX, Y, DY, Rows, N, float(Alpha), Alpha != 1.0,
                               Causal, Sq, float(Fill), S);
  if (Launch L = laneRowsLaunch(Rows); L.Blocks && N > 0)
    withStorage(Y.Kind, [&](auto ST) {
      SP_LAUNCH(softmaxBackwardKernel<ST>, L.Blocks, L.Threads, 0, S, DX, Y, DY,
                Rows, N, float(Alpha), Alpha != 1.0, Causal, Sq, float(Fill));
    });
}

} // namespace sp::cuda
