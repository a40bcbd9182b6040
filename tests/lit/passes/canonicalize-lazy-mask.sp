// A causal mask built at run time from constants with more elements than
// the folder materialises (1040^2 > 2^20; HF Llama's _make_causal_mask at
// s > 1024) is checked one element at a time (analysis/LazyElements.h) and
// becomes causal_mask (canonicalize-lazy-mask-future.sp: the same mask
// letting each query see one future key is left alone).
// RUN: sp-opt %s --passes=constant-fold,canonicalize,dce --verify-each | FileCheck %s

// CHECK-LABEL: graph @causal
// CHECK: %0 : f32[2, 4, 1040, 1040] = causal_mask(%x) {fill = -1e+09}
// CHECK-NOT: onnx.Less
graph @causal {
  input %x : f32[2, 4, 1040, 1040]
  const %start : i64[] = dense<0>
  const %limit : i64[] = dense<1040>
  const %delta : i64[] = dense<1>
  const %one : i64[] = dense<1>
  const %square : i64[2] = dense<[1040, 1040]>
  const %column : i64[2] = dense<[1040, 1]>
  const %batch : i64[4] = dense<[2, 1, 1040, 1040]>
  const %ax01 : i64[2] = dense<[0, 1]>
  const %zero : f32[] = dense<0.0>
  %r : i64[1040] = onnx.Range(%start, %limit, %delta)
  %r1 : i64[1040] = onnx.Add(%r, %one)
  %col : i64[1040, 1] = onnx.Reshape(%r1, %column)
  %keep : bool[1040, 1040] = onnx.Less(%r, %col)
  %full : f32[1040, 1040] = onnx.ConstantOfShape(%square) {dtype = 1, value = -1e+09}
  %m : f32[1040, 1040] = onnx.Where(%keep, %zero, %full)
  %u : f32[1, 1, 1040, 1040] = onnx.Unsqueeze(%m, %ax01)
  %e : f32[2, 1, 1040, 1040] = onnx.Expand(%u, %batch)
  %y : f32[2, 4, 1040, 1040] = onnx.Add(%x, %e)
  output "y" = %y
}
