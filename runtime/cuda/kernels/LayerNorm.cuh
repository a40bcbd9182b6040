//===- LayerNorm.cuh - LayerNorm forward and backward, bias grad -*- CUDA
//-*-===//
//
// Reference (runtime/cpu/kernels/LayerNorm.cpp), per row r of
// X[Rows, H], sums in double as the CPU's laneSum:
//   mu   = sum_j X[r,j] / H
//   var  = sum_j (X[r,j] - mu)^2 / H          (two passes)
//   s    = 1 / sqrt(var + eps)
//   Y    = float((X - mu) * s * gamma + beta)   (gamma/beta null: 1 / 0)
//   Mean[r] = float(mu), Rstd[r] = float(s)
// backward, g = DY * gamma, xhat = (X - mu) * s:
//   DX = float(s * (g - mean(g) - xhat * mean(g * xhat)))
//   DGamma[j] += float(sum_r DY xhat), DBeta[j] += float(sum_r DY)
//   in the CPU's column-sum order (runtime/cpu/Kernels.h, ColumnRows):
//   blocks of 64 rows summed in order from 0, one thread per block and
//   column, then the blocks' sums in order, one thread per column
// bias grad: DBias[j] += float(sum_r DY[r, j]) the same way.
//
// Rows are reduced by 8-lane groups that reproduce laneSum exactly, so the
// statistics and outputs are the CPU's bits. X, gamma, beta, Y, DY and DX
// share one storage (float32, or bf16/fp16 read and rounded in place:
// Elems); the statistics and the parameter gradients are float32.
//
// That is the Exact form (Numerics::Exact). The Fast form, float32 tree
// sums by whole warps or blocks per row with vectorised loads, and the
// parameter gradients by a deterministic two-stage float32 column sum, is
// in LayerNormFast.cuh; the launchers below choose by their Numerics.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"
#include "runtime/cuda/kernels/LayerNormFast.cuh"

namespace sp::cuda {
namespace {

template <Storage ST>
__global__ void layerNormKernel(Elems Y, float *Mean, float *Rstd, Elems X,
                                Elems Gamma, Elems Beta, int64_t Rows,
                                int64_t H, double Eps) {
  forLaneRows(Rows, [&](int64_t R, bool Active, int64_t RR) {
    Elems XR = at(X, RR * H);
    double Mu =
        laneSum(H, Active, [&](int64_t J) { return double(ldAs<ST>(XR, J)); }) /
        double(H);
    double Var = laneSum(H, Active, [&](int64_t J) {
                   double D = ldAs<ST>(XR, J) - Mu;
                   return D * D;
                 }) /
                 double(H);
    if (!Active)
      return;
    double S = 1.0 / sqrt(Var + Eps);
    Elems YR = at(Y, R * H);
    for (int64_t J = laneOf(); J < H; J += RowLanes) {
      if (Gamma.Data && Beta.Data) {
        stAs<ST>(YR, J, float((ldAs<ST>(XR, J) - Mu) * S * ldAs<ST>(Gamma, J) + ldAs<ST>(Beta, J)));
      } else {
        double V = (ldAs<ST>(XR, J) - Mu) * S;
        if (Gamma.Data)
          V *= ldAs<ST>(Gamma, J);
        if (Beta.Data)
          V += ldAs<ST>(Beta, J);
        stAs<ST>(YR, J, float(V));
      }
    }
    if (laneOf() == 0) {
      if (Mean)
        Mean[R] = float(Mu);
      if (Rstd)
        Rstd[R] = float(S);
    }
  });
}

template <Storage ST>
__global__ void layerNormBackwardDxKernel(Elems DX, Elems DY, Elems X,
                                          Elems Gamma, const float *Mean,
                                          const float *Rstd, int64_t Rows,
                                          int64_t H) {
  forLaneRows(Rows, [&](int64_t R, bool Active, int64_t RR) {
    Elems XR = at(X, RR * H), DYR = at(DY, RR * H);
    double Mu = Mean[RR], S = Rstd[RR];
    auto G = [&](int64_t J) {
      return Gamma.Data ? double(ldAs<ST>(DYR, J)) * ldAs<ST>(Gamma, J)
                        : double(ldAs<ST>(DYR, J));
    };
    double MeanG = laneSum(H, Active, G) / double(H);
    double MeanGX = laneSum(H, Active, [&](int64_t J) {
                      return G(J) * ((ldAs<ST>(XR, J) - Mu) * S);
                    }) /
                    double(H);
    if (!Active)
      return;
    Elems DXR = at(DX, R * H);
    for (int64_t J = laneOf(); J < H; J += RowLanes) {
      double XHat = (ldAs<ST>(XR, J) - Mu) * S;
      stAs<ST>(DXR, J, float(S * (G(J) - MeanG - XHat * MeanGX)));
    }
  });
}

/// Block K of column J's two sums (PartG, PartB at K H + J): the rows
/// [K ColumnRows, ...) in order, ColumnBatch rows' terms loaded first.
template <Storage ST>
__global__ void layerNormBackwardPartsKernel(double *PartG, double *PartB,
                                             Elems DY, Elems X,
                                             const float *Mean,
                                             const float *Rstd, int64_t Rows,
                                             int64_t H) {
  SP_GRID_LOOP(E, columnParts(Rows) * H) {
    int64_t J = E % H, R0 = (E / H) * ColumnRows;
    int64_t End = Rows - R0 < ColumnRows ? Rows : R0 + ColumnRows;
    double SG = 0, SB = 0;
    int64_t R = R0;
    for (; R + ColumnBatch <= End; R += ColumnBatch) {
      double G[ColumnBatch];
      float B[ColumnBatch];
#pragma unroll
      for (int K = 0; K < ColumnBatch; ++K) {
        double Mu = Mean[R + K], S = Rstd[R + K];
        B[K] = ldAs<ST>(DY, (R + K) * H + J);
        G[K] = B[K] * ((ldAs<ST>(X, (R + K) * H + J) - Mu) * S);
      }
#pragma unroll
      for (int K = 0; K < ColumnBatch; ++K) {
        SG += G[K];
        SB += B[K];
      }
    }
    for (; R < End; ++R) {
      double Mu = Mean[R], S = Rstd[R];
      float Dy = ldAs<ST>(DY, R * H + J);
      SG += Dy * ((ldAs<ST>(X, R * H + J) - Mu) * S);
      SB += Dy;
    }
    PartG[E] = SG;
    PartB[E] = SB;
  }
}

template <Storage ST>
__global__ void biasBackwardPartsKernel(double *Part, Elems DY, int64_t Rows,
                                        int64_t Out) {
  SP_GRID_LOOP(E, columnParts(Rows) * Out) {
    int64_t J = E % Out;
    Part[E] = columnPart(E / Out, Rows, [&](int64_t R) {
      return double(ldAs<ST>(DY, R * Out + J));
    });
  }
}

} // namespace

void layerNorm(Elems Y, float *Mean, float *Rstd, Elems X, Elems Gamma,
               Elems Beta, int64_t Rows, int64_t H, double Eps, Numerics N,
               cudaStream_t S) {
  if (N == Numerics::Fast)
    return layerNormFast(Y, Mean, Rstd, X, Gamma, Beta, Rows, H, Eps, S);
  if (Launch L = laneRowsLaunch(Rows); L.Blocks && H > 0)
    withStorage(X.Kind, [&](auto ST) {
      SP_LAUNCH(layerNormKernel<ST>, L.Blocks, L.Threads, 0, S, Y, Mean, Rstd,
                X, Gamma, Beta, Rows, H, Eps);
    });
}

void layerNormBackward(Elems DX, float *DGamma, float *DBeta, Elems DY, Elems X,
                       Elems Gamma, const float *Mean, const float *Rstd,
                       int64_t Rows, int64_t H, double *Scratch, Numerics N,
                       cudaStream_t S) {
  if (N == Numerics::Fast)
    return layerNormBackwardFast(DX, DGamma, DBeta, DY, X, Gamma, Mean, Rstd,
                                 Rows, H, reinterpret_cast<float *>(Scratch),
                                 S);
  if (DX)
    if (Launch L = laneRowsLaunch(Rows); L.Blocks && H > 0)
      withStorage(X.Kind, [&](auto ST) {
        SP_LAUNCH(layerNormBackwardDxKernel<ST>, L.Blocks, L.Threads, 0, S, DX,
                  DY, X, Gamma, Mean, Rstd, Rows, H);
      });
  if (!DGamma && !DBeta)
    return;
  int64_t Parts = columnParts(Rows);
  double *PartG = Scratch, *PartB = Scratch + Parts * H;
  if (Launch L = elementwiseLaunch(Parts * H); L.Blocks)
    withStorage(X.Kind, [&](auto ST) {
      SP_LAUNCH(layerNormBackwardPartsKernel<ST>, L.Blocks, L.Threads, 0, S,
                PartG, PartB, DY, X, Mean, Rstd, Rows, H);
    });
  if (DGamma)
    columnPartsSum(DGamma, PartG, Parts, H, S);
  if (DBeta)
    columnPartsSum(DBeta, PartB, Parts, H, S);
}

void biasBackward(float *DBias, Elems DY, int64_t Rows, int64_t Out,
                  double *Scratch, cudaStream_t S) {
  int64_t Parts = columnParts(Rows);
  if (Launch L = elementwiseLaunch(Parts * Out); L.Blocks)
    withStorage(DY.Kind, [&](auto ST) {
      SP_LAUNCH(biasBackwardPartsKernel<ST>, L.Blocks, L.Threads, 0, S, Scratch,
                DY, Rows, Out);
    });
  columnPartsSum(DBias, Scratch, Parts, Out, S);
}

} // namespace sp::cuda
