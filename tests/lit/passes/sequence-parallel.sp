// Sequence parallelism: f and f-bar become g and g-bar; the LayerNorm,
// dropout and residual regions hold [b, s/t, h]; the backward gathers the
// saved shard again before each column-parallel weight gradient.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,tensor-parallel,sequence-parallel,autodiff,lower-collectives --tp 2 --sp --verify-each | FileCheck %s

// Parameters used on sequence-sharded data have their gradients summed.
// CHECK: param %ln1.w : f32[8] #replicated(sum_grad)
// CHECK: param %proj.b : f32[8] #replicated(sum_grad)
// CHECK: param %fc.w : f32[16, 8] #split(dim=0, parts=2)
// The embedding output is reduce-scattered along the sequence; the position
// embedding is split to this rank's positions.
// CHECK: f32[1, 2, 8] #split(dim=1, parts=2) = reduce_scatter({{.*}}) {dim = 1, parts = 2} [role = "embed_fbar"]
// CHECK: f32[1, 2, 8] #split(dim=1, parts=2) = sp_split({{.*}}) {dim = 1, parts = 2} [role = "pos_split"]
// CHECK: f32[1, 2, 8] #split(dim=1, parts=2), {{.*}} = dropout({{.*}}[role = "embed_dropout"]
// Attention: LayerNorm on the shard, g (all-gather), ..., g-bar (reduce-scatter).
// CHECK: [[LN1:%[0-9]+]] : f32[1, 2, 8] #split(dim=1, parts=2), {{.*}} = layer_norm({{.*}}[layer = 0, role = "ln1"]
// CHECK-NEXT: f32[1, 4, 8] #replicated = all_gather([[LN1]]) {dim = 1, parts = 2} [layer = 0, role = "attn_f"]
// CHECK: reduce_scatter({{.*}}) {dim = 1, parts = 2} [layer = 0, role = "attn_fbar"]
// CHECK-NEXT: f32[1, 2, 8] #split(dim=1, parts=2) = add({{.*}}, %proj.b) [layer = 0, role = "proj_bias"]
// CHECK-NEXT: f32[1, 2, 8] #split(dim=1, parts=2), {{.*}} = dropout({{.*}}[layer = 0, role = "attn_dropout"]
// CHECK: [[LN2:%[0-9]+]] : f32[1, 2, 8] #split(dim=1, parts=2), {{.*}} = layer_norm({{.*}}[layer = 0, role = "ln2"]
// CHECK-NEXT: all_gather([[LN2]]) {dim = 1, parts = 2} [layer = 0, role = "mlp_f"]
// CHECK: reduce_scatter({{.*}} [layer = 0, role = "mlp_fbar"]
// The head gathers the sequence; the loss is vocabulary-parallel.
// CHECK: all_gather({{.*}} [role = "head_f"]
// CHECK: cross_entropy({{.*}}) {ignore_index = -100, valid_vocab = 16, vocab_parallel = 1}
// Backward: g-bar's conjugate is an all-gather, g's a reduce-scatter, and the
// fc1 input is gathered again from its saved shard.
// CHECK: all_gather({{.*}} [layer = 0, role = "mlp_fbar", phase = bwd]
// CHECK: all_gather([[LN2]]) {dim = 1, parts = 2} [layer = 0, role = "mlp_f_regather", phase = bwd]
// CHECK-NEXT: linear_grad_w
// CHECK: reduce_scatter({{.*}} [layer = 0, role = "mlp_f", phase = bwd]
// CHECK: all_gather([[LN1]]) {dim = 1, parts = 2} [layer = 0, role = "attn_f_regather", phase = bwd]
// CHECK: all_reduce({{.*}}) loc("ln1.w") [role = "grad_sum", phase = bwd]

// Without --sp the pass changes nothing; without tensor-parallel first, it
// has nothing to convert.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,tensor-parallel --tp 2 > %t.tp
// RUN: sp-opt %t.tp --passes=sequence-parallel --tp 2 | diff - %t.tp
// RUN: not sp-opt %inputs/one-layer.sp --passes=detect-transformer,sequence-parallel --tp 2 --sp 2>&1 | FileCheck %s --check-prefix=NOTP
// NOTP: sp-opt: error: sequence-parallel: run tensor-parallel first: there is no f to turn into g
