//===- Heads.cuh - Head layouts, GQA repeat and RoPE ------------*- CUDA
//-*-===//
//
// Reference (runtime/cpu/kernels/Heads.cpp), H = Heads * D:
//   split_heads: Q[b,a,s,t] = QKV[b,s,0H + aD + t], K: 1H, V: 2H; per_head
//                (GPT-NeoX): part p of head a at QKV[b,s,(3a + p)D + t]
//   merge_heads: Y[b,s,aD + t] = X[b,a,s,t]; its backward (and to_heads) the
//                inverse permutation
//   (split and merge move any storage as it is, a head row's bytes in
//   16-byte words where they divide it: pure permutations, the CPU's bits)
//   repeat_heads: Y[b, gR + r, s, :] = X[b, g, s, :]; backward DX[b,g,s,:] =
//                float(sum_{r<R} DY[b, gR + r, s, :]) in double, r in order
//   rope (half form, h = D/2; c, n the cos and sin rows of (cb, s)):
//     Y[i] = x[i] c[i] - x[i+h] n[i]     (i < h)
//     Y[i] = x[i] c[i] + x[i-h] n[i]     (i >= h)
//   interleaved: Y[2j] = x[2j] c[2j] - x[2j+1] n[2j],
//                Y[2j+1] = x[2j+1] c[2j+1] + x[2j] n[2j+1]
//   partial (tables [.., R], R < D): the above on the first R dims,
//     h = R/2, and Y[i] = x[i] (i >= R)
//   backward: DX[i] = dy[i] c[i] + dy[i+h] n[i+h] (i < h),
//             DX[i] = dy[i] c[i] - dy[i-h] n[i-h] (i >= h); interleaved
//             DX[2j] = dy[2j] c[2j] + dy[2j+1] n[2j+1],
//             DX[2j+1] = dy[2j+1] c[2j+1] - dy[2j] n[2j]
// All in float, one thread per output element: the CPU's bits.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/kernels/Common.cuh"

namespace sp::cuda {
namespace {

/// Unit e of Q/K/V [B, Heads, S, Du] <-> its QKV [B, S, 3 Heads Du] offset
/// for part P (PerHead: GPT-NeoX's [Heads, 3, Du] columns), in units of a
/// head row's Du equal pieces (elements, or the 4- and 16-byte words that
/// move several at once: the permutation is the same in any unit that
/// divides a head row).
__device__ inline int64_t qkvOffset(int64_t E, int P, int64_t S, int64_t Heads,
                                    int64_t Du, bool PerHead) {
  int64_t T = E % Du, Si = (E / Du) % S, A = (E / (Du * S)) % Heads,
          Bi = E / (Du * S * Heads);
  int64_t H = Heads * Du;
  int64_t Col = PerHead ? (3 * A + P) * Du + T : P * H + A * Du + T;
  return (Bi * S + Si) * 3 * H + Col;
}

template <typename U>
__global__ void splitHeadsKernel(U *Q, U *K, U *V, U *QKV, int64_t N,
                                 int64_t S, int64_t Heads, int64_t Du,
                                 bool PerHead, bool Backward) {
  SP_GRID_LOOP(E, 3 * N) {
    int P = int(E / N);
    int64_t Local = E % N;
    U *Part = P == 0 ? Q : P == 1 ? K : V;
    int64_t Off = qkvOffset(Local, P, S, Heads, Du, PerHead);
    if (Backward)
      QKV[Off] = Part[Local];
    else
      Part[Local] = QKV[Off];
  }
}

/// X[B, Heads, S, Du] <-> Y[B, S, Heads * Du], in units as above.
template <typename U>
__global__ void mergeHeadsKernel(U *Y, const U *X, int64_t N, int64_t S,
                                 int64_t Heads, int64_t Du, bool Backward) {
  SP_GRID_LOOP(E, N) { // E indexes X's layout [B, Heads, S, Du]
    int64_t T = E % Du, Si = (E / Du) % S, A = (E / (Du * S)) % Heads,
            Bi = E / (Du * S * Heads);
    int64_t YOff = ((Bi * S + Si) * Heads + A) * Du + T;
    if (Backward) // Y is DX [B, Heads, S, D], X is DY [B, S, H]
      Y[E] = X[YOff];
    else
      Y[YOff] = X[E];
  }
}

/// The widest unit that divides a head row of D elements of Bytes each and
/// every pointer's alignment: 16 bytes (uint4), 4 (uint32_t) or 2.
inline int headUnit(int64_t D, int Bytes, std::initializer_list<const void *> Ptrs) {
  auto Fits = [&](int U) {
    if (D * Bytes % U)
      return false;
    for (const void *P : Ptrs)
      if (reinterpret_cast<uintptr_t>(P) % U)
        return false;
    return true;
  };
  return Fits(16) ? 16 : Fits(4) ? 4 : 2;
}

/// Fn(unit type tag) for the unit headUnit chose.
template <typename F> inline void withHeadUnit(int Unit, F &&Fn) {
  if (Unit == 16)
    Fn(uint4{});
  else if (Unit == 4)
    Fn(uint32_t{});
  else
    Fn(uint16_t{});
}

inline int elemBytes(Elems E) { return E.Kind == Storage::F32 ? 4 : 2; }

__global__ void repeatHeadsKernel(float *Y, const float *X, int64_t NY,
                                  int64_t R, int64_t Block) {
  SP_GRID_LOOP(E, NY) {
    int64_t P = E / (R * Block), In = E % Block;
    Y[E] = X[P * Block + In];
  }
}

__global__ void repeatHeadsBackwardKernel(float *DX, const float *DY,
                                          int64_t NX, int64_t R,
                                          int64_t Block) {
  SP_GRID_LOOP(E, NX) {
    int64_t P = E / Block, In = E % Block;
    const float *Src = DY + P * R * Block;
    double Sum = 0;
    for (int64_t Ri = 0; Ri < R; ++Ri)
      Sum += Src[Ri * Block + In];
    DX[E] = float(Sum);
  }
}

__global__ void ropeKernel(float *Y, const float *X, const float *Cos,
                           const float *Sin, int64_t Rows, int64_t A, int64_t S,
                           int64_t D, int64_t CB, bool Interleaved,
                           bool Backward, int64_t Rot) {
  int64_t Half = Rot / 2;
  SP_GRID_LOOP(E, Rows * D) {
    int64_t Row = E / D, I = E % D;
    int64_t Si = Row % S, Bi = Row / (A * S);
    const float *C = Cos + ((CB == 1 ? 0 : Bi) * S + Si) * Rot;
    const float *Nn = Sin + ((CB == 1 ? 0 : Bi) * S + Si) * Rot;
    const float *XR = X + Row * D;
    float V;
    if (I >= Rot) {
      V = XR[I]; // past the rotated dims: passed through
    } else if (Interleaved) {
      bool Even = (I & 1) == 0;
      if (!Backward)
        V = Even ? XR[I] * C[I] - XR[I + 1] * Nn[I]
                 : XR[I] * C[I] + XR[I - 1] * Nn[I];
      else
        V = Even ? XR[I] * C[I] + XR[I + 1] * Nn[I + 1]
                 : XR[I] * C[I] - XR[I - 1] * Nn[I - 1];
    } else {
      bool Low = I < Half;
      if (!Backward)
        V = Low ? XR[I] * C[I] - XR[I + Half] * Nn[I]
                : XR[I] * C[I] + XR[I - Half] * Nn[I];
      else
        V = Low ? XR[I] * C[I] + XR[I + Half] * Nn[I + Half]
                : XR[I] * C[I] - XR[I - Half] * Nn[I - Half];
    }
    Y[E] = V;
  }
}

} // namespace

void splitHeads(Elems Q, Elems K, Elems V, Elems QKV, int64_t B, int64_t S,
                int64_t Heads, int64_t D, bool PerHead, cudaStream_t St) {
  int Unit = headUnit(D, elemBytes(QKV), {Q.Data, K.Data, V.Data, QKV.Data});
  int64_t Du = D * elemBytes(QKV) / Unit, N = B * Heads * S * Du;
  if (Launch L = elementwiseLaunch(3 * N); L.Blocks)
    withHeadUnit(Unit, [&](auto U) {
      using T = decltype(U);
      SP_LAUNCH(splitHeadsKernel<T>, L.Blocks, L.Threads, 0, St,
                static_cast<T *>(Q.Data), static_cast<T *>(K.Data),
                static_cast<T *>(V.Data), static_cast<T *>(QKV.Data), N, S,
                Heads, Du, PerHead, false);
    });
}
void splitHeadsBackward(Elems DQKV, Elems DQ, Elems DK, Elems DV, int64_t B,
                        int64_t S, int64_t Heads, int64_t D, bool PerHead,
                        cudaStream_t St) {
  int Unit =
      headUnit(D, elemBytes(DQKV), {DQ.Data, DK.Data, DV.Data, DQKV.Data});
  int64_t Du = D * elemBytes(DQKV) / Unit, N = B * Heads * S * Du;
  if (Launch L = elementwiseLaunch(3 * N); L.Blocks)
    withHeadUnit(Unit, [&](auto U) {
      using T = decltype(U);
      SP_LAUNCH(splitHeadsKernel<T>, L.Blocks, L.Threads, 0, St,
                static_cast<T *>(DQ.Data), static_cast<T *>(DK.Data),
                static_cast<T *>(DV.Data), static_cast<T *>(DQKV.Data), N, S,
                Heads, Du, PerHead, true);
    });
}
/// Y = X permuted ([B, Heads, S, D] -> [B, S, H]; Backward the inverse).
static void mergeHeadsAny(Elems Y, Elems X, int64_t B, int64_t S,
                          int64_t Heads, int64_t D, bool Backward,
                          cudaStream_t St) {
  int Unit = headUnit(D, elemBytes(X), {Y.Data, X.Data});
  int64_t Du = D * elemBytes(X) / Unit, N = B * Heads * S * Du;
  if (Launch L = elementwiseLaunch(N); L.Blocks)
    withHeadUnit(Unit, [&](auto U) {
      using T = decltype(U);
      SP_LAUNCH(mergeHeadsKernel<T>, L.Blocks, L.Threads, 0, St,
                static_cast<T *>(Y.Data), static_cast<const T *>(X.Data), N, S,
                Heads, Du, Backward);
    });
}
void mergeHeads(Elems Y, Elems X, int64_t B, int64_t S, int64_t Heads,
                int64_t D, cudaStream_t St) {
  mergeHeadsAny(Y, X, B, S, Heads, D, false, St);
}
void mergeHeadsBackward(Elems DX, Elems DY, int64_t B, int64_t S,
                        int64_t Heads, int64_t D, cudaStream_t St) {
  mergeHeadsAny(DX, DY, B, S, Heads, D, true, St);
}
void repeatHeads(float *Y, const float *X, int64_t B, int64_t G, int64_t R,
                 int64_t S, int64_t D, cudaStream_t St) {
  int64_t Block = S * D, NY = B * G * R * Block;
  if (Launch L = elementwiseLaunch(NY); L.Blocks)
    SP_LAUNCH(repeatHeadsKernel, L.Blocks, L.Threads, 0, St, Y, X, NY, R,
              Block);
}
void repeatHeadsBackward(float *DX, const float *DY, int64_t B, int64_t G,
                         int64_t R, int64_t S, int64_t D, cudaStream_t St) {
  int64_t Block = S * D, NX = B * G * Block;
  if (Launch L = elementwiseLaunch(NX); L.Blocks)
    SP_LAUNCH(repeatHeadsBackwardKernel, L.Blocks, L.Threads, 0, St, DX, DY, NX,
              R, Block);
}
void rope(float *Y, const float *X, const float *Cos, const float *Sin,
          int64_t B, int64_t A, int64_t S, int64_t D, int64_t CB,
          bool Interleaved, bool Backward, int64_t Rot, cudaStream_t St) {
  int64_t Rows = B * A * S;
  if (Launch L = elementwiseLaunch(Rows * D); L.Blocks)
    SP_LAUNCH(ropeKernel, L.Blocks, L.Threads, 0, St, Y, X, Cos, Sin, Rows, A,
              S, D, CB, Interleaved, Backward, Rot);
}

} // namespace sp::cuda
