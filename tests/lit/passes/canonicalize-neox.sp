// GPT-NeoX's attention as HF writes it: the fused projection viewed per head
// ([b, s, heads, 3 d], q, k and v sliced from its last axis and permuted)
// -> split_heads {per_head = 1}; rotary on the first 2 of the 4 dims of each
// head (x[..., :2] rotated, x[..., 2:] passed through, concatenated back)
// -> one rope with [1, s, 2] tables; and baddbmm's scores (q and k viewed to
// [b heads, s, d], a product scaled and added to zeros, viewed back) ->
// batch_matmul and scale on the heads.
// RUN: sp-opt %s --passes=canonicalize --verify-each | FileCheck %s

// CHECK-LABEL: graph @neox
// CHECK-NOT: onnx.
// CHECK: %0 : f32[1, 2, 3, 4], %1 : f32[1, 2, 3, 4], %2 : f32[1, 2, 3, 4] = split_heads(%qkv) {heads = 2, per_head = 1}
// CHECK-NEXT: %3 : f32[1, 2, 3, 4] = rope(%0, %rope_table, %rope_table_0) {interleaved = 0}
// CHECK-NEXT: %4 : f32[1, 2, 3, 3] = batch_matmul(%3, %1) {trans_b = 1}
// CHECK-NEXT: %5 : f32[1, 2, 3, 3] = scale(%4) {alpha = 0.5}
// CHECK-NEXT: output "scores" = %5
// CHECK-NEXT: output "v" = %2

graph @neox {
  input %qkv : f32[1, 3, 24]
  const %perhead : i64[4] = dense<[1, 3, 2, 12]>
  const %last : i64[1] = dense<[-1]>
  const %c0 : i64[1] = dense<[0]>
  const %c1 : i64[1] = dense<[1]>
  const %c2 : i64[1] = dense<[2]>
  const %c4 : i64[1] = dense<[4]>
  const %c8 : i64[1] = dense<[8]>
  const %end : i64[1] = dense<[9223372036854775807]>
  const %cos : f32[1, 1, 3, 2] = dense<[1.0, 1.0, 0.5, 0.5, 0.25, 0.25]>
  const %sin : f32[1, 1, 3, 2] = dense<[0.0, 0.0, 0.5, 0.5, 0.75, 0.75]>
  const %merged : i64[3] = dense<[2, 3, 4]>
  const %split : i64[4] = dense<[1, 2, 3, 3]>
  const %alpha : f32[] = dense<0.5>
  const %zeros : f32[2, 3, 3] = dense<splat 0.0>
  %0 : f32[1, 3, 2, 12] = onnx.Reshape(%qkv, %perhead)
  %1 : f32[1, 3, 2, 4] = onnx.Slice(%0, %c0, %c4, %last, %c1)
  %2 : f32[1, 2, 3, 4] = onnx.Transpose(%1) {perm = [0, 2, 1, 3]}
  %3 : f32[1, 3, 2, 4] = onnx.Slice(%0, %c4, %c8, %last, %c1)
  %4 : f32[1, 2, 3, 4] = onnx.Transpose(%3) {perm = [0, 2, 1, 3]}
  %5 : f32[1, 3, 2, 4] = onnx.Slice(%0, %c8, %end, %last, %c1)
  %6 : f32[1, 2, 3, 4] = onnx.Transpose(%5) {perm = [0, 2, 1, 3]}
  %7 : f32[1, 2, 3, 2] = onnx.Slice(%2, %c0, %c2, %last, %c1)
  %8 : f32[1, 2, 3, 2] = onnx.Slice(%2, %c2, %end, %last, %c1)
  %9 : f32[1, 2, 3, 1] = onnx.Slice(%7, %c0, %c1, %last, %c1)
  %10 : f32[1, 2, 3, 1] = onnx.Slice(%7, %c1, %end, %last, %c1)
  %11 : f32[1, 2, 3, 1] = onnx.Neg(%10)
  %12 : f32[1, 2, 3, 2] = onnx.Concat(%11, %9) {axis = -1}
  %13 : f32[1, 2, 3, 2] = onnx.Mul(%7, %cos)
  %14 : f32[1, 2, 3, 2] = onnx.Mul(%12, %sin)
  %15 : f32[1, 2, 3, 2] = onnx.Add(%13, %14)
  %16 : f32[1, 2, 3, 4] = onnx.Concat(%15, %8) {axis = -1}
  %17 : f32[2, 3, 4] = onnx.Reshape(%16, %merged)
  %18 : f32[2, 3, 4] = onnx.Reshape(%4, %merged)
  %19 : f32[2, 4, 3] = onnx.Transpose(%18) {perm = [0, 2, 1]}
  %20 : f32[2, 3, 3] = onnx.MatMul(%17, %19)
  %21 : f32[2, 3, 3] = onnx.Mul(%20, %alpha)
  %22 : f32[2, 3, 3] = onnx.Add(%21, %zeros)
  %23 : f32[1, 2, 3, 3] = onnx.Reshape(%22, %split)
  output "scores" = %23
  output "v" = %6
}
