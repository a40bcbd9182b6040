//===- Convert.cuh - float32 to and from bfloat16 and half ------*- CUDA -*-===//
//
// Reference (runtime/cpu/Kernels.cpp, widenRange and narrowRange; the rules
// of ir/Float16.h), per element:
//   widen,  bf16: bits << 16 (exact)
//           f16:  normal (e + 112) << 23 | m << 13; exponent 31: inf/nan;
//                 exponent 0: m * 2^-24 (exact), the sign kept
//   narrow, bf16: (b + 0x7fff + ((b >> 16) & 1)) >> 16, a nan kept quiet
//           f16:  round to nearest even; below 2^-14 through |x| + 0.5f;
//                 from 65520 up infinity; nan 0x7e00
// The same integer operations and the same one float addition (round to
// nearest, no flush to zero), so the bits are the CPU's. The CUDA backend's
// mixed-precision path runs every instruction that touches a 16-bit buffer
// on float32 copies made by these (CudaBackend.cpp, dispatchMixed), as the
// CPU backend does.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"

namespace sp::cuda {
namespace {

__global__ void widen16Kernel(float *Y, const uint16_t *X, int64_t N,
                              bool Bf16) {
  SP_GRID_LOOP(I, N) {
    uint32_t H = X[I];
    if (Bf16) {
      Y[I] = __uint_as_float(H << 16);
      continue;
    }
    uint32_t Sign = (H & 0x8000u) << 16, Exp = (H >> 10) & 0x1fu,
             Man = H & 0x3ffu;
    uint32_t Normal = Sign | (Exp + 127 - 15) << 23 | Man << 13;
    uint32_t Special = Sign | 0x7f800000u | Man << 13; // inf, nan
    // A subnormal (or zero) is Man 2^-24, exactly.
    uint32_t Sub = Sign | __float_as_uint(float(int32_t(Man)) * 0x1p-24f);
    Y[I] = __uint_as_float(Exp == 0 ? Sub : Exp == 31 ? Special : Normal);
  }
}

__global__ void narrow16Kernel(uint16_t *Y, const float *X, int64_t N,
                               bool Bf16) {
  SP_GRID_LOOP(I, N) {
    uint32_t B = __float_as_uint(X[I]);
    if (Bf16) {
      uint32_t Rounded = (B + 0x7fffu + ((B >> 16) & 1)) >> 16;
      Y[I] = uint16_t((B & 0x7fffffffu) > 0x7f800000u ? (B >> 16) | 0x40u
                                                       : Rounded);
      continue;
    }
    uint32_t Sign = (B >> 16) & 0x8000u, Abs = B & 0x7fffffffu;
    uint32_t Normal = (Abs + 0xc8000fffu + ((Abs >> 13) & 1)) >> 13;
    // Adding 0.5 aligns a subnormal half's bits with the float's mantissa
    // and rounds to nearest even (__fadd_rn: never contracted or flushed).
    uint32_t Sub = __float_as_uint(__fadd_rn(__uint_as_float(Abs), 0.5f)) -
                   0x3f000000u;
    uint32_t R = Abs < 0x38800000u ? Sub : Normal;
    R = Abs >= 0x477ff000u ? 0x7c00u : R;
    R = Abs >= 0x7f800000u ? (Abs > 0x7f800000u ? 0x7e00u : 0x7c00u) : R;
    Y[I] = uint16_t(Sign | R);
  }
}

} // namespace

void widen16(float *Y, const uint16_t *X, int64_t N, bool Bf16,
             cudaStream_t S) {
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    widen16Kernel<<<L.Blocks, L.Threads, 0, S>>>(Y, X, N, Bf16);
}

void narrow16(uint16_t *Y, const float *X, int64_t N, bool Bf16,
              cudaStream_t S) {
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    narrow16Kernel<<<L.Blocks, L.Threads, 0, S>>>(Y, X, N, Bf16);
}

} // namespace sp::cuda
