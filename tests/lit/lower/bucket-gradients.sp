// bucket-gradients (lower/GradientBuckets.h): the data-parallel pass sums
// each gradient with an all_reduce {group = "dp"} of its own after the
// backward; here they become buckets of at most bucket_bytes, in the order
// the backward finishes the gradients, each placed right after the
// instruction that finishes its last gradient.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer,data-parallel --dp 2 --lower | FileCheck %s --check-prefix=NONE
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer,data-parallel --dp 2 --lower --program-passes=bucket-gradients | FileCheck %s --check-prefix=ONE
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer,data-parallel --dp 2 --dp-bucket 1000 --lower --program-passes=bucket-gradients | FileCheck %s --check-prefix=SMALL
// Without --dp there is nothing to bucket: the program is left as lowered.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer --lower > %t.lowered
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer --lower --program-passes=bucket-gradients > %t.bucketed
// RUN: diff %t.lowered %t.bucketed

// As lowered: one sum per gradient, in the optimizer phase.
// NONE: all_reduce(%{{[0-9]+}}) {bucket_bytes = 26214400, group = "dp"} loc("dp_sum.lnf.w") [role = "dp_grad_sum", phase = opt]
// NONE-COUNT-15: loc("dp_sum.

// The tiny model's 16 gradients fit one bucket, summed once the last one
// (the tied embedding's) is finished, before the optimizer.
// ONE: [[E:%[0-9]+]] : f32[16, 8] #replicated = add({{.*}}) [role = "embed", phase = bwd]
// ONE-NEXT: all_reduce({{(%[0-9]+, )+}}[[E]]) {bucket_bytes = 26214400, group = "dp"} loc("dp_bucket.0") [role = "dp_grad_sum", phase = bwd]
// ONE-NEXT: grad_norm(
// ONE-NOT: dp_sum
// ONE-NOT: dp_bucket.1

// Buckets of at most 1000 bytes: the final norm's two gradients, then fc2's
// weight (1 KiB, a bucket of its own) right after its GEMM, ...
// SMALL: , [[W:%[0-9]+]] : f32[8] #replicated, [[B:%[0-9]+]] : f32[8] #replicated = layer_norm_grad({{.*}}[role = "final_norm", phase = bwd]
// SMALL-NEXT: all_reduce([[W]], [[B]]) {bucket_bytes = 1000, group = "dp"} loc("dp_bucket.0")
// SMALL-NEXT: [[D:%[0-9]+]] : f32[1, 4, 8] = dropout_grad(
// SMALL: [[FC2:%[0-9]+]] : f32[8, 32] #replicated = linear_grad_w({{.*}}[layer = 0, role = "fc2", phase = bwd]
// SMALL-NEXT: all_reduce([[FC2]]) {bucket_bytes = 1000, group = "dp"} loc("dp_bucket.1")
// SMALL: loc("dp_bucket.6")
// SMALL-NEXT: grad_norm(
// SMALL-NOT: dp_sum
