//===- UlyssesAttention.cpp - All-to-all attention over a cp group --------===//
//
// DeepSpeed-Ulysses (Jacobs et al. 2023; Megatron-Core's --cp-comm-type a2a)
// and its hierarchical form (Megatron-Core's a2a+p2p,
// hierarchical_context_parallel_sizes): instead of moving keys around a
// ring of all C ranks, the ranks of an all-to-all group of K consecutive cp
// ranks trade heads for positions. Each rank holds every head of its s / C
// positions; an all-to-all gives inner rank i heads [i A / K, (i + 1) A / K)
// (and the matching key/value heads) of its group's positions, put in the
// grouped layout's local order (global order: ir/ContextLayout.h grouped)
// from each sender's runs; the ring (ContextAttention.cpp) runs on them
// across the C / K groups, between the ranks with the same inner index (with
// K = C, the plain all-to-all, a ring of one: the fused kernel on the whole
// sequence, at global positions and the heads' global offset, as on one
// device); a second all-to-all returns each rank's positions of every head.
// The backward exchanges do, q, k, v, o and the log-sum-exp the same way,
// runs the ring's backward and returns dq, dk, dv.
//
// With K = C each head's computation is one device's, so the results are
// one device's bits; with K < C they are the ring's over C / K ranks. The
// all-to-all is K - 1 sends and receives of a (K - 1) / K share of each
// tensor (sends are buffered: Communicator.h); it needs K to divide the
// heads and the key/value heads, which the compiler checks.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/ContextAttention.h"
#include "support/Diagnostics.h"

#include <algorithm>
#include <vector>

namespace sp::cpu {
namespace {

using UlyssesRun = ContextLayout::Run;

/// Message tags: UlyssesTag + 16 x (the exchange) + 0; the all-to-all
/// group's own.
constexpr int UlyssesTag = 0x7563'0000;

/// One all-to-all over the group Cp, of blocks of Block elements: Pack(J)
/// fills Out with what goes to rank J, Place(Got, J) puts what came from
/// rank J (this rank's own block without a message).
template <typename T, typename PackFn, typename PlaceFn>
llvm::Error ulyssesExchange(int64_t Block, Communicator &Cp, int Tag,
                            std::vector<T> &Out, PackFn Pack, PlaceFn Place) {
  const int C = Cp.size(), R = Cp.rank();
  const int64_t Bytes = Block * int64_t(sizeof(T));
  Out.resize(Block);
  for (int J = 0; J < C; ++J)
    if (J != R) {
      Pack(J);
      if (llvm::Error E = Cp.send(Out.data(), Bytes, J, Tag))
        return E;
    }
  Pack(R);
  Place(Out.data(), R);
  std::vector<T> In(Block);
  for (int J = 0; J < C; ++J)
    if (J != R) {
      if (llvm::Error E = Cp.recv(In.data(), Bytes, J, Tag))
        return E;
      Place(In.data(), J);
    }
  return llvm::Error::success();
}

/// Where the all-to-all moves positions: the cp layout L, and the group's
/// (L.grouped(K)) whose rank Group the K ranks Group K.. of L make up.
struct UlyssesGroup {
  ContextLayout L, Grouped;
  int Group = 0, K = 1;
  /// Sender J's (inner rank J's) runs of positions; each lies inside one
  /// run of the group's, at Grouped.localOf(Group, Run.Global).
  llvm::SmallVector<ContextLayout::Run, 2> runs(int J) const {
    return L.runs(Group * K + J);
  }
  int64_t at(const UlyssesRun &Run) const {
    return Grouped.localOf(Group, Run.Global);
  }
};

/// X [B, H, Sl, D] (every head of this rank's positions) to Full
/// [B, H / K, Sg, D] (this rank's heads of its group's Sg positions, in the
/// group's order).
template <typename T>
llvm::Error ulyssesToSequence(T *Full, const T *X, int64_t B, int64_t H,
                              int64_t D, Communicator &Cp,
                              const UlyssesGroup &U, int Tag) {
  const int64_t Hc = H / U.K, Sl = U.L.local(), Sg = U.Grouped.local();
  std::vector<T> Out;
  return ulyssesExchange<T>(
      B * Hc * Sl * D, Cp, Tag, Out,
      [&](int J) { // heads block J of X, [B, Hc, Sl, D]
        for (int64_t Bb = 0; Bb < B; ++Bb)
          std::copy_n(X + (Bb * H + int64_t(J) * Hc) * Sl * D, Hc * Sl * D,
                      Out.begin() + Bb * Hc * Sl * D);
      },
      [&](const T *Got, int J) { // rank J's positions, in place
        for (int64_t Bh = 0; Bh < B * Hc; ++Bh)
          for (const UlyssesRun &Run : U.runs(J))
            std::copy_n(Got + (Bh * Sl + Run.Local) * D, Run.Length * D,
                        Full + (Bh * Sg + U.at(Run)) * D);
      });
}

/// The inverse: Full [B, H / K, Sg, D] to X [B, H, Sl, D].
template <typename T>
llvm::Error ulyssesToHeads(T *X, const T *Full, int64_t B, int64_t H, int64_t D,
                           Communicator &Cp, const UlyssesGroup &U, int Tag) {
  const int64_t Hc = H / U.K, Sl = U.L.local(), Sg = U.Grouped.local();
  std::vector<T> Out;
  return ulyssesExchange<T>(
      B * Hc * Sl * D, Cp, Tag, Out,
      [&](int J) { // rank J's positions of this rank's heads
        for (int64_t Bh = 0; Bh < B * Hc; ++Bh)
          for (const UlyssesRun &Run : U.runs(J))
            std::copy_n(Full + (Bh * Sg + U.at(Run)) * D, Run.Length * D,
                        Out.begin() + (Bh * Sl + Run.Local) * D);
      },
      [&](const T *Got, int J) { // rank J's heads block
        for (int64_t Bb = 0; Bb < B; ++Bb)
          std::copy_n(Got + Bb * Hc * Sl * D, Hc * Sl * D,
                      X + (Bb * H + int64_t(J) * Hc) * Sl * D);
      });
}

/// [B, Sl, H, D] (merged) <-> [B, H, Sl, D]; D = 1 for the log-sum-exp.
template <typename T>
void ulyssesTranspose(T *Dst, const T *Src, int64_t B, int64_t Sl, int64_t H,
                      int64_t D, bool FromMerged) {
  for (int64_t Bb = 0; Bb < B; ++Bb)
    for (int64_t I = 0; I < Sl; ++I)
      for (int64_t A = 0; A < H; ++A) {
        const int64_t M = ((Bb * Sl + I) * H + A) * D,
                      U = ((Bb * H + A) * Sl + I) * D;
        std::copy_n(Src + (FromMerged ? M : U), D, Dst + (FromMerged ? U : M));
      }
}

llvm::Error ulyssesCheck(const AttentionShape &S, const AttentionCore &C,
                         const ContextGroups &G, const ContextLayout &L) {
  if (C.Packed)
    return makeError("all-to-all attention: packed q, k, v are not "
                     "supported");
  const int K = G.innerSize();
  if (L.Parts < 1 || K * G.outerSize() != L.Parts)
    return makeError("all-to-all attention: an all-to-all group of " +
                     llvm::Twine(K) + " ranks and a ring of " +
                     llvm::Twine(G.outerSize()) + " for a layout over " +
                     llvm::Twine(L.Parts));
  if (S.Heads % K || S.KvHeads % K)
    return makeError("all-to-all attention: a group of " + llvm::Twine(K) +
                     " does not divide the " + llvm::Twine(S.Heads) +
                     " heads and " + llvm::Twine(S.KvHeads) +
                     " key/value heads of a rank");
  if (L.Seq <= 0 || !L.divides() || S.Sq != L.local() || S.Sk != L.local())
    return makeError("all-to-all attention: the rank's queries and keys are "
                     "not the layout's positions");
  return llvm::Error::success();
}

/// This rank's group (U), and the ring's view of its heads of the group's
/// positions: shapes [B, A / K, Sg, D], by head (Sg, Cg), and the dropout
/// draws of those heads.
struct UlyssesView {
  UlyssesGroup U;
  AttentionShape Sg;
  AttentionCore Cg;
};
llvm::Expected<UlyssesView> ulyssesView(const AttentionShape &S,
                                        const AttentionCore &C,
                                        const ContextGroups &G,
                                        const ContextLayout &L) {
  if (llvm::Error E = ulyssesCheck(S, C, G, L))
    return std::move(E);
  const int K = G.innerSize();
  UlyssesView W{{L, L.grouped(K), G.outerRank(), K}, {}, C};
  W.Sg = {S.Batch,
          S.Heads / K,
          S.KvHeads / K,
          W.U.Grouped.local(),
          W.U.Grouped.local(),
          S.D};
  W.Cg.Merged = false;
  if (C.Dropout > 0)
    W.Cg.Probs.Offset[1] += int64_t(G.innerRank()) * W.Sg.Heads;
  return W;
}

} // namespace

template <typename T>
llvm::Error contextAttentionForward(T *O, T *Lse, const T *Q, const T *K,
                                    const T *V, const T *KeyBias,
                                    const AttentionShape &S, AttentionCore C,
                                    const ContextGroups &G,
                                    const ContextLayout &L) {
  if (!G.Inner) // the ring alone
    return ringAttentionForward(O, Lse, Q, K, V, KeyBias, S, C, G.Outer, L);
  auto W = ulyssesView(S, C, G, L);
  if (!W)
    return W.takeError();
  const UlyssesGroup &U = W->U;
  const AttentionShape &Sg = W->Sg;
  const AttentionCore &Cg = W->Cg;
  Communicator &Inner = *G.Inner;
  const int64_t B = S.Batch, H = S.Heads, Kv = S.KvHeads, D = S.D,
                Sl = L.local(), N = U.Grouped.local();
  std::vector<T> Qg(B * Sg.Heads * N * D), Kg(B * Sg.KvHeads * N * D),
      Vg(Kg.size()), Og(Qg.size()), Lg(B * Sg.Heads * N);
  if (llvm::Error E =
          ulyssesToSequence(Qg.data(), Q, B, H, D, Inner, U, UlyssesTag))
    return E;
  if (llvm::Error E =
          ulyssesToSequence(Kg.data(), K, B, Kv, D, Inner, U, UlyssesTag + 16))
    return E;
  if (llvm::Error E =
          ulyssesToSequence(Vg.data(), V, B, Kv, D, Inner, U, UlyssesTag + 32))
    return E;
  if (llvm::Error E =
          ringAttentionForward(Og.data(), Lg.data(), Qg.data(), Kg.data(),
                               Vg.data(), KeyBias, Sg, Cg, G.Outer, U.Grouped))
    return E;
  std::vector<T> Ou(C.Merged ? B * H * Sl * D : 0),
      Lu(C.Merged ? B * H * Sl : 0);
  if (llvm::Error E = ulyssesToHeads(C.Merged ? Ou.data() : O, Og.data(), B, H,
                                     D, Inner, U, UlyssesTag + 48))
    return E;
  if (llvm::Error E = ulyssesToHeads(C.Merged ? Lu.data() : Lse, Lg.data(), B,
                                     H, 1, Inner, U, UlyssesTag + 64))
    return E;
  if (C.Merged) {
    ulyssesTranspose(O, Ou.data(), B, Sl, H, D, /*FromMerged=*/false);
    ulyssesTranspose(Lse, Lu.data(), B, Sl, H, 1, /*FromMerged=*/false);
  }
  return llvm::Error::success();
}

template <typename T>
llvm::Error contextAttentionBackward(T *DQ, T *DK, T *DV, const T *DO,
                                     const T *Q, const T *K, const T *V,
                                     const T *O, const T *Lse, const T *KeyBias,
                                     const AttentionShape &S, AttentionCore C,
                                     const ContextGroups &G,
                                     const ContextLayout &L) {
  if (!G.Inner) // the ring alone
    return ringAttentionBackward(DQ, DK, DV, DO, Q, K, V, O, Lse, KeyBias, S, C,
                                 G.Outer, L);
  auto W = ulyssesView(S, C, G, L);
  if (!W)
    return W.takeError();
  const UlyssesGroup &U = W->U;
  const AttentionShape &Sg = W->Sg;
  const AttentionCore &Cg = W->Cg;
  const int64_t B = S.Batch, H = S.Heads, Kv = S.KvHeads, D = S.D,
                Sl = L.local(), N = U.Grouped.local();
  // do, o and lse by head (the merged layout transposed first).
  std::vector<T> DOu, Ou, Lu;
  if (C.Merged) {
    DOu.resize(B * H * Sl * D);
    Ou.resize(DOu.size());
    Lu.resize(B * H * Sl);
    ulyssesTranspose(DOu.data(), DO, B, Sl, H, D, /*FromMerged=*/true);
    ulyssesTranspose(Ou.data(), O, B, Sl, H, D, /*FromMerged=*/true);
    ulyssesTranspose(Lu.data(), Lse, B, Sl, H, 1, /*FromMerged=*/true);
    DO = DOu.data(), O = Ou.data(), Lse = Lu.data();
  }
  std::vector<T> Qg(B * Sg.Heads * N * D), Kg(B * Sg.KvHeads * N * D),
      Vg(Kg.size()), DOg(Qg.size()), Og(Qg.size()), Lg(B * Sg.Heads * N),
      DQg(Qg.size()), DKg(Kg.size()), DVg(Kg.size());
  struct Exchange {
    T *Group;
    const T *Local;
    int64_t Heads, D;
  } In[] = {{Qg.data(), Q, H, D},  {Kg.data(), K, Kv, D},
            {Vg.data(), V, Kv, D}, {DOg.data(), DO, H, D},
            {Og.data(), O, H, D},  {Lg.data(), Lse, H, 1}};
  int Tag = UlyssesTag + 128;
  for (const Exchange &X : In) {
    if (llvm::Error E = ulyssesToSequence(X.Group, X.Local, B, X.Heads, X.D,
                                          *G.Inner, U, Tag))
      return E;
    Tag += 16;
  }
  if (llvm::Error E = ringAttentionBackward(
          DQg.data(), DKg.data(), DVg.data(), DOg.data(), Qg.data(), Kg.data(),
          Vg.data(), Og.data(), Lg.data(), KeyBias, Sg, Cg, G.Outer, U.Grouped))
    return E;
  struct Return {
    T *Local;
    const T *Group;
    int64_t Heads;
  } Out[] = {{DQ, DQg.data(), H}, {DK, DKg.data(), Kv}, {DV, DVg.data(), Kv}};
  for (const Return &X : Out) {
    if (llvm::Error E =
            ulyssesToHeads(X.Local, X.Group, B, X.Heads, D, *G.Inner, U, Tag))
      return E;
    Tag += 16;
  }
  return llvm::Error::success();
}

#define SP_INSTANTIATE(T)                                                      \
  template llvm::Error contextAttentionForward<T>(                             \
      T *, T *, const T *, const T *, const T *, const T *,                    \
      const AttentionShape &, AttentionCore, const ContextGroups &,            \
      const ContextLayout &);                                                  \
  template llvm::Error contextAttentionBackward<T>(                            \
      T *, T *, T *, const T *, const T *, const T *, const T *, const T *,    \
      const T *, const T *, const AttentionShape &, AttentionCore,             \
      const ContextGroups &, const ContextLayout &);
SP_INSTANTIATE(float)
SP_INSTANTIATE(double)
#undef SP_INSTANTIATE

} // namespace sp::cpu
