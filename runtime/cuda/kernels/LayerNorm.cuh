//===- LayerNorm.cuh - LayerNorm forward and backward, bias grad -*- CUDA -*-===//
//
// Reference (runtime/cpu/Kernels.cpp, sections 3 and 4), per row r of
// X[Rows, H], sums in double as the CPU's laneSum:
//   mu   = sum_j X[r,j] / H
//   var  = sum_j (X[r,j] - mu)^2 / H          (two passes)
//   s    = 1 / sqrt(var + eps)
//   Y    = float((X - mu) * s * gamma + beta)   (gamma/beta null: 1 / 0)
//   Mean[r] = float(mu), Rstd[r] = float(s)
// backward, g = DY * gamma, xhat = (X - mu) * s:
//   DX = float(s * (g - mean(g) - xhat * mean(g * xhat)))
//   DGamma[j] += float(sum_r DY xhat), DBeta[j] += float(sum_r DY)
//   (one thread per column, rows in order, as the CPU's column blocks)
// bias grad: DBias[j] += float(sum_r DY[r, j]) the same way.
//
// Rows are reduced by 8-lane groups that reproduce laneSum exactly, so the
// statistics and outputs are the CPU's bits.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"

namespace sp::cuda {
namespace {

__global__ void layerNormKernel(float *Y, float *Mean, float *Rstd,
                                const float *X, const float *Gamma,
                                const float *Beta, int64_t Rows, int64_t H,
                                double Eps) {
  // Every thread of a warp stays in the loop while any row of it is live
  // (the shuffles need the whole warp).
  int64_t Stride = laneRowStride();
  int64_t Iters = (Rows + Stride - 1) / Stride;
  for (int64_t It = 0; It < Iters; ++It) {
    int64_t R = laneRow() + It * Stride;
    bool Active = R < Rows;
    const float *XR = X + (Active ? R : 0) * H;
    double Mu = laneSum(H, Active, [&](int64_t J) { return double(XR[J]); }) /
                double(H);
    double Var = laneSum(H, Active, [&](int64_t J) {
                   double D = XR[J] - Mu;
                   return D * D;
                 }) /
                 double(H);
    if (!Active)
      continue;
    double S = 1.0 / sqrt(Var + Eps);
    float *YR = Y + R * H;
    for (int64_t J = laneOf(); J < H; J += RowLanes) {
      if (Gamma && Beta) {
        YR[J] = float((XR[J] - Mu) * S * Gamma[J] + Beta[J]);
      } else {
        double V = (XR[J] - Mu) * S;
        if (Gamma)
          V *= Gamma[J];
        if (Beta)
          V += Beta[J];
        YR[J] = float(V);
      }
    }
    if (laneOf() == 0) {
      if (Mean)
        Mean[R] = float(Mu);
      if (Rstd)
        Rstd[R] = float(S);
    }
  }
}

__global__ void layerNormBackwardDxKernel(float *DX, const float *DY,
                                          const float *X, const float *Gamma,
                                          const float *Mean, const float *Rstd,
                                          int64_t Rows, int64_t H) {
  int64_t Stride = laneRowStride();
  int64_t Iters = (Rows + Stride - 1) / Stride;
  for (int64_t It = 0; It < Iters; ++It) {
    int64_t R = laneRow() + It * Stride;
    bool Active = R < Rows;
    int64_t RR = Active ? R : 0;
    const float *XR = X + RR * H, *DYR = DY + RR * H;
    double Mu = Mean[RR], S = Rstd[RR];
    auto G = [&](int64_t J) {
      return Gamma ? double(DYR[J]) * Gamma[J] : double(DYR[J]);
    };
    double MeanG = laneSum(H, Active, G) / double(H);
    double MeanGX = laneSum(H, Active, [&](int64_t J) {
                      return G(J) * ((XR[J] - Mu) * S);
                    }) /
                    double(H);
    if (!Active)
      continue;
    float *DXR = DX + R * H;
    for (int64_t J = laneOf(); J < H; J += RowLanes) {
      double XHat = (XR[J] - Mu) * S;
      DXR[J] = float(S * (G(J) - MeanG - XHat * MeanGX));
    }
  }
}

__global__ void layerNormBackwardParamsKernel(float *DGamma, float *DBeta,
                                              const float *DY, const float *X,
                                              const float *Mean,
                                              const float *Rstd, int64_t Rows,
                                              int64_t H) {
  SP_GRID_LOOP(J, H) {
    // Both sums in row order, ColumnBatch rows' terms loaded first.
    double SG = 0, SB = 0;
    int64_t R = 0;
    for (; R + ColumnBatch <= Rows; R += ColumnBatch) {
      double G[ColumnBatch];
      float B[ColumnBatch];
#pragma unroll
      for (int K = 0; K < ColumnBatch; ++K) {
        double Mu = Mean[R + K], S = Rstd[R + K];
        B[K] = DY[(R + K) * H + J];
        G[K] = B[K] * ((X[(R + K) * H + J] - Mu) * S);
      }
#pragma unroll
      for (int K = 0; K < ColumnBatch; ++K) {
        SG += G[K];
        SB += B[K];
      }
    }
    for (; R < Rows; ++R) {
      double Mu = Mean[R], S = Rstd[R];
      float Dy = DY[R * H + J];
      SG += Dy * ((X[R * H + J] - Mu) * S);
      SB += Dy;
    }
    if (DGamma)
      DGamma[J] += float(SG);
    if (DBeta)
      DBeta[J] += float(SB);
  }
}

__global__ void biasBackwardKernel(float *DBias, const float *DY, int64_t Rows,
                                   int64_t Out) {
  SP_GRID_LOOP(J, Out) {
    double Sum =
        columnSum(Rows, [&](int64_t R) { return double(DY[R * Out + J]); });
    DBias[J] += float(Sum);
  }
}

} // namespace

void layerNorm(float *Y, float *Mean, float *Rstd, const float *X,
               const float *Gamma, const float *Beta, int64_t Rows, int64_t H,
               double Eps, cudaStream_t S) {
  if (Launch L = laneRowsLaunch(Rows); L.Blocks && H > 0)
    layerNormKernel<<<L.Blocks, L.Threads, 0, S>>>(Y, Mean, Rstd, X, Gamma,
                                                   Beta, Rows, H, Eps);
}

void layerNormBackward(float *DX, float *DGamma, float *DBeta, const float *DY,
                       const float *X, const float *Gamma, const float *Mean,
                       const float *Rstd, int64_t Rows, int64_t H,
                       cudaStream_t S) {
  if (DX)
    if (Launch L = laneRowsLaunch(Rows); L.Blocks && H > 0)
      layerNormBackwardDxKernel<<<L.Blocks, L.Threads, 0, S>>>(
          DX, DY, X, Gamma, Mean, Rstd, Rows, H);
  if (DGamma || DBeta)
    if (Launch L = columnsLaunch(H); L.Blocks)
      layerNormBackwardParamsKernel<<<L.Blocks, L.Threads, 0, S>>>(
          DGamma, DBeta, DY, X, Mean, Rstd, Rows, H);
}

void biasBackward(float *DBias, const float *DY, int64_t Rows, int64_t Out,
                  cudaStream_t S) {
  if (Launch L = columnsLaunch(Out); L.Blocks)
    biasBackwardKernel<<<L.Blocks, L.Threads, 0, S>>>(DBias, DY, Rows, Out);
}

} // namespace sp::cuda
