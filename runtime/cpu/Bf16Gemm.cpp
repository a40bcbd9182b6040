//===- Bf16Gemm.cpp - bfloat16 GEMM on the AVX-512 BF16 dot product ------===//
//
// GotoBLAS-style blocking around a 12 x 32 micro-kernel:
//  - C is cut into tiles of TM x NC over the kernel threads;
//  - per tile and per block of KC k's, the tile's B block is packed into
//    panels of NR = 32 columns, [pair][column] words, each word the two
//    bfloat16 B(2p, n) | B(2p + 1, n) << 16;
//  - per MC rows, the A block is packed into panels of MR = 12 rows,
//    [pair][row] words A(r, 2p) | A(r, 2p + 1) << 16;
//  - the micro-kernel holds a 12 x 32 float32 tile in 24 zmm registers and,
//    per pair, loads two B vectors and broadcasts each row's A word:
//    VDPBF16PS adds A(r,2p) B(2p,n) + A(r,2p+1) B(2p+1,n) to each lane.
// An odd K is padded with a zero k; rows and columns past the edge are
// padded with zeros and never stored.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/Bf16Gemm.h"
#include "runtime/cpu/Parallel.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SP_HAVE_BF16_DOT_CODE 1
#endif

namespace sp::cpu {
namespace {

constexpr int MR = 12, NR = 32;
constexpr int64_t KC = 256;    // k per block: 128 pairs; a B panel is 16 KiB
constexpr int64_t MC = 12 * MR;  // rows per packed A block (72 KiB)
constexpr int64_t NC = 512;    // columns per tile (a 256 KiB B block)
constexpr int64_t TM = 4 * MC; // rows per tile

/// Kc values contiguous in k as (Kc + 1) / 2 words, word p = Line[2p] |
/// Line[2p + 1] << 16 (zero past an odd Kc), at Out[p Stride].
void packLine(uint32_t *Out, int64_t Stride, const uint16_t *Line,
              int64_t Kc) {
  int64_t P = 0;
  for (; 2 * P + 1 < Kc; ++P) {
    uint32_t W;
    std::memcpy(&W, Line + 2 * P, 4);
    Out[P * Stride] = W;
  }
  if (2 * P < Kc)
    Out[P * Stride] = Line[2 * P];
}

/// Panels of Width lines (rows of op(A), or columns of op(B)) over k in
/// [K0, K0 + Kc): for lines [L0, L0 + Count) of X, panel w holds words
/// [pair][line], word (p, l) = X(l, K0 + 2p) | X(l, K0 + 2p + 1) << 16.
/// KMajor: X stored [k][line] with leading dimension Ld (an A^T or a B),
/// else [line][k] (an A or a B^T). Lines past Count and the k past an odd
/// Kc are zero.
void pack(uint32_t *Out, int Width, bool KMajor, const uint16_t *X,
          int64_t Ld, int64_t L0, int64_t Count, int64_t K0, int64_t Kc) {
  const int64_t KP = (Kc + 1) / 2;
  for (int64_t W0 = 0; W0 < Count; W0 += Width) {
    uint32_t *Panel = Out + (W0 / Width) * KP * Width;
    const int Valid = int(std::min<int64_t>(Width, Count - W0));
    if (KMajor) { // two k rows interleaved, lines contiguous
      for (int64_t P = 0; P < KP; ++P) {
        const uint16_t *Lo = X + (K0 + 2 * P) * Ld + L0 + W0;
        const uint16_t *Hi = 2 * P + 1 < Kc ? Lo + Ld : nullptr;
        uint32_t *Row = Panel + P * Width;
        for (int L = 0; L < Valid; ++L)
          Row[L] = uint32_t(Lo[L]) | (Hi ? uint32_t(Hi[L]) << 16 : 0);
        for (int L = Valid; L < Width; ++L)
          Row[L] = 0;
      }
    } else { // each line's k contiguous
      for (int L = 0; L < Width; ++L) {
        if (L >= Valid) {
          for (int64_t P = 0; P < KP; ++P)
            Panel[P * Width + L] = 0;
          continue;
        }
        packLine(Panel + L, Width, X + (L0 + W0 + L) * Ld + K0, Kc);
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// Micro-kernels: C[Rows, Cols] (=|+=) Ap-panel x Bp-panel over KP pairs.
//===----------------------------------------------------------------------===//

float flushDenormal(float X) {
  return std::fpclassify(X) == FP_SUBNORMAL ? std::copysign(0.0f, X) : X;
}

float bf16Value(uint32_t Bits16) {
  uint32_t Bits = Bits16 << 16;
  float F;
  std::memcpy(&F, &Bits, 4);
  return flushDenormal(F); // inputs: denormals are zero
}

/// One lane of VDPBF16PS, as the Intel SDM defines it.
float dotPair(float Acc, uint32_t A, uint32_t B) {
  Acc = flushDenormal(
      std::fma(bf16Value(A >> 16), bf16Value(B >> 16), Acc));
  return flushDenormal(
      std::fma(bf16Value(A & 0xffff), bf16Value(B & 0xffff), Acc));
}

void tileEmulated(int64_t KP, const uint32_t *Ap, const uint32_t *Bp, float *C,
                  int64_t Ldc, int Rows, int Cols, bool Accumulate) {
  float Acc[MR][NR] = {};
  for (int64_t P = 0; P < KP; ++P)
    for (int R = 0; R < MR; ++R)
      for (int N = 0; N < NR; ++N)
        Acc[R][N] = dotPair(Acc[R][N], Ap[P * MR + R], Bp[P * NR + N]);
  for (int R = 0; R < Rows; ++R)
    for (int N = 0; N < Cols; ++N)
      C[R * Ldc + N] = Accumulate ? C[R * Ldc + N] + Acc[R][N] : Acc[R][N];
}

#ifdef SP_HAVE_BF16_DOT_CODE
__attribute__((target("avx512f,avx512bf16"))) void
tileNative(int64_t KP, const uint32_t *Ap, const uint32_t *Bp, float *C,
           int64_t Ldc, int Rows, int Cols, bool Accumulate) {
  __m512 Acc[MR][2];
#pragma GCC unroll 12
  for (int R = 0; R < MR; ++R)
    Acc[R][0] = Acc[R][1] = _mm512_setzero_ps();
  for (int64_t P = 0; P < KP; ++P) {
    const __m512bh B0 = (__m512bh)_mm512_loadu_si512(Bp + P * NR);
    const __m512bh B1 = (__m512bh)_mm512_loadu_si512(Bp + P * NR + 16);
    const uint32_t *A = Ap + P * MR;
#pragma GCC unroll 12
    for (int R = 0; R < MR; ++R) {
      const __m512bh AR = (__m512bh)_mm512_set1_epi32(int(A[R]));
      Acc[R][0] = _mm512_dpbf16_ps(Acc[R][0], AR, B0);
      Acc[R][1] = _mm512_dpbf16_ps(Acc[R][1], AR, B1);
    }
  }
  const __mmask16 M0 = Cols >= 16 ? 0xffff : __mmask16((1u << Cols) - 1);
  const __mmask16 M1 = Cols >= 32   ? 0xffff
                       : Cols > 16 ? __mmask16((1u << (Cols - 16)) - 1)
                                   : 0;
  for (int R = 0; R < Rows; ++R) {
    float *Row = C + R * Ldc;
    __m512 V0 = Acc[R][0], V1 = Acc[R][1];
    if (Accumulate) {
      V0 = _mm512_add_ps(_mm512_maskz_loadu_ps(M0, Row), V0);
      V1 = _mm512_add_ps(_mm512_maskz_loadu_ps(M1, Row + 16), V1);
    }
    _mm512_mask_storeu_ps(Row, M0, V0);
    _mm512_mask_storeu_ps(Row + 16, M1, V1);
  }
}
#endif

std::atomic<int> DotEnabled{-1}; // -1: not decided yet

} // namespace

bool hasBf16Dot() {
#ifdef SP_HAVE_BF16_DOT_CODE
  static const bool Has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bf16");
  return Has;
#else
  return false;
#endif
}

bool bf16DotEnabled() {
  int On = DotEnabled.load(std::memory_order_relaxed);
  if (On < 0) {
    const char *Env = std::getenv("SP_CPU_BF16_DOT");
    On = hasBf16Dot() && !(Env && std::strcmp(Env, "0") == 0);
    DotEnabled.store(On, std::memory_order_relaxed);
  }
  return On;
}

void setBf16DotEnabled(bool On) {
  DotEnabled.store(On && hasBf16Dot(), std::memory_order_relaxed);
}

int64_t bf16GemmRoundings(int64_t K, float Beta) {
  int64_t Blocks = (K + KC - 1) / KC;
  return std::max<int64_t>(0, K + Blocks - (Beta == 0 ? 1 : 0));
}

void gemmBf16(bool TransA, bool TransB, int64_t M, int64_t N, int64_t K,
              const uint16_t *A, int64_t Lda, const uint16_t *B, int64_t Ldb,
              float Beta, float *C, int64_t Ldc, Bf16Kernel Kernel) {
  if (M <= 0 || N <= 0)
    return;
  if (Beta != 0 && Beta != 1)
    std::abort(); // a caller's bug: only 0 and 1 are implemented
  if (K <= 0) {
    if (Beta == 0)
      for (int64_t I = 0; I < M; ++I)
        std::fill(C + I * Ldc, C + I * Ldc + N, 0.0f);
    return;
  }
  auto *Tile = tileEmulated;
#ifdef SP_HAVE_BF16_DOT_CODE
  if (Kernel == Bf16Kernel::Native) {
    if (!hasBf16Dot())
      std::abort(); // a caller's bug: check hasBf16Dot() first
    Tile = tileNative;
  }
#else
  if (Kernel == Bf16Kernel::Native)
    std::abort();
#endif
  const int64_t TilesM = (M + TM - 1) / TM, TilesN = (N + NC - 1) / NC;
  parallelFor(TilesM * TilesN, 1, [&](int64_t T0, int64_t T1) {
    thread_local std::vector<uint32_t> Ap, Bp;
    Ap.resize(MC / 2 * (KC + 2)); // MC rows x KC/2 pairs (+ slack)
    Bp.resize(NC / 2 * (KC + 2));
    for (int64_t T = T0; T < T1; ++T) {
      const int64_t M0 = (T / TilesN) * TM, N0 = (T % TilesN) * NC;
      const int64_t Rows = std::min(TM, M - M0), Cols = std::min(NC, N - N0);
      for (int64_t K0 = 0; K0 < K; K0 += KC) {
        const int64_t Kc = std::min(KC, K - K0), KP = (Kc + 1) / 2;
        const bool Accumulate = K0 > 0 || Beta != 0;
        pack(Bp.data(), NR, /*KMajor=*/!TransB, B, Ldb, N0, Cols, K0, Kc);
        for (int64_t I0 = 0; I0 < Rows; I0 += MC) {
          const int64_t Rc = std::min(MC, Rows - I0);
          pack(Ap.data(), MR, /*KMajor=*/TransA, A, Lda, M0 + I0, Rc, K0, Kc);
          for (int64_t J = 0; J < Cols; J += NR)
            for (int64_t I = 0; I < Rc; I += MR)
              Tile(KP, Ap.data() + (I / MR) * KP * MR,
                   Bp.data() + (J / NR) * KP * NR,
                   C + (M0 + I0 + I) * Ldc + N0 + J, Ldc,
                   int(std::min<int64_t>(MR, Rc - I)),
                   int(std::min<int64_t>(NR, Cols - J)), Accumulate);
        }
      }
    }
  });
}

} // namespace sp::cpu
