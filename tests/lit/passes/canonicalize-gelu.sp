// erf GELU (x * 0.5 * (1 + erf(x / sqrt 2))) and the tanh form with Pow.
// RUN: sp-opt %s --passes=canonicalize --verify-each | FileCheck %s

// CHECK-LABEL: graph @gelu
// CHECK-NOT: onnx.
// CHECK: %0 : f32[2, 8] = gelu(%x) {approximate = "none"}
// CHECK-NEXT: %1 : f32[2, 8] = gelu(%0) {approximate = "tanh"}
// CHECK-NEXT: output "y" = %1

graph @gelu {
  input %x : f32[2, 8]
  const %sqrt2 : f32[] = dense<1.4142135>
  const %one : f32[] = dense<1.0>
  const %half : f32[] = dense<0.5>
  const %three : f32[] = dense<3.0>
  const %c : f32[] = dense<0.044715>
  const %k : f32[] = dense<0.7978846>
  %0 : f32[2, 8] = onnx.Div(%x, %sqrt2)
  %1 : f32[2, 8] = onnx.Erf(%0)
  %2 : f32[2, 8] = onnx.Add(%1, %one)
  %3 : f32[2, 8] = onnx.Mul(%x, %2)
  %4 : f32[2, 8] = onnx.Mul(%3, %half)
  %5 : f32[2, 8] = onnx.Pow(%4, %three)
  %6 : f32[2, 8] = onnx.Mul(%c, %5)
  %7 : f32[2, 8] = onnx.Add(%4, %6)
  %8 : f32[2, 8] = onnx.Mul(%k, %7)
  %9 : f32[2, 8] = onnx.Mul(%4, %half)
  %10 : f32[2, 8] = onnx.Tanh(%8)
  %11 : f32[2, 8] = onnx.Add(%one, %10)
  %12 : f32[2, 8] = onnx.Mul(%9, %11)
  output "y" = %12
}
