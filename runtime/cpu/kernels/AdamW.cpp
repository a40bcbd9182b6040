//===- AdamW.cpp - Gradient norm and the AdamW update ---------------------===//
//
// Kernels.h, "13. Optimizer": the sum of squares of a gradient (chunks
// fixed by its size, so the thread count does not change it), torch's
// clipping coefficient, and the AdamW step in T with torch's scalars
// computed in double. The coefficient, the scalars and the element update
// are runtime/Numerics.h's, which the CUDA twin,
// runtime/cuda/kernels/AdamW.cuh, calls too.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/kernels/Common.h"

#include "runtime/Numerics.h"

#include <cmath>

namespace sp::cpu {

using namespace detail;
using namespace simd;

//===----------------------------------------------------------------------===//
// 13. Optimizer
//===----------------------------------------------------------------------===//

template <typename T> double sumSquares(const T *G, int64_t N) {
  checkSizes({N});
  // Chunks of SquaresChunk elements, each a laneSum, their sums added in
  // order: the chunks are fixed by N, so the threads (up to Group chunks a
  // call) do not change the result.
  constexpr int64_t Group = 64;
  auto Chunk = [&](int64_t C) {
    int64_t I0 = C * SquaresChunk, Len = std::min(SquaresChunk, N - I0);
    return laneSum(Len, [&](int64_t I) { return Acc(G[I0 + I]) * G[I0 + I]; });
  };
  int64_t Chunks = (N + SquaresChunk - 1) / SquaresChunk;
  if (Chunks <= 1)
    return Chunks ? Chunk(0) : 0.0;
  Acc Sum = 0;
  for (int64_t C0 = 0; C0 < Chunks; C0 += Group) {
    Acc Part[Group];
    int64_t Count = std::min(Group, Chunks - C0);
    parallelFor(Count, 1, [&](int64_t K0, int64_t K1) {
      for (int64_t K = K0; K < K1; ++K)
        Part[K] = Chunk(C0 + K);
    });
    for (int64_t K = 0; K < Count; ++K)
      Sum += Part[K];
  }
  return Sum;
}

template <typename T> T clipCoefficient(T TotalNorm, T MaxNorm) {
  return numerics::clipCoefficient(TotalNorm, MaxNorm);
}

namespace {

template <typename T>
SP_SIMD void adamwRange(T *__restrict P, const T *__restrict G,
                        T *__restrict M, T *__restrict V, int64_t N,
                        const numerics::AdamScalars<T> &C) {
  for (int64_t I = 0; I < N; ++I)
    numerics::adamwElement(P[I], G[I], M[I], V[I], C);
}

} // namespace

template <typename T>
void adamw(T *P, const T *G, T *M, T *V, int64_t N, double Lr, double Beta1,
           double Beta2, double Eps, double WeightDecay, double GradScale,
           int64_t Step) {
  checkSizes({N});
  SP_CPU_CHECK(Step >= 1, "adam steps count from 1");
  const auto C = numerics::adamScalars<T>(Lr, double(Step), Beta1, Beta2, Eps,
                                         WeightDecay, T(GradScale));
  parallelFor(N, 1 << 13, [&](int64_t I0, int64_t I1) {
    adamwRange(P + I0, G + I0, M + I0, V + I0, I1 - I0, C);
  });
}

#define SP_INSTANTIATE(T)                                                      \
  template double sumSquares<T>(const T *, int64_t);                           \
  template T clipCoefficient<T>(T, T);                                         \
  template void adamw<T>(T *, const T *, T *, T *, int64_t, double, double,    \
                         double, double, double, double, int64_t);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
