// recompute clones the dropped forward nodes into the backward, just before
// their first reader, tagged phase = recompute; a dropout clone keeps its key.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,recompute --recompute selective --verify-each | FileCheck %s --check-prefix=SEL
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,recompute --recompute full --verify-each | FileCheck %s --check-prefix=FULL
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,recompute --verify-each | FileCheck %s --check-prefix=NONE

// Selective: the attention core is recomputed from the stored Q and K, right
// before the dropped-out scores' first reader (dV = P^T dC); attention over
// V itself is not cloned, since no gradient rule reads its output.
// SEL: [[Q:%[0-9]+]] : f32[1, 2, 4, 4], [[K:%[0-9]+]] : f32[1, 2, 4, 4], {{.*}} = split_heads
// SEL: [[DC:%[0-9]+]] : f32[1, 2, 4, 4] = merge_heads_grad
// SEL-NEXT: batch_matmul([[DC]], {{.*}}role = "av", phase = bwd]
// SEL-NEXT: [[S:%[0-9]+]] : f32[1, 2, 4, 4] = batch_matmul([[Q]], [[K]]) {trans_b = 1} [layer = 0, role = "qk", phase = recompute]
// SEL-NEXT: scale([[S]]) {alpha = 0.5} [layer = 0, role = "scale", phase = recompute]
// SEL-NEXT: causal_mask({{.*}}phase = recompute]
// SEL-NEXT: [[P:%[0-9]+]] : f32[1, 2, 4, 4] = softmax({{.*}}phase = recompute]
// SEL-NEXT: [[PD:%[0-9]+]] : f32[1, 2, 4, 4], [[MASK:%[0-9]+]] : u8[1, 2, 4, 4] = dropout([[P]]) {key = [1, 0], ratio = 0.1} [layer = 0, role = "attn_core_dropout", phase = recompute]
// SEL-NEXT: batch_matmul([[PD]], [[DC]]) {trans_a = 1} [layer = 0, role = "av", phase = bwd]
// SEL-NEXT: dropout_grad({{.*}}, [[MASK]])
// SEL-NEXT: softmax_grad([[P]],
// SEL-NOT: phase = recompute

// Full: the whole layer is recomputed from its input, starting with ln1's
// output and statistics where the backward first needs them.
// FULL: [[X:%[0-9]+]] : f32[1, 4, 8], %{{[0-9]+}} : u8[1, 4, 8] = dropout({{.*}}role = "embed_dropout"]
// FULL: phase = bwd
// FULL: layer_norm([[X]], %ln1.w, %ln1.b) {{.*}}[layer = 0, role = "ln1", phase = recompute]
// FULL: linear({{.*}}role = "fc1", phase = recompute]
// FULL: gelu({{.*}}role = "act", phase = recompute]

// NONE-NOT: phase = recompute
