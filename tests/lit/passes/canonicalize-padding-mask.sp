// RUN: sp-opt %s --passes=canonicalize,dce --verify-each | FileCheck %s

// The padding mask of HF's BERT and GPT-2: (1 - m) * fill from an attention
// mask input m [b, k], computed once and added to every layer's scores.
// Either fill (-10000 or finfo.min), either operand order, through the
// Unsqueezes and the Cast; the shared bias nodes are left to dce. HF Llama's
// form (_expand_mask: Where(bool(1 - m), finfo.min, 1 - m) expanded over the
// queries, plus the additive causal mask) becomes a causal mask of the
// padding mask.
// CHECK-LABEL: graph @padding
// CHECK-NOT: onnx.
// CHECK: %0 : f32[2, 3, 4, 4] = padding_mask(%s0, %m) {fill = -10000.0} loc("layer0")
// CHECK-NEXT: %1 : f32[2, 3, 4, 4] = padding_mask(%s1, %m) {fill = -10000.0} loc("layer1")
// CHECK-NEXT: %2 : f32[2, 3, 4, 4] = padding_mask(%s0, %m) {fill = -3.4028235e+38, where = 1} loc("llama")
// CHECK-NEXT: %3 : f32[2, 3, 4, 4] = causal_mask(%2) {fill = -inf} loc("llama")
// CHECK-NEXT: output

graph @padding {
  input %s0 : f32[2, 3, 4, 4]
  input %s1 : f32[2, 3, 4, 4]
  input %m : i64[2, 4]
  const %ax1 : i64[1] = dense<[1]>
  const %ax2 : i64[1] = dense<[2]>
  const %one : f32[] = dense<1.0>
  const %fill : f32[] = dense<-10000.0>
  const %min : f32[] = dense<-3.4028234663852886e+38>
  const %qshape : i64[4] = dense<[2, 1, 4, 4]>
  const %causal : f32[4, 4] = dense<[0.0, -inf, -inf, -inf, 0.0, 0.0, -inf, -inf, 0.0, 0.0, 0.0, -inf, 0.0, 0.0, 0.0, 0.0]>
  %0 : i64[2, 1, 4] = onnx.Unsqueeze(%m, %ax1)
  %1 : i64[2, 1, 1, 4] = onnx.Unsqueeze(%0, %ax2)
  %2 : f32[2, 1, 1, 4] = onnx.Cast(%1) {to = 1}
  %3 : f32[2, 1, 1, 4] = onnx.Sub(%one, %2)
  %4 : f32[2, 1, 1, 4] = onnx.Mul(%3, %fill)
  %5 : f32[2, 3, 4, 4] = onnx.Add(%s0, %4) loc("layer0")
  %6 : f32[2, 3, 4, 4] = onnx.Add(%4, %s1) loc("layer1")
  %7 : i64[2, 1, 4, 4] = onnx.Expand(%1, %qshape)
  %8 : f32[2, 1, 4, 4] = onnx.Cast(%7) {to = 1}
  %9 : f32[2, 1, 4, 4] = onnx.Sub(%one, %8)
  %10 : bool[2, 1, 4, 4] = onnx.Cast(%9) {to = 9}
  %11 : f32[2, 1, 4, 4] = onnx.Where(%10, %min, %9)
  %12 : f32[2, 1, 4, 4] = onnx.Add(%11, %causal)
  %13 : f32[2, 3, 4, 4] = onnx.Add(%s0, %12) loc("llama")
  output "y0" = %5
  output "y1" = %6
  output "y2" = %13
}

