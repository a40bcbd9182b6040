graph @g {
  input %x : f32[2]
  %0 : f32[2] = onnx.Softmax(%x) {axis = 1e300}
  output "o" = %0
}
