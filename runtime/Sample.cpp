//===- Sample.cpp - Drawing the next token from logits ---------------------===//
#include "runtime/Sample.h"
#include <algorithm>
#include <cassert>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

using namespace llvm;

namespace sp {

int64_t sampleToken(ArrayRef<float> Logits, int64_t Allowed,
                    double Temperature, int64_t TopK, double U) {
  int64_t N = std::min<int64_t>(Allowed, int64_t(Logits.size()));
  assert(N > 0 && "no token to draw");
  int64_t Best = 0;
  for (int64_t I = 1; I < N; ++I)
    if (Logits[I] > Logits[Best])
      Best = I;
  if (Temperature <= 0)
    return Best;
  // The K-th largest logit: those below it are out.
  double Floor = -std::numeric_limits<double>::infinity();
  if (TopK > 0 && TopK < N) {
    std::vector<float> Sorted(Logits.begin(), Logits.begin() + N);
    std::nth_element(Sorted.begin(), Sorted.begin() + (TopK - 1), Sorted.end(),
                     std::greater<float>());
    Floor = Sorted[TopK - 1];
  }
  std::vector<double> P(N, 0.0);
  double Max = Logits[Best], Sum = 0;
  for (int64_t I = 0; I < N; ++I)
    if (Logits[I] >= Floor && std::isfinite(Logits[I]))
      Sum += P[I] = std::exp((double(Logits[I]) - Max) / Temperature);
  double Target = U * Sum, Acc = 0;
  for (int64_t I = 0; I < N; ++I) {
    Acc += P[I];
    if (P[I] > 0 && Target < Acc)
      return I;
  }
  return Best; // U * Sum rounded up to Sum
}

} // namespace sp
