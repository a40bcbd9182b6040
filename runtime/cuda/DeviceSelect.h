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
//  - the one-line error of a machine without a usable CUDA device.
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

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_DEVICESELECT_H
