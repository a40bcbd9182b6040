// Tensor parallelism over 2 ranks: where f and f-bar land in a layer, and how
// the weights are sharded.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,tensor-parallel --tp 2 --verify-each | FileCheck %s
// With --tp 1 the pass changes nothing.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer > %t.ref
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,tensor-parallel --tp 1 | diff - %t.ref

// CHECK: param %wte : f32[8, 8] #split(dim=0, parts=2)
// CHECK: param %attn.w : f32[12, 8] #split(dim=0, parts=2, blocks=3)
// CHECK: param %attn.b : f32[12] #split(dim=0, parts=2, blocks=3)
// CHECK: param %proj.w : f32[8, 4] #split(dim=1, parts=2)
// CHECK: param %proj.b : f32[8] #replicated
// CHECK: param %fc.w : f32[16, 8] #split(dim=0, parts=2)
// CHECK: param %fc2.w : f32[8, 16] #split(dim=1, parts=2)
// Vocabulary-parallel embedding: partial sums, then f-bar.
// CHECK: [[E:%[0-9]+]] : f32[1, 4, 8] #partial = embedding(%wte, %idx) {vocab_parallel = 1} [role = "embed"]
// CHECK-NEXT: tp_reduce([[E]]) [role = "embed_fbar"]
// Attention: f, column-parallel qkv, a/t heads, row-parallel proj, f-bar, bias.
// CHECK: [[LN1:%[0-9]+]] : f32[1, 4, 8] #replicated = layer_norm
// CHECK-NEXT: [[F:%[0-9]+]] : f32[1, 4, 8] #replicated = tp_copy([[LN1]]) [layer = 0, role = "attn_f"]
// CHECK-NEXT: f32[1, 4, 12] #split(dim=2, parts=2) = linear([[F]], %attn.w, %attn.b)
// CHECK-NEXT: split_heads({{.*}}) {heads = 1}
// CHECK: [[P:%[0-9]+]] : f32[1, 4, 8] #partial = linear({{.*}}, %proj.w) {trans_w = 1} [layer = 0, role = "proj"]
// CHECK-NEXT: [[R:%[0-9]+]] : f32[1, 4, 8] #replicated = tp_reduce([[P]]) [layer = 0, role = "attn_fbar"]
// CHECK-NEXT: add([[R]], %proj.b) [layer = 0, role = "proj_bias"]
// MLP: the same around fc1 and fc2.
// CHECK: tp_copy({{.*}}) [layer = 0, role = "mlp_f"]
// CHECK-NEXT: #split(dim=2, parts=2) = linear({{.*}}, %fc.w, %fc.b)
// CHECK: #partial = linear({{.*}}, %fc2.w) {trans_w = 1} [layer = 0, role = "fc2"]
// CHECK-NEXT: tp_reduce({{.*}}) [layer = 0, role = "mlp_fbar"]
// Vocabulary-parallel head on the tied (already split) table.
// CHECK: tp_copy({{.*}}) [role = "head_f"]
// CHECK-NEXT: f32[1, 4, 8] #split(dim=2, parts=2) = linear({{.*}}, %wte) {trans_w = 1, valid_vocab = 16} [role = "lm_head"]
