//===- CrossEntropy.cuh - Mean cross entropy and its gradient ---*- CUDA -*-===//
//
// Reference (runtime/cpu/kernels/CrossEntropy.cpp), Logits[N, V] of which
// the first ValidV columns count, C the rows whose target is not ignored:
//   m_n   = max_{j<ValidV} l[n, j];  lse_n = m_n + log(sum_j expD(l - m_n))
//   Loss  = float((sum_{n in C, in order} (lse_n - l[n, t_n])) / |C|), 0 if
//           C is empty
//   DLogits[n, j] = float(f * expD(l[n, j] - lse_n)), f = DLoss / |C|,
//           minus f at the target (float(f * (expD(.) - 1))), 0 past ValidV
//           and on ignored rows
//   a counted target outside [0, ValidV) is an error
// Row statistics are the CPU's lane order (Common.cuh); the loss's sum over
// rows is one thread walking the rows in order, as the CPU. Only log()
// differs from the CPU's (CUDA's double log is within 1 ulp, glibc's is
// correctly rounded in practice), far below float's resolution.
//
// The vocabulary-parallel form (CpuBackend's vocabParallelCrossEntropy):
// each rank holds columns [Start, Start + V), the first Mine of them real;
//   Max[n]    = max_{j<Mine} float l[n, j], then the group maximum
//   Sum[n]    = float(sum_{j<Mine} exp(double l - Max)), then the group sum
//   Target[n] = l[n, t_n - Start] if this rank holds it (else 0), summed
//   Loss      = float(sum_{n in C} (log Sum + Max - Target) / |C|)
//   DLogits   = float((exp(l - Max) / Sum - [Start + j == t_n]) DLoss/|C|)
// one thread per row walking the columns in order, as the CPU's loops (and
// std::exp, std::log there; CUDA's are within 1 ulp in double).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"

namespace sp::cuda {
namespace {

__device__ inline bool counted(const int64_t *Targets, int64_t R,
                               bool HasIgnore, int64_t Ignore) {
  return !HasIgnore || Targets[R] != Ignore;
}

/// Row R's target T and log-sum-exp Lse (every lane gets them), in
/// Logits[N, V] whose first ValidV columns count; R past the end reads row
/// 0 and is inactive. Bad: a counted target outside [0, ValidV); Active:
/// counted and in range (only there is Lse meaningful).
struct TargetRow {
  int64_t T;
  bool Bad, Active;
  const float *Row;
  double Lse;
};
__device__ inline TargetRow targetRow(const float *Logits,
                                      const int64_t *Targets, int64_t R,
                                      int64_t N, int64_t V, int64_t ValidV,
                                      bool HasIgnore, int64_t Ignore) {
  TargetRow Out;
  bool Counted = R < N && counted(Targets, R, HasIgnore, Ignore);
  int64_t RR = R < N ? R : 0;
  Out.T = Targets[RR];
  Out.Bad = Counted && (Out.T < 0 || Out.T >= ValidV);
  Out.Active = Counted && !Out.Bad;
  Out.Row = Logits + RR * V;
  const float *Row = Out.Row;
  double Max = double(
      laneMax(ValidV, Out.Active, [&](int64_t J) { return Row[J]; }));
  double Sum = laneSum(ValidV, Out.Active, [&](int64_t J) {
    return expD(double(Row[J]) - Max);
  });
  Out.Lse = Max + log(Sum);
  return Out;
}

/// *Loss = float((sum of Term(R) over the counted rows R, in order) / their
/// count), 0 without any; one thread.
template <typename F>
__device__ inline void countedMean(float *Loss, const int64_t *Targets,
                                   int64_t N, bool HasIgnore, int64_t Ignore,
                                   F &&Term) {
  if (globalThread() != 0)
    return;
  double Total = 0;
  int64_t Count = 0;
  for (int64_t R = 0; R < N; ++R)
    if (counted(Targets, R, HasIgnore, Ignore)) {
      Total += Term(R);
      ++Count;
    }
  *Loss = Count ? float(Total / double(Count)) : 0.0f;
}

/// The gradient's factor DLoss / |C| (Count: countTargetsKernel's), 0 when
/// no row counts.
__device__ inline double perCounted(const float *DLoss, const double *Count) {
  return *Count > 0 ? double(*DLoss) / *Count : 0.0;
}

__global__ void crossEntropyRowsKernel(double *RowLoss, const float *Logits,
                                       const int64_t *Targets, int64_t N,
                                       int64_t V, int64_t ValidV,
                                       bool HasIgnore, int64_t Ignore,
                                       DeviceError *Err) {
  forLaneRows(N, [&](int64_t R, bool InRange, int64_t) {
    const TargetRow Tr =
        targetRow(Logits, Targets, R, N, V, ValidV, HasIgnore, Ignore);
    if (laneOf() != 0 || !InRange)
      return;
    if (Tr.Bad)
      reportError(Err, CrossEntropyTargetOutOfRange, R, Tr.T);
    RowLoss[R] = Tr.Active ? Tr.Lse - double(Tr.Row[Tr.T]) : 0.0;
  });
}

__global__ void crossEntropyTotalKernel(float *Loss, const double *RowLoss,
                                        const int64_t *Targets, int64_t N,
                                        bool HasIgnore, int64_t Ignore) {
  countedMean(Loss, Targets, N, HasIgnore, Ignore,
              [&](int64_t R) { return RowLoss[R]; });
}

/// *Count = |C| (as a double; exact), one block.
__global__ void countTargetsKernel(double *Count, const int64_t *Targets,
                                   int64_t N, bool HasIgnore, int64_t Ignore) {
  __shared__ long long Part[BlockThreads];
  long long C = 0;
  for (int64_t R = threadIdx.x; R < N; R += blockDim.x)
    C += counted(Targets, R, HasIgnore, Ignore);
  Part[threadIdx.x] = C;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long Sum = 0;
    for (int K = 0; K < BlockThreads; ++K)
      Sum += Part[K];
    *Count = double(Sum);
  }
}

__global__ void crossEntropyBackwardKernel(float *DLogits, const float *Logits,
                                           const int64_t *Targets,
                                           const float *DLoss,
                                           const double *Count, int64_t N,
                                           int64_t V, int64_t ValidV,
                                           bool HasIgnore, int64_t Ignore,
                                           DeviceError *Err) {
  double Factor = perCounted(DLoss, Count);
  forLaneRows(N, [&](int64_t R, bool InRange, int64_t) {
    const TargetRow Tr =
        targetRow(Logits, Targets, R, N, V, ValidV, HasIgnore, Ignore);
    if (!InRange)
      return;
    float *DRow = DLogits + R * V;
    if (!Tr.Active) {
      for (int64_t J = laneOf(); J < V; J += RowLanes)
        DRow[J] = 0.0f;
      if (Tr.Bad && laneOf() == 0)
        reportError(Err, CrossEntropyTargetOutOfRange, R, Tr.T);
      return;
    }
    for (int64_t J = laneOf(); J < V; J += RowLanes) {
      if (J >= ValidV)
        DRow[J] = 0.0f;
      else if (J == Tr.T)
        DRow[J] = float(Factor * (expD(double(Tr.Row[J]) - Tr.Lse) - 1.0));
      else
        DRow[J] = float(Factor * expD(double(Tr.Row[J]) - Tr.Lse));
    }
  });
}

__global__ void vpMaxKernel(float *Max, const float *Logits,
                            const int64_t *Targets, int64_t N, int64_t V,
                            int64_t Mine, int64_t Valid, bool HasIgnore,
                            int64_t Ignore, DeviceError *Err) {
  SP_GRID_LOOP(R, N) {
    bool C = counted(Targets, R, HasIgnore, Ignore);
    if (C && (Targets[R] < 0 || Targets[R] >= Valid))
      reportError(Err, CrossEntropyTargetOutOfRange, R, Targets[R]);
    float M = -__int_as_float(0x7f800000);
    for (int64_t J = 0; J < Mine; ++J) {
      float X = Logits[R * V + J];
      M = M < X ? X : M;
    }
    Max[R] = M;
  }
}

__global__ void vpSumsKernel(float *Sum, float *Target, const float *Logits,
                             const float *Max, const int64_t *Targets,
                             int64_t N, int64_t V, int64_t Mine, int64_t Start,
                             bool HasIgnore, int64_t Ignore) {
  SP_GRID_LOOP(R, N) {
    double S = 0;
    for (int64_t J = 0; J < Mine; ++J)
      S += exp(double(Logits[R * V + J]) - Max[R]);
    Sum[R] = float(S);
    int64_t Col = Targets[R] - Start;
    Target[R] = counted(Targets, R, HasIgnore, Ignore) && Col >= 0 &&
                        Col < Mine
                    ? Logits[R * V + Col]
                    : 0.0f;
  }
}

__global__ void vpLossKernel(float *Loss, const float *Sum, const float *Max,
                             const float *Target, const int64_t *Targets,
                             int64_t N, bool HasIgnore, int64_t Ignore) {
  countedMean(Loss, Targets, N, HasIgnore, Ignore, [&](int64_t R) {
    return log(double(Sum[R])) + Max[R] - Target[R];
  });
}

__global__ void vpGradKernel(float *DLogits, const float *Logits,
                             const float *Max, const float *Sum,
                             const int64_t *Targets, const float *DLoss,
                             const double *Count, int64_t N, int64_t V,
                             int64_t Mine, int64_t Start, bool HasIgnore,
                             int64_t Ignore) {
  double Scale = perCounted(DLoss, Count);
  SP_GRID_LOOP(E, N * V) {
    int64_t R = E / V, J = E % V;
    if (!counted(Targets, R, HasIgnore, Ignore)) {
      DLogits[E] = 0.0f;
      continue;
    }
    double P = J < Mine ? exp(double(Logits[E]) - Max[R]) / Sum[R] : 0.0;
    if (Start + J == Targets[R])
      P -= 1;
    DLogits[E] = float(P * Scale);
  }
}

/// Scratch[0] = |C| for perCounted.
inline void countTargets(double *Scratch, const int64_t *Targets, int64_t N,
                         bool HasIgnore, int64_t Ignore, cudaStream_t S) {
  SP_LAUNCH(countTargetsKernel, 1, BlockThreads, 0, S, Scratch, Targets, N,
            HasIgnore, Ignore);
}

} // namespace

void vocabParallelMax(float *Max, const float *Logits, const int64_t *Targets,
                      int64_t N, int64_t V, int64_t Mine, int64_t Valid,
                      bool HasIgnore, int64_t Ignore, DeviceError *Err,
                      cudaStream_t S) {
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    SP_LAUNCH(vpMaxKernel, L.Blocks, L.Threads, 0, S, Max, Logits, Targets, N,
              V, Mine, Valid, HasIgnore, Ignore, Err);
}

void vocabParallelSums(float *Sum, float *Target, const float *Logits,
                       const float *Max, const int64_t *Targets, int64_t N,
                       int64_t V, int64_t Mine, int64_t Start, bool HasIgnore,
                       int64_t Ignore, cudaStream_t S) {
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    SP_LAUNCH(vpSumsKernel, L.Blocks, L.Threads, 0, S, Sum, Target, Logits, Max,
              Targets, N, V, Mine, Start, HasIgnore, Ignore);
}

void vocabParallelLoss(float *Loss, const float *Sum, const float *Max,
                       const float *Target, const int64_t *Targets, int64_t N,
                       bool HasIgnore, int64_t Ignore, cudaStream_t S) {
  SP_LAUNCH(vpLossKernel, 1, 32, 0, S, Loss, Sum, Max, Target, Targets, N,
            HasIgnore, Ignore);
}

void vocabParallelGrad(float *DLogits, const float *Logits, const float *Max,
                       const float *Sum, const int64_t *Targets,
                       const float *DLoss, int64_t N, int64_t V, int64_t Mine,
                       int64_t Start, bool HasIgnore, int64_t Ignore,
                       double *Scratch, cudaStream_t S) {
  if (N <= 0)
    return;
  countTargets(Scratch, Targets, N, HasIgnore, Ignore, S);
  if (Launch L = elementwiseLaunch(N * V); L.Blocks)
    SP_LAUNCH(vpGradKernel, L.Blocks, L.Threads, 0, S, DLogits, Logits, Max,
              Sum, Targets, DLoss, Scratch, N, V, Mine, Start, HasIgnore,
              Ignore);
}

void crossEntropy(float *Loss, const float *Logits, const int64_t *Targets,
                  int64_t N, int64_t V, int64_t ValidV, bool HasIgnore,
                  int64_t Ignore, double *Scratch, DeviceError *Err,
                  cudaStream_t S) {
  if (Launch L = laneRowsLaunch(N); L.Blocks) {
    SP_LAUNCH(crossEntropyRowsKernel, L.Blocks, L.Threads, 0, S, Scratch,
              Logits, Targets, N, V, ValidV, HasIgnore, Ignore, Err);
    SP_LAUNCH(crossEntropyTotalKernel, 1, 32, 0, S, Loss, Scratch, Targets, N,
              HasIgnore, Ignore);
  }
}

void crossEntropyBackward(float *DLogits, const float *Logits,
                          const int64_t *Targets, const float *DLoss,
                          int64_t N, int64_t V, int64_t ValidV, bool HasIgnore,
                          int64_t Ignore, double *Scratch, DeviceError *Err,
                          cudaStream_t S) {
  if (Launch L = laneRowsLaunch(N); L.Blocks) {
    countTargets(Scratch, Targets, N, HasIgnore, Ignore, S);
    SP_LAUNCH(crossEntropyBackwardKernel, L.Blocks, L.Threads, 0, S, DLogits,
              Logits, Targets, DLoss, Scratch, N, V, ValidV, HasIgnore, Ignore,
              Err);
  }
}

} // namespace sp::cuda
