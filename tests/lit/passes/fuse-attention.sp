// fuse-attention (passes/AttentionFusion.cpp): with --attention fused (the
// default) each attention core, q k^T through the product with v, becomes
// one attention op; GPT's fused QKV projection is read in place (packed)
// and the output written merged. A chain of another shape is left as it is,
// and so is everything under --attention unfused.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,fuse-attention --verify-each | FileCheck %s --check-prefix=PACKED --implicit-check-not=split_heads --implicit-check-not=softmax --implicit-check-not=merge_heads
// RUN: sp-opt %s --passes=fuse-attention --verify-each | FileCheck %s
// RUN: sp-opt %s --passes=fuse-attention --remarks 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK
// RUN: sp-opt %s --passes=fuse-attention --attention unfused > %t.unfused
// RUN: sp-opt %s > %t.input
// RUN: diff %t.input %t.unfused

// The one-layer GPT: the core reads the QKV projection's output, writes the
// projection's input and a log-sum-exp per row and head; the scale, the
// causal mask and the dropout are its attributes.
// PACKED: [[QKV:%[0-9]+]] : f32[1, 4, 24] = linear({{.*}}[layer = 0, role = "qkv"]
// PACKED-NEXT: [[O:%[0-9]+]] : f32[1, 4, 8], %{{[0-9]+}} : f32[1, 4, 2] = attention([[QKV]]) {causal = 1, dropout = 1, fill = -inf, heads = 2, merged = 1, packed = 1, ratio = 0.1, scale = 0.5} [layer = 0, role = "attention"]
// PACKED-NEXT: linear([[O]], %proj.w, %proj.b) {trans_w = 1} [layer = 0, role = "proj"]

// This file's graph: the padded core fuses with its keep mask as an operand
// (the padding before the causal mask: pad_first); the cross-attention
// core (k and v of 6 positions), the core whose probabilities are also an
// output, and the softmax that already carries fused attributes are left.
// CHECK: = attention(%q, %k, %v, %keep) {causal = 1, fill = -inf, pad_fill = -10000.0, pad_first = 1, pad_where = 0, scale = 0.25} loc("padded.av") [role = "attention"]
// CHECK-NEXT: [[S:%[0-9]+]] : f32[1, 2, 4, 6] = batch_matmul(%q, %k6) {trans_b = 1} loc("cross")
// CHECK-NEXT: [[P:%[0-9]+]] : f32[1, 2, 4, 6] = softmax([[S]])
// CHECK-NEXT: batch_matmul([[P]], %v6) {trans_b = 0}
// CHECK-NEXT: [[S:%[0-9]+]] : f32[1, 2, 4, 4] = batch_matmul(%q, %k) {trans_b = 1} loc("read_twice")
// CHECK-NEXT: [[P:%[0-9]+]] : f32[1, 2, 4, 4] = softmax([[S]])
// CHECK-NEXT: batch_matmul([[P]], %v) {trans_b = 0}
// CHECK-NEXT: [[S:%[0-9]+]] : f32[1, 2, 4, 4] = batch_matmul(%q, %k) {trans_b = 1} loc("prefused")
// CHECK-NEXT: [[P:%[0-9]+]] : f32[1, 2, 4, 4] = softmax([[S]]) {alpha = 0.25, causal = 1, fill = -inf} loc("prefused.softmax")
// CHECK-NEXT: batch_matmul([[P]], %v) {trans_b = 0}
// CHECK-NOT: attention(

// REMARK: fuse-attention: cross: q, k, v of f32[1, 2, 4, 8], f32[1, 2, 6, 8], f32[1, 2, 6, 8] are not [b, a, s, d] alike; left unfused
// REMARK-NEXT: fuse-attention: prefused.softmax: a softmax with fused attributes is left alone
// REMARK-NEXT: fuse-attention: 1 attention core fused

graph @cores {
  input %q : f32[1, 2, 4, 8]
  input %k : f32[1, 2, 4, 8]
  input %v : f32[1, 2, 4, 8]
  input %k6 : f32[1, 2, 6, 8]
  input %v6 : f32[1, 2, 6, 8]
  input %keep : i64[1, 4]
  %0 : f32[1, 2, 4, 4] = batch_matmul(%q, %k) {trans_b = 1} loc("padded")
  %1 : f32[1, 2, 4, 4] = scale(%0) {alpha = 0.25}
  %2 : f32[1, 2, 4, 4] = padding_mask(%1, %keep) {fill = -10000.0}
  %3 : f32[1, 2, 4, 4] = causal_mask(%2) {fill = -inf}
  %4 : f32[1, 2, 4, 4] = softmax(%3)
  %5 : f32[1, 2, 4, 8] = batch_matmul(%4, %v) {trans_b = 0} loc("padded.av")
  %6 : f32[1, 2, 4, 6] = batch_matmul(%q, %k6) {trans_b = 1} loc("cross")
  %7 : f32[1, 2, 4, 6] = softmax(%6)
  %8 : f32[1, 2, 4, 8] = batch_matmul(%7, %v6) {trans_b = 0}
  %9 : f32[1, 2, 4, 4] = batch_matmul(%q, %k) {trans_b = 1} loc("read_twice")
  %10 : f32[1, 2, 4, 4] = softmax(%9)
  %11 : f32[1, 2, 4, 8] = batch_matmul(%10, %v) {trans_b = 0}
  %12 : f32[1, 2, 4, 4] = batch_matmul(%q, %k) {trans_b = 1} loc("prefused")
  %13 : f32[1, 2, 4, 4] = softmax(%12) {alpha = 0.25, causal = 1, fill = -inf} loc("prefused.softmax")
  %14 : f32[1, 2, 4, 8] = batch_matmul(%13, %v) {trans_b = 0}
  output "padded" = %5
  output "cross" = %8
  output "probs" = %10
  output "read_twice" = %11
  output "prefused" = %14
}
