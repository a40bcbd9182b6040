// autodiff adds the loss and one gradient rule per op; the rules read only
// what they declare as saved.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff --verify-each | FileCheck %s

// CHECK: input %targets : i64[1, 4] as targets
// CHECK-NEXT: input %loss_weight : f32[] as loss_weight
// Dropouts get their Philox key and a mask; layer norms their statistics.
// CHECK: dropout(%{{.*}}) {key = [0, 0], ratio = 0.1} [role = "embed_dropout"]
// CHECK: %{{[0-9]+}} : f32[1, 4, 8], %{{[0-9]+}} : f32[1, 4], %{{[0-9]+}} : f32[1, 4] = layer_norm
// CHECK: dropout(%{{.*}}) {key = [1, 0], ratio = 0.1} [layer = 0, role = "attn_core_dropout"]
// CHECK: [[LOGITS:%[0-9]+]] : f32[1, 4, 16] = linear({{.*}}[role = "lm_head"]
// The loss is the mean over the counted targets, weighted by the
// microbatch's share of them.
// CHECK: [[CE:%[0-9]+]] : f32[] = cross_entropy([[LOGITS]], %targets) {ignore_index = -100}
// CHECK-NEXT: [[LOSS:%[0-9]+]] : f32[] = mul([[CE]], %loss_weight)
// CHECK-NEXT: [[DCE:%[0-9]+]] : f32[] = mul(%loss_grad_seed, %loss_weight) {{.*}}phase = bwd
// CHECK-NEXT: = cross_entropy_grad([[LOGITS]], %targets, [[DCE]]) {ignore_index = -100} {{.*}}phase = bwd
// The tied embedding's gradient sums the head's and the embedding's.
// CHECK: [[HEADW:%[0-9]+]] : f32[16, 8] = linear_grad_w({{.*}}[role = "lm_head", phase = bwd]
// Attention core: dP = dC V^T, dV = P^T dC, dQ = dS K, dK = dS^T Q.
// CHECK: [[DC:%[0-9]+]] : f32[1, 2, 4, 4] = merge_heads_grad
// CHECK-NEXT: batch_matmul([[DC]], [[V:%[0-9]+]]) {trans_b = 1} [layer = 0, role = "av", phase = bwd]
// CHECK-NEXT: batch_matmul([[P:%[0-9]+]], [[DC]]) {trans_a = 1} [layer = 0, role = "av", phase = bwd]
// CHECK: softmax_grad
// CHECK-NEXT: causal_mask({{.*}}) {fill = 0.0}
// CHECK-NEXT: [[DS:%[0-9]+]] : f32[1, 2, 4, 4] = scale({{.*}}) {alpha = 0.5}
// CHECK-NEXT: batch_matmul([[DS]], [[K:%[0-9]+]]) {trans_b = 0}
// CHECK-NEXT: batch_matmul([[DS]], [[Q:%[0-9]+]]) {trans_a = 1}
// CHECK: [[EMBW:%[0-9]+]] : f32[16, 8] = embedding_grad(%idx, {{.*}}) {vocab = 16}
// CHECK: [[WTE:%[0-9]+]] : f32[16, 8] = add([[HEADW]], [[EMBW]])
// The position embedding is broadcast over the batch: its gradient is reduced.
// CHECK: output "loss" = [[LOSS]]
// CHECK-NEXT: output "grad:wte" = [[WTE]]
// CHECK-NEXT: output "grad:wpe" =
