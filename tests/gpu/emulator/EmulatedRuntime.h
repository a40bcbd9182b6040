//===- EmulatedRuntime.h - CUDA, NCCL and cuBLAS on the CPU ----*- C++ -*-===//
//
// EmulatedRuntime.cpp (the CUDA runtime), EmulatedNccl.cpp (NCCL) and
// EmulatedCublas.cpp (cuBLAS, cuBLASLt) define the functions the CUDA
// backend calls, over host memory and threads, so that the whole backend
// (runtime/cuda/CudaBackendImpl.h, its kernels through CudaEmulator.h) runs
// on the CPU: sp-gpu-emulated-tests is the GPU test
// suite (KernelTest.cpp, EndToEndTest.cpp) linked against it instead of
// libcudart, libnccl and libcublas.
//
// What is modelled, as the CUDA documentation states it:
//   - a stream is a queue that a worker thread of its own runs in order;
//     cudaEventRecord and cudaStreamWaitEvent order two streams (a wait
//     takes the event's latest record at the time of the call), and
//     nothing else does: work on two streams without an event between them
//     runs concurrently, on two threads. The legacy stream (null) runs at
//     the call, on the calling thread;
//   - device memory is host memory, filled with 0xFF bytes (float NaNs) by
//     cudaMalloc, so a read of memory nothing wrote shows; copies are
//     checked against their kind (a device pointer where the kind says
//     host, or the reverse, aborts); cudaMalloc, cudaFree and cudaFreeHost
//     first wait for all the device's streams (cudaFree does, cudaMalloc
//     may: either while an NCCL kernel waits for a peer's later work
//     hangs, so the emulation takes the stricter reading); cudaMallocAsync
//     and cudaFreeAsync (on the legacy stream only) do not wait;
//   - NCCL: a communicator per (unique id, rank); collectives match by
//     their order on each rank and check that the ranks agree on the op,
//     count and type; sums are taken in rank order. ncclSend completes only
//     when the peer's matching ncclRecv has taken the data, and a group's
//     operations run together (its sends posted first), so an order of
//     posting that deadlocks NCCL deadlocks here: every wait gives up after
//     SP_EMULATED_TIMEOUT seconds (default 300) with a message naming what
//     it waited for, and aborts;
//   - NCCL across processes (built with MPI): a process launched by mpirun
//     or srun among two or more is one rank with devices of its own, and a
//     communicator whose id another process made carries its operations as
//     MPI messages between the processes (ncclCommInitRank meets at the
//     id's maker; a collective sends each peer a header it checks and the
//     data; ncclSend is MPI_Issend), so that sp-run --comm mpi --device
//     cuda runs as on a cluster, NCCL bootstrap over MPI included. MPI is
//     then initialised before main with MPI_THREAD_MULTIPLE;
//   - cuBLAS: column-major GEMMs on OpenBLAS in float32; 16-bit operands
//     are widened exactly (their products are exact in float32, as on
//     tensor cores), TF32 mode rounds both operands to TF32 first.
//   - SP_EMULATED_DEVICES devices (default 8), of compute capability 9.0.
//
// What is not: the device's speed, its memory model beyond stream order,
// asynchronous errors, and NCCL's summation order (any order is NCCL's).
//
//===----------------------------------------------------------------------===//
#ifndef SP_TESTS_GPU_EMULATOR_EMULATEDRUNTIME_H
#define SP_TESTS_GPU_EMULATOR_EMULATEDRUNTIME_H

#include <cstdint>
#include <cuda_runtime_api.h>
#include <functional>

namespace sp::emu {

/// Runs Work on stream S after everything queued on S before it (S null:
/// the legacy stream, at once on the calling thread).
void enqueue(cudaStream_t S, std::function<void()> Work);

/// The Ordinal-th stream alive on each device (0: the first) runs each
/// piece of its work Microseconds late from now on (0: at once), so that
/// work on another stream that reads its results without an event between
/// them reads them before they are written, and work of its that reads
/// another stream's results reads them after they were overwritten.
void setStreamDelay(int Ordinal, int Microseconds);

/// How many cublasLtMatmul calls have run in this process, and how many
/// were refused for pointers less aligned than their algorithm was chosen
/// for (the heuristic assumes 256 bytes unless told).
int64_t ltMatmuls();
int64_t ltRefused();

} // namespace sp::emu

#endif // SP_TESTS_GPU_EMULATOR_EMULATEDRUNTIME_H
