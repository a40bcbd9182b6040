//===- LaunchGeometry.h - Grid and block sizes of the CUDA kernels -*- C++ -*-===//
//
// How every kernel of runtime/cuda/kernels/ is launched, as plain constexpr
// host functions so that the CPU-side tests (tests/gpu/HostLogicTest.cpp)
// check them without a device. Three shapes:
//
//  - elementwise: grid-stride loops, 256 threads a block, the grid capped
//    (a kernel over N elements is correct for any grid: each thread walks
//    i = tid, tid + stride, ...);
//  - lane rows: 8 threads per row, 32 rows a block of 256. Thread k of a
//    row sums the elements j = k (mod 8) in order, and the 8 partial sums
//    are combined as ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)): exactly the CPU
//    kernels' laneSum (runtime/cpu/Simd.h), so the row reductions are
//    the CPU's bit for bit;
//  - columns: one thread per column summing its rows in order (the CPU's
//    column sums of bias, LayerNorm-parameter and embedding gradients).
//
// No size may launch an empty grid: a zero-element call launches nothing.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_LAUNCHGEOMETRY_H
#define SP_RUNTIME_CUDA_LAUNCHGEOMETRY_H

#include <cstdint>

namespace sp::cuda {

constexpr int BlockThreads = 256;
/// Lanes of a row reduction (the CPU's Lanes).
constexpr int RowLanes = 8;
constexpr int RowsPerBlock = BlockThreads / RowLanes;
/// The largest grid of the grid-stride kernels: enough blocks to fill an
/// H100 (132 SMs x 16 blocks of 256) many times over.
constexpr int64_t MaxBlocks = 65535;

struct Launch {
  int64_t Blocks = 0; // 0: nothing to launch
  int Threads = BlockThreads;
};

constexpr int64_t ceilDiv(int64_t A, int64_t B) { return (A + B - 1) / B; }

/// N independent elements, grid-stride.
constexpr Launch elementwiseLaunch(int64_t N) {
  if (N <= 0)
    return {0, BlockThreads};
  int64_t B = ceilDiv(N, BlockThreads);
  return {B < MaxBlocks ? B : MaxBlocks, BlockThreads};
}

/// Rows reduced by RowLanes threads each (row-stride over the grid).
constexpr Launch laneRowsLaunch(int64_t Rows) {
  if (Rows <= 0)
    return {0, BlockThreads};
  int64_t B = ceilDiv(Rows, RowsPerBlock);
  return {B < MaxBlocks ? B : MaxBlocks, BlockThreads};
}

/// One thread per column (column-stride over the grid).
constexpr Launch columnsLaunch(int64_t Columns) {
  return elementwiseLaunch(Columns);
}

/// The parameter gradients' column sums (LayerNorm's, RMSNorm's, the
/// bias's) in the CPU's order (runtime/cpu/Kernels.h, ColumnRows, the same
/// number): each column's rows in blocks of ColumnRows, each block summed
/// in order from 0 by its own thread (one thread per block and column), the
/// blocks' sums then added in order by one thread per column.
constexpr int64_t ColumnRows = 64;
constexpr int64_t columnParts(int64_t Rows) { return ceilDiv(Rows, ColumnRows); }

/// Blocks of the deterministic sum of squares: a fixed grid (so the
/// partial sums and their order depend only on N), at most SumBlocks.
constexpr int SumBlocks = 256;
constexpr Launch sumSquaresLaunch(int64_t N) {
  if (N <= 0)
    return {0, BlockThreads};
  int64_t B = ceilDiv(N, BlockThreads);
  return {B < SumBlocks ? B : SumBlocks, BlockThreads};
}

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_LAUNCHGEOMETRY_H
