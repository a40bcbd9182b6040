//===- CudaEmulator.h - CUDA kernel source run on the CPU --------*- C++ -*-===//
//
// Runs the CUDA backend's kernel source (runtime/cuda/kernels/*.cuh) on the
// CPU, so that a kernel's indexing, barriers, warp shuffles and shared
// memory are tested where no GPU is: include this header first, then the
// .cuh file, in a translation unit the host compiler builds.
//
// The execution model, emulated:
//   - a launch runs its blocks one after another; a block's threads are
//     fibers of one OS thread (their own stacks). Each warp in turn runs as far
//     as it can, to the block's next barrier (__syncthreads,
//     __syncthreads_and) or its end, its lanes in turn, each to the warp's
//     next shuffle; then the next warp. A barrier releases when every
//     thread of the block (a shuffle: of the warp) has reached it. Warps
//     and lanes run in ascending order or, with setReverseOrder,
//     descending, so that a read of another thread's shared-memory write
//     without a barrier between sees the old value in one of the two
//     orders. A launch whose first block reaches no barrier and no shuffle
//     runs its other blocks' threads as plain calls, one after another, in
//     the same order (most kernels: the context switches were most of the
//     emulator's time); a thread that does reach one there aborts;
//   - shared memory: a kernel's static __shared__ arrays are static
//     variables (the blocks run one at a time); its dynamic shared memory
//     (SP_DYNAMIC_SHARED) is a buffer filled with NaN bytes at each block,
//     so a read of a slot no thread wrote is seen;
//   - a barrier no thread can pass (some threads waiting at one barrier,
//     the others at another, or finished) aborts with a message;
//   - the float intrinsics are the IEEE operations they name (__fmaf_rn:
//     std::fma, __fmul_rn: a * b with contraction off), expf and logf the C
//     library's (not CUDA's: a few units of rounding apart).
// Streams are ignored (every launch runs to completion when it is made),
// unless SP_EMULATED_STREAMS is defined: then launches are queued on their
// streams, which EmulatedRuntime.cpp runs. cudaFuncSetAttribute is ignored.
// Each OS thread runs its own launches (thread ranks each run theirs). Grids
// and blocks are one-dimensional in threads (blockDim.y = blockDim.z = 1);
// grids may be three-dimensional.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TESTS_GPU_EMULATOR_CUDAEMULATOR_H
#define SP_TESTS_GPU_EMULATOR_CUDAEMULATOR_H

#include <cuda_runtime_api.h> // dim3, uint3, float4, uchar4, cudaStream_t

// The CUDA headers give the qualifiers attributes the host compiler does
// not know: here they are nothing.
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#undef __restrict__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
// Static locals: shared by a block's fibers, and the blocks run one at a
// time (on each OS thread: thread ranks run kernels side by side).
#define __shared__ static thread_local

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <ucontext.h>
#include <utility>
#include <vector>

namespace sp::emu {

// A fiber's saved context. On x86-64 (without sanitizers, which follow
// stacks through ucontext only) a switch saves the callee-saved registers,
// MXCSR and the x87 control word on the stack it leaves and loads those of
// the stack it enters: no system call, where swapcontext makes one (to
// save the signal mask) and was most of the emulator's time.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) &&                   \
    !defined(__SANITIZE_THREAD__)
struct Context {
  void *Sp = nullptr;
};
/// Saves the running context in *From, resumes To.
__attribute__((naked, noinline)) static void switchStacks(void **, void *) {
  asm("pushq %rbp\n\t"
      "pushq %rbx\n\t"
      "pushq %r12\n\t"
      "pushq %r13\n\t"
      "pushq %r14\n\t"
      "pushq %r15\n\t"
      "subq $8, %rsp\n\t"
      "stmxcsr (%rsp)\n\t"
      "fnstcw 4(%rsp)\n\t"
      "movq %rsp, (%rdi)\n\t"
      "movq %rsi, %rsp\n\t"
      "ldmxcsr (%rsp)\n\t"
      "fldcw 4(%rsp)\n\t"
      "addq $8, %rsp\n\t"
      "popq %r15\n\t"
      "popq %r14\n\t"
      "popq %r13\n\t"
      "popq %r12\n\t"
      "popq %rbx\n\t"
      "popq %rbp\n\t"
      "ret\n\t");
}
inline void swapTo(Context &From, Context &To) {
  switchStacks(&From.Sp, To.Sp);
}
/// C starts Entry on the Bytes of stack at Stack (Entry never returns).
inline void makeContext(Context &C, char *Stack, size_t Bytes,
                        void (*Entry)()) {
  uintptr_t Top = (reinterpret_cast<uintptr_t>(Stack) + Bytes) & ~uintptr_t(15);
  auto *Slot = reinterpret_cast<uint64_t *>(Top);
  Slot[-1] = 0;                                  // Entry's return address
  Slot[-2] = reinterpret_cast<uintptr_t>(Entry); // switchStacks' ret
  for (int R = 3; R <= 8; ++R)                   // rbp, rbx, r12-r15
    Slot[-R] = 0;
  uint32_t Mxcsr;
  uint16_t Fpucw;
  asm volatile("stmxcsr %0" : "=m"(Mxcsr));
  asm volatile("fnstcw %0" : "=m"(Fpucw));
  Slot[-9] = uint64_t(Mxcsr) | uint64_t(Fpucw) << 32;
  C.Sp = &Slot[-9];
}
#else
struct Context {
  ucontext_t U;
};
inline void swapTo(Context &From, Context &To) { swapcontext(&From.U, &To.U); }
inline void makeContext(Context &C, char *Stack, size_t Bytes,
                        void (*Entry)()) {
  getcontext(&C.U);
  C.U.uc_stack.ss_sp = Stack;
  C.U.uc_stack.ss_size = Bytes;
  C.U.uc_link = nullptr; // Entry never returns
  makecontext(&C.U, Entry, 0);
}
#endif

struct Fiber {
  Context Ctx;
  uint3 ThreadIdx;
  bool Started = false, Done = false;
};

struct Barrier {
  int Arrived = 0;
  unsigned Generation = 0;
  bool And = true, Result = true;
};

/// The block being run.
struct Block {
  dim3 GridDim, BlockDim;
  uint3 BlockIdx;
  std::vector<Fiber> Fibers;
  int Current = 0;
  Context Scheduler;
  std::function<void()> Body;
  Barrier All;
  std::vector<Barrier> Warps;
  std::vector<uint64_t> Slots; // a warp's shuffle values, 32 per warp
  std::vector<char> Shared;
  char *SharedAligned = nullptr;
  uint64_t Events = 0; // arrivals and finished threads: progress
  uint64_t Arrivals = 0; // at barriers and shuffles
  bool Direct = false;   // threads run as plain calls (see launch)
};

inline Block *&current() {
  static thread_local Block *B = nullptr;
  return B;
}
inline bool &reverseOrder() {
  static bool R = false;
  return R;
}
/// Fibers run in descending thread order from now on (or ascending).
inline void setReverseOrder(bool R) { reverseOrder() = R; }

inline Fiber &self() { return current()->Fibers[current()->Current]; }
inline void yield() {
  Block *B = current();
  swapTo(B->Fibers[B->Current].Ctx, B->Scheduler);
}

/// Waits at Bar until Expected threads have arrived; returns the AND of
/// their predicates.
inline bool arrive(Barrier &Bar, int Expected, bool Pred) {
  Block *B = current();
  if (B->Direct) {
    std::fprintf(stderr,
                 "CudaEmulator: thread %d of block (%u, %u, %u) reached a "
                 "barrier or shuffle, but no thread of the launch's first "
                 "block did\n",
                 B->Current, B->BlockIdx.x, B->BlockIdx.y, B->BlockIdx.z);
    std::abort();
  }
  ++B->Events;
  ++B->Arrivals;
  Bar.And = Bar.And && Pred;
  unsigned Gen = Bar.Generation;
  if (++Bar.Arrived == Expected) {
    Bar.Result = Bar.And;
    Bar.Arrived = 0;
    Bar.And = true;
    ++Bar.Generation;
    return Bar.Result;
  }
  while (Bar.Generation == Gen)
    yield();
  return Bar.Result;
}

inline int threadsPerBlock() {
  const Block *B = current();
  return int(B->BlockDim.x * B->BlockDim.y * B->BlockDim.z);
}
inline int warpOf() { return int(self().ThreadIdx.x) / 32; }
inline int laneOf() { return int(self().ThreadIdx.x) % 32; }
inline int warpSize(int W) {
  int N = threadsPerBlock() - 32 * W;
  return N < 32 ? N : 32;
}

inline void trampoline() {
  Block *B = current();
  B->Body();
  B->Fibers[B->Current].Done = true;
  ++B->Events;
  swapTo(B->Fibers[B->Current].Ctx, B->Scheduler); // never resumed
  std::abort();
}

// The scheduler's locals live across swapcontext (without the stack
// switch), which GCC treats as
// returning twice (as setjmp): they are not clobbered, since the scheduler
// runs nothing between saving its context and being resumed.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wclobbered"
/// Runs Kernel(Args...) over Grid blocks of Threads threads.
template <typename... Params, typename... Args>
void launch(dim3 Grid, dim3 Threads, size_t SharedBytes,
            void (*Kernel)(Params...), Args &&...A) {
  if (Threads.y != 1 || Threads.z != 1) {
    std::fprintf(stderr, "CudaEmulator: blocks are one-dimensional\n");
    std::abort();
  }
  const int N = int(Threads.x);
  constexpr size_t StackBytes = 256 * 1024;
  std::tuple<std::decay_t<Args>...> Copy(std::forward<Args>(A)...);
  // The fibers' stacks, kept from launch to launch on each OS thread.
  static thread_local std::vector<std::unique_ptr<char[]>> Stacks;
  while (Stacks.size() < size_t(N))
    Stacks.emplace_back(new char[StackBytes]);
  bool Direct = false;
  for (unsigned Z = 0; Z < Grid.z; ++Z)
    for (unsigned Y = 0; Y < Grid.y; ++Y)
      for (unsigned X = 0; X < Grid.x; ++X) {
        Block B;
        B.GridDim = Grid;
        B.BlockDim = Threads;
        B.BlockIdx = uint3{X, Y, Z};
        B.Fibers.resize(N);
        B.Warps.resize((N + 31) / 32);
        B.Slots.resize(B.Warps.size() * 32);
        B.Shared.assign(SharedBytes + 16, char(0xFF)); // NaN floats
        B.SharedAligned = B.Shared.data() +
                          (16 - reinterpret_cast<uintptr_t>(B.Shared.data()) %
                                    16) %
                              16;
        B.Body = [&] {
          std::apply([&](auto &...P) { Kernel(P...); }, Copy);
        };
        current() = &B;
        if (Direct) {
          // The first block reached no barrier and no shuffle: its threads
          // ran to their ends one at a time, and so do these, as plain
          // calls (a thread that does reach one aborts, in arrive).
          B.Direct = true;
          for (int K = 0; K < N; ++K) {
            const int T = reverseOrder() ? N - 1 - K : K;
            B.Fibers[T].ThreadIdx = uint3{unsigned(T), 0, 0};
            B.Current = T;
            B.Body();
          }
          current() = nullptr;
          continue;
        }
        // A thread's fiber is made when it first runs, on the OS thread's
        // T-th stack.
        auto Start = [&](int T) {
          Fiber &F = B.Fibers[T];
          F.ThreadIdx = uint3{unsigned(T), 0, 0};
          makeContext(F.Ctx, Stacks[T].get(), StackBytes, trampoline);
          F.Started = true;
        };
        // Each warp in turn runs as far as it can (to the block's next
        // barrier, or its end), its lanes in turn to each warp barrier:
        // a warp that gets ahead of the others is what exposes a missing
        // block barrier.
        const int Warps = int(B.Warps.size());
        for (int Alive = N; Alive > 0;) {
          const uint64_t Before = B.Events;
          for (int WK = 0; WK < Warps; ++WK) {
            const int W = reverseOrder() ? Warps - 1 - WK : WK;
            const int Lanes = warpSize(W);
            for (uint64_t Seen = ~uint64_t(0); Seen != B.Events;) {
              Seen = B.Events;
              for (int LK = 0; LK < Lanes; ++LK) {
                const int T = 32 * W + (reverseOrder() ? Lanes - 1 - LK : LK);
                if (B.Fibers[T].Done)
                  continue;
                if (!B.Fibers[T].Started)
                  Start(T);
                B.Current = T;
                swapTo(B.Scheduler, B.Fibers[T].Ctx);
              }
            }
          }
          Alive = 0;
          for (const Fiber &F : B.Fibers)
            Alive += !F.Done;
          if (Alive && B.Events == Before) {
            std::fprintf(stderr,
                         "CudaEmulator: block (%u, %u, %u) is stuck: %d "
                         "threads wait at barriers the others cannot reach\n",
                         X, Y, Z, Alive);
            std::abort();
          }
        }
        // A launch whose first block reached no barrier and no shuffle runs
        // its other blocks' threads as plain calls: the context switches
        // are most of the emulator's time.
        Direct = B.Arrivals == 0;
        current() = nullptr;
      }
}
#pragma GCC diagnostic pop

/// A value exchanged within a warp: every lane stores, then reads lane
/// Src's (its own where Src is outside its segment of Width lanes).
template <typename T> T exchange(T V, int Src) {
  static_assert(sizeof(T) <= 8, "shuffles of up to 8 bytes");
  Block *B = current();
  const int W = warpOf(), Lane = laneOf(), Size = warpSize(W);
  uint64_t Bits = 0;
  std::memcpy(&Bits, &V, sizeof(T));
  B->Slots[W * 32 + Lane] = Bits;
  arrive(B->Warps[W], Size, true);
  T R = V;
  if (Src >= 0 && Src < Size)
    std::memcpy(&R, &B->Slots[W * 32 + Src], sizeof(T));
  arrive(B->Warps[W], Size, true); // every lane has read
  return R;
}

} // namespace sp::emu

#define threadIdx (::sp::emu::self().ThreadIdx)
#define blockIdx (::sp::emu::current()->BlockIdx)
#define blockDim (::sp::emu::current()->BlockDim)
#define gridDim (::sp::emu::current()->GridDim)

inline void __syncthreads() {
  ::sp::emu::arrive(::sp::emu::current()->All, ::sp::emu::threadsPerBlock(),
                    true);
}
inline int __syncthreads_and(int P) {
  return ::sp::emu::arrive(::sp::emu::current()->All,
                           ::sp::emu::threadsPerBlock(), P != 0);
}
template <typename T>
inline T __shfl_xor_sync(unsigned, T V, int LaneMask, int Width = 32) {
  int Lane = ::sp::emu::laneOf(), Src = Lane ^ LaneMask;
  return ::sp::emu::exchange(V, Src / Width == Lane / Width ? Src : Lane);
}
template <typename T>
inline T __shfl_sync(unsigned, T V, int SrcLane, int Width = 32) {
  int Lane = ::sp::emu::laneOf();
  return ::sp::emu::exchange(V, Lane / Width * Width + SrcLane % Width);
}

inline float __fmaf_rn(float A, float B, float C) { return std::fma(A, B, C); }
inline float __fmul_rn(float A, float B) { return A * B; }
inline float __fadd_rn(float A, float B) { return A + B; }
inline float __fsub_rn(float A, float B) { return A - B; }
inline float __frcp_rn(float A) { return 1.0f / A; }
inline float __fdiv_rn(float A, float B) { return A / B; }
inline double __dadd_rn(double A, double B) { return A + B; }
inline double __dmul_rn(double A, double B) { return A * B; }
template <typename To, typename From> inline To emuBitCast(From F) {
  static_assert(sizeof(To) == sizeof(From));
  To T;
  std::memcpy(&T, &F, sizeof(To));
  return T;
}
inline float __int_as_float(int X) { return emuBitCast<float>(X); }
inline float __uint_as_float(unsigned X) { return emuBitCast<float>(X); }
inline int __float_as_int(float X) { return emuBitCast<int>(X); }
inline unsigned __float_as_uint(float X) { return emuBitCast<unsigned>(X); }
inline long long __double_as_longlong(double X) {
  return emuBitCast<long long>(X);
}
inline double __longlong_as_double(long long X) {
  return emuBitCast<double>(X);
}
inline uchar4 make_uchar4(unsigned char X, unsigned char Y, unsigned char Z,
                          unsigned char W) {
  uchar4 V;
  V.x = X;
  V.y = Y;
  V.z = Z;
  V.w = W;
  return V;
}
inline int atomicCAS(int *At, int Compare, int Value) {
  int Old = *At; // one OS thread runs every fiber
  if (Old == Compare)
    *At = Value;
  return Old;
}
template <typename K, typename A, typename V>
inline cudaError_t cudaFuncSetAttribute(K, A, V) {
  return cudaSuccess;
}
#define SP_DYNAMIC_SHARED(T, Name)                                             \
  T *Name = reinterpret_cast<T *>(::sp::emu::current()->SharedAligned)

#ifdef SP_EMULATED_STREAMS
// With EmulatedRuntime.cpp: a launch is queued on its stream, its
// arguments copied when it is made (as a launch's are), and the runtime's
// cudaMemsetAsync queues too.
#include "EmulatedRuntime.h"
namespace sp::emu {
template <typename... Params, typename... Args>
void launchOn(cudaStream_t S, dim3 Grid, dim3 Threads, size_t SharedBytes,
              void (*Kernel)(Params...), Args &&...A) {
  enqueue(S, [=, Copy = std::tuple<std::decay_t<Args>...>(
                     std::forward<Args>(A)...)] {
    std::apply(
        [&](const auto &...P) {
          launch(Grid, Threads, SharedBytes, Kernel, P...);
        },
        Copy);
  });
}
} // namespace sp::emu
#define SP_LAUNCH(Kernel, Grid, Block, Shared, Stream, ...)                    \
  ::sp::emu::launchOn((Stream), dim3(Grid), dim3(Block), (Shared), Kernel,     \
                      __VA_ARGS__)
#else
/// The runtime calls a launcher makes, on host memory (the stream ignored).
inline cudaError_t emuMemsetAsync(void *P, int V, size_t N, cudaStream_t) {
  std::memset(P, V, N);
  return cudaSuccess;
}
#define cudaMemsetAsync emuMemsetAsync
#define SP_LAUNCH(Kernel, Grid, Block, Shared, Stream, ...)                    \
  ((void)(Stream), ::sp::emu::launch(dim3(Grid), dim3(Block), (Shared),        \
                                     Kernel, __VA_ARGS__))
#endif

#endif // SP_TESTS_GPU_EMULATOR_CUDAEMULATOR_H
