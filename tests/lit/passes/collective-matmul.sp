// collective-matmul (passes/CollectiveMatmul.cpp): with --tp-comm-overlap,
// each forward all-gather of sequence parallelism read only by linears (the
// QKV projection, fc1, the head) becomes a ring: the linear of this rank's
// chunk, a ring_shift of the chunk, the linear of the next chunk, ...; a
// ring_concat puts the chunk products back in place. The backward's
// all-gathers (read by the weight gradients too) are left whole.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,tensor-parallel,sequence-parallel,autodiff,lower-collectives,optimizer,collective-matmul --tp 2 --sp --tp-comm-overlap --verify-each | FileCheck %s
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,tensor-parallel,sequence-parallel,autodiff,lower-collectives,optimizer,collective-matmul --tp 2 --sp --tp-comm-overlap --remarks 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK
// Without --tp-comm-overlap the pass does nothing.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,tensor-parallel,sequence-parallel,autodiff,lower-collectives,optimizer --tp 2 --sp > %t.before
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,tensor-parallel,sequence-parallel,autodiff,lower-collectives,optimizer,collective-matmul --tp 2 --sp > %t.after
// RUN: diff %t.before %t.after
// Without sequence parallelism there is no all-gather to cut.
// RUN: not sp-opt %inputs/one-layer.sp --passes=detect-transformer,tensor-parallel,autodiff,lower-collectives,optimizer,collective-matmul --tp 2 --tp-comm-overlap 2>&1 | FileCheck %s --check-prefix=ERR

// No all-gather is left in the forward.
// CHECK-NOT: = all_gather(
// CHECK: [[X:%[0-9]+]] : f32[1, 2, 8] #split(dim=1, parts=2), {{.*}} = layer_norm({{.*}}[layer = 0, role = "ln1"]
// CHECK-NEXT: [[Y0:%[0-9]+]] : f32[1, 2, 12] = linear([[X]], %attn.w, %attn.b) {trans_w = 1} loc(".chunk0") [layer = 0, role = "qkv"]
// CHECK-NEXT: [[X1:%[0-9]+]] : f32[1, 2, 8] #split(dim=1, parts=2) = ring_shift([[X]]) {parts = 2} loc(".shift1") [layer = 0, role = "attn_f"]
// CHECK-NEXT: [[Y1:%[0-9]+]] : f32[1, 2, 12] = linear([[X1]], %attn.w, %attn.b) {trans_w = 1} loc(".chunk1") [layer = 0, role = "qkv"]
// CHECK-NEXT: [[QKV:%[0-9]+]] : f32[1, 4, 12] #split(dim=2, parts=2) = ring_concat([[Y0]], [[Y1]]) {dim = 1, parts = 2} loc(".concat") [layer = 0, role = "qkv"]
// CHECK-NEXT: split_heads([[QKV]])
// CHECK-NOT: = all_gather(
// CHECK: ring_shift({{.*}}[layer = 0, role = "mlp_f"]
// CHECK-NOT: = all_gather(
// CHECK: = ring_concat({{.*}}[role = "lm_head"]
// CHECK-NOT: = all_gather(
// CHECK: phase = bwd
// The backward gathers the saved shard again for the weight gradient, whole.
// CHECK: [[G:%[0-9]+]] : f32[1, 4, 8] = all_gather([[X]]) {dim = 1, parts = 2} [layer = 0, role = "attn_f_regather", phase = bwd]
// CHECK-NEXT: linear_grad_w([[G]],
// CHECK-NOT: ring_

// REMARK: collective-matmul: 3 all-gathers cut into rings of 2 chunks, 7 left whole (their result is read by something other than linears of its phase)

// ERR: sp-opt: error: --tp-comm-overlap cuts sequence parallelism's forward all-gathers into a ring; it needs --sp
