//===- Kernels.h - CPU kernels, forward and backward ------------*- C++ -*-===//
//
// The reference backend, kept plain as in llm.c: each op's forward and its
// backward side by side, raw contiguous row-major pointers and explicit
// sizes, no allocation. GEMMs go through OpenBLAS (cblas); everything else is
// a simple loop. Each kernel is a template over the element type T in
// {float, double}, both instantiated: float is the runtime, double exists for
// the finite-difference tests. Reductions (means, variances, softmax sums,
// losses, norms) accumulate in double whatever T is.
//
// The definitions are in runtime/cpu/kernels/, one file per family, named
// as runtime/cuda/kernels/ where the CUDA backend has the family: sections
// 4 and 7 in Linear.cpp; 2, 8, 15 and 16 in Elementwise.cpp; 9 and 10 in
// AttentionSoftmax.cpp; 6, 17 and 18 in Heads.cpp; 13 in AdamW.cpp; 19 in
// Convert.cpp; the others in a file named as their section.
//
// Conventions:
//  - Arguments: outputs first, then inputs, then sizes, then attributes.
//  - "rows" is the product of all leading dimensions.
//  - Gradient accumulation rule: gradients of parameters ACCUMULATE (+=) into
//    their buffer (dW, db, dgamma, dbeta, dtable), so the caller zeroes them
//    once per step and microbatches sum for free; every other output,
//    activation gradients included, is OVERWRITTEN (=).
//  - Kernels that can reject their data (ids, targets, shapes, keys) return a
//    Status; its Message is a static string naming the cause. Misuse that is a
//    bug in the caller (negative sizes, a GEMM dimension over INT_MAX) aborts
//    with file:line and a hint.
//  - Outputs may not alias inputs unless a kernel says so (the elementwise
//    ones allow Y == X).
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CPU_KERNELS_H
#define SP_RUNTIME_CPU_KERNELS_H

#include <cstdint>
#include <optional>
#include <span>

namespace sp::cpu {

/// The result of a kernel that validates its input. Message is nullptr on
/// success, else a static string; Index and Value locate the bad element
/// (e.g. the position of an out-of-range id and the id itself).
struct [[nodiscard]] Status {
  const char *Message = nullptr;
  int64_t Index = -1;
  int64_t Value = 0;

  bool ok() const { return Message == nullptr; }
  static Status success() { return {}; }
  static Status error(const char *Msg, int64_t Index = -1, int64_t Value = 0) {
    return {Msg, Index, Value};
  }
};

/// The highest rank of the shape-generic kernels (reduceToShape,
/// addBroadcast, mulBroadcast, GlobalIndex).
constexpr int MaxRank = 6;

/// Shapes are spans of dimension sizes.
using Shape = std::span<const int64_t>;

//===----------------------------------------------------------------------===//
// GEMM
//===----------------------------------------------------------------------===//

/// How gemm cuts C = op(A) op(B), [M, N] with inner size K, over the kernel
/// threads: Rows x Cols tiles of TM x TN (the last row and column of tiles
/// shorter). A function of the shape only, so that results do not depend on
/// the thread count; one tile for small products.
struct GemmTiles {
  int64_t TM, TN, Rows, Cols;
  int64_t count() const { return Rows * Cols; }
};
GemmTiles gemmTiles(int64_t M, int64_t N, int64_t K);

/// Row-major C[M,N] = Alpha * op(A)[M,K] * op(B)[K,N] + Beta * C, where
/// op(A) = A (stored [M,K], leading dimension Lda) or A^T (stored [K,M]) and
/// likewise for B. Beta = 0 overwrites C (NaNs in C are not propagated).
template <typename T>
void gemm(bool TransA, bool TransB, int64_t M, int64_t N, int64_t K, T Alpha,
          const T *A, int64_t Lda, const T *B, int64_t Ldb, T Beta, T *C,
          int64_t Ldc);

//===----------------------------------------------------------------------===//
// 1. Embedding
//===----------------------------------------------------------------------===//

/// Y[n, :] = Table[Ids[n], :] for n < N (N = B*S), Table[V, H].
/// Error "embedding id out of range" (Index = n, Value = id) if an id is not
/// in [0, V); Y is then untouched.
template <typename T>
Status embedding(T *Y, const T *Table, const int64_t *Ids, int64_t N, int64_t V,
                 int64_t H);

/// DTable[v, :] += sum over n with Ids[n] == v of DY[n, :]  (accumulates).
/// Same error as the forward; DTable is then untouched.
template <typename T>
Status embeddingBackward(T *DTable, const T *DY, const int64_t *Ids, int64_t N,
                         int64_t V, int64_t H);

//===----------------------------------------------------------------------===//
// 2. Add and its broadcast reduction
//===----------------------------------------------------------------------===//

/// Y[i] = A[i] + B[i], i < N. Y may alias A or B.
template <typename T> void add(T *Y, const T *A, const T *B, int64_t N);

/// Y[YShape] = A[AShape] + B[BShape] with numpy broadcasting: shapes align
/// on the right, and each input dimension is 1 or equal to Y's. Errors on
/// shapes that do not broadcast to YShape or rank > MaxRank. No aliasing.
template <typename T>
Status addBroadcast(T *Y, Shape YShape, const T *A, Shape AShape, const T *B,
                    Shape BShape);

/// The backward of a broadcast: DX[XShape] = sum of DY[YShape] over the
/// dimensions XShape broadcasts along (missing leading dims and dims of size 1
/// that are not 1 in YShape). Same shape errors as addBroadcast.
template <typename T>
Status reduceToShape(T *DX, Shape XShape, const T *DY, Shape YShape);

//===----------------------------------------------------------------------===//
// 3. LayerNorm over the last axis
//===----------------------------------------------------------------------===//

/// For each row r of X[Rows, H]:
///   Mean[r] = sum_j X[r,j] / H
///   Rstd[r] = 1 / sqrt(sum_j (X[r,j] - Mean[r])^2 / H + Eps)   (biased var)
///   Y[r,j]  = (X[r,j] - Mean[r]) * Rstd[r] * Gamma[j] + Beta[j]
/// Gamma == nullptr means 1, Beta == nullptr means 0. Mean and Rstd may be
/// nullptr when not needed.
template <typename T>
void layerNorm(T *Y, T *Mean, T *Rstd, const T *X, const T *Gamma,
               const T *Beta, int64_t Rows, int64_t H, double Eps);

/// The column sums of the parameter gradients (layerNormBackward,
/// rmsNormBackward, biasBackward) are in double, in one order for every
/// backend: per column, the rows in blocks of ColumnRows, each block summed
/// in order from 0, the blocks' sums added in order, then rounded once. A
/// GPU sums the blocks in parallel (runtime/cuda/kernels/LayerNorm.cuh) and
/// gets the same bits; at most ColumnRows rows it is the plain row order.
constexpr int64_t ColumnRows = 64;

/// With xhat = (X - Mean) * Rstd and g = DY * Gamma (per row):
///   DX     = Rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))   (overwrites)
///   DGamma += sum_rows DY * xhat,   DBeta += sum_rows DY        (accumulate;
///             the column sums' order above)
/// DX, DGamma, DBeta may each be nullptr (not computed); Gamma == nullptr
/// means 1.
template <typename T>
void layerNormBackward(T *DX, T *DGamma, T *DBeta, const T *DY, const T *X,
                       const T *Gamma, const T *Mean, const T *Rstd,
                       int64_t Rows, int64_t H);

//===----------------------------------------------------------------------===//
// 4. Linear
//===----------------------------------------------------------------------===//

/// Y[Rows, Out] = X[Rows, In] * W^T + Bias  if TransW (W stored [Out, In], the
///                                          torch layout)
///              = X[Rows, In] * W   + Bias  otherwise (W stored [In, Out]).
/// Bias[Out] may be nullptr.
template <typename T>
void linear(T *Y, const T *X, const T *W, const T *Bias, int64_t Rows,
            int64_t In, int64_t Out, bool TransW);

/// DX[Rows, In] = DY[Rows, Out] * W   if TransW   (overwrites)
///              = DY * W^T             otherwise.
/// This is linear(DY, W, trans_w = !TransW), which is how autodiff emits it.
template <typename T>
void linearBackwardInput(T *DX, const T *DY, const T *W, int64_t Rows,
                         int64_t In, int64_t Out, bool TransW);

/// DW[Out, In] += DY^T * X   if TransW       (accumulates)
/// DW[In, Out] += X^T * DY   otherwise.
template <typename T>
void linearBackwardWeight(T *DW, const T *X, const T *DY, int64_t Rows,
                          int64_t In, int64_t Out, bool TransW);

/// DBias[Out] += sum_rows DY[Rows, Out]   (accumulates; the column sums'
/// order of layerNormBackward).
template <typename T>
void biasBackward(T *DBias, const T *DY, int64_t Rows, int64_t Out);

//===----------------------------------------------------------------------===//
// 5. GELU
//===----------------------------------------------------------------------===//

enum class GeluApprox { None, Tanh };

/// None: Y = 0.5 x (1 + erf(x / sqrt 2))
/// Tanh: Y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
/// Y may alias X.
template <typename T> void gelu(T *Y, const T *X, int64_t N, GeluApprox Approx);

/// DX = DY * gelu'(X), the exact derivative of the chosen form:
/// None: 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)
/// Tanh: 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u'(x),
///       u'(x) = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
/// DX may alias DY.
template <typename T>
void geluBackward(T *DX, const T *X, const T *DY, int64_t N, GeluApprox Approx);

/// The epilogue fusions (lower/FuseEpilogue.h), each with the bits of the
/// pair it stands for: the GEMM, then the GELU (or its gradient, in place)
/// over the whole result on the kernel threads. (Running the GELU on each
/// GEMM tile as soon as it was computed, while in cache, measured 2.4 ms
/// slower per medium step: the double-precision GELU is compute-bound.)
/// Z = linear(X, W, Bias) and Y = gelu(Z).
template <typename T>
void linearGelu(T *Z, T *Y, const T *X, const T *W, const T *Bias,
                int64_t Rows, int64_t In, int64_t Out, bool TransW,
                GeluApprox Approx);
/// DX = geluBackward(Z, linear(DY, W)): DX[Rows, Out] is the gradient of
/// the GELU's input Z[Rows, Out], whose output's gradient is the linear
/// input gradient DY[Rows, In] op(W) (W as linear reads it with TransW).
template <typename T>
void linearGeluBackward(T *DX, const T *DY, const T *W, const T *Z,
                        int64_t Rows, int64_t In, int64_t Out, bool TransW,
                        GeluApprox Approx);

//===----------------------------------------------------------------------===//
// 6. Head layouts (D = H / Heads)
//===----------------------------------------------------------------------===//

/// QKV[B, S, 3H] -> Q, K, V [B, Heads, S, D]:
///   Q[b,a,s,t] = QKV[b, s, 0H + a D + t]
///   K[b,a,s,t] = QKV[b, s, 1H + a D + t]
///   V[b,a,s,t] = QKV[b, s, 2H + a D + t]
/// or, PerHead (GPT-NeoX's [Heads, 3, D] columns), part p of head a at
/// QKV[b, s, (3 a + p) D + t].
template <typename T>
void splitHeads(T *Q, T *K, T *V, const T *QKV, int64_t B, int64_t S,
                int64_t Heads, int64_t D, bool PerHead = false);

/// The inverse permutation: DQKV[B, S, 3H] from DQ, DK, DV [B, Heads, S, D]
/// (overwrites).
template <typename T>
void splitHeadsBackward(T *DQKV, const T *DQ, const T *DK, const T *DV,
                        int64_t B, int64_t S, int64_t Heads, int64_t D,
                        bool PerHead = false);

/// X[B, Heads, S, D] -> Y[B, S, Heads * D]: Y[b, s, a D + t] = X[b, a, s, t].
template <typename T>
void mergeHeads(T *Y, const T *X, int64_t B, int64_t S, int64_t Heads,
                int64_t D);

/// The inverse: DX[b, a, s, t] = DY[b, s, a D + t] (overwrites).
template <typename T>
void mergeHeadsBackward(T *DX, const T *DY, int64_t B, int64_t S, int64_t Heads,
                        int64_t D);

//===----------------------------------------------------------------------===//
// 7. Batched matrix product
//===----------------------------------------------------------------------===//

/// C[p, M, N] = op(A)[p] * op(B)[p] for p < Batch, where A is stored
/// [Batch, M, K] (or [Batch, K, M] if TransA) and B [Batch, K, N] (or
/// [Batch, N, K] if TransB). The backward is batchMatMul again (autodiff's
/// rules), e.g. for C = A B: dA = bmm(dC, B, transB), dB = bmm(A, dC, transA).
///
/// Causal structure (batch_matmul's causal and causal_a attributes, set by
/// lower/CausalProducts.h): with CausalOut, only C[p, i, j] with j <= i are
/// computed and the rest are set to 0; with CausalA, A as stored is zero
/// above its diagonal (A[p, r, c] = 0 for c > r), so the products of those
/// zeros are skipped. Either way the products run over row blocks of C, each
/// over the columns and contraction range the structure leaves, so about
/// half the multiply-adds of a square product are skipped.
template <typename T>
void batchMatMul(T *C, const T *A, const T *B, int64_t Batch, int64_t M,
                 int64_t N, int64_t K, bool TransA, bool TransB,
                 bool CausalOut = false, bool CausalA = false);

//===----------------------------------------------------------------------===//
// 8. Scale
//===----------------------------------------------------------------------===//

/// Y = Alpha * X. Its own backward (DX = Alpha * DY). Y may alias X.
template <typename T> void scale(T *Y, const T *X, int64_t N, double Alpha);

//===----------------------------------------------------------------------===//
// 9. Causal mask
//===----------------------------------------------------------------------===//

/// X[Batch, Sq, Sk]: Y[p, i, j] = Fill if K0 + j > Q0 + i, else X[p, i, j].
/// Row i is global query Q0 + i and column j global key K0 + j, so blocks of a
/// sequence-sharded score matrix mask consistently. The backward is
/// causalMask(DY, Fill = 0). Y may alias X.
template <typename T>
void causalMask(T *Y, const T *X, int64_t Batch, int64_t Sq, int64_t Sk,
                double Fill, int64_t Q0 = 0, int64_t K0 = 0);

/// The additive padding mask: Y[p, i, j] = X[p, i, j] + Bias[p, j] for
/// X[Batch, Inner, K] (Inner = heads * queries), Bias[Batch, K] the
/// (1 - keep) * fill the caller computed in T, as torch does. The backward
/// is the identity. Y may alias X.
template <typename T>
void addKeyBias(T *Y, const T *X, const T *Bias, int64_t Batch, int64_t Inner,
                int64_t K);

//===----------------------------------------------------------------------===//
// 10. Softmax over the last axis
//===----------------------------------------------------------------------===//

/// Y[r, j] = exp(X[r,j] - m) / sum_k exp(X[r,k] - m), m = max_k X[r,k].
/// A row that is all -inf gives all zeros (not NaN). Y may alias X.
template <typename T> void softmax(T *Y, const T *X, int64_t Rows, int64_t N);

/// scale(Alpha), then (when Causal) causalMask(Fill), then softmax, over
/// scores X[Batch, Sq, Sk], in one pass per row with the same bits as the
/// three kernels one after the other. Where every masked score's exp is
/// exactly 0 (the fill more than 800 below the row's maximum, or -inf), the
/// masked tail's exps are not computed: the row sums gain +0 for each one.
/// Y may alias X.
template <typename T>
void scaledCausalSoftmax(T *Y, const T *X, int64_t Batch, int64_t Sq,
                         int64_t Sk, double Alpha, bool Causal, double Fill);

/// Its backward: softmaxBackward, then (when Causal) causalMask(Fill), then
/// scale(Alpha), in one pass per row with the same bits. DX may alias DY.
template <typename T>
void scaledCausalSoftmaxBackward(T *DX, const T *Y, const T *DY, int64_t Batch,
                                 int64_t Sq, int64_t Sk, double Alpha,
                                 bool Causal, double Fill);

/// DX[r, :] = Y[r, :] * (DY[r, :] - sum_j DY[r,j] Y[r,j]). DX may alias DY.
template <typename T>
void softmaxBackward(T *DX, const T *Y, const T *DY, int64_t Rows, int64_t N);

//===----------------------------------------------------------------------===//
// 11. Dropout
//===----------------------------------------------------------------------===//

/// What a dropout mask is keyed by (see Philox.h for the exact mapping).
/// Layer and Site must be < 2^16.
struct DropoutKey {
  uint64_t Seed = 0;
  uint32_t Layer = 0;
  uint32_t Site = 0;
  uint32_t Stream = 0; // e.g. the microbatch (and step) index
};

/// Where a local tensor sits in the global (unsharded) one: the local tensor
/// is the block [Offset, Offset + Local) of a tensor of shape Global, and
/// local element (i0, .., i{r-1}) is global element (Offset0 + i0, ..), whose
/// global index is its row-major index in Global.
struct GlobalIndex {
  int Rank = 0;
  int64_t Global[MaxRank] = {};
  int64_t Local[MaxRank] = {};
  int64_t Offset[MaxRank] = {};
  /// A block in two runs along an axis (a context-parallel rank's zigzag
  /// positions, ir/ContextLayout.h): local index x of axis D is global
  /// Offset[D] + x, plus Jump[D] from x = Seam[D] on (Seam 0: one run).
  int64_t Seam[MaxRank] = {};
  int64_t Jump[MaxRank] = {};

  /// The unsharded tensor of this shape.
  static GlobalIndex whole(Shape S);
  /// The block of shape LocalShape at Off in a tensor of shape GlobalShape.
  static GlobalIndex block(Shape GlobalShape, Shape LocalShape, Shape Off);
  /// Elements of the local block.
  int64_t numLocal() const;
  /// Errors on rank > MaxRank, negative sizes or a block outside Global.
  Status check() const;
};

/// Y = X * Mask / (1 - Ratio), Mask[e] = 1 iff philox::uniform(word of the
/// global index of e) >= Ratio (Philox.h). N = G.numLocal(). Mask may be
/// nullptr (then it is only used internally). Ratio >= 1 drops everything
/// (Y = 0). Errors on Ratio outside [0, 1], Layer or Site >= 2^16, or a bad G.
/// With Addend (N values; dropout_add, lower/FuseEpilogue.h) Y = dropout(X)
/// + Addend, rounded as the two ops apart. Y may alias X or Addend.
/// Causal (dropout's causal attribute, lower/CausalProducts.h): X is zero
/// above the diagonal of its last two (global) dimensions, and there the
/// mask is 0 without a draw (so Y is 0, as it would be anyway); below it
/// the mask is the same as without Causal. Errors on rank < 2.
template <typename T>
Status dropout(T *Y, uint8_t *Mask, const T *X, double Ratio,
               const DropoutKey &K, const GlobalIndex &G,
               const T *Addend = nullptr, bool Causal = false);

/// Keep[j] = whether dropout at Ratio keeps global element Global0 + j, for
/// j < Len: the mask of Len consecutive global elements (fused kernels that
/// draw dropout inside). Ratio and K as checked by dropout.
void dropoutKeep(uint8_t *Keep, uint64_t Global0, int64_t Len,
                 const DropoutKey &K, double Ratio);

/// Only the mask of dropout (e.g. to regenerate it in a recomputation).
Status dropoutMask(uint8_t *Mask, double Ratio, const DropoutKey &K,
                   const GlobalIndex &G);

/// DX = DY * Mask / (1 - Ratio) (0 when Ratio >= 1). DX may alias DY.
template <typename T>
void dropoutBackward(T *DX, const T *DY, const uint8_t *Mask, int64_t N,
                     double Ratio);

//===----------------------------------------------------------------------===//
// 12. Cross entropy
//===----------------------------------------------------------------------===//

/// Logits[N, V] of which the first ValidV columns are the vocabulary and the
/// rest padding (treated as -inf). With lse_n = log sum_{j<ValidV} exp(l[n,j])
/// and the counted rows C = {n : Targets[n] != IgnoreIndex} (all rows when
/// IgnoreIndex is empty):
///   Loss = (1/|C|) sum_{n in C} (lse_n - Logits[n, Targets[n]])
/// (double accumulation), and Loss = 0 when C is empty (torch's
/// F.cross_entropy(ignore_index=..., reduction="mean") gives NaN there, 0/0,
/// and zero gradients). Only the targets are ignored: the ignored class stays
/// in every row's softmax, as in torch. IgnoreIndex may be any value, inside
/// [0, ValidV) or not.
/// Error "cross entropy target out of range" (Index = n, Value = target) if a
/// target that is not IgnoreIndex is not in [0, ValidV); errors on N <= 0 or
/// ValidV not in [1, V].
template <typename T>
Status crossEntropy(T *Loss, const T *Logits, const int64_t *Targets, int64_t N,
                    int64_t V, int64_t ValidV,
                    std::optional<int64_t> IgnoreIndex = std::nullopt);

/// DLogits[n, j] = DLoss * (softmax_j(Logits[n, :ValidV]) - [j == t_n]) / |C|
/// for n in C and j < ValidV; 0 for the padding columns, the ignored rows,
/// and everything when C is empty (overwrites). Same errors.
template <typename T>
Status crossEntropyBackward(T *DLogits, const T *Logits, const int64_t *Targets,
                            double DLoss, int64_t N, int64_t V, int64_t ValidV,
                            std::optional<int64_t> IgnoreIndex = std::nullopt);

//===----------------------------------------------------------------------===//
// 13. Optimizer
//===----------------------------------------------------------------------===//

/// sum_i G[i]^2 in double (the global gradient norm is the square root of
/// the sum over all gradients and ranks): over chunks of SquaresChunk
/// elements in parallel, each chunk a sum of 8 lane sums (lane j mod 8)
/// combined as ((0+1)+(2+3))+((4+5)+(6+7)), the chunks' sums added in
/// order, whatever the thread count.
constexpr int64_t SquaresChunk = int64_t(1) << 16;
template <typename T> double sumSquares(const T *G, int64_t N);

/// torch.nn.utils.clip_grad_norm_'s coefficient, computed in T as torch does
/// on T tensors: min(1, (1 / (TotalNorm + 1e-6)) * MaxNorm). (torch evaluates
/// max_norm / x as x.reciprocal() * max_norm.)
template <typename T> T clipCoefficient(T TotalNorm, T MaxNorm);

/// One torch.optim.AdamW step (Loshchilov & Hutter), in place, Step >= 1:
///   g  = G * GradScale                       (GradScale: clipCoefficient)
///   P  = P * (1 - Lr * WeightDecay)          (decoupled weight decay)
///   M  = Beta1 M + (1 - Beta1) g
///   V  = Beta2 V + (1 - Beta2) g^2
///   P -= (Lr / (1 - Beta1^Step)) * M / (sqrt(V) / sqrt(1 - Beta2^Step) + Eps)
/// The last line is lr * mhat / (sqrt(vhat) + eps) evaluated in torch's order;
/// scalar factors are computed in double as torch computes them in Python.
template <typename T>
void adamw(T *P, const T *G, T *M, T *V, int64_t N, double Lr, double Beta1,
           double Beta2, double Eps, double WeightDecay, double GradScale,
           int64_t Step);

//===----------------------------------------------------------------------===//
// 14. RMSNorm over the last axis
//===----------------------------------------------------------------------===//

/// Llama's LlamaRMSNorm. For each row r of X[Rows, H]:
///   Rstd[r] = 1 / sqrt(sum_j X[r,j]^2 / H + Eps)   (double accumulation)
///   Y[r,j]  = X[r,j] * Rstd[r] * Gamma[j]
/// Gamma is required. Rstd may be nullptr when not needed; it is stored in T
/// like layerNorm's statistics.
template <typename T>
void rmsNorm(T *Y, T *Rstd, const T *X, const T *Gamma, int64_t Rows,
             int64_t H, double Eps);

/// With xhat = X * Rstd and g = DY * Gamma (per row):
///   DX     = Rstd * (g - xhat * mean_j(g * xhat))   (overwrites)
///   DGamma += sum_rows DY * xhat                     (accumulates)
/// DX and DGamma may each be nullptr (not computed).
template <typename T>
void rmsNormBackward(T *DX, T *DGamma, const T *DY, const T *X, const T *Gamma,
                     const T *Rstd, int64_t Rows, int64_t H);

//===----------------------------------------------------------------------===//
// 15. Activations: the SP_UNARY_OP ops of ir/Ops.def
//===----------------------------------------------------------------------===//

/// One enumerator per SP_UNARY_OP line of ir/Ops.def. Its kernel is the
/// struct of the same name in runtime/Numerics.h (sp::numerics, shared with
/// the CUDA kernels; kernels/Elementwise.cpp generates the dispatch): the
/// value f(x) and the derivative f'(x), both in double (float rounds once),
/// finite for every finite x.
enum class Activation : uint8_t {
#define SP_OP(Enum, Name)
#define SP_UNARY_OP(Enum, Name, OnnxName) Enum,
#include "ir/Ops.def"
};

/// Y = f(X). Y may alias X.
///  - Silu: x * sigmoid(x), sigmoid(x) = 1 / (1 + exp(-x)), from exp(-|x|)
///    without overflow or cancellation (x = -1e4 gives -0, 1e4 gives 1e4;
///    exp(-|x|) is flushed to 0 below e^-708, so double returns -0 for
///    x < -708).
///  - Relu: max(x, 0).
template <typename T>
void activation(Activation F, T *Y, const T *X, int64_t N);

/// DX = DY * f'(X). DX may alias DY.
///  - Silu: s (1 + x (1 - s)), s = sigmoid(x).
///  - Relu: 1 for x > 0, else 0 (torch's choice at 0).
template <typename T>
void activationBackward(Activation F, T *DX, const T *X, const T *DY,
                        int64_t N);

//===----------------------------------------------------------------------===//
// 16. Elementwise product
//===----------------------------------------------------------------------===//

/// Y[i] = A[i] * B[i], i < N. Y may alias A or B. Its backward is mul again:
/// DA = DY * B, DB = DY * A.
template <typename T> void mul(T *Y, const T *A, const T *B, int64_t N);

/// Y[YShape] = A[AShape] * B[BShape] with addBroadcast's broadcasting rules
/// and errors. No aliasing. The backward is mulBroadcast then reduceToShape:
/// DA = reduceToShape(AShape, DY * B broadcast to YShape), likewise DB.
template <typename T>
Status mulBroadcast(T *Y, Shape YShape, const T *A, Shape AShape, const T *B,
                    Shape BShape);

//===----------------------------------------------------------------------===//
// 17. Rotary position embedding
//===----------------------------------------------------------------------===//

/// X, Y [B, A, S, D] (D even), tables Cos, Sin [CB, S, D] with CB == 1
/// (shared by the batch) or CB == B; every head uses its batch row's table.
/// With c = Cos[cb, s, :], n = Sin[cb, s, :], cb = (CB == 1 ? 0 : b), and
/// x = X[b, a, s, :], h = D / 2:
///  - half form (HF rotate_half, rot(x) = cat(-x[h:], x[:h])):
///      Y[i] = x[i] c[i] - x[i+h] n[i]   for i < h
///      Y[i] = x[i] c[i] + x[i-h] n[i]   for i >= h
///  - Interleaved (GPT-J rotate_every_two, (x[2j], x[2j+1]) ->
///    (-x[2j+1], x[2j])):
///      Y[2j]   = x[2j] c[2j]     - x[2j+1] n[2j]
///      Y[2j+1] = x[2j+1] c[2j+1] + x[2j] n[2j+1]
/// i.e. Y = x * c + rot(x) * n, evaluated in T in that order (torch's order).
/// Y may not alias X.
/// Rot (0: D) rotates only the first Rot dims of each row, with [CB, S, Rot]
/// tables (h = Rot / 2 above), and copies the rest (GPT-NeoX's partial
/// rotary).
template <typename T>
void rope(T *Y, const T *X, const T *Cos, const T *Sin, int64_t B, int64_t A,
          int64_t S, int64_t D, int64_t CB, bool Interleaved, int64_t Rot = 0);

/// The transpose: DX = DY * c + rot^T(DY * n) (overwrites), i.e.
///  - half form:  DX[i] = dy[i] c[i] + dy[i+h] n[i+h]   for i < h
///                DX[i] = dy[i] c[i] - dy[i-h] n[i-h]   for i >= h
///  - Interleaved: DX[2j]   = dy[2j] c[2j]     + dy[2j+1] n[2j+1]
///                 DX[2j+1] = dy[2j+1] c[2j+1] - dy[2j] n[2j]
/// The tables get no gradient. DX may not alias DY.
template <typename T>
void ropeBackward(T *DX, const T *DY, const T *Cos, const T *Sin, int64_t B,
                  int64_t A, int64_t S, int64_t D, int64_t CB, bool Interleaved,
                  int64_t Rot = 0);

//===----------------------------------------------------------------------===//
// 18. Grouped-query attention's head repeat
//===----------------------------------------------------------------------===//

/// HF repeat_kv: X[B, G, S, D] -> Y[B, G * R, S, D],
///   Y[b, g R + r, s, :] = X[b, g, s, :]   for r < R.
template <typename T>
void repeatHeads(T *Y, const T *X, int64_t B, int64_t G, int64_t R, int64_t S,
                 int64_t D);

/// DX[b, g, s, :] = sum_{r < R} DY[b, g R + r, s, :]  (overwrites; summed in
/// double in the order r = 0, 1, ..).
template <typename T>
void repeatHeadsBackward(T *DX, const T *DY, int64_t B, int64_t G, int64_t R,
                         int64_t S, int64_t D);

//===----------------------------------------------------------------------===//
// 19. 16-bit storage: widening to float32 and rounding back
//===----------------------------------------------------------------------===//

/// Y[i] = the float32 value of the bfloat16 (Bf16) or IEEE half bits X[i]
/// (exact), and back: Y[i] = X[i] rounded to nearest even, nans quiet,
/// bit for bit ir/Float16.h's scalar conversions.
void widen16(float *Y, const uint16_t *X, int64_t N, bool Bf16);
void narrow16(uint16_t *Y, const float *X, int64_t N, bool Bf16);

} // namespace sp::cpu

#endif // SP_RUNTIME_CPU_KERNELS_H
