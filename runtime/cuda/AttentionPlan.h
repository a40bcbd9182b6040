//===- AttentionPlan.h - The fused attention core as unfused ops --*- C++ -*-===//
//
// The CUDA backend has no blockwise kernel for the fused attention core
// (`attention`, `attention_grad`; runtime/cpu/Attention.h) yet. It runs one
// by the unfused ops the fuse-attention pass replaced, each with its tested
// kernel, on score-sized tensors in a per-stream workspace outside the
// plan's arena (the plan stores none of them):
//
//   forward:  q, k, v = split_heads(qkv)           (packed = 1)
//             kr, vr = repeat_heads(k, v)          (grouped-query heads)
//             s = batch_matmul(q, kr^T); scale; causal_mask and
//                 padding_mask (in the op's order)
//             lse = log-sum-exp of s's rows        (rowLogSumExp)
//             p = softmax(s); p = dropout(p)       (the op's Philox key)
//             o = batch_matmul(p, vr)              (merge_heads when merged)
//   backward: s, p and the dropout mask again, then
//             dv = p^T do; dp = do vr^T; dropout_grad; softmax_grad with the
//             scale and the causal mask; dq = ds kr; dk = ds^T q (summed over
//             a group's heads by repeat_heads_grad); packed, dqkv =
//             split_heads_grad(dq, dk, dv)
//
// These are the ops whose results fused and unfused plans already agree
// on (tests/e2e, FusedAttention.*), so the results are the fused CPU
// kernel's up to the order of float additions; the dropout draws the same
// words (the probabilities' global index comes from q's sharding and the
// op's microbatch attributes, as the dropout op computes it).
//
// The expansion is host logic: tests/gpu/HostLogicTest.cpp runs it on the
// CPU backend against the fused CPU kernel.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_ATTENTIONPLAN_H
#define SP_RUNTIME_CUDA_ATTENTIONPLAN_H

#include "plan/Program.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <vector>

namespace sp::cuda {

struct AttentionPlan {
  /// The unfused instructions, over Local's buffers.
  Program Local;
  /// Local buffer K is the attention instruction's buffer Outer[K], or -1
  /// for a workspace tensor at Local.Buffers[K].Offset in the workspace.
  std::vector<int> Outer;
  int64_t WorkspaceBytes = 0;
  /// Forward: after instruction LseAfter, the log-sum-exp of the rows of
  /// Local buffer Scores (the masked scores, [B, A, Sq, Sk]) is written to
  /// Local buffer Lse ([B, A, Sq], or [B, Sq, A] when merged). -1: none.
  int LseAfter = -1, Scores = -1, Lse = -1;
  bool LseMerged = false;
  int64_t Batch = 0, Heads = 0, Sq = 0, Sk = 0;
};

/// The expansion of an attention or attention_grad instruction over the
/// program's buffers. Workspace tensors are float32 (the fused kernel
/// computes its scores and probabilities in float32 in every plan).
llvm::Expected<AttentionPlan>
planAttention(const Instruction &I, const std::vector<ProgramBuffer> &Buffers);

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_ATTENTIONPLAN_H
