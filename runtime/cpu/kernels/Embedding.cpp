//===- Embedding.cpp - Token embedding, forward and backward --------------===//
//
// Kernels.h, "1. Embedding": rows of the table gathered by id, and the
// gradient scattered back into it (accumulated, ids in order). The CUDA
// twin is runtime/cuda/kernels/Embedding.cuh.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/kernels/Common.h"

#include <cstring>

namespace sp::cpu {

using namespace detail;

//===----------------------------------------------------------------------===//
// 1. Embedding
//===----------------------------------------------------------------------===//

namespace {
Status checkIds(const int64_t *Ids, int64_t N, int64_t V) {
  for (int64_t I = 0; I < N; ++I)
    if (Ids[I] < 0 || Ids[I] >= V)
      return Status::error("embedding id out of range", I, Ids[I]);
  return Status::success();
}
} // namespace

template <typename T>
Status embedding(T *Y, const T *Table, const int64_t *Ids, int64_t N, int64_t V,
                 int64_t H) {
  checkSizes({N, V, H});
  if (Status S = checkIds(Ids, N, V); !S.ok())
    return S;
  for (int64_t I = 0; I < N; ++I)
    std::memcpy(Y + I * H, Table + Ids[I] * H, sizeof(T) * H);
  return Status::success();
}

template <typename T>
Status embeddingBackward(T *DTable, const T *DY, const int64_t *Ids, int64_t N,
                         int64_t V, int64_t H) {
  checkSizes({N, V, H});
  if (Status S = checkIds(Ids, N, V); !S.ok())
    return S;
  for (int64_t I = 0; I < N; ++I) {
    T *Row = DTable + Ids[I] * H;
    const T *G = DY + I * H;
    for (int64_t J = 0; J < H; ++J)
      Row[J] += G[J];
  }
  return Status::success();
}

#define SP_INSTANTIATE(T)                                                      \
  template Status embedding<T>(T *, const T *, const int64_t *, int64_t,       \
                               int64_t, int64_t);                              \
  template Status embeddingBackward<T>(T *, const T *, const int64_t *,        \
                                       int64_t, int64_t, int64_t);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
