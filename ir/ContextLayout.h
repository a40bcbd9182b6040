//===- ContextLayout.h - A cp rank's sequence positions ---------*- C++ -*-===//
//
// Context parallelism (sp-compile --cp C) splits the sequence of every
// activation over the C ranks of the cp group. The layout says which global
// positions rank r holds, in local order:
//
//   contiguous   positions [r S/C, (r + 1) S/C)
//   zigzag       the sequence cut into 2C chunks of S/2C; rank r holds
//                chunk r, then chunk 2C - 1 - r (Megatron-Core's causal
//                load balancing: under a causal mask every rank then has the
//                same number of (query, key) pairs to compute)
//
// The compiler records it in the attention ops and the dropouts it touches
// (attributes cp, cp_zigzag); the runtime maps local positions to global
// ones with it: the token and target rows a rank reads, the Philox index of
// its dropout elements, the causal mask and the key blocks of the ring.
//
// Hierarchical context parallelism (--cp-comm a2a+ring, --cp-a2a K) sees
// the C ranks as C / K groups of K consecutive ranks. The positions of
// group g together, in global order, are rank g's of the same layout over
// C / K ranks (grouped(K)): contiguous, ranks gK.. (g + 1)K - 1 hold
// [gK S/C, (g + 1)K S/C); zigzag, they hold chunks gK.. gK + K - 1 and
// their mirrors, which are chunks g and 2C/K - 1 - g of 2C/K. Each rank's
// runs lie inside one run of its group's (the chunks nest).
//
// Header-only: shared by the passes and the backends.
//
//===----------------------------------------------------------------------===//
#ifndef SP_IR_CONTEXTLAYOUT_H
#define SP_IR_CONTEXTLAYOUT_H

#include "llvm/ADT/SmallVector.h"
#include <algorithm>
#include <cstdint>

namespace sp {

struct ContextLayout {
  /// Ranks of the cp group (1: no context parallelism).
  int Parts = 1;
  bool Zigzag = false;
  /// The global sequence length S.
  int64_t Seq = 0;

  /// S is cut into this many equal chunks.
  int64_t chunks() const { return Zigzag ? 2 * int64_t(Parts) : Parts; }
  /// Whether S divides into the chunks.
  bool divides() const { return Seq % chunks() == 0; }
  int64_t chunk() const { return Seq / chunks(); }
  /// The positions one rank holds: S / C.
  int64_t local() const { return Seq / Parts; }

  /// A run of positions contiguous both locally and globally: local
  /// positions [Local, Local + Length) are global [Global, Global + Length).
  struct Run {
    int64_t Local = 0, Global = 0, Length = 0;
  };

  /// The runs of rank R's local positions [Begin, Begin + Length) (a
  /// tensor-parallel rank's slice of them under sequence parallelism), in
  /// local order: one, or two across the zigzag seam.
  llvm::SmallVector<Run, 2> runs(int R, int64_t Begin, int64_t Length) const {
    llvm::SmallVector<Run, 2> Out;
    const int64_t K = chunk();
    int64_t End = Begin + Length;
    if (!Zigzag || Parts == 1) {
      if (Length > 0)
        Out.push_back({Begin, int64_t(R) * local() + Begin, Length});
      return Out;
    }
    // Local [0, K): chunk R; [K, 2K): chunk 2C - 1 - R.
    if (Begin < K && End > Begin)
      Out.push_back({Begin, int64_t(R) * K + Begin, std::min(End, K) - Begin});
    if (End > K) {
      int64_t B = Begin > K ? Begin : K;
      Out.push_back({B, (2 * int64_t(Parts) - 1 - R) * K + (B - K), End - B});
    }
    return Out;
  }
  /// All of rank R's positions.
  llvm::SmallVector<Run, 2> runs(int R) const { return runs(R, 0, local()); }

  /// The layout of the C / K groups of K consecutive ranks (K divides
  /// Parts): group g's positions are its rank g's.
  ContextLayout grouped(int K) const { return {Parts / K, Zigzag, Seq}; }

  /// Rank R's local position of global position P, which R holds.
  int64_t localOf(int R, int64_t P) const {
    if (!Zigzag || Parts == 1)
      return P - int64_t(R) * local();
    const int64_t K = chunk();
    return P / K == R ? P - int64_t(R) * K
                      : K + P - (2 * int64_t(Parts) - 1 - R) * K;
  }

  /// The global position of rank R's local position P.
  int64_t position(int R, int64_t P) const {
    if (!Zigzag || Parts == 1)
      return int64_t(R) * local() + P;
    const int64_t K = chunk();
    return P < K ? int64_t(R) * K + P
                 : (2 * int64_t(Parts) - 1 - R) * K + (P - K);
  }
};

} // namespace sp

#endif // SP_IR_CONTEXTLAYOUT_H
