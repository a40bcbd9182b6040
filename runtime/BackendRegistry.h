//===- BackendRegistry.h - The backends by --device name --------*- C++ -*-===//
//
// Where a plan can run, by name ("cpu", "cuda"): each backend registers an
// entry saying what it is, which flags of its own it takes, how to check
// that it can run on this machine, how to make one rank's backend, and what
// it says about how it runs a plan (the notes sp-run prints under its
// header: the CPU's bf16 kernels or its OpenBLAS core, the GPU's tensor
// cores and attention core). The training library (train/) picks the entry
// of --device and includes no backend's header.
//
// Registration is explicit, once per process, before the registry is read:
// the CPU backend (sp_runtime) is registered when the registry is first
// used; a tool that links the CUDA backend (sp_runtime_cuda) calls
// registerCudaBackend() first thing in main. (Static registration objects
// in static libraries are dropped by the linker when nothing refers to
// them; these calls are the references.)
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_BACKENDREGISTRY_H
#define SP_RUNTIME_BACKENDREGISTRY_H

#include "runtime/Backend.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sp {

struct Plan;

/// A flag of one backend's own (sp-run --tf32, --cuda-attention): given
/// with another --device, it is refused ("--tf32 is for --device cuda").
struct BackendFlag {
  std::string Name;
  std::string Help;
  /// The values it takes ("unfused", "blockwise"), the first the default;
  /// empty: a switch (given: "true").
  std::vector<std::string> Values;
  std::string ValueDesc;
};

/// What a backend factory gets on each rank.
struct BackendContext {
  /// N of --device NAME:N (unset for NAME alone).
  std::optional<int> DeviceIndex;
  /// The ranks are threads of this process (each must take its own
  /// device: the launcher's local rank is the whole process's).
  bool ThreadRanks = false;
  /// The job's world (null for one rank) and this rank's groups (as
  /// Executor's RunOptions takes them).
  Communicator *World = nullptr;
  Communicator *Tensor = nullptr, *Pipeline = nullptr, *Data = nullptr;
  Communicator *Context = nullptr; // the cp group (--cp), or null
  /// The backend's own flags that were given: name -> value.
  std::map<std::string, std::string> Flags;
  /// For a backend whose set-up is collective: called on every rank with
  /// the outcome of its local set-up, before its collective part; returns
  /// the outcome every rank agreed on. Unset: the rank's own.
  std::function<llvm::Error(llvm::Error)> AgreeBeforeCollectives;

  /// The value of the backend flag Name, or Default when it was not given.
  std::string flag(llvm::StringRef Name, llvm::StringRef Default = "") const;
};

/// What a backend says about how it runs a plan, for a run's log.
struct BackendNotes {
  /// Lines under the run's header ("bf16 compute: ...").
  std::vector<std::string> Lines;
  /// Added to the line that states the peak FLOP/s ("; note: OpenBLAS runs
  /// its ... kernels"); empty for none.
  std::string PeakNote;
};

struct BackendEntry {
  /// The --device name, and its part of the flag's help ("cpu (default)").
  std::string Name;
  std::string Description;
  /// What N means in --device NAME:N ("a GPU index"); empty: no N.
  std::string IndexMeaning;
  /// Its own flags.
  std::vector<BackendFlag> Flags;
  /// Empty when it runs float64 plans (sp-run --float64); else why not
  /// ("the CUDA kernels are float32").
  std::string NoFloat64Reason;
  /// Whether Backend::peakFlops() is the whole process's (its thread ranks
  /// share the kernel threads) rather than each rank's, and what it is,
  /// for the log ("this CPU's measured float32 GEMM rate").
  bool PeakIsPerProcess = false;
  std::string PeakSource;

  /// Once per process, before anything is read or written: success if it
  /// can run here, else a one-line error saying what to do. Unset: always.
  std::function<llvm::Error()> CheckAvailable;
  /// One rank's backend; every rank calls it (a collective when the
  /// backend's set-up is).
  std::function<llvm::Expected<std::unique_ptr<Backend>>(
      const BackendContext &)>
      Create;
  /// How it will run Plan (unset: nothing to say).
  std::function<BackendNotes(const Plan &, const BackendContext &)> Notes;
  /// The kernel threads of the process, shared by its ranks (unset: it has
  /// none of its own).
  std::function<void(int)> SetThreads;
};

/// A --device value: the entry, and N of NAME:N.
struct DeviceChoice {
  const BackendEntry *Entry = nullptr;
  std::optional<int> Index;
};

class BackendRegistry {
public:
  /// The process's registry; the CPU backend is in it from the start.
  static BackendRegistry &instance();

  /// Adds E; a second entry of a name already there replaces the first.
  void add(BackendEntry E);
  /// The entry named Name, or null.
  const BackendEntry *find(llvm::StringRef Name) const;
  /// Every entry, in the order they were registered.
  std::vector<const BackendEntry *> entries() const;
  /// The entry whose Flags has one named Flag, or null.
  const BackendEntry *ownerOfFlag(llvm::StringRef Flag) const;

  /// Reads a --device value, NAME or NAME:N; an error names the choices
  /// ("--device must be cpu, cuda or cuda:N (N a GPU index), got 'x'").
  llvm::Expected<DeviceChoice> parseDevice(llvm::StringRef Spec) const;
  /// The choices, "cpu, cuda or cuda:N", and their short form for a value
  /// description, "cpu|cuda[:N]".
  std::string deviceChoices() const;
  std::string deviceValueDesc() const;

  /// Gives every backend that has kernel threads of its own Threads.
  void setThreads(int Threads) const;

private:
  BackendRegistry() = default;
  std::vector<std::unique_ptr<BackendEntry>> Entries;
};

/// The backends' registration functions, each defined beside its backend:
/// the CPU backend's in sp_runtime (runtime/cpu/Register.cpp), called by
/// BackendRegistry::instance(); the CUDA backend's in sp_runtime_cuda
/// (runtime/cuda/Register.cpp), called by the tools that link it. Calling
/// one again does nothing.
void registerCpuBackend();
void registerCudaBackend();

} // namespace sp

#endif // SP_RUNTIME_BACKENDREGISTRY_H
