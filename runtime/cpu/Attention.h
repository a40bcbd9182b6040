//===- Attention.h - The fused attention core (blockwise, online softmax) -===//
//
// The attention core of a layer in one kernel, as FlashAttention computes
// it (Dao et al. 2022; Dao 2023): per block of query rows it walks the keys
// block by block, keeping for each row the running maximum m and sum l of
// the exponentials, and rescales its output accumulator when m grows. It
// writes the output and one statistic per row, the log-sum-exp m + log l,
// never the [Sq, Sk] scores or probabilities. The backward recomputes each
// block's probabilities from Q, K and the log-sum-exp.
//
// The core is the unfused sequence's, op for op on each score:
//   s = Scale * (q . k)                    (scale)
//   s = Fill  where Key0 + j > Query0 + i   (causal_mask, when Causal)
//   s = s + KeyBias[b, j]                  (padding_mask, when KeyBias;
//                                           before the causal fill when
//                                           PadFirst, as HF Llama orders it)
//   p = softmax_j(s)
//   p = dropout(p): kept iff the Philox word of the probability's global
//       index in the [B, A, Sq, Sk] tensor (Probs) passes; kept values are
//       scaled by 1 / (1 - Ratio) (dropout)
//   o = sum_j p_j v_j
// so a fused and an unfused run draw the same dropout at every tensor-
// parallel rank (Probs holds the rank's block of the heads) and differ only
// in the order of float additions in the softmax sums.
//
// Shapes: Q, O, DQ, DO [B, A, Sq, D]; K, V, DK, DV [B, G, Sk, D] with A a
// multiple of G (grouped-query attention: query head a reads key/value head
// a / (A / G)); Lse [B, A, Sq]; KeyBias [B, Sk]. Row-major, contiguous.
// Two layouts read or write the projections' tensors in place instead:
// Merged puts O, DO and Lse as [B, Sq, A, D] and [B, Sq, A] (merge_heads'
// result); Packed reads Q, K, V as the three column blocks of one
// [B, S, 3, A, D] tensor (the QKV projection's output, split_heads' input)
// and writes DQ, DK, DV into one so (split_heads_grad's result).
//
// A window restricts a call to query rows [QBegin, QEnd) and keys [KBegin,
// KEnd): the forward writes those rows of O and Lse, the softmax over the
// window's keys only; the backward, given the O and Lse of the attention over
// ALL keys, writes DQ's window rows with the window keys' contribution and
// DK, DV's window keys with the window rows' contribution (FlashAttention's
// decomposition: the contributions of a partition of the keys, or of the
// rows, sum to the whole gradient). Other rows and keys are left untouched.
// Local row i stays at global position Query0 + i, key j at Key0 + j, and
// the dropout's Probs block keeps its [B, A, Sq, Sk] meaning (ring attention,
// ContextAttention.h, calls the kernel on one block pair at a time).
//
// Blocks of keys above the causal diagonal are skipped once every row of
// the query block has seen a score exceeding Fill + max(KeyBias) by more
// than 104 (exp(-104) < 2^-149: the skipped probabilities are below the
// smallest float), so skipping never changes a result.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CPU_ATTENTION_H
#define SP_RUNTIME_CPU_ATTENTION_H

#include "runtime/cpu/Kernels.h"

namespace sp::cpu {

struct AttentionShape {
  int64_t Batch = 1, Heads = 1, KvHeads = 1, Sq = 1, Sk = 1, D = 1;
};

struct AttentionCore {
  double Scale = 1;
  bool Causal = false;
  double Fill = -10000;       // the causal mask's fill
  int64_t Query0 = 0, Key0 = 0; // global positions of row 0 and column 0
  bool PadFirst = false;      // the padding bias before the causal fill
  /// O and DO [B, Sq, A, D] (heads merged: the projection's input) and Lse
  /// [B, Sq, A], instead of [B, A, Sq, D] and [B, A, Sq].
  bool Merged = false;
  /// Q, K, V (and DQ, DK, DV) are column blocks of one [B, S, 3, A, D]
  /// tensor X: the caller passes X, X + A D and X + 2 A D; rows are 3 A D
  /// apart. Needs G = A and Sk = Sq.
  bool Packed = false;
  double Dropout = 0;         // ratio on the probabilities; 0: none
  DropoutKey Key;             // the dropout's key
  GlobalIndex Probs;          // the [B, A, Sq, Sk] probabilities' global index
  /// Only query rows [QBegin, QEnd) and keys [KBegin, KEnd) take part (-1:
  /// Sq, Sk).
  int64_t QBegin = 0, QEnd = -1, KBegin = 0, KEnd = -1;
};

/// O and Lse from Q, K, V (KeyBias may be null), the window's rows from
/// its keys. Errors on inconsistent shapes, a window outside [0, Sq) x
/// [0, Sk), a dropout ratio outside [0, 1] or a Probs block that is not
/// [B, A, Sq, Sk].
template <typename T>
Status attentionForward(T *O, T *Lse, const T *Q, const T *K, const T *V,
                        const T *KeyBias, const AttentionShape &S,
                        const AttentionCore &C);

/// DQ, DK, DV (overwritten: the window's rows of DQ, its keys of DK and DV)
/// from DO and the forward's Q, K, V, O, Lse (those of all the keys).
template <typename T>
Status attentionBackward(T *DQ, T *DK, T *DV, const T *DO, const T *Q,
                         const T *K, const T *V, const T *O, const T *Lse,
                         const T *KeyBias, const AttentionShape &S,
                         const AttentionCore &C);

} // namespace sp::cpu

#endif // SP_RUNTIME_CPU_ATTENTION_H
