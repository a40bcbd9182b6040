//===- DeviceSelect.cpp - Which GPU a rank uses ---------------------------===//
//
// See DeviceSelect.h.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/DeviceSelect.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include <cstring>
#include <unistd.h>

using namespace llvm;

namespace sp::cuda {

ArrayRef<const char *> localRankVariables() {
  static const char *const Vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK",
                                     "SLURM_LOCALID", "MPI_LOCALRANKID"};
  return Vars;
}

Expected<std::optional<LocalRank>> localRankFromEnvironment(EnvLookup Env) {
  for (const char *Var : localRankVariables()) {
    const char *V = Env(Var);
    if (!V)
      continue;
    unsigned long long R;
    if (StringRef(V).trim().getAsInteger(10, R) || R > 1u << 20)
      return createStringError(
          inconvertibleErrorCode(),
          "--device cuda: %s='%s' is not a local rank (a non-negative "
          "integer); fix the launcher's environment or unset it",
          Var, V);
    return std::optional<LocalRank>(LocalRank{int(R), Var});
  }
  return std::optional<LocalRank>();
}

int localRankFromHosts(ArrayRef<std::string> Hosts, int Rank) {
  int Local = 0;
  for (int R = 0; R < Rank; ++R)
    Local += Hosts[R] == Hosts[Rank];
  return Local;
}

Expected<LocalRank> findLocalRank(EnvLookup Env, Communicator *World) {
  auto FromEnv = localRankFromEnvironment(Env);
  if (!FromEnv)
    return FromEnv.takeError();
  if (*FromEnv)
    return **FromEnv;
  if (!World || World->size() == 1)
    return LocalRank{0, "a single rank"};
  // Fixed-size host names, gathered rank-major.
  constexpr int64_t NameBytes = 256;
  std::vector<char> Mine(NameBytes, 0);
  if (gethostname(Mine.data(), NameBytes - 1) != 0)
    return createStringError(inconvertibleErrorCode(),
                             "--device cuda: gethostname failed: %s",
                             std::strerror(errno));
  std::vector<int64_t> Packed(NameBytes / 8), All;
  std::memcpy(Packed.data(), Mine.data(), NameBytes);
  All.resize(Packed.size() * World->size());
  if (auto E = World->allGather(All.data(), Packed.data(),
                                int64_t(Packed.size()), CommType::I64))
    return E;
  std::vector<std::string> Hosts;
  for (int R = 0; R < World->size(); ++R) {
    const char *Name =
        reinterpret_cast<const char *>(All.data() + R * Packed.size());
    Hosts.emplace_back(Name, strnlen(Name, NameBytes));
  }
  return LocalRank{localRankFromHosts(Hosts, World->rank()), "host names"};
}

Expected<int> chooseDevice(const LocalRank &Local, int DeviceCount,
                           std::optional<int> Requested) {
  if (DeviceCount <= 0)
    return createStringError(inconvertibleErrorCode(), "%s",
                             noDeviceMessage("0 devices").c_str());
  if (Requested) {
    if (*Requested < 0 || *Requested >= DeviceCount)
      return createStringError(
          inconvertibleErrorCode(),
          "--device cuda:%d: this machine shows %d CUDA device(s), 0 to %d",
          *Requested, DeviceCount, DeviceCount - 1);
    return *Requested;
  }
  if (Local.Rank >= DeviceCount)
    return createStringError(
        inconvertibleErrorCode(),
        "--device cuda: local rank %d (from %s) has no GPU: this node shows "
        "%d CUDA device(s); start at most %d rank(s) per node",
        Local.Rank, Local.Source.c_str(), DeviceCount, DeviceCount);
  return Local.Rank;
}

std::string noDeviceMessage(StringRef What) {
  return formatv("--device cuda: no CUDA device is visible "
                 "(cudaGetDeviceCount: {0}); run on a machine with an NVIDIA "
                 "GPU or use --device cpu",
                 What)
      .str();
}

double gpuPeakFlops(int Major, int Minor, int SMs, double ClockKHz,
                    StringRef Dtype, bool TF32) {
  struct Arch {
    int Major, Minor;
    double F32, TF32, F16, BF16; // FLOPs per SM per clock
  };
  static const Arch Table[] = {
      {7, 0, 128, 0, 1024, 0},       {8, 0, 128, 1024, 2048, 2048},
      {8, 6, 256, 512, 1024, 1024},  {8, 9, 256, 512, 1024, 1024},
      {9, 0, 256, 2048, 4096, 4096}, {10, 0, 256, 4096, 8192, 8192},
  };
  for (const Arch &A : Table) {
    if (A.Major != Major || A.Minor != Minor)
      continue;
    double PerClock = Dtype == "f32"    ? (TF32 ? A.TF32 : A.F32)
                      : Dtype == "f16"  ? A.F16
                      : Dtype == "bf16" ? A.BF16
                                        : 0;
    return double(SMs) * ClockKHz * 1e3 * PerClock;
  }
  return 0;
}

} // namespace sp::cuda
