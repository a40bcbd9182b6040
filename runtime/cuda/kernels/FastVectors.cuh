//===- FastVectors.cuh - 16-byte loads and stores of the fast kernels -*- CUDA
//-*-===//
//
// The fast (Numerics::Fast) kernels (softmax, GELU, the norms) and the
// bit-exact ones that move eight elements a thread move their operands
// as 16-byte vectors: Vec = 4 float32 or 8 bf16/fp16 elements per load and
// store, widened to float32 in registers. Vec = 1 is the scalar fallback
// (a row length or a pointer that is not a multiple of 16 bytes).
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_KERNELS_FASTVECTORS_CUH
#define SP_RUNTIME_CUDA_KERNELS_FASTVECTORS_CUH

#include "runtime/cuda/kernels/Common.cuh"
#include <cstdint>
#include <initializer_list>

namespace sp::cuda {
namespace {

/// The elements of one 16-byte vector of storage ST.
template <Storage ST> constexpr int vecWidth() {
  return ST == Storage::F32 ? 4 : 8;
}

/// Whether P is 16-byte aligned (the vector form's precondition).
inline bool aligned16(const void *P) {
  return reinterpret_cast<uintptr_t>(P) % 16 == 0;
}

/// Elements [V Vec, (V + 1) Vec) of E as float32.
template <Storage ST, int Vec>
__device__ inline void loadVec(Elems E, int64_t V, float (&O)[Vec]) {
  if constexpr (Vec == 1) {
    O[0] = ldAs<ST>(E, V);
  } else if constexpr (ST == Storage::F32) {
    static_assert(Vec == 4, "four floats in 16 bytes");
    float4 Q = static_cast<const float4 *>(E.Data)[V];
    O[0] = Q.x, O[1] = Q.y, O[2] = Q.z, O[3] = Q.w;
  } else {
    static_assert(Vec == 8, "eight halves in 16 bytes");
    uint4 Q = static_cast<const uint4 *>(E.Data)[V];
    unsigned W[4] = {Q.x, Q.y, Q.z, Q.w};
#pragma unroll
    for (int K = 0; K < 4; ++K) { // little-endian: the low half is first
      O[2 * K] = widenBits(uint16_t(W[K] & 0xffffu), ST == Storage::BF16);
      O[2 * K + 1] = widenBits(uint16_t(W[K] >> 16), ST == Storage::BF16);
    }
  }
}

/// Stores I (each rounded once to ST) as elements [V Vec, (V + 1) Vec).
template <Storage ST, int Vec>
__device__ inline void storeVec(Elems E, int64_t V, const float (&I)[Vec]) {
  if constexpr (Vec == 1) {
    stAs<ST>(E, V, I[0]);
  } else if constexpr (ST == Storage::F32) {
    float4 Q;
    Q.x = I[0], Q.y = I[1], Q.z = I[2], Q.w = I[3];
    static_cast<float4 *>(E.Data)[V] = Q;
  } else {
    unsigned W[4];
#pragma unroll
    for (int K = 0; K < 4; ++K)
      W[K] = unsigned(narrowBits(I[2 * K], ST == Storage::BF16)) |
             unsigned(narrowBits(I[2 * K + 1], ST == Storage::BF16)) << 16;
    uint4 Q;
    Q.x = W[0], Q.y = W[1], Q.z = W[2], Q.w = W[3];
    static_cast<uint4 *>(E.Data)[V] = Q;
  }
}

/// Eight consecutive elements of E from element 8 O on, as float32, and
/// back rounded once: one 16-byte vector of 16-bit storage, two of float32
/// (E's pointer 16-byte aligned). The bit-exact kernels that move eight
/// elements a thread (dropout's two Philox blocks, add, mul) use them.
template <Storage ST>
__device__ inline void load8(Elems E, int64_t O, float (&V)[8]) {
  if constexpr (ST == Storage::F32) {
    float Lo[4], Hi[4];
    loadVec<ST, 4>(E, 2 * O, Lo);
    loadVec<ST, 4>(E, 2 * O + 1, Hi);
#pragma unroll
    for (int K = 0; K < 4; ++K)
      V[K] = Lo[K], V[4 + K] = Hi[K];
  } else {
    loadVec<ST, 8>(E, O, V);
  }
}
template <Storage ST>
__device__ inline void store8(Elems E, int64_t O, const float (&V)[8]) {
  if constexpr (ST == Storage::F32) {
    float Lo[4], Hi[4];
#pragma unroll
    for (int K = 0; K < 4; ++K)
      Lo[K] = V[K], Hi[K] = V[4 + K];
    storeVec<ST, 4>(E, 2 * O, Lo);
    storeVec<ST, 4>(E, 2 * O + 1, Hi);
  } else {
    storeVec<ST, 8>(E, O, V);
  }
}

} // namespace
} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_KERNELS_FASTVECTORS_CUH
