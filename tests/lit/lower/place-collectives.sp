// place-collectives (lower/Overlap.h): each tensor-parallel collective of
// the backward moves up beside the GEMM it overlaps, as Megatron-Core runs
// them. With sequence parallelism the re-all-gather of a column-parallel
// linear's saved input shard runs beside the dgrad GEMM and the
// reduce-scatter of dX beside the wgrad GEMM; without it, the all-reduce of
// dX beside the wgrad GEMM. "beside" names the GEMM's result.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,tensor-parallel,sequence-parallel,autodiff,lower-collectives,optimizer --tp 2 --sp --lower --program-passes=place-collectives | FileCheck %s
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,tensor-parallel,autodiff,lower-collectives,optimizer --tp 2 --lower --program-passes=place-collectives | FileCheck %s --check-prefix=TP
// The data-parallel sums (group "dp") are not the tensor-parallel ones: the
// program is left as it was lowered.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer,data-parallel --dp 2 --lower > %t.lowered
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer,data-parallel --dp 2 --lower --program-passes=place-collectives > %t.placed
// RUN: diff %t.lowered %t.placed
// RUN: FileCheck %s --check-prefix=DP < %t.placed

// The forward's LayerNorm -> all-gather -> GEMM chain has nothing to overlap
// the all-gather with: it stays, beside nothing.
// CHECK: [[LN:%[0-9]+]] : f32[1, 2, 8] #split(dim=1, parts=2), {{.*}} = layer_norm({{.*}}[layer = 0, role = "ln2"]
// CHECK-NEXT: all_gather([[LN]]) {dim = 1, parts = 2} [layer = 0, role = "mlp_f"]
// CHECK-NEXT: linear({{.*}}[layer = 0, role = "fc1"]
// Backward of fc1: the re-gather before dX = dZ W, the reduce-scatter of dX
// before dW = dZ^T X.
// CHECK: [[G:%[0-9]+]] : f32[1, 4, 8] = all_gather([[LN]]) {dim = 1, parts = 2} [layer = 0, role = "mlp_f_regather", phase = bwd, beside = [[DX:%[0-9]+]]]
// CHECK-NEXT: [[DX]] : f32[1, 4, 8] = linear([[DZ:%[0-9]+]], %fc.w) {trans_w = 0} [layer = 0, role = "fc1", phase = bwd]
// CHECK-NEXT: reduce_scatter([[DX]]) {dim = 1, parts = 2} [layer = 0, role = "mlp_f", phase = bwd, beside = [[DW:%[0-9]+]]]
// CHECK-NEXT: [[DW]] : f32[16, 8] #split(dim=0, parts=2) = linear_grad_w([[G]], [[DZ]]) {trans_w = 1} [layer = 0, role = "fc1", phase = bwd]

// TP: [[DX:%[0-9]+]] : f32[1, 4, 8] = linear({{.*}}, %fc.w) {trans_w = 0} [layer = 0, role = "fc1", phase = bwd]
// TP-NEXT: all_reduce([[DX]]) [layer = 0, role = "mlp_f", phase = bwd, beside = [[DW:%[0-9]+]]]
// TP-NEXT: [[DW]] : f32[16, 8] #split(dim=0, parts=2) = linear_grad_w({{.*}}) {trans_w = 1} [layer = 0, role = "fc1", phase = bwd]

// DP: all_reduce({{.*}}) {bucket_bytes = 26214400, group = "dp"}
// DP-NOT: beside
