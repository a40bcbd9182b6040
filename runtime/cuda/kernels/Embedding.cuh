//===- Embedding.cuh - Token embedding, forward and backward ---*- CUDA -*-===//
//
// Reference (runtime/cpu/kernels/Embedding.cpp, and
// CpuBackend's vocabulary-parallel form, Offset = rank * V):
//
//   for n < N: id = Ids[n] - Offset
//     if 0 <= id < V:  Y[n, :] = Table[id, :]
//     else:            Y[n, :] = 0 (vocabulary-parallel) or error
//   backward: for n < N in order, for j < H: DTable[id, j] += DY[n, j]
//
// The forward is one thread per element. The backward is one thread per
// column j walking the rows n in order (ColumnBatch rows loaded at a time),
// so each DTable element receives its additions in the CPU's order (no
// atomics: deterministic, bitwise equal).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"

namespace sp::cuda {
namespace {

__global__ void embeddingKernel(float *Y, const float *Table,
                                const int64_t *Ids, int64_t N, int64_t V,
                                int64_t H, int64_t Offset, bool OutsideIsZero,
                                DeviceError *Err) {
  SP_GRID_LOOP(E, N * H) {
    int64_t Row = E / H, J = E % H;
    int64_t Id = Ids[Row] - Offset;
    if (Id >= 0 && Id < V) {
      Y[E] = Table[Id * H + J];
    } else {
      Y[E] = 0.0f;
      if (!OutsideIsZero && J == 0)
        reportError(Err, EmbeddingIdOutOfRange, Row, Ids[Row]);
    }
  }
}

__global__ void embeddingBackwardKernel(float *DTable, const float *DY,
                                        const int64_t *Ids, int64_t N,
                                        int64_t V, int64_t H, int64_t Offset,
                                        bool OutsideIsZero, DeviceError *Err) {
  SP_GRID_LOOP(J, H) {
    // ColumnBatch rows' ids and gradients are loaded before their
    // additions, which stay in row order.
    int64_t Row = 0;
    for (; Row + ColumnBatch <= N; Row += ColumnBatch) {
      int64_t Id[ColumnBatch];
      float D[ColumnBatch];
#pragma unroll
      for (int K = 0; K < ColumnBatch; ++K) {
        Id[K] = Ids[Row + K] - Offset;
        D[K] = DY[(Row + K) * H + J];
      }
#pragma unroll
      for (int K = 0; K < ColumnBatch; ++K) {
        if (Id[K] >= 0 && Id[K] < V)
          DTable[Id[K] * H + J] += D[K];
        else if (!OutsideIsZero && J == 0)
          reportError(Err, EmbeddingIdOutOfRange, Row + K, Ids[Row + K]);
      }
    }
    for (; Row < N; ++Row) {
      int64_t Id = Ids[Row] - Offset;
      if (Id >= 0 && Id < V)
        DTable[Id * H + J] += DY[Row * H + J];
      else if (!OutsideIsZero && J == 0)
        reportError(Err, EmbeddingIdOutOfRange, Row, Ids[Row]);
    }
  }
}

} // namespace

void embedding(float *Y, const float *Table, const int64_t *Ids, int64_t N,
               int64_t V, int64_t H, int64_t Offset, bool OutsideIsZero,
               DeviceError *Err, cudaStream_t S) {
  Launch L = elementwiseLaunch(N * H);
  if (L.Blocks)
    SP_LAUNCH(embeddingKernel, L.Blocks, L.Threads, 0, S, Y, Table, Ids, N, V,
              H, Offset, OutsideIsZero, Err);
}

void embeddingBackward(float *DTable, const float *DY, const int64_t *Ids,
                       int64_t N, int64_t V, int64_t H, int64_t Offset,
                       bool OutsideIsZero, DeviceError *Err, cudaStream_t S) {
  Launch L = columnsLaunch(H);
  if (L.Blocks && N > 0)
    SP_LAUNCH(embeddingBackwardKernel, L.Blocks, L.Threads, 0, S, DTable, DY,
              Ids, N, V, H, Offset, OutsideIsZero, Err);
}

} // namespace sp::cuda
