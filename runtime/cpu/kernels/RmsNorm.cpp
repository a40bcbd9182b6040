//===- RmsNorm.cpp - RMSNorm, forward and backward ------------------------===//
//
// Kernels.h, "14. RMSNorm": per row, the mean square in double as laneSum's
// lanes; the backward's row sum likewise and the gain's gradient as column
// sums in the order the CUDA kernels reproduce
// (runtime/cuda/kernels/RmsNorm.cuh). The loops are layerNorm's
// (LayerNorm.cpp) without the mean and the bias.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/kernels/Common.h"

#include <cmath>

namespace sp::cpu {

using namespace detail;
using namespace simd;

template <typename T>
void rmsNorm(T *Y, T *Rstd, const T *X, const T *Gamma, int64_t Rows,
             int64_t H, double Eps) {
  checkSizes({Rows, H});
  SP_CPU_CHECK(H > 0, "rms norm over an empty axis");
  forEachRow(Rows, H, [&](int64_t R) {
    const T *XR = X + R * H;
    Acc MeanSq =
        laneSum(H, [&](int64_t J) { return Acc(XR[J]) * XR[J]; }) / Acc(H);
    Acc S = 1.0 / std::sqrt(MeanSq + Eps);
    T *YR = Y + R * H;
    for (int64_t J = 0; J < H; ++J)
      YR[J] = T(XR[J] * S * Gamma[J]);
    if (Rstd)
      Rstd[R] = T(S);
  });
}

template <typename T>
void rmsNormBackward(T *DX, T *DGamma, const T *DY, const T *X, const T *Gamma,
                     const T *Rstd, int64_t Rows, int64_t H) {
  checkSizes({Rows, H});
  // DX: rows over the threads, each row's sum in double.
  if (DX)
    forEachRow(Rows, H, [&](int64_t R) {
      const T *XR = X + R * H, *DYR = DY + R * H;
      Acc S = Rstd[R];
      Acc MeanGX = laneSum(H, [&](int64_t J) {
                     return (Acc(DYR[J]) * Gamma[J]) * (XR[J] * S);
                   }) /
                   Acc(H);
      T *DXR = DX + R * H;
      for (int64_t J = 0; J < H; ++J)
        DXR[J] = T(S * (Acc(DYR[J]) * Gamma[J] - (XR[J] * S) * MeanGX));
    });
  if (!DGamma)
    return;
  // DGamma: columns over the threads, each summed over the rows in double
  // in the column sums' order and added once.
  columnSums<1>(
      Rows, H,
      [&](int64_t R, int64_t JB, int64_t JE, auto &Part) {
        const T *XR = X + R * H, *DYR = DY + R * H;
        Acc S = Rstd[R];
        for (int64_t J = JB; J < JE; ++J)
          Part[0][J - JB] += DYR[J] * (XR[J] * S);
      },
      [&](int64_t JB, int64_t JE, auto &Sums) {
        for (int64_t J = JB; J < JE; ++J)
          DGamma[J] += T(Sums[0][J - JB]);
      });
}

#define SP_INSTANTIATE(T)                                                      \
  template void rmsNorm<T>(T *, T *, const T *, const T *, int64_t, int64_t,   \
                           double);                                            \
  template void rmsNormBackward<T>(T *, T *, const T *, const T *, const T *,  \
                                   const T *, int64_t, int64_t);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
