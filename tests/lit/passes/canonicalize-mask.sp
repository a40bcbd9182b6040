// Every causal-mask form becomes causal_mask: a folded constant condition, a
// tril buffer that cannot be read (weight-free graphs), a Trilu of ones too
// large to fold, and an additive mask.
// RUN: sp-opt %s --passes=canonicalize,dce --verify-each | FileCheck %s

// CHECK-LABEL: graph @masks
// CHECK-NOT: onnx.
// CHECK: %0 : f32[1, 1, 3, 3] = causal_mask(%x) {fill = -inf} loc("folded")
// CHECK-NEXT: %1 : f32[1, 1, 3, 3] = causal_mask(%0) {fill = -10000.0} loc("buffer")
// CHECK-NEXT: %2 : f32[1, 1, 3, 3] = causal_mask(%1) {fill = -inf} loc("trilu")
// CHECK-NEXT: %3 : f32[1, 1, 3, 3] = causal_mask(%2) {fill = -1e+09} loc("additive")

graph @masks {
  input %x : f32[1, 1, 3, 3]
  const %upper : bool[3, 3] = dense<[0, 1, 1, 0, 0, 1, 0, 0, 0]>
  const %ninf : f32[] = dense<-inf>
  const %neg : f32[] = dense<-10000.0>
  const %bias : bool[1, 1, 8, 8] = external("missing.bin", 0, 64)
  const %zero1 : i64[1] = dense<[0]>
  const %three : i64[1] = dense<[3]>
  const %ax2 : i64[1] = dense<[2]>
  const %ax3 : i64[1] = dense<[3]>
  const %shape : i64[2] = dense<[3, 3]>
  const %k0 : i64[] = dense<0>
  const %add : f32[3, 3] = dense<[0.0, -1e9, -1e9, 0.0, 0.0, -1e9, 0.0, 0.0, 0.0]>
  %0 : f32[1, 1, 3, 3] = onnx.Where(%upper, %ninf, %x) loc("folded")
  %1 : bool[1, 1, 3, 8] = onnx.Slice(%bias, %zero1, %three, %ax2)
  %2 : bool[1, 1, 3, 3] = onnx.Slice(%1, %zero1, %three, %ax3)
  %3 : bool[1, 1, 3, 3] = onnx.Not(%2)
  %4 : f32[1, 1, 3, 3] = onnx.Where(%3, %neg, %0) loc("buffer")
  %5 : bool[3, 3] = onnx.ConstantOfShape(%shape) {dtype = 9, value = 1}
  %6 : bool[3, 3] = onnx.Trilu(%5, %k0) {upper = 0}
  %7 : bool[3, 3] = onnx.Not(%6)
  %8 : f32[1, 1, 3, 3] = onnx.Where(%7, %ninf, %4) loc("trilu")
  %9 : f32[1, 1, 3, 3] = onnx.Add(%8, %add) loc("additive")
  output "y" = %9
}

