

graph @fold {
  input %x : f32[2, 3]
  const %a : f32[3] = dense<[1.0, 2.0, 3.0]>
  const %b : f32[3] = dense<[1.5, 2.0, 3.0]>
  %0 : f32[3] = onnx.Add(%a, %b)
  %1 : f32[2, 3] = onnx.Mul(%x, %0)
  output "y" = %1
}

