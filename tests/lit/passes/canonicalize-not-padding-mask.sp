// RUN: sp-opt %s --passes=canonicalize,dce --verify-each | FileCheck %s

// Not a padding mask: 2 - m of an input, and 1 - c of a constant; the
// adds stay adds.
// CHECK-LABEL: graph @not_padding
// CHECK-NOT: padding_mask
// CHECK: = add(%s, %[[B0:[0-9]+]])
// CHECK: = add(%s, %[[B1:[0-9]+]])

graph @not_padding {
  input %s : f32[2, 3, 4, 4]
  input %m : f32[2, 4]
  const %two : f32[] = dense<2.0>
  const %one : f32[] = dense<1.0>
  const %fill : f32[] = dense<-10000.0>
  const %c : f32[2, 1, 1, 4] = dense<[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]>
  const %shape : i64[4] = dense<[2, 1, 1, 4]>
  %1 : f32[2, 1, 1, 4] = onnx.Reshape(%m, %shape)
  %2 : f32[2, 1, 1, 4] = onnx.Sub(%two, %1)
  %3 : f32[2, 1, 1, 4] = onnx.Mul(%2, %fill)
  %4 : f32[2, 3, 4, 4] = onnx.Add(%s, %3)
  %5 : f32[2, 1, 1, 4] = onnx.Sub(%one, %c)
  %6 : f32[2, 1, 1, 4] = onnx.Mul(%5, %fill)
  %7 : f32[2, 3, 4, 4] = onnx.Add(%s, %6)
  output "y0" = %4
  output "y1" = %7
}
