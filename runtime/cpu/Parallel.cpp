//===- Parallel.cpp - A parallel-for for the kernels ----------------------===//
#include "runtime/cpu/Parallel.h"
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace sp::cpu {
namespace {

/// How long a worker waits by spinning for the next job, and the caller for
/// the workers' parts, before sleeping on a condition variable. A training
/// step runs hundreds of kernels a few microseconds to a millisecond apart;
/// a futex sleep and wake-up costs tens of microseconds each time, so
/// spinning through the short gaps is what keeps small kernels worth
/// splitting.
constexpr std::chrono::microseconds SpinTime(200);

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// Spins until Ready() holds (true) or SpinTime has passed (false).
template <typename F> bool spinUntil(F &&Ready) {
  auto Start = std::chrono::steady_clock::now();
  while (true) {
    for (int I = 0; I < 64; ++I) {
      if (Ready())
        return true;
      cpuRelax();
    }
    if (std::chrono::steady_clock::now() - Start > SpinTime)
      return Ready();
  }
}

/// Jobs are published under a sequence number, a seqlock: the caller makes
/// Generation odd, writes the job's part count and size, and makes it even
/// again, the job's number. Workers spin, then sleep, until the generation
/// changes, read the job between two reads of an equal, even generation,
/// run their range and count down Pending; the caller runs the first range
/// and waits for Pending to reach 0 the same way.
///
/// A worker not taking part in a job is not waited for, so the caller may
/// already be writing the next job while such a worker still reads this
/// one: the odd generation is what tells it, where a single increment after
/// the writes would let it take the next job's part count for this job's,
/// run a part twice and count Pending below zero, leaving the caller waiting
/// forever. Workers that take part are waited for, so the job stays put
/// while they run it. Sleeping and waking use the Dekker pattern on seq_cst
/// atomics: a sleeper registers (Sleepers, CallerWaiting) and then re-checks
/// under the mutex; the other side changes the state and then looks for
/// sleepers.
class Pool {
public:
  ~Pool() { resize(1); }

  void resize(int N) {
    {
      std::lock_guard<std::mutex> L(M);
      Stop.store(true);
      Generation.fetch_add(2);
    }
    Wake.notify_all();
    for (std::thread &T : Workers)
      T.join();
    Workers.clear();
    Stop.store(false);
    Threads = std::max(1, N);
    // New workers start at the current generation: no earlier job is theirs.
    uint64_t G = Generation.load();
    for (int I = 1; I < Threads; ++I)
      Workers.emplace_back([this, I, G] { work(I, G); });
  }

  int threads() const { return Threads; }

  void run(int64_t N, int64_t Grain,
           llvm::function_ref<void(int64_t, int64_t)> Body) {
    int T = int(std::min<int64_t>(Threads, N / std::max<int64_t>(Grain, 1)));
    std::unique_lock<std::mutex> Busy(RunMutex, std::try_to_lock);
    if (T < 2 || !Busy.owns_lock()) {
      Body(0, N);
      return;
    }
    // Odd while the job is written: a worker still reading the last one
    // sees that it changed.
    Generation.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    Job = Body;
    JobN.store(N, std::memory_order_relaxed);
    JobParts.store(T, std::memory_order_relaxed);
    Pending.store(T - 1, std::memory_order_relaxed);
    Generation.fetch_add(1); // even again, seq_cst: publishes the job
    if (Sleepers.load() > 0) {
      { std::lock_guard<std::mutex> L(M); }
      Wake.notify_all();
    }
    Body(0, N / T);
    if (spinUntil([&] { return Pending.load(std::memory_order_acquire) == 0; }))
      return;
    std::unique_lock<std::mutex> L(M);
    CallerWaiting.store(true);
    Done.wait(L, [&] { return Pending.load() == 0; });
    CallerWaiting.store(false);
  }

private:
  void work(int Index, uint64_t Seen) {
    while (true) {
      uint64_t G = Generation.load(std::memory_order_acquire);
      if (G == Seen) {
        if (spinUntil([&] {
              return Generation.load(std::memory_order_acquire) != Seen;
            }))
          continue;
        std::unique_lock<std::mutex> L(M);
        Sleepers.fetch_add(1);
        Wake.wait(L, [&] { return Generation.load() != Seen; });
        Sleepers.fetch_sub(1);
        continue;
      }
      if (G & 1) {
        cpuRelax(); // the caller is writing job G + 1
        continue;
      }
      if (Stop.load())
        return;
      int Parts = JobParts.load(std::memory_order_relaxed);
      int64_t N = JobN.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (Generation.load(std::memory_order_relaxed) != G)
        continue; // job G is over (not ours) or being replaced: read again
      Seen = G;
      if (Index >= Parts)
        continue;
      Job(N * Index / Parts, N * (Index + 1) / Parts);
      if (Pending.fetch_sub(1) == 1 && CallerWaiting.load()) {
        { std::lock_guard<std::mutex> L(M); }
        Done.notify_one();
      }
    }
  }

  std::mutex M, RunMutex;
  std::condition_variable Wake, Done;
  std::vector<std::thread> Workers;
  int Threads = 1;
  std::atomic<bool> Stop{false}, CallerWaiting{false};
  std::atomic<uint64_t> Generation{0};
  std::atomic<int> Sleepers{0}, Pending{0}, JobParts{0};
  std::atomic<int64_t> JobN{0};
  llvm::function_ref<void(int64_t, int64_t)> Job;
};

Pool &pool() {
  static Pool P;
  return P;
}

} // namespace

void setKernelThreads(int N) { pool().resize(N); }
int kernelThreads() { return pool().threads(); }

void parallelFor(int64_t N, int64_t Grain,
                 llvm::function_ref<void(int64_t, int64_t)> Body) {
  pool().run(N, Grain, Body);
}

} // namespace sp::cpu
