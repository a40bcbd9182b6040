//===- UlyssesAttention.cpp - All-to-all attention over a cp group --------===//
//
// DeepSpeed-Ulysses (Jacobs et al. 2023; Megatron-Core's --cp-comm-type a2a):
// instead of moving keys around a ring, the cp ranks trade heads for
// positions. Each rank holds every head of its s / C positions; an
// all-to-all gives rank r heads [r A / C, (r + 1) A / C) (and the matching
// key/value heads) of the whole sequence, put back in global order from
// each sender's layout runs (ir/ContextLayout.h); the fused kernel runs on
// them as on one device (the same rows, keys and dropout draws: global
// positions, the heads' global offset); a second all-to-all returns each
// rank's positions of every head. The backward exchanges do, q, k, v, o and
// the log-sum-exp the same way and returns dq, dk, dv.
//
// Each head's computation is one device's, so the results are one device's
// bits. The all-to-all is C - 1 sends and receives of a (C - 1) / C share of
// each tensor (sends are buffered: Communicator.h); it needs C to divide
// the heads and the key/value heads, which the compiler checks.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/ContextAttention.h"
#include "support/Diagnostics.h"

#include <algorithm>
#include <vector>

namespace sp::cpu {
namespace {

using UlyssesRun = ContextLayout::Run;

/// Message tags: UlyssesTag + 16 x (the exchange) + 0; the cp group's own.
constexpr int UlyssesTag = 0x7563'0000;

/// One all-to-all of blocks of Block elements: Pack(J) fills Out with what
/// goes to rank J, Place(Got, J) puts what came from rank J (this rank's
/// own block without a message).
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

/// X [B, H, Sl, D] (every head of this rank's positions) to Full
/// [B, H / C, S, D] (this rank's heads of every position, in global order).
template <typename T>
llvm::Error ulyssesToSequence(T *Full, const T *X, int64_t B, int64_t H,
                              int64_t D, Communicator &Cp,
                              const ContextLayout &L, int Tag) {
  const int64_t Hc = H / L.Parts, Sl = L.local();
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
          for (const UlyssesRun &Run : L.runs(J))
            std::copy_n(Got + (Bh * Sl + Run.Local) * D, Run.Length * D,
                        Full + (Bh * L.Seq + Run.Global) * D);
      });
}

/// The inverse: Full [B, H / C, S, D] to X [B, H, Sl, D].
template <typename T>
llvm::Error ulyssesToHeads(T *X, const T *Full, int64_t B, int64_t H, int64_t D,
                           Communicator &Cp, const ContextLayout &L, int Tag) {
  const int64_t Hc = H / L.Parts, Sl = L.local();
  std::vector<T> Out;
  return ulyssesExchange<T>(
      B * Hc * Sl * D, Cp, Tag, Out,
      [&](int J) { // rank J's positions of this rank's heads
        for (int64_t Bh = 0; Bh < B * Hc; ++Bh)
          for (const UlyssesRun &Run : L.runs(J))
            std::copy_n(Full + (Bh * L.Seq + Run.Global) * D, Run.Length * D,
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
                         Communicator &Cp, const ContextLayout &L) {
  if (C.Packed)
    return makeError("all-to-all attention: packed q, k, v are not "
                     "supported");
  if (L.Parts < 1 || Cp.size() != L.Parts)
    return makeError("all-to-all attention: a cp group of " +
                     llvm::Twine(Cp.size()) + " ranks for a layout over " +
                     llvm::Twine(L.Parts));
  if (S.Heads % L.Parts || S.KvHeads % L.Parts)
    return makeError("all-to-all attention: cp " + llvm::Twine(L.Parts) +
                     " does not divide the " + llvm::Twine(S.Heads) +
                     " heads and " + llvm::Twine(S.KvHeads) +
                     " key/value heads of a rank");
  if (L.Seq <= 0 || !L.divides() || S.Sq != L.local() || S.Sk != L.local())
    return makeError("all-to-all attention: the rank's queries and keys are "
                     "not the layout's positions");
  return llvm::Error::success();
}

/// The kernel's view of this rank's heads of the whole sequence.
void ulyssesWhole(AttentionShape &Sf, AttentionCore &Cf,
                  const AttentionShape &S, const AttentionCore &C, int Rank,
                  const ContextLayout &L) {
  Sf = {S.Batch, S.Heads / L.Parts, S.KvHeads / L.Parts, L.Seq, L.Seq, S.D};
  Cf = C;
  Cf.Merged = false;
  Cf.Query0 = Cf.Key0 = 0;
  Cf.QBegin = Cf.KBegin = 0;
  Cf.QEnd = Cf.KEnd = -1;
  if (C.Dropout > 0) {
    Cf.Probs.Local[0] = Sf.Batch, Cf.Probs.Local[1] = Sf.Heads;
    Cf.Probs.Local[2] = Cf.Probs.Local[3] = L.Seq;
    Cf.Probs.Offset[1] += int64_t(Rank) * Sf.Heads;
    Cf.Probs.Offset[2] = Cf.Probs.Offset[3] = 0;
    Cf.Probs.Global[2] = Cf.Probs.Global[3] = L.Seq;
  }
}

llvm::Error ulyssesKernelError(Status St) {
  return makeError(llvm::Twine("all-to-all attention: ") + St.Message);
}

} // namespace

template <typename T>
llvm::Error ulyssesAttentionForward(T *O, T *Lse, const T *Q, const T *K,
                                    const T *V, const T *KeyBias,
                                    const AttentionShape &S, AttentionCore C,
                                    Communicator &Cp, const ContextLayout &L) {
  if (llvm::Error E = ulyssesCheck(S, C, Cp, L))
    return E;
  AttentionShape Sf;
  AttentionCore Cf;
  ulyssesWhole(Sf, Cf, S, C, Cp.rank(), L);
  const int64_t B = S.Batch, H = S.Heads, G = S.KvHeads, D = S.D;
  std::vector<T> Qf(B * Sf.Heads * L.Seq * D), Kf(B * Sf.KvHeads * L.Seq * D),
      Vf(Kf.size()), Of(Qf.size()), Lf(B * Sf.Heads * L.Seq);
  if (llvm::Error E =
          ulyssesToSequence(Qf.data(), Q, B, H, D, Cp, L, UlyssesTag))
    return E;
  if (llvm::Error E =
          ulyssesToSequence(Kf.data(), K, B, G, D, Cp, L, UlyssesTag + 16))
    return E;
  if (llvm::Error E =
          ulyssesToSequence(Vf.data(), V, B, G, D, Cp, L, UlyssesTag + 32))
    return E;
  if (Status St = attentionForward(Of.data(), Lf.data(), Qf.data(), Kf.data(),
                                   Vf.data(), KeyBias, Sf, Cf);
      !St.ok())
    return ulyssesKernelError(St);
  const int64_t Sl = L.local();
  std::vector<T> Ou(C.Merged ? B * H * Sl * D : 0),
      Lu(C.Merged ? B * H * Sl : 0);
  if (llvm::Error E = ulyssesToHeads(C.Merged ? Ou.data() : O, Of.data(), B, H,
                                     D, Cp, L, UlyssesTag + 48))
    return E;
  if (llvm::Error E = ulyssesToHeads(C.Merged ? Lu.data() : Lse, Lf.data(), B,
                                     H, 1, Cp, L, UlyssesTag + 64))
    return E;
  if (C.Merged) {
    ulyssesTranspose(O, Ou.data(), B, Sl, H, D, /*FromMerged=*/false);
    ulyssesTranspose(Lse, Lu.data(), B, Sl, H, 1, /*FromMerged=*/false);
  }
  return llvm::Error::success();
}

template <typename T>
llvm::Error ulyssesAttentionBackward(T *DQ, T *DK, T *DV, const T *DO,
                                     const T *Q, const T *K, const T *V,
                                     const T *O, const T *Lse, const T *KeyBias,
                                     const AttentionShape &S, AttentionCore C,
                                     Communicator &Cp, const ContextLayout &L) {
  if (llvm::Error E = ulyssesCheck(S, C, Cp, L))
    return E;
  AttentionShape Sf;
  AttentionCore Cf;
  ulyssesWhole(Sf, Cf, S, C, Cp.rank(), L);
  const int64_t B = S.Batch, H = S.Heads, G = S.KvHeads, D = S.D,
                Sl = L.local();
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
  std::vector<T> Qf(B * Sf.Heads * L.Seq * D), Kf(B * Sf.KvHeads * L.Seq * D),
      Vf(Kf.size()), DOf(Qf.size()), Of(Qf.size()), Lf(B * Sf.Heads * L.Seq),
      DQf(Qf.size()), DKf(Kf.size()), DVf(Kf.size());
  struct Exchange {
    T *Full;
    const T *Local;
    int64_t Heads, D;
  } In[] = {{Qf.data(), Q, H, D}, {Kf.data(), K, G, D},
            {Vf.data(), V, G, D}, {DOf.data(), DO, H, D},
            {Of.data(), O, H, D}, {Lf.data(), Lse, H, 1}};
  int Tag = UlyssesTag + 128;
  for (const Exchange &X : In) {
    if (llvm::Error E =
            ulyssesToSequence(X.Full, X.Local, B, X.Heads, X.D, Cp, L, Tag))
      return E;
    Tag += 16;
  }
  if (Status St = attentionBackward(DQf.data(), DKf.data(), DVf.data(),
                                    DOf.data(), Qf.data(), Kf.data(), Vf.data(),
                                    Of.data(), Lf.data(), KeyBias, Sf, Cf);
      !St.ok())
    return ulyssesKernelError(St);
  struct Return {
    T *Local;
    const T *Full;
    int64_t Heads;
  } Out[] = {{DQ, DQf.data(), H}, {DK, DKf.data(), G}, {DV, DVf.data(), G}};
  for (const Return &X : Out) {
    if (llvm::Error E =
            ulyssesToHeads(X.Local, X.Full, B, X.Heads, D, Cp, L, Tag))
      return E;
    Tag += 16;
  }
  return llvm::Error::success();
}

#define SP_INSTANTIATE(T)                                                      \
  template llvm::Error ulyssesAttentionForward<T>(                             \
      T *, T *, const T *, const T *, const T *, const T *,                    \
      const AttentionShape &, AttentionCore, Communicator &,                   \
      const ContextLayout &);                                                  \
  template llvm::Error ulyssesAttentionBackward<T>(                            \
      T *, T *, T *, const T *, const T *, const T *, const T *, const T *,    \
      const T *, const T *, const AttentionShape &, AttentionCore,             \
      Communicator &, const ContextLayout &);
SP_INSTANTIATE(float)
SP_INSTANTIATE(double)
#undef SP_INSTANTIATE

} // namespace sp::cpu
