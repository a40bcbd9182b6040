// The optimizer pass appends global-norm clipping and in-place AdamW updates.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,optimizer --verify-each > %t
// RUN: FileCheck %s < %t
// dce keeps the updates: they write their operands.
// RUN: sp-opt %t --passes=dce | FileCheck %s

// CHECK: input %lr : f32[]
// CHECK-NEXT: input %step : f32[]
// CHECK: state %adam.m.wte : f32[16, 8]
// CHECK-NEXT: state %adam.v.wte : f32[16, 8]
// CHECK: [[NORM:%[0-9]+]] : f32[] = grad_norm(
// CHECK-SAME: [role = "grad_norm", phase = opt]
// Weight decay on matrices, not on biases and norm scales.
// CHECK-NEXT: adamw(%wte, %{{[0-9]+}}, %adam.m.wte, %adam.v.wte, [[NORM]], %lr, %step) {beta1 = 0.9, beta2 = 0.95, eps = 1e-08, max_norm = 1.0, weight_decay = 0.1} loc("adamw.wte") [role = "adamw", phase = opt]
// CHECK: adamw(%ln1.w, {{.*}} weight_decay = 0.0}
// CHECK: output "loss"

// RUN: not sp-opt %inputs/one-layer.sp --passes=optimizer 2>&1 | FileCheck %s --check-prefix=NOGRAD
// NOGRAD: sp-opt: error: optimizer: no gradients to apply: run autodiff first
