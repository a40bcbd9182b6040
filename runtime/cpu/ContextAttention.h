//===- ContextAttention.h - Ring attention over a cp group ------*- C++ -*-===//
//
// Under context parallelism (ir/ContextLayout.h) every rank of the cp group
// holds S / C positions of the sequence: its queries must attend to the keys
// of every rank. Ring attention (Liu et al. 2023; Megatron-Core's context
// parallelism) moves the keys instead of the queries: each rank's K and V
// travel once around the ring, and at each of the C steps a rank computes
// its queries against the block it holds with the fused kernel's window
// (Attention.h), one call per (query run, key run) pair of the two ranks'
// layouts, at the runs' global positions (the causal mask and the dropout
// draw are the one-device run's). The forward merges the partial outputs by
// their log-sum-exp; the backward, given the whole O and Lse, adds each
// block's contribution to the rank's dQ and to the block's dK, dV, which
// travel with the block and reach their owner after one more shift.
//
// A (query run, key run) pair wholly above the causal diagonal is skipped
// where the kernel would skip it: once each of its rows has a log-sum-exp
// (the running one in the forward) more than 104 above the masked scores
// (Fill + the block's largest padding bias), so skipping changes no result.
//
// Sends are posted before the compute on the block they carry (buffered,
// Communicator.h), so that the transfer overlaps it. Results are the same
// bits for the same inputs whatever the kernel thread count: every sum has
// one order (the ring's).
//
// contextAttentionForward and Backward are the one entry of the three
// --cp-comm variants (ContextGroups below): the ring alone, or the
// all-to-all of UlyssesAttention.cpp around a ring (of one for a2a, across
// the groups for a2a+ring). One ring and one all-to-all serve all three.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CPU_CONTEXTATTENTION_H
#define SP_RUNTIME_CPU_CONTEXTATTENTION_H

#include "ir/ContextLayout.h"
#include "runtime/comm/Communicator.h"
#include "runtime/cpu/Attention.h"
#include "llvm/Support/Error.h"

namespace sp::cpu {

/// The tags of the ring's messages, RingAttentionTag + step and (the
/// backward's travelling dK, dV) RingAttentionTag + 0x8000 + step: the
/// communicator is the ring's own.
constexpr int RingAttentionTag = 0x6370'0000;

/// The cp group as the attention core talks over it (--cp-comm):
///
///   ring      Inner null, Outer the cp group: the ring over C ranks
///   a2a       Inner the cp group, Outer null: the all-to-all, then the
///             kernel on the whole sequence (a ring of one)
///   a2a+ring  Inner the all-to-all group of K consecutive cp ranks, Outer
///             the ring across the C / K groups, between the ranks with the
///             same inner index (runtime/comm/ProcessGrid.h splitContext)
///
/// A null group is one of one rank. The rank's cp rank is
/// Outer rank x K + Inner rank.
struct ContextGroups {
  Communicator *Inner = nullptr, *Outer = nullptr;
  int innerSize() const { return Inner ? Inner->size() : 1; }
  int outerSize() const { return Outer ? Outer->size() : 1; }
  int innerRank() const { return Inner ? Inner->rank() : 0; }
  int outerRank() const { return Outer ? Outer->rank() : 0; }
  int rank() const { return outerRank() * innerSize() + innerRank(); }
};

/// The attention core of one cp rank: Q, K, V, O, Lse (and their gradients)
/// are this rank's positions (L.runs(rank)) in local order, shapes S (Sq =
/// Sk = L.local()); KeyBias is over the GLOBAL keys [B, L.Seq] (or null);
/// with dropout, C.Probs's Global must be [B_g, A_g, Seq, Seq] with
/// Offset[0], Offset[1] the batch and head offsets: the ring sets Local
/// ([B, A, Sq, Sk]) and Offset[2], Offset[3] (Query0, Key0) per call, so
/// that each (query, key) draws the one-device run's dropout. C.Query0, Key0
/// and the window are set by the ring (ignored on input). Merged works; Packed
/// is refused.
///
/// With an all-to-all group of K ranks (G.Inner; UlyssesAttention.cpp)
/// each rank first trades heads for positions: it gets heads
/// [i A / K, (i + 1) A / K) (and the matching key/value heads) of its
/// group's positions, L.grouped(K); the ring then runs over the groups on
/// those heads, and a second all-to-all returns each rank's positions of
/// every head. K must divide A and G. With K = C (a ring of one) each
/// head's computation is one device's: the results are its bits.
///
/// Errors on groups whose sizes do not multiply to L.Parts, shapes that are
/// not the layout's, or the kernel's or the communicators' errors.
template <typename T>
llvm::Error contextAttentionForward(T *O, T *Lse, const T *Q, const T *K,
                                    const T *V, const T *KeyBias,
                                    const AttentionShape &S, AttentionCore C,
                                    const ContextGroups &G,
                                    const ContextLayout &L);

/// DQ, DK, DV (overwritten) of this rank's positions from DO and the
/// forward's Q, K, V, O, Lse (this rank's, as contextAttentionForward wrote
/// them).
template <typename T>
llvm::Error contextAttentionBackward(T *DQ, T *DK, T *DV, const T *DO,
                                     const T *Q, const T *K, const T *V,
                                     const T *O, const T *Lse, const T *KeyBias,
                                     const AttentionShape &S, AttentionCore C,
                                     const ContextGroups &G,
                                     const ContextLayout &L);

/// The ring alone (ContextAttention.cpp): the same arguments over Ring, a
/// communicator of L.Parts ranks, or null for a ring of one (L.Parts = 1:
/// the kernel's window calls on the rank's runs, no messages).
template <typename T>
llvm::Error ringAttentionForward(T *O, T *Lse, const T *Q, const T *K,
                                 const T *V, const T *KeyBias,
                                 const AttentionShape &S, AttentionCore C,
                                 Communicator *Ring, const ContextLayout &L);
template <typename T>
llvm::Error ringAttentionBackward(T *DQ, T *DK, T *DV, const T *DO, const T *Q,
                                  const T *K, const T *V, const T *O,
                                  const T *Lse, const T *KeyBias,
                                  const AttentionShape &S, AttentionCore C,
                                  Communicator *Ring, const ContextLayout &L);

} // namespace sp::cpu

#endif // SP_RUNTIME_CPU_CONTEXTATTENTION_H
