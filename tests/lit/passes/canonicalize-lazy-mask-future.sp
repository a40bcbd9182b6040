// The run-time mask of canonicalize-lazy-mask.sp with each query seeing one
// future key (arange < arange + 2) is not causal: the Add stays, and
// detection then refuses the model instead of training it as causal.
// RUN: sp-opt %s --passes=constant-fold,canonicalize,dce --verify-each | FileCheck %s

// CHECK-LABEL: graph @future
// CHECK-NOT: causal_mask
// CHECK: add(%x,
graph @future {
  input %x : f32[2, 4, 1040, 1040]
  const %start : i64[] = dense<0>
  const %limit : i64[] = dense<1040>
  const %delta : i64[] = dense<1>
  const %two : i64[] = dense<2>
  const %square : i64[2] = dense<[1040, 1040]>
  const %column : i64[2] = dense<[1040, 1]>
  const %batch : i64[4] = dense<[2, 1, 1040, 1040]>
  const %ax01 : i64[2] = dense<[0, 1]>
  const %zero : f32[] = dense<0.0>
  %r : i64[1040] = onnx.Range(%start, %limit, %delta)
  %r2 : i64[1040] = onnx.Add(%r, %two)
  %col : i64[1040, 1] = onnx.Reshape(%r2, %column)
  %keep : bool[1040, 1040] = onnx.Less(%r, %col)
  %full : f32[1040, 1040] = onnx.ConstantOfShape(%square) {dtype = 1, value = -1e+09}
  %m : f32[1040, 1040] = onnx.Where(%keep, %zero, %full)
  %u : f32[1, 1, 1040, 1040] = onnx.Unsqueeze(%m, %ax01)
  %e : f32[2, 1, 1040, 1040] = onnx.Expand(%u, %batch)
  %y : f32[2, 4, 1040, 1040] = onnx.Add(%x, %e)
  output "y" = %y
}
