graph @g {
  input %x : f32[2]
  const %a : f32[1] = dense<[1e30]>
  %0 : f32[1, 2] = onnx.Unsqueeze(%x, %a)
  output "o" = %0
}
