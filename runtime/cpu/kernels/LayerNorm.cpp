//===- LayerNorm.cpp - LayerNorm, forward and backward --------------------===//
//
// Kernels.h, "3. LayerNorm": per row, the mean and the (two-pass) variance
// in double as laneSum's lanes; the backward's row sums likewise and the
// parameter gradients as column sums in the order the CUDA kernels
// reproduce (runtime/cuda/kernels/LayerNorm.cuh).
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/kernels/Common.h"

#include <cmath>

namespace sp::cpu {

using namespace detail;
using namespace simd;

template <typename T>
void layerNorm(T *Y, T *Mean, T *Rstd, const T *X, const T *Gamma,
               const T *Beta, int64_t Rows, int64_t H, double Eps) {
  checkSizes({Rows, H});
  SP_CPU_CHECK(H > 0, "layer norm over an empty axis");
  forEachRow(Rows, H, [&](int64_t R) {
    const T *XR = X + R * H;
    Acc Mu = laneSum(H, [&](int64_t J) { return Acc(XR[J]); }) / Acc(H);
    // Two passes: no cancellation.
    Acc Var = laneSum(H, [&](int64_t J) {
                Acc D = XR[J] - Mu;
                return D * D;
              }) /
              Acc(H);
    Acc S = 1.0 / std::sqrt(Var + Eps);
    T *YR = Y + R * H;
    if (Gamma && Beta)
      for (int64_t J = 0; J < H; ++J)
        YR[J] = T((XR[J] - Mu) * S * Gamma[J] + Beta[J]);
    else
      for (int64_t J = 0; J < H; ++J) {
        Acc V = (XR[J] - Mu) * S;
        if (Gamma)
          V *= Gamma[J];
        if (Beta)
          V += Beta[J];
        YR[J] = T(V);
      }
    if (Mean)
      Mean[R] = T(Mu);
    if (Rstd)
      Rstd[R] = T(S);
  });
}

template <typename T>
void layerNormBackward(T *DX, T *DGamma, T *DBeta, const T *DY, const T *X,
                       const T *Gamma, const T *Mean, const T *Rstd,
                       int64_t Rows, int64_t H) {
  checkSizes({Rows, H});
  // DX: rows over the threads, each row's sums in double.
  if (DX)
    forEachRow(Rows, H, [&](int64_t R) {
      const T *XR = X + R * H, *DYR = DY + R * H;
      Acc Mu = Mean[R], S = Rstd[R];
      auto G = [&](int64_t J) {
        return Gamma ? Acc(DYR[J]) * Gamma[J] : Acc(DYR[J]);
      };
      Acc MeanG = laneSum(H, G) / Acc(H);
      Acc MeanGX = laneSum(H, [&](int64_t J) {
                     return G(J) * ((XR[J] - Mu) * S);
                   }) /
                   Acc(H);
      T *DXR = DX + R * H;
      for (int64_t J = 0; J < H; ++J) {
        Acc XHat = (XR[J] - Mu) * S;
        DXR[J] = T(S * (G(J) - MeanG - XHat * MeanGX));
      }
    });
  if (!DGamma && !DBeta)
    return;
  // DGamma, DBeta: columns over the threads, each column summed over the
  // rows in double in the column sums' order and added once.
  columnSums<2>(
      Rows, H,
      [&](int64_t R, int64_t JB, int64_t JE, auto &Part) {
        const T *XR = X + R * H, *DYR = DY + R * H;
        Acc Mu = Mean[R], S = Rstd[R];
        for (int64_t J = JB; J < JE; ++J) {
          Part[0][J - JB] += DYR[J] * ((XR[J] - Mu) * S);
          Part[1][J - JB] += DYR[J];
        }
      },
      [&](int64_t JB, int64_t JE, auto &Sums) {
        for (int64_t J = JB; J < JE; ++J) {
          if (DGamma)
            DGamma[J] += T(Sums[0][J - JB]);
          if (DBeta)
            DBeta[J] += T(Sums[1][J - JB]);
        }
      });
}

#define SP_INSTANTIATE(T)                                                      \
  template void layerNorm<T>(T *, T *, T *, const T *, const T *, const T *,   \
                             int64_t, int64_t, double);                        \
  template void layerNormBackward<T>(T *, T *, T *, const T *, const T *,      \
                                     const T *, const T *, const T *, int64_t, \
                                     int64_t);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
