//===- AttentionSoftmax.cpp - Masks and softmax of attention --------------===//
//
// Kernels.h, sections 9 and 10: the causal mask, the key bias (padding),
// the row softmax and its backward, and the fused scale + causal mask +
// softmax of attention scores with its backward (each element through the
// same operations as the three kernels one after the other). Row sums in
// double as laneSum's lanes, exp through expD (runtime/Numerics.h), so the
// CUDA twin, runtime/cuda/kernels/AttentionSoftmax.cuh, gets the same bits.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/kernels/Common.h"

#include <limits>

namespace sp::cpu {

using namespace detail;
using namespace simd;

//===----------------------------------------------------------------------===//
// 9. Causal mask
//===----------------------------------------------------------------------===//

namespace {
/// How many of its Sk keys the causal mask keeps for query row I (global
/// query Q0 + I, key j global K0 + j): those with K0 + j <= Q0 + I.
SP_INLINE int64_t causalKeep(int64_t I, int64_t Sk, int64_t Q0 = 0,
                             int64_t K0 = 0) {
  return std::clamp<int64_t>(Q0 + I - K0 + 1, 0, Sk);
}
} // namespace

template <typename T>
void causalMask(T *Y, const T *X, int64_t Batch, int64_t Sq, int64_t Sk,
                double Fill, int64_t Q0, int64_t K0) {
  checkSizes({Batch, Sq, Sk});
  const T F = T(Fill);
  // Row i keeps its columns j <= Q0 + i - K0 and fills the rest.
  forEachRow(Batch * Sq, Sk, [&](int64_t R) {
    int64_t I = R % std::max<int64_t>(Sq, 1);
    int64_t Keep = causalKeep(I, Sk, Q0, K0);
    T *YR = Y + R * Sk;
    if (YR != X + R * Sk)
      std::copy(X + R * Sk, X + R * Sk + Keep, YR);
    std::fill(YR + Keep, YR + Sk, F);
  });
}

template <typename T>
void addKeyBias(T *Y, const T *X, const T *Bias, int64_t Batch, int64_t Inner,
                int64_t K) {
  checkSizes({Batch, Inner, K});
  forEachRow(Batch * Inner, K, [&](int64_t R) {
    const T *B = Bias + (R / std::max<int64_t>(Inner, 1)) * K;
    const T *XR = X + R * K;
    T *YR = Y + R * K;
    for (int64_t J = 0; J < K; ++J)
      YR[J] = XR[J] + B[J];
  });
}

//===----------------------------------------------------------------------===//
// 10. Softmax
//===----------------------------------------------------------------------===//

namespace {

template <typename T>
SP_SIMD void softmaxRows(T *Y, const T *X, int64_t Rows, int64_t N) {
  for (int64_t R = 0; R < Rows; ++R) {
    T *YR = Y + R * N;
    const T *XR = X + R * N;
    T Max = rowMax(XR, N);
    if (Max == -std::numeric_limits<T>::infinity()) { // all masked
      std::fill(YR, YR + N, T(0));
      continue;
    }
    Acc Sum = expShiftedSum(YR, XR, N, Max);
    Acc Inv = 1.0 / Sum; // X is no longer read: Y may alias it
    for (int64_t J = 0; J < N; ++J)
      YR[J] = T(Acc(YR[J]) * Inv);
  }
}

/// One row of scaledCausalSoftmax, Keep of its N columns unmasked: the
/// operations of scale, causalMask and softmax on each element, in their
/// order.
template <typename T>
SP_INLINE void scaledCausalRowBody(T *YR, const T *XR, int64_t N, int64_t Keep,
                                   T Alpha, bool Scaled, T Fill) {
  if (Scaled)
    for (int64_t J = 0; J < Keep; ++J)
      YR[J] = Alpha * XR[J];
  else if (YR != XR)
    std::copy(XR, XR + Keep, YR);
  T Max = rowMax(YR, Keep); // the maximum is exact in any order
  if (Keep < N && Max < Fill)
    Max = Fill;
  if (Max == -std::numeric_limits<T>::infinity()) { // all masked
    std::fill(YR, YR + N, T(0));
    return;
  }
  // A masked score's exp is exactly +0 when expD's argument is below -708;
  // the lane sums then gain +0 for it, and its probability is 0 * Inv.
  int64_t Live = double(Fill) - double(Max) < -708.0 ? Keep : N;
  std::fill(YR + Keep, YR + Live, Fill);
  Acc Sum = expShiftedSum(YR, YR, Live, Max);
  Acc Inv = 1.0 / Sum;
  for (int64_t J = 0; J < Live; ++J)
    YR[J] = T(Acc(YR[J]) * Inv);
  std::fill(YR + Live, YR + N, T(Acc(0) * Inv));
}

template <typename T>
SP_SIMD void scaledCausalRows(T *Y, const T *X, int64_t R0, int64_t R1,
                              int64_t Sq, int64_t N, T Alpha, bool Scaled,
                              bool Causal, T Fill) {
  for (int64_t R = R0; R < R1; ++R) {
    int64_t Keep = Causal ? causalKeep(R % Sq, N) : N;
    scaledCausalRowBody(Y + R * N, X + R * N, N, Keep, Alpha, Scaled, Fill);
  }
}

/// One row of scaledCausalSoftmaxBackward: the operations of
/// softmaxBackward, causalMask and scale on each element, in their order.
template <typename T>
SP_INLINE void scaledCausalGradRowBody(T *DXR, const T *YR, const T *DYR,
                                       int64_t N, int64_t Keep, T Alpha,
                                       bool Scaled, T Fill) {
  Acc Dot = laneSum(N, [&](int64_t J) { return Acc(DYR[J]) * YR[J]; });
  for (int64_t J = 0; J < Keep; ++J) {
    T G = T(YR[J] * (DYR[J] - Dot));
    DXR[J] = Scaled ? Alpha * G : G;
  }
  const T Masked = Scaled ? Alpha * Fill : Fill;
  std::fill(DXR + Keep, DXR + N, Masked);
}

template <typename T>
SP_SIMD void scaledCausalGradRows(T *DX, const T *Y, const T *DY, int64_t R0,
                                  int64_t R1, int64_t Sq, int64_t N, T Alpha,
                                  bool Scaled, bool Causal, T Fill) {
  for (int64_t R = R0; R < R1; ++R) {
    int64_t Keep = Causal ? causalKeep(R % Sq, N) : N;
    scaledCausalGradRowBody(DX + R * N, Y + R * N, DY + R * N, N, Keep, Alpha,
                            Scaled, Fill);
  }
}

} // namespace

template <typename T> void softmax(T *Y, const T *X, int64_t Rows, int64_t N) {
  checkSizes({Rows, N});
  parallelFor(Rows, std::max<int64_t>(1, (1 << 12) / std::max<int64_t>(N, 1)),
              [&](int64_t R0, int64_t R1) {
    softmaxRows(Y + R0 * N, X + R0 * N, R1 - R0, N);
  });
}

template <typename T>
void scaledCausalSoftmax(T *Y, const T *X, int64_t Batch, int64_t Sq,
                         int64_t Sk, double Alpha, bool Causal, double Fill) {
  checkSizes({Batch, Sq, Sk});
  if (Sq == 0 || Sk == 0)
    return;
  parallelFor(Batch * Sq,
              std::max<int64_t>(1, (1 << 12) / std::max<int64_t>(Sk, 1)),
              [&](int64_t R0, int64_t R1) {
    scaledCausalRows(Y, X, R0, R1, Sq, Sk, T(Alpha), Alpha != 1.0, Causal,
                     T(Fill));
  });
}

template <typename T>
void scaledCausalSoftmaxBackward(T *DX, const T *Y, const T *DY, int64_t Batch,
                                 int64_t Sq, int64_t Sk, double Alpha,
                                 bool Causal, double Fill) {
  checkSizes({Batch, Sq, Sk});
  if (Sq == 0 || Sk == 0)
    return;
  parallelFor(Batch * Sq,
              std::max<int64_t>(1, (1 << 13) / std::max<int64_t>(Sk, 1)),
              [&](int64_t R0, int64_t R1) {
    scaledCausalGradRows(DX, Y, DY, R0, R1, Sq, Sk, T(Alpha), Alpha != 1.0,
                         Causal, T(Fill));
  });
}

template <typename T>
void softmaxBackward(T *DX, const T *Y, const T *DY, int64_t Rows, int64_t N) {
  checkSizes({Rows, N});
  forEachRow(Rows, N, [&](int64_t R) {
    const T *YR = Y + R * N, *DYR = DY + R * N;
    Acc Dot = laneSum(N, [&](int64_t J) { return Acc(DYR[J]) * YR[J]; });
    T *DXR = DX + R * N;
    for (int64_t J = 0; J < N; ++J)
      DXR[J] = T(YR[J] * (DYR[J] - Dot));
  });
}

#define SP_INSTANTIATE(T)                                                      \
  template void causalMask<T>(T *, const T *, int64_t, int64_t, int64_t,       \
                              double, int64_t, int64_t);                       \
  template void addKeyBias<T>(T *, const T *, const T *, int64_t, int64_t,     \
                              int64_t);                                        \
  template void softmax<T>(T *, const T *, int64_t, int64_t);                  \
  template void softmaxBackward<T>(T *, const T *, const T *, int64_t,         \
                                   int64_t);                                   \
  template void scaledCausalSoftmax<T>(T *, const T *, int64_t, int64_t,      \
                                       int64_t, double, bool, double);         \
  template void scaledCausalSoftmaxBackward<T>(                                \
      T *, const T *, const T *, int64_t, int64_t, int64_t, double, bool,      \
      double);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
