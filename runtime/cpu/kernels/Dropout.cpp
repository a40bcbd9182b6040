//===- Dropout.cpp - Philox dropout, forward and backward -----------------===//
//
// Kernels.h, "11. Dropout": the keep mask of an element is a function of its
// index in the global (unsharded) tensor through Philox-4x32-10
// (runtime/cpu/Philox.h, which the CUDA kernels share), so any shard or
// recomputation gets the same mask. The words are generated for a batch of
// Philox blocks side by side so that the rounds vectorise; the block is
// walked in runs contiguous both locally and globally. The CUDA twin is
// runtime/cuda/kernels/Dropout.cuh.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/kernels/Common.h"

#include "runtime/cpu/Philox.h"

#include <cstring>

namespace sp::cpu {

using namespace detail;

//===----------------------------------------------------------------------===//
// 11. Dropout
//===----------------------------------------------------------------------===//

GlobalIndex GlobalIndex::whole(Shape S) {
  GlobalIndex G = block(S, S, {});
  return G;
}

GlobalIndex GlobalIndex::block(Shape GlobalShape, Shape LocalShape, Shape Off) {
  GlobalIndex G;
  G.Rank = int(GlobalShape.size());
  // An over-long shape is left for check() to reject.
  int R = std::min(G.Rank, MaxRank);
  for (int D = 0; D < R; ++D) {
    G.Global[D] = GlobalShape[D];
    G.Local[D] = D < int(LocalShape.size()) ? LocalShape[D] : -1;
    G.Offset[D] = D < int(Off.size()) ? Off[D] : 0;
  }
  if (LocalShape.size() != GlobalShape.size() ||
      (!Off.empty() && Off.size() != GlobalShape.size()))
    G.Local[0] = -1; // ranks disagree: make check() fail
  return G;
}

int64_t GlobalIndex::numLocal() const {
  int64_t N = 1;
  for (int D = 0; D < Rank && D < MaxRank; ++D)
    N *= Local[D];
  return N;
}

Status GlobalIndex::check() const {
  if (Rank < 0 || Rank > MaxRank)
    return Status::error("global index: rank above MaxRank", -1, Rank);
  for (int D = 0; D < Rank; ++D)
    if (Global[D] < 0 || Local[D] < 0 || Offset[D] < 0 || Seam[D] < 0 ||
        Seam[D] > Local[D] || Jump[D] < 0 ||
        Offset[D] + Local[D] + (Seam[D] ? Jump[D] : 0) > Global[D])
      return Status::error("global index: block outside the global shape "
                           "(or ranks disagree)",
                           D, Local[D]);
  return Status::success();
}

namespace {

Status checkDropout(double Ratio, const DropoutKey &K, const GlobalIndex &G) {
  if (!(Ratio >= 0.0 && Ratio <= 1.0))
    return Status::error("dropout ratio outside [0, 1]");
  if (K.Layer > 0xFFFFu)
    return Status::error("dropout key layer above 65535", -1, K.Layer);
  if (K.Site > 0xFFFFu)
    return Status::error("dropout key site above 65535", -1, K.Site);
  return G.check();
}

/// Philox blocks generated per call of philoxBlocks (4 words each).
constexpr int64_t PhiloxBatch = 64;

/// Words[4 i + k] = word k of Philox4x32_10 of the dropout counter of block
/// First + i (Philox.h), i < Count <= PhiloxBatch: philox::philox4x32_10's
/// rounds and key schedule, computed for Count blocks side by side so that
/// the rounds vectorise (integer arithmetic: exact on every clone).
SP_SIMD void philoxBlocks(uint32_t *__restrict Words, uint64_t First,
                          int64_t Count, uint32_t C2, uint32_t C3,
                          uint32_t K0, uint32_t K1) {
  uint32_t A[PhiloxBatch], B[PhiloxBatch], C[PhiloxBatch], D[PhiloxBatch];
  for (int64_t I = 0; I < Count; ++I) {
    uint64_t Block = First + uint64_t(I);
    A[I] = uint32_t(Block);
    B[I] = uint32_t(Block >> 32);
    C[I] = C2;
    D[I] = C3;
  }
  for (int R = 0; R < 10; ++R) {
    if (R) {
      K0 += philox::W0;
      K1 += philox::W1;
    }
    for (int64_t I = 0; I < Count; ++I) {
      philox::Words4 W =
          philox::philoxRound({{A[I], B[I], C[I], D[I]}}, K0, K1);
      A[I] = W.V[0];
      B[I] = W.V[1];
      C[I] = W.V[2];
      D[I] = W.V[3];
    }
  }
  for (int64_t I = 0; I < Count; ++I) {
    Words[4 * I] = A[I];
    Words[4 * I + 1] = B[I];
    Words[4 * I + 2] = C[I];
    Words[4 * I + 3] = D[I];
  }
}

SP_SIMD void wordsToKeep(uint8_t *__restrict Keep,
                         const uint32_t *__restrict Words, int64_t N,
                         uint32_t Threshold) {
  for (int64_t I = 0; I < N; ++I)
    Keep[I] = Words[I] >= Threshold;
}

/// Keep[j] = whether dropout keeps global element G0 + j, j < Len.
void keepRun(uint8_t *Keep, uint64_t G0, int64_t Len, const DropoutKey &K,
             uint64_t Threshold) {
  if (Threshold > 0xFFFFFFFFu) { // ratio 1: nothing is kept
    std::memset(Keep, 0, size_t(Len));
    return;
  }
  const uint32_t C2 = (K.Layer & 0xFFFFu) | (K.Site << 16);
  uint32_t Words[4 * PhiloxBatch];
  uint64_t Block = G0 >> 2;
  int64_t Skip = int64_t(G0 & 3);
  for (int64_t J = 0; J < Len;) {
    int64_t N = std::min(4 * PhiloxBatch - Skip, Len - J);
    philoxBlocks(Words, Block, (Skip + N + 3) / 4, C2, K.Stream,
                 uint32_t(K.Seed), uint32_t(K.Seed >> 32));
    wordsToKeep(Keep + J, Words + Skip, N, uint32_t(Threshold));
    J += N;
    Block += PhiloxBatch;
    Skip = 0;
  }
}

/// Y = Keep ? X * Scale : 0 (Y may alias X).
template <typename T>
SP_SIMD void applyKeep(T *Y, const T *X, const uint8_t *__restrict Keep,
                       int64_t N, T Scale) {
  for (int64_t I = 0; I < N; ++I)
    Y[I] = Keep[I] ? X[I] * Scale : T(0);
}

/// Y = (Keep ? X * Scale : 0) + R, rounded as applyKeep and then an add
/// (Y may alias X or R).
template <typename T>
SP_SIMD void applyKeepAdd(T *Y, const T *X, const T *R,
                          const uint8_t *__restrict Keep, int64_t N, T Scale) {
  for (int64_t I = 0; I < N; ++I)
    Y[I] = (Keep[I] ? X[I] * Scale : T(0)) + R[I];
}

/// Elements per piece of work of the dropout kernels.
constexpr int64_t DropoutPiece = 1024;

/// Calls Fn(Local0, Global0, Len) over pieces of the block that are
/// contiguous both locally and globally (local elements [Local0, Local0 +
/// Len) are global elements [Global0, Global0 + Len)), in parallel. Trailing
/// dimensions the block spans whole merge into one run, so the unsharded
/// tensor is a single run.
template <typename F> void forEachRun(const GlobalIndex &G, F &&Fn) {
  int R = G.Rank;
  int64_t N = G.numLocal();
  if (N == 0)
    return;
  if (R == 0) {
    Fn(int64_t(0), uint64_t(0), int64_t(1));
    return;
  }
  int64_t GS[MaxRank];
  rowMajorStrides(R, G.Global, GS);
  // Dimensions [D, R) form one contiguous run, unless D is in two (a
  // seam): then [D + 1, R) do.
  int D = R - 1;
  while (D > 0 && G.Local[D] == G.Global[D])
    --D;
  if (G.Seam[D] && G.Jump[D])
    ++D;
  int64_t Run = 1;
  for (int E = D; E < R; ++E)
    Run *= G.Local[E];
  int64_t Runs = N / Run, PerRun = (Run + DropoutPiece - 1) / DropoutPiece;
  parallelFor(Runs * PerRun, 8, [&](int64_t P0, int64_t P1) {
    for (int64_t P = P0; P < P1; ++P) {
      int64_t RunIdx = P / PerRun, Piece = P % PerRun;
      // The global index of the run's first element: outer dims [0, D)
      // from RunIdx (row-major over Local), dim D at its offset.
      int64_t Base = D < R ? G.Offset[D] * GS[D] : 0;
      for (int64_t E = D - 1, Rest = RunIdx; E >= 0; --E) {
        int64_t X = Rest % G.Local[E];
        Base +=
            (G.Offset[E] + X + (G.Seam[E] && X >= G.Seam[E] ? G.Jump[E] : 0)) *
            GS[E];
        Rest /= G.Local[E];
      }
      int64_t Off = Piece * DropoutPiece;
      Fn(RunIdx * Run + Off, uint64_t(Base + Off),
         std::min(DropoutPiece, Run - Off));
    }
  });
}

} // namespace

void dropoutKeep(uint8_t *Keep, uint64_t Global0, int64_t Len,
                 const DropoutKey &K, double Ratio) {
  checkSizes({Len});
  keepRun(Keep, Global0, Len, K, philox::dropoutThreshold(Ratio));
}

Status dropoutMask(uint8_t *Mask, double Ratio, const DropoutKey &K,
                   const GlobalIndex &G) {
  if (Status S = checkDropout(Ratio, K, G); !S.ok())
    return S;
  const uint64_t Threshold = philox::dropoutThreshold(Ratio);
  forEachRun(G, [&](int64_t L0, uint64_t G0, int64_t Len) {
    keepRun(Mask + L0, G0, Len, K, Threshold);
  });
  return Status::success();
}

template <typename T>
Status dropout(T *Y, uint8_t *Mask, const T *X, double Ratio,
               const DropoutKey &K, const GlobalIndex &G, const T *Addend,
               bool Causal) {
  if (Status S = checkDropout(Ratio, K, G); !S.ok())
    return S;
  if (Causal && G.Rank < 2)
    return Status::error("causal dropout of a tensor of rank < 2", -1,
                         G.Rank);
  const T Scale = T(philox::dropoutScale(Ratio));
  const uint64_t Threshold = philox::dropoutThreshold(Ratio);
  // The global [Sq, Sk] of the causal mask (Causal).
  const uint64_t Sq = Causal ? uint64_t(G.Global[G.Rank - 2]) : 1,
                 Sk = Causal ? uint64_t(G.Global[G.Rank - 1]) : 1;
  forEachRun(G, [&](int64_t L0, uint64_t G0, int64_t Len) {
    uint8_t Local[DropoutPiece];
    uint8_t *Keep = Mask ? Mask + L0 : Local;
    if (!Causal) {
      keepRun(Keep, G0, Len, K, Threshold);
    } else {
      // Row by row: keys j <= i are drawn, the rest dropped.
      for (int64_t J = 0; J < Len;) {
        uint64_t Gj = G0 + uint64_t(J), Col = Gj % Sk,
                 Row = Gj / Sk % Sq;
        int64_t InRow = std::min<int64_t>(Len - J, int64_t(Sk - Col));
        int64_t Drawn =
            Col <= Row ? std::min<int64_t>(InRow, int64_t(Row - Col + 1)) : 0;
        keepRun(Keep + J, Gj, Drawn, K, Threshold);
        std::memset(Keep + J + Drawn, 0, size_t(InRow - Drawn));
        J += InRow;
      }
    }
    if (Addend)
      applyKeepAdd(Y + L0, X + L0, Addend + L0, Keep, Len, Scale);
    else
      applyKeep(Y + L0, X + L0, Keep, Len, Scale);
  });
  return Status::success();
}

template <typename T>
void dropoutBackward(T *DX, const T *DY, const uint8_t *Mask, int64_t N,
                     double Ratio) {
  checkSizes({N});
  const T Scale = T(philox::dropoutScale(Ratio));
  parallelFor(N, 1 << 13, [&](int64_t I0, int64_t I1) {
    applyKeep(DX + I0, DY + I0, Mask + I0, I1 - I0, Scale);
  });
}

#define SP_INSTANTIATE(T)                                                      \
  template Status dropout<T>(T *, uint8_t *, const T *, double,                \
                             const DropoutKey &, const GlobalIndex &,          \
                             const T *, bool);                                 \
  template void dropoutBackward<T>(T *, const T *, const uint8_t *, int64_t,   \
                                   double);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
