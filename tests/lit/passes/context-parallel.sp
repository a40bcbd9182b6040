// Context parallelism: every activation holds this rank's half of the
// sequence (zigzag: chunks r and 3 - r of 4); the token input becomes
// [b, s/2], the position ids are cut to this rank's positions, the
// attention core gets the ring's attributes and every dropout the axis of
// its positions; the gradients are summed over the data-parallel x
// context-parallel group ("dp").
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,bind-inputs,fuse-attention,context-parallel,autodiff,lower-collectives,optimizer,data-parallel --cp 2 --verify-each | FileCheck %s
// The unfused core's [s, s] scores, and a sequence that does not cut into
// 2 x cp chunks, are refused with what to change.
// RUN: not sp-opt %inputs/one-layer.sp --passes=detect-transformer,bind-inputs,context-parallel --cp 2 2>&1 | FileCheck %s --check-prefix=UNFUSED
// RUN: not sp-opt %inputs/one-layer.sp --passes=detect-transformer,bind-inputs,fuse-attention,context-parallel --cp 4 2>&1 | FileCheck %s --check-prefix=CHUNKS
// RUN: not sp-opt %inputs/one-layer.sp --cp 2 --cp-comm hier 2>&1 | FileCheck %s --check-prefix=COMM

// CHECK: input %idx : i64[1, 2] #replicated as tokens
// CHECK: input %targets : i64[1, 2] as targets
// CHECK: [[POS:%[0-9]+]] : i64[1, 2] #replicated = cp_slice(%pos) {dim = 1, parts = 2, zigzag = 1} [role = "pos_cp_slice"]
// CHECK-NEXT: f32[1, 2, 8] #replicated = embedding(%wpe, [[POS]]) [role = "pos_embed"]
// CHECK: dropout({{.*}}) {cp = 2, cp_dim = 1, cp_zigzag = 1, key = [0, 0], ratio = 0.1} [role = "embed_dropout"]
// CHECK: f32[1, 2, 2, 4] #replicated, {{.*}} = split_heads(
// CHECK-NEXT: f32[1, 2, 8] #replicated, {{.*}} : f32[1, 2, 2] #replicated = attention({{.*}}) {causal = 1, cp = 2, cp_comm = "ring", cp_zigzag = 1, dropout = 1, {{.*}}} [layer = 0, role = "attention"]
// CHECK: dropout({{.*}}) {cp = 2, cp_dim = 1, cp_zigzag = 1, {{.*}}} [layer = 0, role = "attn_dropout"]
// CHECK: dropout({{.*}}) {cp = 2, cp_dim = 1, cp_zigzag = 1, {{.*}}} [layer = 0, role = "mlp_dropout"]
// CHECK: cross_entropy({{.*}}, %targets)
// The backward of the ring, and the position table's gradient from this
// rank's positions only (summed over the group with the others).
// CHECK: attention_grad({{.*}}) {causal = 1, cp = 2, cp_comm = "ring", {{.*}} phase = bwd]
// CHECK: f32[4, 8] #replicated = embedding_grad([[POS]], {{.*}}) {vocab = 4} [role = "pos_embed", phase = bwd]
// CHECK: all_reduce({{.*}}) {bucket_bytes = 26214400, group = "dp"} loc("dp_sum.
// CHECK-NOT: cp_pad

// UNFUSED: error: {{.*}}unfused attention core{{.*}}compile with --attention fused
// CHUNKS: error: {{.*}}--cp 4: the sequence length 4 must split into 2 x cp = 8 equal chunks
// COMM: --cp-comm 'hier': expected ring, a2a or a2a+ring
