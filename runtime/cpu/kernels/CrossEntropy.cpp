//===- CrossEntropy.cpp - Mean cross entropy and its gradient -------------===//
//
// Kernels.h, "12. Cross entropy": per row the max and the log-sum-exp over
// the valid vocabulary (exp through expD of runtime/Numerics.h, the sum as
// laneSum's lanes), the loss the mean over the rows whose target counts.
// The CUDA twin is runtime/cuda/kernels/CrossEntropy.cuh.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/kernels/Common.h"

#include <cmath>

namespace sp::cpu {

using namespace detail;
using namespace simd;

//===----------------------------------------------------------------------===//
// 12. Cross entropy
//===----------------------------------------------------------------------===//

namespace {

/// Checks the sizes and targets; Counted is set to the number of rows whose
/// target is not IgnoreIndex.
Status checkCrossEntropy(const int64_t *Targets, int64_t N, int64_t V,
                         int64_t ValidV, std::optional<int64_t> IgnoreIndex,
                         int64_t &Counted) {
  if (N <= 0)
    return Status::error("cross entropy over no rows", -1, N);
  if (ValidV < 1 || ValidV > V)
    return Status::error("cross entropy valid vocabulary not in [1, V]", -1,
                         ValidV);
  Counted = 0;
  for (int64_t I = 0; I < N; ++I) {
    if (IgnoreIndex && Targets[I] == *IgnoreIndex)
      continue;
    if (Targets[I] < 0 || Targets[I] >= ValidV)
      return Status::error("cross entropy target out of range", I, Targets[I]);
    ++Counted;
  }
  return Status::success();
}

/// The row's max and log-sum-exp over its first ValidV entries.
template <typename T>
SP_SIMD void rowLogSumExp(const T *Row, int64_t ValidV, Acc &Max, Acc &Lse) {
  Max = Acc(rowMax(Row, ValidV));
  Acc Sum = laneSumBuffered(ValidV,
                            [&](int64_t J) { return expD(Acc(Row[J]) - Max); });
  Lse = Max + std::log(Sum);
}

/// DRow[j] = Factor * exp(Row[j] - Lse), j < ValidV.
template <typename T>
SP_SIMD void softmaxScaled(T *DRow, const T *Row, int64_t ValidV, Acc Lse,
                           Acc Factor) {
  for (int64_t J = 0; J < ValidV; ++J)
    DRow[J] = T(Factor * expD(Acc(Row[J]) - Lse));
}

} // namespace

template <typename T>
Status crossEntropy(T *Loss, const T *Logits, const int64_t *Targets, int64_t N,
                    int64_t V, int64_t ValidV,
                    std::optional<int64_t> IgnoreIndex) {
  int64_t Counted;
  if (Status S = checkCrossEntropy(Targets, N, V, ValidV, IgnoreIndex, Counted);
      !S.ok())
    return S;
  Acc Total = 0;
  for (int64_t R = 0; R < N; ++R) {
    if (IgnoreIndex && Targets[R] == *IgnoreIndex)
      continue;
    const T *Row = Logits + R * V;
    Acc Max, Lse;
    rowLogSumExp(Row, ValidV, Max, Lse);
    Total += Lse - Acc(Row[Targets[R]]);
  }
  // No counted target: 0 rather than torch's NaN (0 / 0).
  *Loss = Counted ? T(Total / Acc(Counted)) : T(0);
  return Status::success();
}

template <typename T>
Status crossEntropyBackward(T *DLogits, const T *Logits, const int64_t *Targets,
                            double DLoss, int64_t N, int64_t V, int64_t ValidV,
                            std::optional<int64_t> IgnoreIndex) {
  int64_t Counted;
  if (Status S = checkCrossEntropy(Targets, N, V, ValidV, IgnoreIndex, Counted);
      !S.ok())
    return S;
  const Acc Factor = Counted ? DLoss / Acc(Counted) : 0.0;
  parallelFor(N, std::max<int64_t>(1, (1 << 12) / V), [&](int64_t R0,
                                                          int64_t R1) {
    for (int64_t R = R0; R < R1; ++R) {
      const T *Row = Logits + R * V;
      T *DRow = DLogits + R * V;
      if (IgnoreIndex && Targets[R] == *IgnoreIndex) {
        std::fill(DRow, DRow + V, T(0));
        continue;
      }
      Acc Max, Lse;
      rowLogSumExp(Row, ValidV, Max, Lse);
      softmaxScaled(DRow, Row, ValidV, Lse, Factor);
      int64_t Tgt = Targets[R];
      DRow[Tgt] = T(Factor * (expD(Acc(Row[Tgt]) - Lse) - 1.0));
      std::fill(DRow + ValidV, DRow + V, T(0));
    }
  });
  return Status::success();
}

#define SP_INSTANTIATE(T)                                                      \
  template Status crossEntropy<T>(T *, const T *, const int64_t *, int64_t,    \
                                  int64_t, int64_t, std::optional<int64_t>);   \
  template Status crossEntropyBackward<T>(T *, const T *, const int64_t *,     \
                                          double, int64_t, int64_t, int64_t,   \
                                          std::optional<int64_t>);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
