//===- DeviceSelect.h - Which GPU a rank uses, and the no-GPU error -*- C++ -*-===//
//
// Host-side decisions of the CUDA backend, free of CUDA so that they build
// and are unit-tested everywhere (tests/gpu/HostLogicTest.cpp):
//
//  - the local rank of a process on its node, from the launcher's
//    environment: OMPI_COMM_WORLD_LOCAL_RANK (mpirun of Open MPI) wins, then
//    SLURM_LOCALID (srun), then MPI_LOCALRANKID (MPICH's Hydra); a variable
//    that is set but not a non-negative integer is an error naming it;
//  - without any of them, the local rank from the world communicator: every
//    rank's host name gathered, the local rank is the number of lower ranks
//    on the same host (what an MPI shared-memory split gives, for threads
//    and MPI alike);
//  - the device of a local rank: local rank r uses device r of the ones
//    visible (CUDA_VISIBLE_DEVICES applies); more ranks on a node than
//    devices is an error saying how many to start;
//  - the one-line error of a machine without a usable CUDA device;
//  - a GPU's dense GEMM peak from its compute capability, SM count and
//    clock (the denominator of sp-run's MFU).
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_DEVICESELECT_H
#define SP_RUNTIME_CUDA_DEVICESELECT_H

#include "runtime/comm/Communicator.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"
#include <optional>
#include <string>

namespace sp::cuda {

/// Reads an environment variable (nullptr when unset); getenv in
/// production, a table in the tests.
using EnvLookup = llvm::function_ref<const char *(const char *)>;

/// The local rank the launcher set, and the variable it came from.
struct LocalRank {
  int Rank = 0;
  std::string Source; // e.g. "OMPI_COMM_WORLD_LOCAL_RANK", "host names"
};

/// The launcher variables, in the order they are tried.
llvm::ArrayRef<const char *> localRankVariables();

/// The local rank from the environment, std::nullopt when no launcher
/// variable is set, an error when the first one set is malformed.
llvm::Expected<std::optional<LocalRank>> localRankFromEnvironment(EnvLookup Env);

/// The number of ranks before Rank whose host is Hosts[Rank].
int localRankFromHosts(llvm::ArrayRef<std::string> Hosts, int Rank);

/// The environment's local rank, else the host names gathered over World (a
/// collective over World; a single-rank job without one is local rank 0).
llvm::Expected<LocalRank> findLocalRank(EnvLookup Env, Communicator *World);

/// The device a local rank uses: Requested when given (--device cuda:N),
/// else the local rank; an error when there is no such device.
llvm::Expected<int> chooseDevice(const LocalRank &Local, int DeviceCount,
                                 std::optional<int> Requested);

/// "--device cuda: no CUDA device is visible (cudaGetDeviceCount: WHAT); run
/// on a machine with an NVIDIA GPU or use --device cpu".
std::string noDeviceMessage(llvm::StringRef What);

/// The dense GEMM peak (FLOP/s) of a GPU of compute capability
/// Major.Minor with SMs multiprocessors at ClockKHz (the driver's
/// cudaDevAttrClockRate, its highest clock), for GEMMs with Dtype inputs:
/// "f32" on the FP32 cores, or on the tensor cores as TF32 when TF32;
/// "bf16" and "f16" on the tensor cores (float32 accumulation). It is SMs x
/// clock x the FLOPs one SM does per clock on that architecture:
///
///   sm     f32   tf32   f16/bf16     e.g.
///   7.0    128   -      1024 (f16)   V100: 80 x 1.53 GHz x 1024 = 125 T
///   8.0    128   1024   2048         A100: 108 x 1.41 GHz x 2048 = 312 T
///   8.6    256   512    1024         A10, A40
///   8.9    256   512    1024         L4, L40S
///   9.0    256   2048   4096         H100 SXM: 132 x 1.98 GHz x 4096 = 1.07 P
///   10.0   256   4096   8192         B200
///
/// (NVIDIA's data sheets quote the H100 at 989 TFLOP/s, at 1.83 GHz: at the
/// highest clock this is 8% above.) 0 for an architecture or a type not in
/// the table.
double gpuPeakFlops(int Major, int Minor, int SMs, double ClockKHz,
                    llvm::StringRef Dtype, bool TF32);

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_DEVICESELECT_H
