// Both LayerNorm forms become layer_norm; running the pass again changes nothing.
// RUN: sp-opt %s --passes=canonicalize --verify-each | FileCheck %s
// RUN: sp-opt %s --passes=canonicalize | sp-opt --passes=canonicalize | FileCheck %s

// CHECK-LABEL: graph @ln
// CHECK-NOT: onnx.
// CHECK: %0 : f32[2, 3, 4] = layer_norm(%x, %w, %b) {epsilon = 1e-05}
// CHECK-NEXT: %1 : f32[2, 3, 4] = layer_norm(%0, %w, %b) {epsilon = 1e-05} loc("fused")
// CHECK-NEXT: output "y" = %1

graph @ln {
  input %x : f32[2, 3, 4]
  param %w : f32[4] = external("w.bin", 0, 16)
  param %b : f32[4] = external("w.bin", 16, 16)
  const %two : f32[] = dense<2.0>
  const %eps : f32[] = dense<1e-05>
  %0 : f32[2, 3, 1] = onnx.ReduceMean(%x) {axes = [-1]}
  %1 : f32[2, 3, 4] = onnx.Sub(%x, %0)
  %2 : f32[2, 3, 4] = onnx.Pow(%1, %two)
  %3 : f32[2, 3, 1] = onnx.ReduceMean(%2) {axes = [-1]}
  %4 : f32[2, 3, 1] = onnx.Add(%3, %eps)
  %5 : f32[2, 3, 1] = onnx.Sqrt(%4)
  %6 : f32[2, 3, 4] = onnx.Div(%1, %5)
  %7 : f32[2, 3, 4] = onnx.Mul(%6, %w)
  %8 : f32[2, 3, 4] = onnx.Add(%b, %7)
  %9 : f32[2, 3, 4] = onnx.LayerNormalization(%8, %w, %b) {axis = -1, epsilon = 1e-05} loc("fused")
  output "y" = %9
}
