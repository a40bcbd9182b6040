//===- ContextAttention.cpp - Ring attention over a cp group -------------===//
//
// The forward keeps the running output and log-sum-exp of the rank's rows in
// double and rounds them to T once at the end; each window call's partial
// (O_p, l_p) merges in as l = logaddexp(l, l_p), O = e^(l_old - l) O +
// e^(l_p - l) O_p. The backward sums the window calls' contributions to dQ,
// and to the travelling block's dK, dV, in T (in the ring's order).
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/ContextAttention.h"
#include "support/Diagnostics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace sp::cpu {
namespace {

using RingRun = ContextLayout::Run;

/// exp of this, or less, is below the smallest float (Attention.cpp's).
constexpr double RingNegligible = -104;

llvm::Error ringCheck(const AttentionShape &S, const AttentionCore &C,
                      Communicator *Ring, const ContextLayout &L) {
  const int Size = Ring ? Ring->size() : 1;
  if (C.Packed)
    return makeError("ring attention: packed q, k, v are not supported (the "
                     "ring moves k and v as tensors of their own)");
  if (L.Parts < 1 || Size != L.Parts)
    return makeError("ring attention: a cp group of " + llvm::Twine(Size) +
                     " ranks for a layout over " + llvm::Twine(L.Parts));
  if (L.Seq <= 0 || !L.divides())
    return makeError("ring attention: a sequence of " + llvm::Twine(L.Seq) +
                     " does not divide into " + llvm::Twine(L.chunks()) +
                     " chunks");
  if (S.Sq != L.local() || S.Sk != L.local())
    return makeError("ring attention: " + llvm::Twine(S.Sq) + " queries and " +
                     llvm::Twine(S.Sk) + " keys on a rank, not the layout's " +
                     llvm::Twine(L.local()));
  if (C.Dropout > 0 && (C.Probs.Rank != 4 || C.Probs.Global[2] != L.Seq ||
                        C.Probs.Global[3] != L.Seq))
    return makeError("ring attention: the probabilities' global index is not "
                     "[batch, heads, " +
                     llvm::Twine(L.Seq) + ", " + llvm::Twine(L.Seq) + "]");
  return llvm::Error::success();
}

llvm::Error ringKernelError(Status St) {
  return makeError(llvm::Twine("ring attention: ") + St.Message);
}

/// The kernel call of one (query run, key run) pair: the runs' global
/// positions, their local windows, and the probabilities' block of this
/// rank's [B, A, Sq, Sk] at global rows Query0.., columns Key0...
AttentionCore ringPairCore(const AttentionCore &C, const AttentionShape &S,
                           const RingRun &Qr, const RingRun &Kr, int64_t Seq) {
  AttentionCore W = C;
  W.Query0 = Qr.Global - Qr.Local;
  W.Key0 = Kr.Global - Kr.Local;
  W.QBegin = Qr.Local, W.QEnd = Qr.Local + Qr.Length;
  W.KBegin = Kr.Local, W.KEnd = Kr.Local + Kr.Length;
  if (C.Dropout > 0) {
    W.Probs.Local[0] = S.Batch, W.Probs.Local[1] = S.Heads;
    W.Probs.Local[2] = S.Sq, W.Probs.Local[3] = S.Sk;
    W.Probs.Offset[2] = W.Query0, W.Probs.Offset[3] = W.Key0;
    W.Probs.Global[2] = W.Probs.Global[3] = Seq;
  }
  return W;
}

/// Where row (b, a, i) of O (and DO) and of Lse is, in rows of D and in
/// elements (Attention.h's layouts).
int64_t ringRow(const AttentionShape &S, bool Merged, int64_t B, int64_t A,
                int64_t I) {
  return Merged ? (B * S.Sq + I) * S.Heads + A : (B * S.Heads + A) * S.Sq + I;
}

/// Whether the pair (Qr, Kr) may be skipped: every key after every query
/// under the causal mask, and every row's log-sum-exp (Lse(b, a, i)) far
/// enough above the masked scores (Fill + the largest bias of batch row b's
/// keys in Kr, Bias [B, Sk] or null) that their probabilities are 0.
template <typename LseAt, typename T>
bool ringPairNegligible(const AttentionCore &C, const AttentionShape &S,
                        const RingRun &Qr, const RingRun &Kr, const T *Bias,
                        LseAt Lse) {
  if (!C.Causal || Kr.Global <= Qr.Global + Qr.Length - 1)
    return false;
  for (int64_t B = 0; B < S.Batch; ++B) {
    double Top = 0;
    if (Bias)
      for (int64_t J = Kr.Local; J < Kr.Local + Kr.Length; ++J)
        Top = std::max(Top, double(Bias[B * S.Sk + J]));
    const double Skip = C.Fill + Top - RingNegligible;
    for (int64_t A = 0; A < S.Heads; ++A)
      for (int64_t I = Qr.Local; I < Qr.Local + Qr.Length; ++I)
        if (!(Lse(B, A, I) > Skip))
          return false;
  }
  return true;
}

/// The padding bias of rank Src's keys, gathered from the global [B, Seq]
/// bias into Out [B, Sk].
template <typename T>
void ringGatherBias(T *Out, const T *KeyBias, const AttentionShape &S,
                    const ContextLayout &L, int Src) {
  for (int64_t B = 0; B < S.Batch; ++B)
    for (const RingRun &R : L.runs(Src))
      std::copy_n(KeyBias + B * L.Seq + R.Global, R.Length,
                  Out + B * S.Sk + R.Local);
}

/// Dst += Src over rows [R0, R1) of every head of a [B, H, N, D] tensor.
template <typename T>
void ringAddRows(T *Dst, const T *Src, int64_t Batch, int64_t Heads, int64_t N,
                 int64_t D, int64_t R0, int64_t R1) {
  for (int64_t H = 0; H < Batch * Heads; ++H)
    for (int64_t E = (H * N + R0) * D; E < (H * N + R1) * D; ++E)
      Dst[E] += Src[E];
}

} // namespace

template <typename T>
llvm::Error ringAttentionForward(T *O, T *Lse, const T *Q, const T *K,
                                 const T *V, const T *KeyBias,
                                 const AttentionShape &S, AttentionCore C,
                                 Communicator *Ring, const ContextLayout &L) {
  if (llvm::Error E = ringCheck(S, C, Ring, L))
    return E;
  const int Parts = L.Parts, Rank = Ring ? Ring->rank() : 0;
  const int Next = (Rank + 1) % Parts, Prev = (Rank + Parts - 1) % Parts;
  const int64_t NK = S.Batch * S.KvHeads * S.Sk * S.D,
                NQ = S.Batch * S.Heads * S.Sq * S.D,
                NL = S.Batch * S.Heads * S.Sq;
  // The block held (K then V) and the one arriving.
  std::vector<T> Cur(2 * NK), Arriving(Parts > 1 ? 2 * NK : 0);
  std::copy_n(K, NK, Cur.begin());
  std::copy_n(V, NK, Cur.begin() + NK);
  std::vector<T> Bias(KeyBias ? S.Batch * S.Sk : 0), Op(NQ), Lp(NL);
  std::vector<double> RunO(NQ, 0.0),
      RunL(NL, -std::numeric_limits<double>::infinity());
  const auto Mine = L.runs(Rank);
  for (int Step = 0; Step < Parts; ++Step) {
    const int Src = (Rank - Step + Parts) % Parts;
    if (Step + 1 < Parts)
      if (llvm::Error E = Ring->send(Cur.data(), 2 * NK * int64_t(sizeof(T)),
                                     Next, RingAttentionTag + Step))
        return E;
    if (KeyBias)
      ringGatherBias(Bias.data(), KeyBias, S, L, Src);
    const T *BlockBias = KeyBias ? Bias.data() : nullptr;
    for (const RingRun &Qr : Mine)
      for (const RingRun &Kr : L.runs(Src)) {
        if (ringPairNegligible(C, S, Qr, Kr, BlockBias,
                               [&](int64_t B, int64_t A, int64_t I) {
                                 return RunL[ringRow(S, C.Merged, B, A, I)];
                               }))
          continue;
        const AttentionCore W = ringPairCore(C, S, Qr, Kr, L.Seq);
        if (Status St = attentionForward(Op.data(), Lp.data(), Q, Cur.data(),
                                         Cur.data() + NK, BlockBias, S, W);
            !St.ok())
          return ringKernelError(St);
        // Merge the partial rows by their log-sum-exp.
        for (int64_t B = 0; B < S.Batch; ++B)
          for (int64_t A = 0; A < S.Heads; ++A)
            for (int64_t I = Qr.Local; I < Qr.Local + Qr.Length; ++I) {
              const int64_t R = ringRow(S, C.Merged, B, A, I);
              const double L1 = RunL[R], L2 = double(Lp[R]);
              if (L2 == -std::numeric_limits<double>::infinity())
                continue; // every score -inf: no weight
              const double Hi = std::max(L1, L2), Lo = std::min(L1, L2);
              const double New = Hi + std::log1p(std::exp(Lo - Hi));
              const double W1 = std::exp(L1 - New), W2 = std::exp(L2 - New);
              double *Acc = RunO.data() + R * S.D;
              const T *Part = Op.data() + R * S.D;
              for (int64_t X = 0; X < S.D; ++X)
                Acc[X] = W1 * Acc[X] + W2 * double(Part[X]);
              RunL[R] = New;
            }
      }
    if (Step + 1 < Parts) {
      if (llvm::Error E =
              Ring->recv(Arriving.data(), 2 * NK * int64_t(sizeof(T)), Prev,
                         RingAttentionTag + Step))
        return E;
      std::swap(Cur, Arriving);
    }
  }
  for (int64_t E = 0; E < NQ; ++E)
    O[E] = T(RunO[E]);
  for (int64_t E = 0; E < NL; ++E)
    Lse[E] = T(RunL[E]);
  return llvm::Error::success();
}

template <typename T>
llvm::Error ringAttentionBackward(T *DQ, T *DK, T *DV, const T *DO, const T *Q,
                                  const T *K, const T *V, const T *O,
                                  const T *Lse, const T *KeyBias,
                                  const AttentionShape &S, AttentionCore C,
                                  Communicator *Ring, const ContextLayout &L) {
  if (llvm::Error E = ringCheck(S, C, Ring, L))
    return E;
  const int Parts = L.Parts, Rank = Ring ? Ring->rank() : 0;
  const int Next = (Rank + 1) % Parts, Prev = (Rank + Parts - 1) % Parts;
  const int64_t NK = S.Batch * S.KvHeads * S.Sk * S.D,
                NQ = S.Batch * S.Heads * S.Sq * S.D;
  const int64_t KvBytes = 2 * NK * int64_t(sizeof(T));
  const int DTag = RingAttentionTag + 0x8000;
  // The block held: K, V, then its dK, dV summed so far; and the next one.
  std::vector<T> Cur(4 * NK), Arriving(Parts > 1 ? 4 * NK : 0);
  std::copy_n(K, NK, Cur.begin());
  std::copy_n(V, NK, Cur.begin() + NK);
  std::vector<T> Bias(KeyBias ? S.Batch * S.Sk : 0);
  // The window calls' outputs, and this rank's sums of them for the block.
  std::vector<T> DQw(NQ), DKw(NK), DVw(NK), DKc(NK), DVc(NK);
  std::fill_n(DQ, NQ, T(0));
  const auto Mine = L.runs(Rank);
  for (int Step = 0; Step < Parts; ++Step) {
    const int Src = (Rank - Step + Parts) % Parts;
    if (Step + 1 < Parts)
      if (llvm::Error E =
              Ring->send(Cur.data(), KvBytes, Next, RingAttentionTag + Step))
        return E;
    if (KeyBias)
      ringGatherBias(Bias.data(), KeyBias, S, L, Src);
    const T *BlockBias = KeyBias ? Bias.data() : nullptr;
    std::fill(DKc.begin(), DKc.end(), T(0));
    std::fill(DVc.begin(), DVc.end(), T(0));
    for (const RingRun &Qr : Mine)
      for (const RingRun &Kr : L.runs(Src)) {
        if (ringPairNegligible(
                C, S, Qr, Kr, BlockBias, [&](int64_t B, int64_t A, int64_t I) {
                  return double(Lse[ringRow(S, C.Merged, B, A, I)]);
                }))
          continue;
        const AttentionCore W = ringPairCore(C, S, Qr, Kr, L.Seq);
        if (Status St = attentionBackward(DQw.data(), DKw.data(), DVw.data(),
                                          DO, Q, Cur.data(), Cur.data() + NK, O,
                                          Lse, BlockBias, S, W);
            !St.ok())
          return ringKernelError(St);
        ringAddRows(DQ, DQw.data(), S.Batch, S.Heads, S.Sq, S.D, Qr.Local,
                    Qr.Local + Qr.Length);
        ringAddRows(DKc.data(), DKw.data(), S.Batch, S.KvHeads, S.Sk, S.D,
                    Kr.Local, Kr.Local + Kr.Length);
        ringAddRows(DVc.data(), DVw.data(), S.Batch, S.KvHeads, S.Sk, S.D,
                    Kr.Local, Kr.Local + Kr.Length);
      }
    // The block's dK, dV so far (zero for this rank's own, at step 0), plus
    // this rank's contribution, passed on with the block.
    T *DKb = Cur.data() + 2 * NK, *DVb = Cur.data() + 3 * NK;
    if (Step == 0) {
      std::fill_n(DKb, 2 * NK, T(0));
    } else if (llvm::Error E =
                   Ring->recv(DKb, KvBytes, Prev, DTag + Step - 1)) {
      return E;
    }
    for (int64_t E = 0; E < NK; ++E) {
      DKb[E] += DKc[E];
      DVb[E] += DVc[E];
    }
    if (Parts > 1)
      if (llvm::Error E = Ring->send(DKb, KvBytes, Next, DTag + Step))
        return E;
    if (Step + 1 < Parts) {
      if (llvm::Error E = Ring->recv(Arriving.data(), KvBytes, Prev,
                                     RingAttentionTag + Step))
        return E;
      std::swap(Cur, Arriving);
    }
  }
  // One more shift: this rank's own block's sums, from the rank before it.
  if (Parts > 1) {
    if (llvm::Error E =
            Ring->recv(Cur.data() + 2 * NK, KvBytes, Prev, DTag + Parts - 1))
      return E;
  }
  std::copy_n(Cur.data() + 2 * NK, NK, DK);
  std::copy_n(Cur.data() + 3 * NK, NK, DV);
  return llvm::Error::success();
}

#define SP_INSTANTIATE(T)                                                      \
  template llvm::Error ringAttentionForward<T>(                                \
      T *, T *, const T *, const T *, const T *, const T *,                    \
      const AttentionShape &, AttentionCore, Communicator *,                   \
      const ContextLayout &);                                                  \
  template llvm::Error ringAttentionBackward<T>(                               \
      T *, T *, T *, const T *, const T *, const T *, const T *, const T *,    \
      const T *, const T *, const AttentionShape &, AttentionCore,             \
      Communicator *, const ContextLayout &);
SP_INSTANTIATE(float)
SP_INSTANTIATE(double)
#undef SP_INSTANTIATE

} // namespace sp::cpu
