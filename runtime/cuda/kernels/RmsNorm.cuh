//===- RmsNorm.cuh - RMSNorm forward and backward ---------------*- CUDA
//-*-===//
//
// Reference (runtime/cpu/kernels/RmsNorm.cpp), per row r of X[Rows, H]:
//   s  = 1 / sqrt(sum_j X[r,j]^2 / H + eps)      (double, laneSum order)
//   Y  = float(X * s * gamma), Rstd[r] = float(s)
// backward, xhat = X * s:
//   DX = float(s * (DY gamma - xhat * mean_j(DY gamma xhat)))
//   DGamma[j] += float(sum_r DY xhat)   (one thread per column, rows in order)
//
// That is the Exact form (Numerics::Exact), the CPU's bits. The Fast form
// is LayerNormFast.cuh's kernels with mu = 0 (float32 tree sums per row,
// vectorised loads, a deterministic two-stage column sum for DGamma).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"
#include "runtime/cuda/kernels/LayerNormFast.cuh"

namespace sp::cuda {
namespace {

__global__ void rmsNormKernel(float *Y, float *Rstd, const float *X,
                              const float *Gamma, int64_t Rows, int64_t H,
                              double Eps) {
  forLaneRows(Rows, [&](int64_t R, bool Active, int64_t RR) {
    const float *XR = X + RR * H;
    double MeanSq = laneSum(H, Active, [&](int64_t J) {
                      return double(XR[J]) * XR[J];
                    }) /
                    double(H);
    if (!Active)
      return;
    double S = 1.0 / sqrt(MeanSq + Eps);
    float *YR = Y + R * H;
    for (int64_t J = laneOf(); J < H; J += RowLanes)
      YR[J] = float(XR[J] * S * Gamma[J]);
    if (Rstd && laneOf() == 0)
      Rstd[R] = float(S);
  });
}

__global__ void rmsNormBackwardDxKernel(float *DX, const float *DY,
                                        const float *X, const float *Gamma,
                                        const float *Rstd, int64_t Rows,
                                        int64_t H) {
  forLaneRows(Rows, [&](int64_t R, bool Active, int64_t RR) {
    const float *XR = X + RR * H, *DYR = DY + RR * H;
    double S = Rstd[RR];
    double MeanGX = laneSum(H, Active, [&](int64_t J) {
                      return (double(DYR[J]) * Gamma[J]) * (XR[J] * S);
                    }) /
                    double(H);
    if (!Active)
      return;
    float *DXR = DX + R * H;
    for (int64_t J = laneOf(); J < H; J += RowLanes)
      DXR[J] = float(S * (double(DYR[J]) * Gamma[J] - (XR[J] * S) * MeanGX));
  });
}

/// Block E / H of column E % H's gain-gradient sum (LayerNorm.cuh's order).
__global__ void rmsNormBackwardGammaPartsKernel(double *Part, const float *DY,
                                                const float *X,
                                                const float *Rstd, int64_t Rows,
                                                int64_t H) {
  SP_GRID_LOOP(E, columnParts(Rows) * H) {
    int64_t J = E % H;
    Part[E] = columnPart(E / H, Rows, [&](int64_t R) {
      double S = Rstd[R];
      float Dy = DY[R * H + J];
      return Dy * (X[R * H + J] * S);
    });
  }
}

} // namespace

void rmsNorm(float *Y, float *Rstd, const float *X, const float *Gamma,
             int64_t Rows, int64_t H, double Eps, Numerics N, cudaStream_t S) {
  if (N == Numerics::Fast)
    return layerNormFast<true>(Y, nullptr, Rstd, X, Gamma, nullptr, Rows, H,
                               Eps, S);
  if (Launch L = laneRowsLaunch(Rows); L.Blocks && H > 0)
    SP_LAUNCH(rmsNormKernel, L.Blocks, L.Threads, 0, S, Y, Rstd, X, Gamma, Rows,
              H, Eps);
}

void rmsNormBackward(float *DX, float *DGamma, const float *DY, const float *X,
                     const float *Gamma, const float *Rstd, int64_t Rows,
                     int64_t H, double *Scratch, Numerics N, cudaStream_t S) {
  if (N == Numerics::Fast)
    return layerNormBackwardFast<true>(DX, DGamma, nullptr, DY, X, Gamma,
                                       nullptr, Rstd, Rows, H,
                                       reinterpret_cast<float *>(Scratch), S);
  if (DX)
    if (Launch L = laneRowsLaunch(Rows); L.Blocks && H > 0)
      SP_LAUNCH(rmsNormBackwardDxKernel, L.Blocks, L.Threads, 0, S, DX, DY, X,
                Gamma, Rstd, Rows, H);
  if (!DGamma)
    return;
  int64_t Parts = columnParts(Rows);
  if (Launch L = elementwiseLaunch(Parts * H); L.Blocks)
    SP_LAUNCH(rmsNormBackwardGammaPartsKernel, L.Blocks, L.Threads, 0, S,
              Scratch, DY, X, Rstd, Rows, H);
  columnPartsSum(DGamma, Scratch, Parts, H, S);
}

} // namespace sp::cuda
