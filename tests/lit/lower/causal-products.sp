// causal-products (lower/CausalProducts.h): after fuse-softmax, the
// attention's products learn the causal structure around the softmax. q k^T
// and dO v^T, read only below the diagonal by the causal softmax (its
// gradient), compute only that triangle (causal); the products of the
// probabilities, their dropout and their gradient, zero above the diagonal,
// skip those terms (causal_a); the dropout of the probabilities, whose mask
// only meets zeros there, draws no mask above the diagonal (causal).
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer --lower --program-passes=fuse-softmax,causal-products | FileCheck %s
// Without fuse-softmax no softmax says it is causal (the scale sits between
// the masks and the products), and in a bf16 program the products keep their
// bf16 GEMM path: nothing is marked.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer --lower --program-passes=causal-products | FileCheck %s --check-prefix=NONE --implicit-check-not="causal =" --implicit-check-not=causal_a
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer --lower --dtype bf16 --program-passes=fuse-softmax,causal-products | FileCheck %s --check-prefix=BF16 --implicit-check-not=causal_a --implicit-check-not="causal = 1, trans" --implicit-check-not="causal = 1, key"

// CHECK: [[S:%[0-9]+]] : f32[1, 2, 4, 4] = batch_matmul({{.*}}) {causal = 1, trans_b = 1} [layer = 0, role = "qk"]
// CHECK-NEXT: [[P:%[0-9]+]] : f32[1, 2, 4, 4] = softmax([[S]]) {alpha = 0.5, causal = 1, fill = -inf} [layer = 0, role = "softmax"]
// CHECK-NEXT: [[D:%[0-9]+]] : f32[1, 2, 4, 4], {{.*}} = dropout([[P]]) {causal = 1, key = [1, 0], ratio = 0.1} [layer = 0, role = "attn_core_dropout"]
// CHECK-NEXT: batch_matmul([[D]], {{.*}}) {causal_a = 1, trans_b = 0} [layer = 0, role = "av"]
// CHECK: [[DD:%[0-9]+]] : f32[1, 2, 4, 4] = batch_matmul({{.*}}) {causal = 1, trans_b = 1} [layer = 0, role = "av", phase = bwd]
// CHECK-NEXT: batch_matmul([[D]], {{.*}}) {causal_a = 1, trans_a = 1} [layer = 0, role = "av", phase = bwd]
// CHECK-NEXT: [[DP:%[0-9]+]] : f32[1, 2, 4, 4] = dropout_grad([[DD]], {{.*}}) {ratio = 0.1} [layer = 0, role = "attn_core_dropout", phase = bwd]
// CHECK-NEXT: [[DS:%[0-9]+]] : f32[1, 2, 4, 4] = softmax_grad([[P]], [[DP]]) {alpha = 0.5, causal = 1, fill = 0.0}
// CHECK-NEXT: batch_matmul([[DS]], {{.*}}) {causal_a = 1, trans_b = 0} [layer = 0, role = "qk", phase = bwd]
// CHECK-NEXT: batch_matmul([[DS]], {{.*}}) {causal_a = 1, trans_a = 1} [layer = 0, role = "qk", phase = bwd]

// NONE: batch_matmul({{.*}}) {trans_b = 1} [layer = 0, role = "qk"]
// NONE: dropout({{.*}}) {key = [1, 0], ratio = 0.1} [layer = 0, role = "attn_core_dropout"]

// BF16: bf16[1, 2, 4, 4] = batch_matmul({{.*}}) {trans_b = 1} [layer = 0, role = "qk"]
// BF16-NEXT: softmax({{.*}}) {alpha = 0.5, causal = 1, fill = -inf}
// BF16: dropout({{.*}}) {key = [1, 0], ratio = 0.1} [layer = 0, role = "attn_core_dropout"]
