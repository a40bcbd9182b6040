// Core IR is left unchanged, and a Where whose condition is not causal is not
// turned into a mask.
// RUN: sp-opt %s --passes=canonicalize > %t
// RUN: sp-opt %s | diff - %t
// RUN: FileCheck %s < %t

// CHECK: onnx.Where
// CHECK-NOT: causal_mask

graph @noop {
  input %x : f32[1, 1, 2, 2]
  const %notcausal : bool[1, 1, 2, 2] = dense<[1, 0, 0, 0]>
  const %ninf : f32[] = dense<-inf>
  %0 : f32[1, 1, 2, 2] = softmax(%x)
  %1 : f32[1, 1, 2, 2] = onnx.Where(%notcausal, %ninf, %0)
  output "y" = %1
}
