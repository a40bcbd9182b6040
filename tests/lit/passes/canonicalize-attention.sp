// The attention core as torch 1.13 writes it: Split + Reshape + Transpose
// heads (keys transposed straight to [0, 2, 3, 1]), MatMul, Div by sqrt(d),
// Where with a constant causal condition, Softmax, Dropout, MatMul, and the
// Transpose + Reshape merge.
// RUN: sp-opt %s --passes=canonicalize --verify-each | FileCheck %s

// CHECK-LABEL: graph @attn
// CHECK-NOT: onnx.
// CHECK: %0 : f32[1, 2, 3, 2], %1 : f32[1, 2, 3, 2], %2 : f32[1, 2, 3, 2] = split_heads(%qkv) {heads = 2}
// CHECK-NEXT: %3 : f32[1, 2, 3, 3] = batch_matmul(%0, %1) {trans_b = 1}
// CHECK-NEXT: %4 : f32[1, 2, 3, 3] = scale(%3) {alpha = 0.5}
// CHECK-NEXT: %5 : f32[1, 2, 3, 3] = causal_mask(%4) {fill = -inf}
// CHECK-NEXT: %6 : f32[1, 2, 3, 3] = softmax(%5)
// CHECK-NEXT: %7 : f32[1, 2, 3, 3] = dropout(%6) {ratio = 0.1}
// CHECK-NEXT: %8 : f32[1, 2, 3, 2] = batch_matmul(%7, %2) {trans_b = 0}
// CHECK-NEXT: %9 : f32[1, 3, 4] = merge_heads(%8)
// CHECK-NEXT: output "y" = %9

graph @attn {
  input %qkv : f32[1, 3, 12]
  const %split : i64[3] = dense<[4, 4, 4]>
  const %heads : i64[4] = dense<[1, 3, 2, 2]>
  const %merged : i64[3] = dense<[1, 3, 4]>
  const %two : f32[] = dense<2.0>
  const %upper : bool[1, 1, 3, 3] = dense<[0, 1, 1, 0, 0, 1, 0, 0, 0]>
  const %ninf : f32[] = dense<-inf>
  const %ratio : f32[] = dense<0.1>
  const %train : bool[] = dense<1>
  %0 : f32[1, 3, 4], %1 : f32[1, 3, 4], %2 : f32[1, 3, 4] = onnx.Split(%qkv, %split) {axis = 2}
  %3 : f32[1, 3, 2, 2] = onnx.Reshape(%0, %heads)
  %4 : f32[1, 2, 3, 2] = onnx.Transpose(%3) {perm = [0, 2, 1, 3]}
  %5 : f32[1, 3, 2, 2] = onnx.Reshape(%1, %heads)
  %6 : f32[1, 3, 2, 2] = onnx.Reshape(%2, %heads)
  %7 : f32[1, 2, 3, 2] = onnx.Transpose(%6) {perm = [0, 2, 1, 3]}
  %8 : f32[1, 2, 2, 3] = onnx.Transpose(%5) {perm = [0, 2, 3, 1]}
  %9 : f32[1, 2, 3, 3] = onnx.MatMul(%4, %8)
  %10 : f32[1, 2, 3, 3] = onnx.Div(%9, %two)
  %11 : f32[1, 2, 3, 3] = onnx.Where(%upper, %ninf, %10)
  %12 : f32[1, 2, 3, 3] = onnx.Softmax(%11) {axis = -1}
  %13 : f32[1, 2, 3, 3], %14 : bool[1, 2, 3, 3] = onnx.Dropout(%12, %ratio, %train)
  %15 : f32[1, 2, 3, 2] = onnx.MatMul(%13, %7)
  %16 : f32[1, 3, 2, 2] = onnx.Transpose(%15) {perm = [0, 2, 1, 3]}
  %17 : f32[1, 3, 4] = onnx.Reshape(%16, %merged)
  output "y" = %17
}
