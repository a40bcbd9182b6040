//===- Philox.h - Counter-based random numbers for dropout -----*- C++ -*-===//
//
// Philox-4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as
// easy as 1, 2, 3", SC 2011), written out so that the CPU and CUDA backends
// share one definition. Header-only, no std:: containers, constexpr, and
// __host__ __device__ under nvcc.
//
// The dropout mapping (the one thing every backend must agree on):
//
//   Block  = Index / 4            (Index: the element's row-major index in
//   Lane   = Index % 4             the *global*, unsharded tensor)
//   key    = (lo32(Seed), hi32(Seed))
//   ctr    = (lo32(Block), hi32(Block), Layer | Site << 16, Stream)
//   Word   = Philox4x32_10(ctr, key)[Lane]
//   keep   = Word >= ceil(Ratio * 2^32)      (i.e. Word * 2^-32 >= Ratio)
//
// So one Philox call serves four consecutive global elements. Layer and Site
// must be < 2^16 (the compiler's keys are [layer + 1, ordinal within the
// layer]); Stream is a free 32-bit word (e.g. step * microbatches +
// microbatch) and Seed is 64 bits. Because the mask is a pure function of the
// global index, a shard of a tensor (any block of it) gets exactly the
// corresponding block of the full tensor's mask, whatever the tensor-parallel,
// sequence-parallel or microbatch split, and a recomputation reproduces it.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CPU_PHILOX_H
#define SP_RUNTIME_CPU_PHILOX_H

#include "runtime/Numerics.h" // SP_HOST_DEVICE

#include <cstdint>

namespace sp::philox {

/// Four 32-bit words: a Philox counter or output block.
struct Words4 {
  uint32_t V[4];
};

constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u; // round multipliers
constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u; // Weyl key bumps

/// One round: (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0) with
/// hi0:lo0 = M0 * c0 and hi1:lo1 = M1 * c2.
SP_HOST_DEVICE constexpr Words4 philoxRound(Words4 C, uint32_t K0,
                                            uint32_t K1) {
  uint64_t P0 = uint64_t(M0) * C.V[0];
  uint64_t P1 = uint64_t(M1) * C.V[2];
  uint32_t Hi0 = uint32_t(P0 >> 32), Lo0 = uint32_t(P0);
  uint32_t Hi1 = uint32_t(P1 >> 32), Lo1 = uint32_t(P1);
  return Words4{{Hi1 ^ C.V[1] ^ K0, Lo1, Hi0 ^ C.V[3] ^ K1, Lo0}};
}

/// Philox-4x32-10: ten rounds, the key bumped by (W0, W1) between rounds.
SP_HOST_DEVICE constexpr Words4 philox4x32_10(Words4 Ctr, uint32_t K0,
                                              uint32_t K1) {
  for (int R = 0; R < 10; ++R) {
    if (R) {
      K0 += W0;
      K1 += W1;
    }
    Ctr = philoxRound(Ctr, K0, K1);
  }
  return Ctr;
}

/// The Philox counter of the block holding global element Index (see the
/// file comment).
SP_HOST_DEVICE constexpr Words4
dropoutCounter(uint32_t Layer, uint32_t Site, uint32_t Stream, uint64_t Index) {
  uint64_t Block = Index >> 2;
  return Words4{{uint32_t(Block), uint32_t(Block >> 32),
                 (Layer & 0xFFFFu) | (Site << 16), Stream}};
}

/// The 32-bit random word of global element Index.
SP_HOST_DEVICE constexpr uint32_t dropoutWord(uint64_t Seed, uint32_t Layer,
                                              uint32_t Site, uint32_t Stream,
                                              uint64_t Index) {
  Words4 Out = philox4x32_10(dropoutCounter(Layer, Site, Stream, Index),
                             uint32_t(Seed), uint32_t(Seed >> 32));
  return Out.V[Index & 3];
}

/// The uniform number in [0, 1) of a word: Word * 2^-32 (exact in double).
SP_HOST_DEVICE constexpr double uniform(uint32_t Word) {
  return double(Word) * (1.0 / 4294967296.0);
}

/// ceil(Ratio * 2^32), clamped to [0, 2^32]: an element is kept iff its word
/// is >= this, which is exactly uniform(Word) >= Ratio.
SP_HOST_DEVICE constexpr uint64_t dropoutThreshold(double Ratio) {
  if (!(Ratio > 0.0)) // also NaN
    return 0;
  if (Ratio >= 1.0)
    return uint64_t(1) << 32;
  double S = Ratio * 4294967296.0; // exact: a power-of-two scaling
  uint64_t T = uint64_t(S);
  return double(T) < S ? T + 1 : T;
}

/// The factor of a kept element, 1 / (1 - Ratio), in double (the callers
/// round it to their type); 0 for Ratio >= 1, where nothing is kept.
SP_HOST_DEVICE constexpr double dropoutScale(double Ratio) {
  return Ratio >= 1.0 ? 0.0 : 1.0 / (1.0 - Ratio);
}

} // namespace sp::philox

#endif // SP_RUNTIME_CPU_PHILOX_H
