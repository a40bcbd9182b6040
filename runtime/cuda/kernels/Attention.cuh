//===- Attention.cuh - The fused attention core, blockwise -------*- CUDA
//-*-===//
//
// Reference: runtime/cpu/Attention.cpp (FlashAttention's algorithm; Dao et
// al. 2022, Dao 2023), the same core op for op on each score:
//   s = float(Scale) * (q . k)                 (float32)
//   s = s + bias[b, j]          (padding, before the causal fill if PadFirst)
//   s = Fill  where Key0 + j > Query0 + i      (causal)
//   s = s + bias[b, j]          (padding, after it otherwise)
//   forward, per block of 64 keys: m' = max(m, max_j s_j),
//     p_j = exp(s_j - m'), l = l exp(m - m') + sum_j p_j,
//     acc = acc exp(m - m') + sum_j dropout(p_j) v_j;
//     o = acc / l, lse = m + log l (a row of -inf scores: o = 0, lse = -inf)
//   dropout(p) = keep ? p * float(1 / (1 - Ratio)) : 0, keep from the
//     Philox word of the probability's global index (Dropout.cuh's rule), so
//     the draws are the CPU's and the unfused dropout's, bit for bit
//   backward: Delta_i = float(sum_d do_id o_id) (double), p = exp(s - lse),
//     dv_j += sum_i dropout(p_ij) do_i, dp_ij = do_i . v_j,
//     ds_ij = float(Scale) * (p_ij (dropout'(dp_ij) - Delta_i)), 0 where the
//     causal mask replaced the score, dq_i += sum_j ds_ij k_j,
//     dk_j += sum_i ds_ij q_i
// Blocks of keys above the causal diagonal are skipped by the CPU kernel's
// rule (once every row's maximum, or log-sum-exp, exceeds Fill + max(0,
// bias) + 104, where exp underflows float32), so skipping changes nothing.
//
// Every product is computed in float32 on the CUDA cores, from operands
// widened exactly from their storage (Elems), each result rounded once to
// it: the CPU backend's rule for 16-bit plans. The products sum in another
// order than the CPU's GEMMs (and fused multiply-adds round once), so the
// results match the CPU's within a few float32 roundings, not bit for bit
// (tests/gpu/AttentionCase.h derives the bound).
//
// Work: 256 threads per block of 64 query rows (forward, dq) or 64 keys
// (dk and dv), as a 16 x 16 grid: thread (ty, tx) owns the scores of rows
// ty + 16 i and keys tx + 16 j (i, j < 4), and the output columns
// 64 g + 4 tx + {0..3}. Tiles of 64 rows by the head size sit in shared
// memory, row-major with a row pitch of 4 (mod 32) floats, so the float4
// reads of a quarter warp touch distinct banks. The backward runs two
// kernels, one per key block (dk, dv) and one per query block (dq), each
// recomputing the scores, so that every gradient element has one writer
// and one summation order: no atomics, the same bits on every run.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/Philox.h"
#include "runtime/cuda/kernels/Common.cuh"

namespace sp::cuda {
namespace {

constexpr int ABlock = int(AttentionBlock); // rows and keys of a block
constexpr int AThreads = 256;
constexpr int APitch = ABlock + 4; // the score tiles' row pitch

/// A tile's row pitch: at least the head size rounded up to 4, and 4 mod
/// 32 (see the file comment).
inline int tilePitch(int64_t D) {
  int P = int((D + 3) / 4 * 4);
  while (P % 32 != 4)
    P += 4;
  return P;
}

/// An Elems element whose storage is known only at run time (the
/// log-sum-exp, which a 16-bit plan may keep in float32).
__device__ inline float ldAny(Elems E, int64_t I) {
  switch (E.Kind) {
  case Storage::F32:
    return ldAs<Storage::F32>(E, I);
  case Storage::BF16:
    return ldAs<Storage::BF16>(E, I);
  default:
    return ldAs<Storage::F16>(E, I);
  }
}
__device__ inline void stAny(Elems E, int64_t I, float V) {
  switch (E.Kind) {
  case Storage::F32:
    return stAs<Storage::F32>(E, I, V);
  case Storage::BF16:
    return stAs<Storage::BF16>(E, I, V);
  default:
    return stAs<Storage::F16>(E, I, V);
  }
}

/// Dst[r, d] = Src[Base + r RowStride + d] for r < Rows, d < D; zero
/// elsewhere in the 64 x D4 tile (D4: D rounded up to 4).
template <Storage ST>
__device__ inline void loadTile(float *Dst, int Pitch, Elems Src, int64_t Base,
                                int64_t RowStride, int Rows, int D, int D4) {
  for (int E = threadIdx.x; E < ABlock * D4; E += AThreads) {
    int R = E / D4, X = E % D4;
    Dst[R * Pitch + X] =
        R < Rows && X < D ? ldAs<ST>(Src, Base + R * RowStride + X) : 0.0f;
  }
}

/// Acc[i][j] = sum_d A[ty + 16 i, d] B[tx + 16 j, d] over the tiles' D4
/// columns.
__device__ inline void tileProduct(float (&Acc)[4][4], const float *A,
                                   const float *B, int Pitch, int D4) {
  const int Tx = threadIdx.x % 16, Ty = threadIdx.x / 16;
#pragma unroll
  for (int I = 0; I < 4; ++I)
#pragma unroll
    for (int J = 0; J < 4; ++J)
      Acc[I][J] = 0.0f;
  for (int X = 0; X < D4; X += 4) {
    float4 Av[4], Bv[4];
#pragma unroll
    for (int I = 0; I < 4; ++I)
      Av[I] = *reinterpret_cast<const float4 *>(A + (Ty + 16 * I) * Pitch + X);
#pragma unroll
    for (int J = 0; J < 4; ++J)
      Bv[J] = *reinterpret_cast<const float4 *>(B + (Tx + 16 * J) * Pitch + X);
#pragma unroll
    for (int I = 0; I < 4; ++I)
#pragma unroll
      for (int J = 0; J < 4; ++J) {
        float S = Acc[I][J];
        S = __fmaf_rn(Av[I].x, Bv[J].x, S);
        S = __fmaf_rn(Av[I].y, Bv[J].y, S);
        S = __fmaf_rn(Av[I].z, Bv[J].z, S);
        S = __fmaf_rn(Av[I].w, Bv[J].w, S);
        Acc[I][J] = S;
      }
  }
}

/// Out[i][g][k] += sum_c P[(Ty + 16 i) PPitch + c] B[c, 64 g + 4 Tx + k]
/// over the 64 columns of the score tile P (its rows are this thread's
/// rows) and the rows of the tile B (pitch Pitch).
template <int NG>
__device__ inline void scoresTimesTile(float (&Out)[4][NG][4], const float *P,
                                       const float *B, int Pitch, int D4) {
  const int Tx = threadIdx.x % 16, Ty = threadIdx.x / 16;
  for (int C = 0; C < ABlock; C += 4) {
    float4 Pv[4];
#pragma unroll
    for (int I = 0; I < 4; ++I)
      Pv[I] = *reinterpret_cast<const float4 *>(P + (Ty + 16 * I) * APitch + C);
#pragma unroll
    for (int G = 0; G < NG; ++G) {
      const int X = 64 * G + 4 * Tx;
      if (X >= D4)
        continue;
#pragma unroll
      for (int CC = 0; CC < 4; ++CC) {
        const float4 Bv =
            *reinterpret_cast<const float4 *>(B + (C + CC) * Pitch + X);
#pragma unroll
        for (int I = 0; I < 4; ++I) {
          const float Pc = CC == 0   ? Pv[I].x
                           : CC == 1 ? Pv[I].y
                           : CC == 2 ? Pv[I].z
                                     : Pv[I].w;
          Out[I][G][0] = __fmaf_rn(Pc, Bv.x, Out[I][G][0]);
          Out[I][G][1] = __fmaf_rn(Pc, Bv.y, Out[I][G][1]);
          Out[I][G][2] = __fmaf_rn(Pc, Bv.z, Out[I][G][2]);
          Out[I][G][3] = __fmaf_rn(Pc, Bv.w, Out[I][G][3]);
        }
      }
    }
  }
}

/// The global index of probability (b, a, i, 0) (Attention.cpp's
/// rowIndex).
__device__ inline uint64_t probRow(const AttentionGeometry &G, int64_t B,
                                   int64_t A, int64_t I) {
  return uint64_t(
             ((B + G.ProbOffset[0]) * G.ProbGlobal[1] + A + G.ProbOffset[1]) *
                 G.ProbGlobal[2] +
             I + G.ProbOffset[2]) *
             uint64_t(G.ProbGlobal[3]) +
         uint64_t(G.ProbOffset[3]);
}

/// Keep[r 64 + c] = whether the dropout keeps probability (b, a, I0 + r,
/// J0 + c): one Philox evaluation per four keys whose global indices are
/// one Philox block, else one per key (Dropout.cuh's rule).
__device__ inline void blockKeep(uint8_t *Keep, const AttentionGeometry &G,
                                 int64_t B, int64_t A, int64_t I0, int64_t J0,
                                 uint64_t Threshold) {
  for (int Q = threadIdx.x; Q < ABlock * ABlock / 4; Q += AThreads) {
    const int R = Q / (ABlock / 4), C = Q % (ABlock / 4) * 4;
    const uint64_t At = probRow(G, B, A, I0 + R) + uint64_t(J0 + C);
    uint32_t W[4];
    if ((At & 3) == 0) {
      philox::Words4 P = philox::philox4x32_10(
          philox::dropoutCounter(G.Layer, G.Site, G.Stream, At),
          uint32_t(G.Seed), uint32_t(G.Seed >> 32));
#pragma unroll
      for (int K = 0; K < 4; ++K)
        W[K] = P.V[K];
    } else {
#pragma unroll
      for (int K = 0; K < 4; ++K)
        W[K] = philox::dropoutWord(G.Seed, G.Layer, G.Site, G.Stream, At + K);
    }
    uchar4 Out;
    const bool Any = Threshold <= 0xFFFFFFFFull;
    Out.x = Any && W[0] >= uint32_t(Threshold);
    Out.y = Any && W[1] >= uint32_t(Threshold);
    Out.z = Any && W[2] >= uint32_t(Threshold);
    Out.w = Any && W[3] >= uint32_t(Threshold);
    *reinterpret_cast<uchar4 *>(Keep + R * ABlock + C) = Out;
  }
}

/// max(0, max_j Bias[j]) over a batch's keys (Attention.cpp's maxBias),
/// for the skipping rule; 0 without a bias. Every thread calls it.
__device__ inline float biasMax(const float *Bias, int64_t Sk) {
  __shared__ float Part[AThreads / 32];
  float M = 0.0f;
  if (Bias)
    for (int64_t J = threadIdx.x; J < Sk; J += AThreads)
      M = M < Bias[J] ? Bias[J] : M;
#pragma unroll
  for (int Off = 16; Off > 0; Off /= 2) {
    float O = __shfl_xor_sync(0xffffffffu, M, Off);
    M = M < O ? O : M;
  }
  if (threadIdx.x % 32 == 0)
    Part[threadIdx.x / 32] = M;
  __syncthreads();
  float All = Part[0];
#pragma unroll
  for (int K = 1; K < AThreads / 32; ++K)
    All = All < Part[K] ? Part[K] : All;
  __syncthreads();
  return All;
}

/// The score above which a row's masked scores are negligible: Fill +
/// max(0, bias) + 104, in float (Attention.cpp's Skip). Every thread calls
/// it.
__device__ inline float skipAbove(const AttentionGeometry &G,
                                  const float *Bias) {
  return __fadd_rn(__fadd_rn(G.Fill, biasMax(Bias, G.Sk)), 104.0f);
}

/// The query block of a forward or dq thread block: blockIdx.x counts the
/// query blocks from the last (under a causal mask, the longest first),
/// blockIdx.y is the head, blockIdx.z the batch. I0: its first row; Rows:
/// its rows (up to 64); QBase: q's element (b, a, I0, 0); KBase: k's and
/// v's (b, kv head of a, 0, 0); Bias: the batch's key bias (or null); Skip:
/// skipAbove's. Every thread calls it.
struct QueryBlock {
  int64_t I0, A, B;
  int Rows;
  int64_t QBase, KBase;
  const float *Bias;
  float Skip;
};
__device__ inline QueryBlock queryBlock(const AttentionGeometry &G,
                                        const float *KeyBias) {
  QueryBlock Q;
  const int64_t QBlocks = (G.Sq + ABlock - 1) / ABlock;
  Q.I0 = (QBlocks - 1 - int64_t(blockIdx.x)) * ABlock;
  Q.A = blockIdx.y;
  Q.B = blockIdx.z;
  const int64_t Kv = Q.A / (G.Heads / G.KvHeads);
  Q.Rows = int(G.Sq - Q.I0 < ABlock ? G.Sq - Q.I0 : ABlock);
  Q.QBase = Q.B * G.Q[0] + Q.A * G.Q[1] + Q.I0 * G.Q[2];
  Q.KBase = Q.B * G.K[0] + Kv * G.K[1];
  Q.Bias = KeyBias ? KeyBias + Q.B * G.Sk : nullptr;
  Q.Skip = skipAbove(G, Q.Bias);
  return Q;
}

/// An accumulator of this thread's rows Ty + 16 i and columns
/// 64 g + 4 Tx + k.
template <int NG> using RowsAcc = float[4][NG][4];

template <int NG> __device__ inline void zero(RowsAcc<NG> &A) {
#pragma unroll
  for (int I = 0; I < 4; ++I)
#pragma unroll
    for (int Gr = 0; Gr < NG; ++Gr)
#pragma unroll
      for (int X = 0; X < 4; ++X)
        A[I][Gr][X] = 0.0f;
}

/// Out[Base + r RowStride + c] = A's element (r, c), for rows r < Rows and
/// columns c < D, rounded once to Out's storage.
template <Storage ST, int NG>
__device__ inline void storeRows(Elems Out, int64_t Base, int64_t RowStride,
                                 const RowsAcc<NG> &A, int Rows, int D) {
  const int Tx = threadIdx.x % 16, Ty = threadIdx.x / 16;
#pragma unroll
  for (int I = 0; I < 4; ++I) {
    const int R = Ty + 16 * I;
    if (R >= Rows)
      continue;
#pragma unroll
    for (int Gr = 0; Gr < NG; ++Gr)
#pragma unroll
      for (int X = 0; X < 4; ++X) {
        const int Col = 64 * Gr + 4 * Tx + X;
        if (Col < D)
          stAs<ST>(Out, Base + R * RowStride + Col, A[I][Gr][X]);
      }
  }
}

/// Whether the key block at J0 lies wholly above the causal diagonal of
/// query rows [I0, I0 + Rows).
__device__ inline bool aboveDiagonal(const AttentionGeometry &G, int64_t I0,
                                     int Rows, int64_t J0) {
  return G.Causal && G.Key0 + J0 > G.Query0 + I0 + Rows - 1;
}

/// Score (r, c) of the block at (I0, J0) from its product X, or -inf where
/// the row or the key is past the end. Masked: whether the causal fill
/// replaced it.
__device__ inline float score(const AttentionGeometry &G, float X,
                              const float *Bias, int64_t I0, int R, int Rows,
                              int64_t J0, int C, int Cols, bool &Masked) {
  Masked = false;
  if (R >= Rows || C >= Cols)
    return -__int_as_float(0x7f800000);
  float S = __fmul_rn(G.Scale, X);
  const float Bj = Bias ? Bias[J0 + C] : 0.0f;
  if (Bias && G.PadFirst)
    S = __fadd_rn(S, Bj);
  if (G.Causal && G.Key0 + J0 + C > G.Query0 + I0 + R) {
    S = G.Fill;
    Masked = true;
  }
  if (Bias && !G.PadFirst)
    S = __fadd_rn(S, Bj);
  return S;
}

/// Sum and maximum over the 16 threads of a row (one half warp).
__device__ inline float rowSum16(float V) {
#pragma unroll
  for (int Off = 8; Off > 0; Off /= 2)
    V = __fadd_rn(V, __shfl_xor_sync(0xffffffffu, V, Off, 16));
  return V;
}
__device__ inline float rowMax16(float V) {
#pragma unroll
  for (int Off = 8; Off > 0; Off /= 2) {
    float O = __shfl_xor_sync(0xffffffffu, V, Off, 16);
    V = V < O ? O : V;
  }
  return V;
}

struct Tiles {
  int Pitch, D, D4;
};

//===----------------------------------------------------------------------===//
// Forward: one block per (query block, head, batch).
//===----------------------------------------------------------------------===//

template <Storage ST, int NG>
__global__ void __launch_bounds__(AThreads)
    attentionForwardKernel(Elems O, Elems Lse, Elems Q, Elems K, Elems V,
                           const float *KeyBias, AttentionGeometry G, Tiles T,
                           uint64_t Threshold, float KeepScale) {
  if (G.SkipIf && *G.SkipIf)
    return;
  SP_DYNAMIC_SHARED(float4, SharedF4);
  float *Qs = reinterpret_cast<float *>(SharedF4);
  float *KVs = Qs + ABlock * T.Pitch; // K, then V, of the key block
  float *Ps = KVs + ABlock * T.Pitch; // the dropped probabilities
  uint8_t *Keep = reinterpret_cast<uint8_t *>(Ps + ABlock * APitch);
  const int Tx = threadIdx.x % 16, Ty = threadIdx.x / 16;
  const auto [I0, A, B, Rows, QBase, KBase, Bias, Skip] =
      queryBlock(G, KeyBias);
  loadTile<ST>(Qs, T.Pitch, Q, QBase, G.Q[2], Rows, T.D, T.D4);

  const float NegInf = -__int_as_float(0x7f800000);
  float M[4], L[4];
  RowsAcc<NG> Acc;
  zero<NG>(Acc);
#pragma unroll
  for (int I = 0; I < 4; ++I) {
    M[I] = NegInf;
    L[I] = 0.0f;
  }
  for (int64_t J0 = 0; J0 < G.Sk; J0 += ABlock) {
    const int Cols = int(G.Sk - J0 < ABlock ? G.Sk - J0 : ABlock);
    if (aboveDiagonal(G, I0, Rows, J0)) {
      bool Done = true;
#pragma unroll
      for (int I = 0; I < 4; ++I)
        if (Ty + 16 * I < Rows)
          Done = Done && M[I] > Skip;
      if (__syncthreads_and(Done))
        break;
    }
    __syncthreads(); // the last block's V and P are read
    loadTile<ST>(KVs, T.Pitch, K, KBase + J0 * G.K[2], G.K[2], Cols, T.D, T.D4);
    if (G.Ratio > 0)
      blockKeep(Keep, G, B, A, I0, J0, Threshold);
    __syncthreads();
    float S[4][4];
    tileProduct(S, Qs, KVs, T.Pitch, T.D4);
#pragma unroll
    for (int I = 0; I < 4; ++I) {
      const int R = Ty + 16 * I;
      float RowMax = NegInf;
#pragma unroll
      for (int J = 0; J < 4; ++J) {
        bool Masked;
        S[I][J] =
            score(G, S[I][J], Bias, I0, R, Rows, J0, Tx + 16 * J, Cols, Masked);
        RowMax = RowMax < S[I][J] ? S[I][J] : RowMax;
      }
      RowMax = rowMax16(RowMax);
      const float New = M[I] < RowMax ? RowMax : M[I];
      // Nothing seen yet (every score so far -inf): the row's p are 0 and
      // its statistics stay. The shuffles below run in every thread.
      const bool Seen = New != NegInf;
      const float Corr = Seen ? expf(__fadd_rn(M[I], -New)) : 1.0f; // 0 first
      float Sum = 0.0f;
#pragma unroll
      for (int J = 0; J < 4; ++J) {
        S[I][J] = Seen ? expf(__fadd_rn(S[I][J], -New)) : 0.0f;
        Sum = __fadd_rn(Sum, S[I][J]);
      }
      Sum = rowSum16(Sum);
      if (Seen) {
        L[I] = __fadd_rn(__fmul_rn(L[I], Corr), Sum);
        M[I] = New;
        if (Corr != 1.0f)
#pragma unroll
          for (int Gr = 0; Gr < NG; ++Gr)
#pragma unroll
            for (int X = 0; X < 4; ++X)
              Acc[I][Gr][X] = __fmul_rn(Acc[I][Gr][X], Corr);
      }
#pragma unroll
      for (int J = 0; J < 4; ++J) {
        const int C = Tx + 16 * J;
        float P = S[I][J];
        if (G.Ratio > 0)
          P = Keep[R * ABlock + C] ? __fmul_rn(P, KeepScale) : 0.0f;
        Ps[R * APitch + C] = P;
      }
    }
    __syncthreads(); // K read, P written
    loadTile<ST>(KVs, T.Pitch, V, KBase + J0 * G.K[2], G.K[2], Cols, T.D, T.D4);
    __syncthreads();
    scoresTimesTile<NG>(Acc, Ps, KVs, T.Pitch, T.D4);
  }
#pragma unroll
  for (int I = 0; I < 4; ++I) {
    // A row with every score -inf gives zeros, as softmax does.
    const float Inv = L[I] > 0.0f ? __frcp_rn(L[I]) : 0.0f;
#pragma unroll
    for (int Gr = 0; Gr < NG; ++Gr)
#pragma unroll
      for (int X = 0; X < 4; ++X)
        Acc[I][Gr][X] = __fmul_rn(Acc[I][Gr][X], Inv);
    const int R = Ty + 16 * I;
    if (Tx == 0 && R < Rows)
      stAny(Lse, B * G.L[0] + A * G.L[1] + (I0 + R) * G.L[2],
            L[I] > 0.0f ? __fadd_rn(M[I], logf(L[I])) : NegInf);
  }
  storeRows<ST, NG>(O, B * G.O[0] + A * G.O[1] + I0 * G.O[2], G.O[2], Acc,
                    Rows, T.D);
}

//===----------------------------------------------------------------------===//
// Backward.
//===----------------------------------------------------------------------===//

/// Delta[(b A + a) Sq + i] = float(sum_d do_id o_id), in double: one warp
/// per row.
template <Storage ST>
__global__ void attentionDeltaKernel(float *Delta, Elems DO, Elems O,
                                     AttentionGeometry G) {
  if (G.SkipIf && *G.SkipIf)
    return;
  const int Lane = threadIdx.x % 32;
  const int64_t Rows = G.Batch * G.Heads * G.Sq;
  for (int64_t Row = globalThread() / 32; Row < Rows;
       Row += gridThreads() / 32) {
    const int64_t I = Row % G.Sq, A = Row / G.Sq % G.Heads,
                  B = Row / (G.Sq * G.Heads);
    const int64_t At = B * G.O[0] + A * G.O[1] + I * G.O[2];
    double S = 0;
    for (int64_t X = Lane; X < G.D; X += 32)
      S += double(ldAs<ST>(DO, At + X)) * double(ldAs<ST>(O, At + X));
#pragma unroll
    for (int Off = 16; Off > 0; Off /= 2)
      S += __shfl_xor_sync(0xffffffffu, S, Off);
    if (Lane == 0)
      Delta[Row] = float(S);
  }
}

/// The backward kernels' shared memory (backwardShared bytes): the query
/// block's q and do and the key block's k and v (tiles of pitch T.Pitch),
/// a score tile (pitch APitch), the query rows' log-sum-exp and Delta, and
/// the block's dropout mask (blockKeep's).
struct BackwardTiles {
  float *Qs, *DOs, *Ks, *Vs, *Ps, *LseS, *DeltaS;
  uint8_t *Keep;
};
__device__ inline BackwardTiles backwardTiles(float4 *Shared, const Tiles &T) {
  BackwardTiles S;
  S.Qs = reinterpret_cast<float *>(Shared);
  S.DOs = S.Qs + ABlock * T.Pitch;
  S.Ks = S.DOs + ABlock * T.Pitch;
  S.Vs = S.Ks + ABlock * T.Pitch;
  S.Ps = S.Vs + ABlock * T.Pitch;
  S.LseS = S.Ps + ABlock * APitch;
  S.DeltaS = S.LseS + ABlock;
  S.Keep = reinterpret_cast<uint8_t *>(S.DeltaS + ABlock);
  return S;
}

/// Loads the q and do tiles of the query block at (b, a, I0).
template <Storage ST>
__device__ inline void loadQueryTiles(const BackwardTiles &Sh, Elems Q,
                                      Elems DO, const AttentionGeometry &G,
                                      const Tiles &T, int64_t B, int64_t A,
                                      int64_t I0, int Rows) {
  loadTile<ST>(Sh.Qs, T.Pitch, Q, B * G.Q[0] + A * G.Q[1] + I0 * G.Q[2],
               G.Q[2], Rows, T.D, T.D4);
  loadTile<ST>(Sh.DOs, T.Pitch, DO, B * G.O[0] + A * G.O[1] + I0 * G.O[2],
               G.O[2], Rows, T.D, T.D4);
}

/// Loads the k and v tiles of the key block whose first element is KBase.
template <Storage ST>
__device__ inline void loadKeyTiles(const BackwardTiles &Sh, Elems K, Elems V,
                                    const AttentionGeometry &G, const Tiles &T,
                                    int64_t KBase, int Cols) {
  loadTile<ST>(Sh.Ks, T.Pitch, K, KBase, G.K[2], Cols, T.D, T.D4);
  loadTile<ST>(Sh.Vs, T.Pitch, V, KBase, G.K[2], Cols, T.D, T.D4);
}

/// One block's recomputed probabilities and score gradients, in this
/// thread's places (rows Ty + 16 i, keys Tx + 16 j): P the dropped-out
/// probabilities, DS the scores' gradient. Draws the block's dropout mask,
/// then waits for it and the tiles (Sh: the query block's q, do, log-sum-exp
/// and Delta, the key block's k and v). Every thread calls it.
struct BlockGrads {
  float P[4][4], DS[4][4];
};
__device__ inline void blockGrads(BlockGrads &Out, const AttentionGeometry &G,
                                  const Tiles &T, const BackwardTiles &Sh,
                                  const float *Bias, int64_t B, int64_t A,
                                  int64_t I0, int Rows, int64_t J0, int Cols,
                                  uint64_t Threshold, float KeepScale) {
  if (G.Ratio > 0)
    blockKeep(Sh.Keep, G, B, A, I0, J0, Threshold);
  __syncthreads();
  const int Tx = threadIdx.x % 16, Ty = threadIdx.x / 16;
  const float NegInf = -__int_as_float(0x7f800000);
  float S[4][4], DP[4][4];
  tileProduct(S, Sh.Qs, Sh.Ks, T.Pitch, T.D4);
  tileProduct(DP, Sh.DOs, Sh.Vs, T.Pitch, T.D4);
#pragma unroll
  for (int I = 0; I < 4; ++I) {
    const int R = Ty + 16 * I;
    const float Lr = R < Rows ? Sh.LseS[R] : NegInf;
    const float Dr = R < Rows ? Sh.DeltaS[R] : 0.0f;
#pragma unroll
    for (int J = 0; J < 4; ++J) {
      const int C = Tx + 16 * J;
      bool Masked;
      const float Sc =
          score(G, S[I][J], Bias, I0, R, Rows, J0, C, Cols, Masked);
      const bool Live = R < Rows && C < Cols && Lr != NegInf;
      const float P = Live ? expf(__fadd_rn(Sc, -Lr)) : 0.0f;
      float PD = P, DPd = DP[I][J];
      if (G.Ratio > 0) {
        const bool Kept = Live && Sh.Keep[R * ABlock + C];
        PD = Kept ? __fmul_rn(P, KeepScale) : 0.0f;
        DPd = Kept ? __fmul_rn(DPd, KeepScale) : 0.0f;
      }
      Out.P[I][J] = PD;
      Out.DS[I][J] = Live && !Masked
                         ? __fmul_rn(G.Scale, __fmul_rn(P, __fadd_rn(DPd, -Dr)))
                         : 0.0f;
    }
  }
}

/// This thread's places of a 64 x 64 score tile (rows Ty + 16 i, keys
/// Tx + 16 j) written into Dst (pitch APitch), or its transpose.
__device__ inline void writeScores(float *Dst, const float (&V)[4][4],
                                   bool Transposed) {
  const int Tx = threadIdx.x % 16, Ty = threadIdx.x / 16;
#pragma unroll
  for (int I = 0; I < 4; ++I)
#pragma unroll
    for (int J = 0; J < 4; ++J) {
      const int R = Ty + 16 * I, C = Tx + 16 * J;
      Dst[Transposed ? C * APitch + R : R * APitch + C] = V[I][J];
    }
}

/// Loads the rows' log-sum-exp and Delta of the query block at (b, a, I0)
/// into Sh; returns whether every row's log-sum-exp exceeds Skip (the
/// block's masked scores are negligible). Every thread calls it.
__device__ inline bool loadRowStats(const BackwardTiles &Sh, Elems Lse,
                                    const float *Delta,
                                    const AttentionGeometry &G, int64_t B,
                                    int64_t A, int64_t I0, int Rows,
                                    float Skip) {
  bool Above = true;
  for (int R = threadIdx.x; R < Rows; R += AThreads) {
    Sh.LseS[R] = ldAny(Lse, B * G.L[0] + A * G.L[1] + (I0 + R) * G.L[2]);
    Sh.DeltaS[R] = Delta[(B * G.Heads + A) * G.Sq + I0 + R];
    Above = Above && Sh.LseS[R] > Skip;
  }
  return __syncthreads_and(Above);
}

/// dk and dv of one key block (of key/value head blockIdx.y, batch
/// blockIdx.z), over every query block of the heads that read it.
template <Storage ST, int NG>
__global__ void __launch_bounds__(AThreads)
    attentionKeyGradKernel(Elems DK, Elems DV, Elems DO, Elems Q, Elems K,
                           Elems V, Elems Lse, const float *KeyBias,
                           const float *Delta, AttentionGeometry G, Tiles T,
                           uint64_t Threshold, float KeepScale) {
  if (G.SkipIf && *G.SkipIf)
    return;
  SP_DYNAMIC_SHARED(float4, SharedF4);
  const BackwardTiles Sh = backwardTiles(SharedF4, T);
  float *Pt = Sh.Ps; // [key][row]: P, then DS, transposed
  const int64_t J0 = int64_t(blockIdx.x) * ABlock, Kv = blockIdx.y,
                B = blockIdx.z, Group = G.Heads / G.KvHeads;
  const int Cols = int(G.Sk - J0 < ABlock ? G.Sk - J0 : ABlock);
  const int64_t KBase = B * G.K[0] + Kv * G.K[1] + J0 * G.K[2];
  const float *Bias = KeyBias ? KeyBias + B * G.Sk : nullptr;
  const float Skip = skipAbove(G, Bias);
  loadKeyTiles<ST>(Sh, K, V, G, T, KBase, Cols);
  RowsAcc<NG> DKa, DVa;
  zero<NG>(DKa);
  zero<NG>(DVa);
  for (int64_t A = Kv * Group; A < (Kv + 1) * Group; ++A)
    for (int64_t I0 = 0; I0 < G.Sq; I0 += ABlock) {
      const int Rows = int(G.Sq - I0 < ABlock ? G.Sq - I0 : ABlock);
      __syncthreads(); // the last block's tiles are read
      const bool Negligible =
          loadRowStats(Sh, Lse, Delta, G, B, A, I0, Rows, Skip);
      if (aboveDiagonal(G, I0, Rows, J0) && Negligible)
        continue;
      loadQueryTiles<ST>(Sh, Q, DO, G, T, B, A, I0, Rows);
      BlockGrads BG;
      blockGrads(BG, G, T, Sh, Bias, B, A, I0, Rows, J0, Cols, Threshold,
                 KeepScale);
      // dv += P^T do, then dk += DS^T q, through Pt.
      writeScores(Pt, BG.P, /*Transposed=*/true);
      __syncthreads();
      scoresTimesTile<NG>(DVa, Pt, Sh.DOs, T.Pitch, T.D4);
      __syncthreads();
      writeScores(Pt, BG.DS, /*Transposed=*/true);
      __syncthreads();
      scoresTimesTile<NG>(DKa, Pt, Sh.Qs, T.Pitch, T.D4);
    }
  storeRows<ST, NG>(DK, KBase, G.K[2], DKa, Cols, T.D);
  storeRows<ST, NG>(DV, KBase, G.K[2], DVa, Cols, T.D);
}

/// dq of one query block (of head blockIdx.y, batch blockIdx.z), over the
/// key blocks it sees.
template <Storage ST, int NG>
__global__ void __launch_bounds__(AThreads)
    attentionQueryGradKernel(Elems DQ, Elems DO, Elems Q, Elems K, Elems V,
                             Elems Lse, const float *KeyBias,
                             const float *Delta, AttentionGeometry G, Tiles T,
                             uint64_t Threshold, float KeepScale) {
  if (G.SkipIf && *G.SkipIf)
    return;
  SP_DYNAMIC_SHARED(float4, SharedF4);
  const BackwardTiles Sh = backwardTiles(SharedF4, T);
  const auto [I0, A, B, Rows, QBase, KBase, Bias, Skip] =
      queryBlock(G, KeyBias);
  loadQueryTiles<ST>(Sh, Q, DO, G, T, B, A, I0, Rows);
  const bool Negligible = loadRowStats(Sh, Lse, Delta, G, B, A, I0, Rows, Skip);
  RowsAcc<NG> DQa;
  zero<NG>(DQa);
  for (int64_t J0 = 0; J0 < G.Sk; J0 += ABlock) {
    const int Cols = int(G.Sk - J0 < ABlock ? G.Sk - J0 : ABlock);
    if (aboveDiagonal(G, I0, Rows, J0) && Negligible)
      break;
    __syncthreads(); // the last block's tiles are read
    loadKeyTiles<ST>(Sh, K, V, G, T, KBase + J0 * G.K[2], Cols);
    BlockGrads BG;
    blockGrads(BG, G, T, Sh, Bias, B, A, I0, Rows, J0, Cols, Threshold,
               KeepScale);
    // DS, row-major, times k.
    writeScores(Sh.Ps, BG.DS, /*Transposed=*/false);
    __syncthreads();
    scoresTimesTile<NG>(DQa, Sh.Ps, Sh.Ks, T.Pitch, T.D4);
  }
  storeRows<ST, NG>(DQ, QBase, G.Q[2], DQa, Rows, T.D);
}

/// Shared memory of the kernels, in bytes (the backward's: BackwardTiles).
inline size_t forwardShared(const Tiles &T) {
  return size_t(2 * ABlock * T.Pitch + ABlock * APitch) * 4 + ABlock * ABlock;
}
inline size_t backwardShared(const Tiles &T) {
  return size_t(4 * ABlock * T.Pitch + ABlock * APitch + 2 * ABlock) * 4 +
         ABlock * ABlock;
}

template <typename Kernel> inline void allowShared(Kernel K, size_t Bytes) {
  cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       int(Bytes));
}

/// Calls Fn with the storage and the column groups (NG) as compile-time
/// constants.
template <typename F> inline void withAttention(Storage K, int64_t D, F &&Fn) {
  withStorage(K, [&](auto ST) {
    if (D <= 64)
      Fn(ST, std::integral_constant<int, 1>());
    else
      Fn(ST, std::integral_constant<int, 2>());
  });
}

} // namespace

void attentionForward(Elems O, Elems Lse, Elems Q, Elems K, Elems V,
                      const float *KeyBias, const AttentionGeometry &G,
                      cudaStream_t S) {
  if (G.Batch <= 0 || G.Heads <= 0 || G.Sq <= 0)
    return;
  const Tiles T{tilePitch(G.D), int(G.D), int((G.D + 3) / 4 * 4)};
  const uint64_t Threshold = philox::dropoutThreshold(G.Ratio);
  const float KeepScale = float(philox::dropoutScale(G.Ratio));
  const dim3 Grid(unsigned((G.Sq + ABlock - 1) / ABlock), unsigned(G.Heads),
                  unsigned(G.Batch));
  const size_t Bytes = forwardShared(T);
  withAttention(Q.Kind, G.D, [&](auto ST, auto NG) {
    auto *Kern =
        attentionForwardKernel<decltype(ST)::value, decltype(NG)::value>;
    allowShared(Kern, Bytes);
    SP_LAUNCH(Kern, Grid, AThreads, Bytes, S, O, Lse, Q, K, V, KeyBias, G, T,
              Threshold, KeepScale);
  });
}

void attentionBackward(Elems DQ, Elems DK, Elems DV, Elems DO, Elems Q, Elems K,
                       Elems V, Elems O, Elems Lse, const float *KeyBias,
                       float *Delta, const AttentionGeometry &G,
                       cudaStream_t S) {
  if (G.Batch <= 0 || G.Heads <= 0)
    return;
  const Tiles T{tilePitch(G.D), int(G.D), int((G.D + 3) / 4 * 4)};
  const uint64_t Threshold = philox::dropoutThreshold(G.Ratio);
  const float KeepScale = float(philox::dropoutScale(G.Ratio));
  const size_t Bytes = backwardShared(T);
  withAttention(Q.Kind, G.D, [&](auto ST, auto NG) {
    constexpr Storage K16 = decltype(ST)::value;
    constexpr int N = decltype(NG)::value;
    if (G.Sq > 0)
      if (Launch L = elementwiseLaunch(G.Batch * G.Heads * G.Sq * 32);
          L.Blocks) // a warp per row
        SP_LAUNCH(attentionDeltaKernel<K16>, L.Blocks, L.Threads, 0, S, Delta,
                  DO, O, G);
    if (G.Sk > 0) {
      auto *KeyKern = attentionKeyGradKernel<K16, N>;
      allowShared(KeyKern, Bytes);
      const dim3 Grid(unsigned((G.Sk + ABlock - 1) / ABlock),
                      unsigned(G.KvHeads), unsigned(G.Batch));
      SP_LAUNCH(KeyKern, Grid, AThreads, Bytes, S, DK, DV, DO, Q, K, V, Lse,
                KeyBias, Delta, G, T, Threshold, KeepScale);
    }
    if (G.Sq > 0) {
      auto *QueryKern = attentionQueryGradKernel<K16, N>;
      allowShared(QueryKern, Bytes);
      const dim3 Grid(unsigned((G.Sq + ABlock - 1) / ABlock), unsigned(G.Heads),
                      unsigned(G.Batch));
      SP_LAUNCH(QueryKern, Grid, AThreads, Bytes, S, DQ, DO, Q, K, V, Lse,
                KeyBias, Delta, G, T, Threshold, KeepScale);
    }
  });
}

} // namespace sp::cuda
