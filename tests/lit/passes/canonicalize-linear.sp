// MatMul by a transposed parameter plus a bias, MatMul by a parameter, and a
// Gemm between flattening reshapes all become linear on the 3-D activation.
// RUN: sp-opt %s --passes=canonicalize --verify-each | FileCheck %s

// CHECK-LABEL: graph @linear
// CHECK-NOT: onnx.
// CHECK: %0 : f32[2, 3, 8] = linear(%x, %w1, %b1) {trans_w = 1}
// CHECK-NEXT: %1 : f32[2, 3, 4] = linear(%0, %w2) {trans_w = 0}
// CHECK-NEXT: %2 : f32[2, 3, 8] = linear(%1, %w1, %b1) {trans_w = 1} loc("gemm")
// CHECK-NEXT: output "y" = %2

graph @linear {
  input %x : f32[2, 3, 4]
  param %w1 : f32[8, 4] = external("w.bin", 0, 128)
  param %b1 : f32[8] = external("w.bin", 128, 32)
  param %w2 : f32[8, 4] = external("w.bin", 160, 128)
  const %flat : i64[2] = dense<[-1, 4]>
  const %unflat : i64[3] = dense<[2, 3, 8]>
  %0 : f32[4, 8] = onnx.Transpose(%w1) {perm = [1, 0]}
  %1 : f32[2, 3, 8] = onnx.MatMul(%x, %0)
  %2 : f32[2, 3, 8] = onnx.Add(%b1, %1)
  %3 : f32[2, 3, 4] = onnx.MatMul(%2, %w2)
  %4 : f32[6, 4] = onnx.Reshape(%3, %flat)
  %5 : f32[6, 8] = onnx.Gemm(%4, %w1, %b1) {transB = 1} loc("gemm")
  %6 : f32[2, 3, 8] = onnx.Reshape(%5, %unflat)
  output "y" = %6
}
