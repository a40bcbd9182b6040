//===- EmulatedCommon.h - What the emulated runtime's parts share -*- C++
//-*-===//
//
// Internal to the emulated CUDA runtime (EmulatedRuntime.h): its three
// parts, the CUDA runtime (EmulatedRuntime.cpp), NCCL (EmulatedNccl.cpp)
// and cuBLAS with cuBLASLt (EmulatedCublas.cpp), share its failure, its
// environment, and its waits, each of which gives up after
// SP_EMULATED_TIMEOUT seconds naming what every thread waited for.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TESTS_GPU_EMULATOR_EMULATEDCOMMON_H
#define SP_TESTS_GPU_EMULATOR_EMULATEDCOMMON_H

#include "EmulatedRuntime.h"
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

namespace sp::emu {

using Clock = std::chrono::steady_clock;

/// Prints Why as the emulation's and aborts.
[[noreturn]] void fail(const std::string &Why);

/// The environment variable Name as an integer of at least Min (Default
/// when unset).
long envInt(const char *Name, long Default, long Min);

/// How long any wait may take before it is taken for a deadlock.
std::chrono::seconds timeout();

/// What the calling thread waits for from now on (for a deadlock's
/// message), and that it no longer does.
void noteWait(const std::string &What);
void endWait();
/// What the other threads of this process wait for, a line each.
std::string otherWaits();

/// Waits on CV under Lock until Ready(); after the timeout, aborts naming
/// What and everything else waited for at the time.
template <typename F>
void waitFor(std::condition_variable &CV, std::unique_lock<std::mutex> &Lock,
             F &&Ready, const std::string &What) {
  if (Ready())
    return;
  noteWait(What);
  bool Done = CV.wait_for(Lock, timeout(), Ready);
  endWait();
  if (!Done)
    fail("waited " + std::to_string(timeout().count()) + " s for " + What +
         " (a deadlock?)" + otherWaits());
}

/// Which stream of its device S is (0: the first made), for logs.
int streamOrdinal(cudaStream_t S);

} // namespace sp::emu

#endif // SP_TESTS_GPU_EMULATOR_EMULATEDCOMMON_H
