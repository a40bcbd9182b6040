//===- Parallel.cpp - A parallel-for for the elementwise kernels ----------===//
#include "runtime/cpu/Parallel.h"
#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace sp::cpu {
namespace {

/// Workers wait for a generation number to change, run their range of the
/// current job, and count down; the caller waits for the count to reach 0.
class Pool {
public:
  ~Pool() { resize(1); }

  void resize(int N) {
    {
      std::lock_guard<std::mutex> L(M);
      Stop = true;
      ++Generation;
    }
    Wake.notify_all();
    for (std::thread &T : Workers)
      T.join();
    Workers.clear();
    Stop = false;
    JobParts = 0;
    Threads = std::max(1, N);
    // New workers start at the current generation: no earlier job is theirs.
    for (int I = 1; I < Threads; ++I)
      Workers.emplace_back([this, I, G = Generation] { work(I, G); });
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
    {
      std::lock_guard<std::mutex> L(M);
      Job = Body;
      JobN = N;
      JobParts = T;
      Pending = T - 1;
      ++Generation;
    }
    Wake.notify_all();
    Body(0, N / T);
    std::unique_lock<std::mutex> L(M);
    Done.wait(L, [&] { return Pending == 0; });
  }

private:
  void work(int Index, uint64_t Seen) {
    while (true) {
      std::unique_lock<std::mutex> L(M);
      Wake.wait(L, [&] { return Generation != Seen; });
      Seen = Generation;
      if (Stop)
        return;
      if (Index >= JobParts)
        continue;
      auto Body = Job;
      int64_t Begin = JobN * Index / JobParts,
              End = JobN * (Index + 1) / JobParts;
      L.unlock();
      Body(Begin, End);
      L.lock();
      if (--Pending == 0)
        Done.notify_one();
    }
  }

  std::mutex M, RunMutex;
  std::condition_variable Wake, Done;
  std::vector<std::thread> Workers;
  int Threads = 1;
  bool Stop = false;
  uint64_t Generation = 0;
  llvm::function_ref<void(int64_t, int64_t)> Job;
  int64_t JobN = 0;
  int JobParts = 0, Pending = 0;
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
