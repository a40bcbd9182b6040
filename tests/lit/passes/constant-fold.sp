// Arithmetic on constants folds; nodes on activations stay.
// RUN: sp-opt %s --passes=constant-fold,dce --verify-each | FileCheck %s
// RUN: sp-opt %s --passes=constant-fold | FileCheck %s --check-prefix=NODCE

// CHECK: const %{{.*}} : f32[3] = dense<[2.5, 4.0, 6.0]>
// CHECK-NOT: onnx.Add
// CHECK: onnx.Mul(%x, %{{.*}})
// The folded Add is left for dce.
// NODCE: onnx.Add

graph @fold {
  input %x : f32[2, 3]
  const %a : f32[3] = dense<[1.0, 2.0, 3.0]>
  const %b : f32[3] = dense<[1.5, 2.0, 3.0]>
  %0 : f32[3] = onnx.Add(%a, %b)
  %1 : f32[2, 3] = onnx.Mul(%x, %0)
  output "y" = %1
}

// No-op: nothing to fold in a graph without constant computations.
// RUN: sp-opt %inputs/one-layer.sp --passes=constant-fold > %t.noop
// RUN: sp-opt %inputs/one-layer.sp | diff - %t.noop
