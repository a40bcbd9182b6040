// The data-parallel pass sums every gradient over the replicas before the
// optimizer reads it: one optimizer-phase all_reduce {group = "dp"} per
// gradient, in the order the backward made them, before grad_norm; the
// updates and the grad: outputs read the sums.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,optimizer,data-parallel --dp 2 --verify-each > %t
// RUN: FileCheck %s < %t
// RUN: %python -c "import sys; t = open(sys.argv[1]).read(); print(t.count('group = \"dp\"'), t.count('adamw('))" %t | FileCheck %s --check-prefix=COUNT

// CHECK: all_reduce(%{{[0-9]+}}) {bucket_bytes = 26214400, group = "dp"} loc("dp_sum.lnf.w") [role = "dp_grad_sum", phase = opt]
// CHECK: [[WTE:%[0-9]+]] : f32[16, 8] #replicated = all_reduce(%{{[0-9]+}}) {bucket_bytes = 26214400, group = "dp"} loc("dp_sum.wte") [role = "dp_grad_sum", phase = opt]
// CHECK: grad_norm(
// CHECK-SAME: [[WTE]]
// CHECK: adamw(%wte, [[WTE]],
// CHECK: output "grad:wte" = [[WTE]]
// COUNT: [[N:[0-9]+]] [[N]]

// Without --dp it changes nothing.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,optimizer > %t.none
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,optimizer,data-parallel > %t.dp1
// RUN: diff %t.none %t.dp1

// It needs the optimizer step, and runs once.
// RUN: not sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,data-parallel --dp 2 2>&1 | FileCheck %s --check-prefix=NOOPT
// NOOPT: sp-opt: error: data-parallel: needs a training graph with its optimizer (run autodiff and optimizer first)
// RUN: not sp-opt %t --passes=data-parallel --dp 2 2>&1 | FileCheck %s --check-prefix=TWICE
// TWICE: sp-opt: error: data-parallel: the graph already sums its gradients over the data-parallel group
