//===- AttentionSoftmax.cuh - Scale, masks and softmax of attention -*- CUDA -*-===//
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
// CPU's lane order (Common.cuh), so the results are the CPU's bits.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"

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
             bool Causal, int64_t Sq, double Fill, cudaStream_t S) {
  if (Launch L = laneRowsLaunch(Rows); L.Blocks && N > 0)
    withStorage(X.Kind, [&](auto ST) {
      SP_LAUNCH(softmaxKernel<ST>, L.Blocks, L.Threads, 0, S, Y, X, Rows, N,
                float(Alpha), Alpha != 1.0, Causal, Sq, float(Fill));
    });
}

void softmaxBackward(Elems DX, Elems Y, Elems DY, int64_t Rows, int64_t N,
                     double Alpha, bool Causal, int64_t Sq, double Fill,
                     cudaStream_t S) {
  if (Launch L = laneRowsLaunch(Rows); L.Blocks && N > 0)
    withStorage(Y.Kind, [&](auto ST) {
      SP_LAUNCH(softmaxBackwardKernel<ST>, L.Blocks, L.Threads, 0, S, DX, Y, DY,
                Rows, N, float(Alpha), Alpha != 1.0, Causal, Sq, float(Fill));
    });
}

} // namespace sp::cuda
