// Nodes and constants that no output needs are removed; inputs stay.
// RUN: sp-opt %s --passes=dce --verify-each | FileCheck %s
// Nothing left to remove: a second run is a no-op.
// RUN: sp-opt %s --passes=dce | sp-opt --passes=dce | FileCheck %s

// CHECK: input %x
// CHECK-NEXT: input %unused
// CHECK-NOT: const %dead
// CHECK: %0 : f32[2] = gelu(%x)
// CHECK-NOT: softmax
// CHECK: output "y" = %0

graph @dce {
  input %x : f32[2]
  input %unused : f32[2]
  const %dead : f32[2] = dense<[1.0, 2.0]>
  %0 : f32[2] = gelu(%x) {approximate = "none"}
  %1 : f32[2] = softmax(%dead)
  %2 : f32[2] = add(%1, %0)
  output "y" = %0
}
