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
#include "runtime/Numerics.h"
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
#if defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define SP_HAVE_AMX_CODE 1
#endif
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
  // inputs: denormals are zero
  return flushDenormal(numerics::widenBits(Bits16, /*Bf16=*/true));
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

//===----------------------------------------------------------------------===//
// AMX (Intel Sapphire Rapids on). TDPBF16PS multiplies a tile of 16 rows x
// 16 pairs of A by a tile of 16 pairs x 16 columns of B into a 16 x 16
// float32 tile, per the Intel SDM: for each pair, C += A(2p) B(2p), then
// C += A(2p+1) B(2p+1), each a float32 FMA rounded to nearest even with
// denormal inputs and results flushed to zero. The blocking is the one
// above, over 32 x 32 blocks of C (2 x 2 tiles, the eight tile registers:
// four of C, two of A, two of B) and k steps of 16 pairs:
//  - A is packed per 16-row panel and k step into a 1 KiB tile, [row][pair]
//    words A(r, 2p) | A(r, 2p + 1) << 16;
//  - B per 16-column panel and k step into a 1 KiB tile, [pair][column]
//    words B(2p, n) | B(2p + 1, n) << 16 (the "VNNI" layout);
//  - rows, columns and pairs past the edges are zero;
//  - a block of C is loaded into the tiles (or zeroed when Beta is 0 and
//    this is the first k block), takes the block's k steps and is stored
//    back: its sums start from C, one rounding per k, none for the add.
//===----------------------------------------------------------------------===//

constexpr int AmxEdge = 16;        // rows of an A tile, columns of a B tile
constexpr int AmxPairs = 16;       // k pairs per tile step (32 k)
constexpr int AmxTileWords = 256;  // one 1 KiB tile of 32-bit words
constexpr int64_t AmxMC = 128;     // rows per packed A block (64 KiB)

int64_t amxSteps(int64_t Kc) { return (Kc + 2 * AmxPairs - 1) / (2 * AmxPairs); }

/// Tile[P][L] = word (pair P, line L) of lines [L0, L0 + Valid) and pairs
/// [0, Pairs) from k = K (HasLast: the last pair has its odd k), zero
/// elsewhere; the lines of X as packAmx takes them.
void gatherPairs(uint32_t *Tile, bool KMajor, const uint16_t *X, int64_t Ld,
                 int64_t L0, int Valid, int64_t K, int Pairs, bool HasLast) {
  if (Valid < AmxEdge || Pairs < AmxPairs || !HasLast)
    std::memset(Tile, 0, AmxTileWords * 4);
  for (int P = 0; P < Pairs; ++P) {
    const bool HasHi = P + 1 < Pairs || HasLast;
    uint32_t *Row = Tile + P * AmxEdge;
    if (KMajor) { // two k rows, lines contiguous: interleave them
      const uint16_t *Lo = X + (K + 2 * P) * Ld + L0;
      const uint16_t *Hi = HasHi ? Lo + Ld : nullptr;
      if (Valid == AmxEdge && Hi) {
        for (int L = 0; L < AmxEdge; ++L)
          Row[L] = uint32_t(Lo[L]) | uint32_t(Hi[L]) << 16;
        continue;
      }
      for (int L = 0; L < Valid; ++L)
        Row[L] = uint32_t(Lo[L]) | (Hi ? uint32_t(Hi[L]) << 16 : 0);
    } else { // each line's k contiguous
      for (int L = 0; L < Valid; ++L) {
        const uint16_t *W = X + (L0 + L) * Ld + K + 2 * P;
        Row[L] = uint32_t(W[0]) | (HasHi ? uint32_t(W[1]) << 16 : 0);
      }
    }
  }
}

/// Pack rows (RowTiles: of A) or columns (of B) [L0, L0 + Count) of op(X)
/// over k in [K0, K0 + Kc) into 16-line panels of amxSteps(Kc) tiles: A's
/// [line][pair], B's [pair][line]. KMajor: X stored [k][line] with leading
/// dimension Ld, else [line][k].
void packAmx(uint32_t *Out, bool RowTiles, bool KMajor, const uint16_t *X,
             int64_t Ld, int64_t L0, int64_t Count, int64_t K0, int64_t Kc) {
  const int64_t Steps = amxSteps(Kc), KP = (Kc + 1) / 2;
  alignas(64) uint32_t Tmp[AmxTileWords];
  for (int64_t W0 = 0; W0 < Count; W0 += AmxEdge) {
    const int Valid = int(std::min<int64_t>(AmxEdge, Count - W0));
    for (int64_t S = 0; S < Steps; ++S) {
      uint32_t *Tile = Out + ((W0 / AmxEdge) * Steps + S) * AmxTileWords;
      const int Pairs = int(std::min<int64_t>(AmxPairs, KP - S * AmxPairs));
      const int64_t K = K0 + 2 * S * AmxPairs;
      const bool HasLast = K + 2 * Pairs <= K0 + Kc;
      if (RowTiles && !KMajor && Valid == AmxEdge && Pairs == AmxPairs) {
        // A's rows as they are: 32 k of a row are one row of the tile.
        for (int L = 0; L < AmxEdge; ++L)
          std::memcpy(Tile + L * AmxPairs, X + (L0 + W0 + L) * Ld + K, 64);
        continue;
      }
      if (!RowTiles) {
        gatherPairs(Tile, KMajor, X, Ld, L0 + W0, Valid, K, Pairs, HasLast);
        continue;
      }
      gatherPairs(Tmp, KMajor, X, Ld, L0 + W0, Valid, K, Pairs, HasLast);
      for (int L = 0; L < AmxEdge; ++L) // A's tile is [line][pair]
        for (int P = 0; P < AmxPairs; ++P)
          Tile[L * AmxPairs + P] = Tmp[P * AmxEdge + L];
    }
  }
}

/// One TDPBF16PS, as the Intel SDM defines it: Acc[16][16] += A x B tiles.
void dpbf16Emulated(float *Acc, const uint32_t *A, const uint32_t *B) {
  for (int M = 0; M < AmxEdge; ++M)
    for (int P = 0; P < AmxPairs; ++P) {
      const uint32_t AW = A[M * AmxPairs + P];
      for (int N = 0; N < AmxEdge; ++N) {
        const uint32_t BW = B[P * AmxEdge + N];
        float V = Acc[M * AmxEdge + N];
        V = flushDenormal(std::fma(bf16Value(AW & 0xffff),
                                   bf16Value(BW & 0xffff), V));
        V = flushDenormal(
            std::fma(bf16Value(AW >> 16), bf16Value(BW >> 16), V));
        Acc[M * AmxEdge + N] = V;
      }
    }
}

/// The block C[Rows <= 32, Cols <= 32] over Steps k steps: A0/A1 the packed
/// tiles of rows 0-15 and 16-31 (A1 null when Rows <= 16), B0/B1 those of
/// columns 0-15 and 16-31 (B1 null when Cols <= 16). Accumulate: the sums
/// start from C, else from zero.
using AmxBlockFn = void (*)(int64_t Steps, const uint32_t *A0,
                            const uint32_t *A1, const uint32_t *B0,
                            const uint32_t *B1, float *C, int64_t Ldc,
                            int Rows, int Cols, bool Accumulate);

/// C's block as 2 x 2 tiles of 16 x 16 with leading dimension 32, for the
/// edges: the valid part copied in (or zeros) and out.
struct EdgeBlock {
  alignas(64) float V[32 * 32];
  void load(const float *C, int64_t Ldc, int Rows, int Cols, bool Accumulate) {
    std::memset(V, 0, sizeof(V));
    if (Accumulate)
      for (int R = 0; R < Rows; ++R)
        std::memcpy(V + R * 32, C + R * Ldc, Cols * sizeof(float));
  }
  void store(float *C, int64_t Ldc, int Rows, int Cols) const {
    for (int R = 0; R < Rows; ++R)
      std::memcpy(C + R * Ldc, V + R * 32, Cols * sizeof(float));
  }
};

void amxBlockEmulated(int64_t Steps, const uint32_t *A0, const uint32_t *A1,
                      const uint32_t *B0, const uint32_t *B1, float *C,
                      int64_t Ldc, int Rows, int Cols, bool Accumulate) {
  EdgeBlock E;
  E.load(C, Ldc, Rows, Cols, Accumulate);
  float Acc[4][AmxEdge * AmxEdge];
  const uint32_t *As[2] = {A0, A1}, *Bs[2] = {B0, B1};
  for (int T = 0; T < 4; ++T) {
    const int TR = T / 2, TC = T % 2;
    if (!As[TR] || !Bs[TC])
      continue;
    for (int R = 0; R < AmxEdge; ++R)
      std::memcpy(Acc[T] + R * AmxEdge, E.V + (16 * TR + R) * 32 + 16 * TC,
                  AmxEdge * sizeof(float));
    for (int64_t S = 0; S < Steps; ++S)
      dpbf16Emulated(Acc[T], As[TR] + S * AmxTileWords,
                     Bs[TC] + S * AmxTileWords);
    for (int R = 0; R < AmxEdge; ++R)
      std::memcpy(E.V + (16 * TR + R) * 32 + 16 * TC, Acc[T] + R * AmxEdge,
                  AmxEdge * sizeof(float));
  }
  E.store(C, Ldc, Rows, Cols);
}

#ifdef SP_HAVE_AMX_CODE
/// The tile configuration: palette 1, tiles 0-7 all 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t Palette = 1, StartRow = 0;
  uint8_t Reserved[14] = {};
  uint16_t ColBytes[16] = {};
  uint8_t Rows[16] = {};
  TileConfig() {
    for (int T = 0; T < 8; ++T) {
      ColBytes[T] = 64;
      Rows[T] = 16;
    }
  }
};

__attribute__((target("amx-tile"))) void amxBegin() {
  static const TileConfig Config;
  _tile_loadconfig(&Config);
}
__attribute__((target("amx-tile"))) void amxEnd() { _tile_release(); }

__attribute__((target("amx-tile,amx-bf16"))) void
amxBlockNative(int64_t Steps, const uint32_t *A0, const uint32_t *A1,
               const uint32_t *B0, const uint32_t *B1, float *C, int64_t Ldc,
               int Rows, int Cols, bool Accumulate) {
  constexpr int Stride = AmxPairs * 4; // bytes per row of a packed tile
  if (Rows == 32 && Cols == 32) {      // the whole block in place
    const int64_t Ldb = Ldc * 4;
    if (Accumulate) {
      _tile_loadd(0, C, Ldb);
      _tile_loadd(1, C + 16, Ldb);
      _tile_loadd(2, C + 16 * Ldc, Ldb);
      _tile_loadd(3, C + 16 * Ldc + 16, Ldb);
    } else {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int64_t S = 0; S < Steps; ++S) {
      const int64_t O = S * AmxTileWords;
      _tile_loadd(4, A0 + O, Stride);
      _tile_loadd(6, B0 + O, Stride);
      _tile_loadd(7, B1 + O, Stride);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, A1 + O, Stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, C, Ldb);
    _tile_stored(1, C + 16, Ldb);
    _tile_stored(2, C + 16 * Ldc, Ldb);
    _tile_stored(3, C + 16 * Ldc + 16, Ldb);
    return;
  }
  EdgeBlock E; // an edge: through a 32 x 32 copy of the valid part
  E.load(C, Ldc, Rows, Cols, Accumulate);
  constexpr int EB = 32 * 4;
  _tile_loadd(0, E.V, EB);
  _tile_loadd(1, E.V + 16, EB);
  _tile_loadd(2, E.V + 16 * 32, EB);
  _tile_loadd(3, E.V + 16 * 32 + 16, EB);
  for (int64_t S = 0; S < Steps; ++S) {
    const int64_t O = S * AmxTileWords;
    _tile_loadd(4, A0 + O, Stride);
    _tile_loadd(6, B0 + O, Stride);
    _tile_dpbf16ps(0, 4, 6);
    if (B1) {
      _tile_loadd(7, B1 + O, Stride);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (A1) {
      _tile_loadd(5, A1 + O, Stride);
      _tile_dpbf16ps(2, 5, 6);
      if (B1)
        _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, E.V, EB);
  _tile_stored(1, E.V + 16, EB);
  _tile_stored(2, E.V + 16 * 32, EB);
  _tile_stored(3, E.V + 16 * 32 + 16, EB);
  E.store(C, Ldc, Rows, Cols);
}

/// Whether the CPU has AMX-TILE and AMX-BF16 (CPUID 7.0 EDX bits 24, 22) and
/// Linux lets this process use the tile data (arch_prctl
/// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, Linux 5.16 on).
bool amxPermitted() {
  unsigned A = 0, B = 0, C = 0, D = 0;
  if (!__get_cpuid_count(7, 0, &A, &B, &C, &D) || !((D >> 22) & 1) ||
      !((D >> 24) & 1))
    return false;
  constexpr long ReqXCompPerm = 0x1023, GetXCompPerm = 0x1022;
  constexpr long XTileData = 18;
  if (syscall(SYS_arch_prctl, ReqXCompPerm, XTileData) != 0)
    return false;
  unsigned long Features = 0;
  return syscall(SYS_arch_prctl, GetXCompPerm, &Features) == 0 &&
         ((Features >> XTileData) & 1);
}
#endif

/// gemmBf16 on AMX tiles (Block: the instruction or its twin).
void gemmAmx(bool TransA, bool TransB, int64_t M, int64_t N, int64_t K,
             const uint16_t *A, int64_t Lda, const uint16_t *B, int64_t Ldb,
             float Beta, float *C, int64_t Ldc, AmxBlockFn Block) {
  [[maybe_unused]] const bool Native = Block != amxBlockEmulated; // tiles set up
  const int64_t TilesM = (M + TM - 1) / TM, TilesN = (N + NC - 1) / NC;
  const int64_t MaxSteps = amxSteps(KC);
  parallelFor(TilesM * TilesN, 1, [&](int64_t T0, int64_t T1) {
    thread_local std::vector<uint32_t> Ap, Bp;
    Ap.resize(AmxMC / AmxEdge * MaxSteps * AmxTileWords);
    Bp.resize(NC / AmxEdge * MaxSteps * AmxTileWords);
#ifdef SP_HAVE_AMX_CODE
    if (Native)
      amxBegin();
#endif
    for (int64_t T = T0; T < T1; ++T) {
      const int64_t M0 = (T / TilesN) * TM, N0 = (T % TilesN) * NC;
      const int64_t Rows = std::min(TM, M - M0), Cols = std::min(NC, N - N0);
      for (int64_t K0 = 0; K0 < K; K0 += KC) {
        const int64_t Kc = std::min(KC, K - K0), Steps = amxSteps(Kc);
        const int64_t PanelWords = Steps * AmxTileWords;
        const bool Accumulate = K0 > 0 || Beta != 0;
        packAmx(Bp.data(), /*RowTiles=*/false, /*KMajor=*/!TransB, B, Ldb, N0,
                Cols, K0, Kc);
        for (int64_t I0 = 0; I0 < Rows; I0 += AmxMC) {
          const int64_t Rc = std::min(AmxMC, Rows - I0);
          packAmx(Ap.data(), /*RowTiles=*/true, /*KMajor=*/TransA, A, Lda,
                  M0 + I0, Rc, K0, Kc);
          for (int64_t J = 0; J < Cols; J += 32) {
            const int Cn = int(std::min<int64_t>(32, Cols - J));
            const uint32_t *B0 = Bp.data() + (J / AmxEdge) * PanelWords;
            const uint32_t *B1 = Cn > 16 ? B0 + PanelWords : nullptr;
            for (int64_t I = 0; I < Rc; I += 32) {
              const int Rn = int(std::min<int64_t>(32, Rc - I));
              const uint32_t *A0 = Ap.data() + (I / AmxEdge) * PanelWords;
              const uint32_t *A1 = Rn > 16 ? A0 + PanelWords : nullptr;
              Block(Steps, A0, A1, B0, B1, C + (M0 + I0 + I) * Ldc + N0 + J,
                    Ldc, Rn, Cn, Accumulate);
            }
          }
        }
      }
    }
#ifdef SP_HAVE_AMX_CODE
    if (Native)
      amxEnd();
#endif
  });
}

std::atomic<int> DotEnabled{-1}; // -1: not decided yet
std::atomic<int> AmxEnabled{-1};

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

bool hasAmxBf16() {
#ifdef SP_HAVE_AMX_CODE
  static const bool Has = amxPermitted();
  return Has;
#else
  return false;
#endif
}

static bool envOff(const char *Name) {
  const char *Env = std::getenv(Name);
  return Env && std::strcmp(Env, "0") == 0;
}

bool bf16DotEnabled() {
  int On = DotEnabled.load(std::memory_order_relaxed);
  if (On < 0) {
    On = (hasBf16Dot() || hasAmxBf16()) && !envOff("SP_CPU_BF16_DOT");
    DotEnabled.store(On, std::memory_order_relaxed);
  }
  return On;
}

void setBf16DotEnabled(bool On) {
  DotEnabled.store(On && (hasBf16Dot() || hasAmxBf16()),
                   std::memory_order_relaxed);
}

bool amxEnabled() {
  int On = AmxEnabled.load(std::memory_order_relaxed);
  if (On < 0) {
    On = hasAmxBf16() && !envOff("SP_CPU_AMX");
    AmxEnabled.store(On, std::memory_order_relaxed);
  }
  return On;
}

void setAmxEnabled(bool On) {
  AmxEnabled.store(On && hasAmxBf16(), std::memory_order_relaxed);
}

const char *bf16KernelName(Bf16Kernel Kernel) {
  switch (resolveBf16Kernel(Kernel)) {
  case Bf16Kernel::Native:
    return "AVX-512 BF16 (VDPBF16PS)";
  case Bf16Kernel::Amx:
    return "AMX (TDPBF16PS)";
  case Bf16Kernel::Emulated:
    return "the portable twin of VDPBF16PS";
  case Bf16Kernel::AmxEmulated:
    return "the portable twin of TDPBF16PS";
  case Bf16Kernel::Best:
    break;
  }
  return "?";
}

Bf16Kernel resolveBf16Kernel(Bf16Kernel Kernel) {
  if (Kernel != Bf16Kernel::Best)
    return Kernel;
  if (amxEnabled())
    return Bf16Kernel::Amx;
  return hasBf16Dot() ? Bf16Kernel::Native : Bf16Kernel::Emulated;
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
  Kernel = resolveBf16Kernel(Kernel);
  if (Kernel == Bf16Kernel::AmxEmulated)
    return gemmAmx(TransA, TransB, M, N, K, A, Lda, B, Ldb, Beta, C, Ldc,
                   amxBlockEmulated);
  if (Kernel == Bf16Kernel::Amx) {
#ifdef SP_HAVE_AMX_CODE
    if (!hasAmxBf16())
      std::abort(); // a caller's bug: check hasAmxBf16() first
    return gemmAmx(TransA, TransB, M, N, K, A, Lda, B, Ldb, Beta, C, Ldc,
                   amxBlockNative);
#else
    std::abort();
#endif
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
