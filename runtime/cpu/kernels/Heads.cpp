//===- Heads.cpp - Head layouts, GQA repeat and RoPE ----------------------===//
//
// Kernels.h, sections 6, 17 and 18: the attention heads' layouts (copies,
// each element written once), the rotary position embedding and the
// grouped-query heads' repeat and its summing backward. The CUDA twin is
// runtime/cuda/kernels/Heads.cuh.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/kernels/Common.h"

#include <cstring>
#include <type_traits>

namespace sp::cpu {

using namespace detail;

//===----------------------------------------------------------------------===//
// 6. Head layouts
//===----------------------------------------------------------------------===//

namespace {
/// The head layouts are copies between token-major rows and head-major
/// blocks: for every token t = (b, s) and head a, Copy(Tok, Hd) copies
/// head a's D values between column a D of the token's row of Width
/// (offset t Width + a D) and row s of block (b, a) of a [B, Heads, S, D]
/// tensor (offset ((b Heads + a) S + s) D), in the direction the kernel
/// needs. The tokens go over the kernel threads; each element is written
/// once, so the split changes nothing.
template <typename F>
void forHeadRows(int64_t B, int64_t S, int64_t Heads, int64_t D, int64_t Width,
                 int64_t HeadStride, F &&Copy) {
  forEachRow(B * S, Width, [&](int64_t T) {
    int64_t Bi = T / S, Si = T % S;
    for (int64_t A = 0; A < Heads; ++A)
      Copy(T * Width + A * HeadStride, ((Bi * Heads + A) * S + Si) * D);
  });
}

/// Every head layout is one such copy between a token-major tensor Tok
/// [B, S, Parts H], H = Heads D, and Parts head-major tensors Hd[p] [B,
/// Heads, S, D], the p-th being columns [p H, (p + 1) H) of Tok (or, when
/// PerHead, GPT-NeoX's [Heads, Parts, D] columns: head a's part p at
/// (a Parts + p) D): into the heads when ToHeads, else into Tok.
template <bool ToHeads, typename T, int Parts>
void copyHeads(std::conditional_t<ToHeads, const T, T> *Tok,
               std::conditional_t<ToHeads, T, const T> *const (&Hd)[Parts],
               int64_t B, int64_t S, int64_t Heads, int64_t D,
               bool PerHead = false) {
  checkSizes({B, S, Heads, D});
  const int64_t H = Heads * D;
  const int64_t HeadStride = PerHead ? Parts * D : D;
  const int64_t PartStride = PerHead ? D : H;
  forHeadRows(B, S, Heads, D, Parts * H, HeadStride,
              [&](int64_t TokAt, int64_t HdAt) {
                for (int P = 0; P < Parts; ++P)
                  if constexpr (ToHeads)
                    std::memcpy(Hd[P] + HdAt, Tok + TokAt + P * PartStride,
                                sizeof(T) * D);
                  else
                    std::memcpy(Tok + TokAt + P * PartStride, Hd[P] + HdAt,
                                sizeof(T) * D);
              });
}
} // namespace

template <typename T>
void splitHeads(T *Q, T *K, T *V, const T *QKV, int64_t B, int64_t S,
                int64_t Heads, int64_t D, bool PerHead) {
  copyHeads</*ToHeads=*/true, T, 3>(QKV, {Q, K, V}, B, S, Heads, D, PerHead);
}

template <typename T>
void splitHeadsBackward(T *DQKV, const T *DQ, const T *DK, const T *DV,
                        int64_t B, int64_t S, int64_t Heads, int64_t D,
                        bool PerHead) {
  copyHeads</*ToHeads=*/false, T, 3>(DQKV, {DQ, DK, DV}, B, S, Heads, D,
                                     PerHead);
}

template <typename T>
void mergeHeads(T *Y, const T *X, int64_t B, int64_t S, int64_t Heads,
                int64_t D) {
  copyHeads</*ToHeads=*/false, T, 1>(Y, {X}, B, S, Heads, D);
}

template <typename T>
void mergeHeadsBackward(T *DX, const T *DY, int64_t B, int64_t S, int64_t Heads,
                        int64_t D) {
  copyHeads</*ToHeads=*/true, T, 1>(DY, {DX}, B, S, Heads, D);
}

//===----------------------------------------------------------------------===//
// 17. Rotary position embedding
//===----------------------------------------------------------------------===//

namespace {

void checkRope(int64_t B, int64_t A, int64_t S, int64_t D, int64_t CB,
               int64_t Rot) {
  checkSizes({B, A, S, D, CB, Rot});
  SP_CPU_CHECK(Rot % 2 == 0 && Rot <= D,
               "rope rotates an even number of dims, at most the head size");
  SP_CPU_CHECK(CB == 1 || CB == B,
               "rope tables must have batch dimension 1 or B");
}

/// Calls Fn(Out, In, C, N, I, J) for every rotated pair (I, J) of the first
/// Rot dims of every (b, a, s) row of [B, A, S, D] ((2k, 2k + 1) when
/// Interleaved, else (k, k + Rot / 2)), rows over the threads, with the
/// row's Cos and Sin rows ([.., Rot] tables); dims Rot.. are copied.
template <typename T, typename F>
void forEachRopePair(T *Out, const T *In, const T *Cos, const T *Sin, int64_t B,
                     int64_t A, int64_t S, int64_t D, int64_t CB,
                     bool Interleaved, int64_t Rot, F &&Fn) {
  Rot = Rot ? Rot : D;
  checkRope(B, A, S, D, CB, Rot);
  const int64_t Half = Rot / 2;
  forEachRow(B * A * S, D, [&](int64_t R) {
    int64_t Si = R % S, Bi = R / (A * S);
    int64_t Table = ((CB == 1 ? 0 : Bi) * S + Si) * Rot;
    T *O = Out + R * D;
    const T *X = In + R * D, *C = Cos + Table, *N = Sin + Table;
    if (Interleaved)
      for (int64_t J = 0; J < Rot; J += 2)
        Fn(O, X, C, N, J, J + 1);
    else
      for (int64_t I = 0; I < Half; ++I)
        Fn(O, X, C, N, I, I + Half);
    if (Rot < D)
      std::memcpy(O + Rot, X + Rot, sizeof(T) * (D - Rot));
  });
}

} // namespace

template <typename T>
void rope(T *Y, const T *X, const T *Cos, const T *Sin, int64_t B, int64_t A,
          int64_t S, int64_t D, int64_t CB, bool Interleaved, int64_t Rot) {
  forEachRopePair(
      Y, X, Cos, Sin, B, A, S, D, CB, Interleaved, Rot,
      [](T *YR, const T *XR, const T *C, const T *N, int64_t I, int64_t J) {
        YR[I] = XR[I] * C[I] - XR[J] * N[I];
        YR[J] = XR[J] * C[J] + XR[I] * N[J];
      });
}

template <typename T>
void ropeBackward(T *DX, const T *DY, const T *Cos, const T *Sin, int64_t B,
                  int64_t A, int64_t S, int64_t D, int64_t CB, bool Interleaved,
                  int64_t Rot) {
  forEachRopePair(
      DX, DY, Cos, Sin, B, A, S, D, CB, Interleaved, Rot,
      [](T *DXR, const T *DYR, const T *C, const T *N, int64_t I, int64_t J) {
        DXR[I] = DYR[I] * C[I] + DYR[J] * N[J];
        DXR[J] = DYR[J] * C[J] - DYR[I] * N[I];
      });
}

//===----------------------------------------------------------------------===//
// 18. Grouped-query attention's head repeat
//===----------------------------------------------------------------------===//

template <typename T>
void repeatHeads(T *Y, const T *X, int64_t B, int64_t G, int64_t R, int64_t S,
                 int64_t D) {
  checkSizes({B, G, R, S, D});
  // Each [S, D] head block copied R times, as mergeHeads copies.
  const int64_t Block = S * D;
  for (int64_t P = 0; P < B * G; ++P)
    for (int64_t Ri = 0; Ri < R; ++Ri)
      std::memcpy(Y + (P * R + Ri) * Block, X + P * Block, sizeof(T) * Block);
}

template <typename T>
void repeatHeadsBackward(T *DX, const T *DY, int64_t B, int64_t G, int64_t R,
                         int64_t S, int64_t D) {
  checkSizes({B, G, R, S, D});
  const int64_t Block = S * D;
  for (int64_t P = 0; P < B * G; ++P) {
    const T *Src = DY + P * R * Block;
    T *Dst = DX + P * Block;
    for (int64_t E = 0; E < Block; ++E) {
      Acc Sum = 0;
      for (int64_t Ri = 0; Ri < R; ++Ri)
        Sum += Src[Ri * Block + E];
      Dst[E] = T(Sum);
    }
  }
}

#define SP_INSTANTIATE(T)                                                      \
  template void splitHeads<T>(T *, T *, T *, const T *, int64_t, int64_t,      \
                              int64_t, int64_t, bool);                         \
  template void splitHeadsBackward<T>(T *, const T *, const T *, const T *,    \
                                      int64_t, int64_t, int64_t, int64_t,      \
                                      bool);                                   \
  template void mergeHeads<T>(T *, const T *, int64_t, int64_t, int64_t,       \
                              int64_t);                                        \
  template void mergeHeadsBackward<T>(T *, const T *, int64_t, int64_t,        \
                                      int64_t, int64_t);                       \
  template void rope<T>(T *, const T *, const T *, const T *, int64_t,         \
                        int64_t, int64_t, int64_t, int64_t, bool, int64_t);    \
  template void ropeBackward<T>(T *, const T *, const T *, const T *, int64_t, \
                                int64_t, int64_t, int64_t, int64_t, bool,      \
                                int64_t);                                      \
  template void repeatHeads<T>(T *, const T *, int64_t, int64_t, int64_t,      \
                               int64_t, int64_t);                              \
  template void repeatHeadsBackward<T>(T *, const T *, int64_t, int64_t,       \
                                       int64_t, int64_t, int64_t);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
