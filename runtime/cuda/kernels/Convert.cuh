//===- Convert.cuh - float32 to and from bfloat16 and half ------*- CUDA -*-===//
//
// Reference (runtime/cpu/kernels/Convert.cpp, widenRange and narrowRange; the rules
// of ir/Float16.h), per element:
//   widen,  bf16: bits << 16 (exact)
//           f16:  normal (e + 112) << 23 | m << 13; exponent 31: inf/nan;
//                 exponent 0: m * 2^-24 (exact), the sign kept
//   narrow, bf16: (b + 0x7fff + ((b >> 16) & 1)) >> 16, a nan kept quiet
//           f16:  round to nearest even; below 2^-14 through |x| + 0.5f;
//                 from 65520 up infinity; nan 0x7e00
// The same integer operations and the same one float addition (round to
// nearest, no flush to zero; eight elements a thread where they are
// aligned), so the bits are the CPU's (widenBits and
// narrowBits in Common.cuh, which the kernels taking Elems also use). The
// CUDA backend's mixed-precision path runs an instruction that touches a
// 16-bit buffer on float32 copies made by these (Dispatch.cpp,
// dispatchMixed), as the CPU backend does, unless its kernel reads and
// writes the 16-bit buffers in place (MixedPlan.h, runsIn16Bit).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"
#include "runtime/cuda/kernels/FastVectors.cuh"

namespace sp::cuda {
namespace {

__global__ void widen16Kernel(float *Y, const uint16_t *X, int64_t N,
                              bool Bf16) {
  SP_GRID_LOOP(I, N) Y[I] = widenBits(X[I], Bf16);
}

__global__ void narrow16Kernel(uint16_t *Y, const float *X, int64_t N,
                               bool Bf16) {
  SP_GRID_LOOP(I, N) Y[I] = narrowBits(X[I], Bf16);
}

/// Y (of storage To) = X (of storage From), eight elements a thread.
template <Storage From, Storage To>
__global__ void convertOctKernel(Elems Y, Elems X, int64_t Octs) {
  SP_GRID_LOOP(O, Octs) {
    float V[8];
    load8<From>(X, O, V);
    store8<To>(Y, O, V);
  }
}

/// Y = X, one side float32 and the other 16-bit (Half, of storage K),
/// eight elements a thread: false (nothing queued) unless N is a multiple
/// of eight and both pointers 16-byte aligned.
bool convertOcts(float *F, uint16_t *Half, Storage K, bool Widen, int64_t N,
                 cudaStream_t S) {
  if (N % 8 || reinterpret_cast<uintptr_t>(F) % 16 ||
      reinterpret_cast<uintptr_t>(Half) % 16)
    return false;
  Elems FE(F), HE(Half, K);
  if (Launch L = elementwiseLaunch(N / 8); L.Blocks)
    withStorage(K, [&](auto ST) {
      if (Widen)
        SP_LAUNCH((convertOctKernel<ST, Storage::F32>), L.Blocks, L.Threads, 0,
                  S, FE, HE, N / 8);
      else
        SP_LAUNCH((convertOctKernel<Storage::F32, ST>), L.Blocks, L.Threads, 0,
                  S, HE, FE, N / 8);
    });
  return true;
}

} // namespace

void widen16(float *Y, const uint16_t *X, int64_t N, bool Bf16,
             cudaStream_t S) {
  if (convertOcts(Y, const_cast<uint16_t *>(X),
                  Bf16 ? Storage::BF16 : Storage::F16, true, N, S))
    return;
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    SP_LAUNCH(widen16Kernel, L.Blocks, L.Threads, 0, S, Y, X, N, Bf16);
}

void narrow16(uint16_t *Y, const float *X, int64_t N, bool Bf16,
              cudaStream_t S) {
  if (convertOcts(const_cast<float *>(X), Y,
                  Bf16 ? Storage::BF16 : Storage::F16, false, N, S))
    return;
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    SP_LAUNCH(narrow16Kernel, L.Blocks, L.Threads, 0, S, Y, X, N, Bf16);
}

} // namespace sp::cuda
