

graph @llama_parts {
  input %x : f32[2, 8]
  param %w : f32[8] = dense<[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]>
  const %two : f32[] = dense<2.0>
  const %one : f32[] = dense<1.0>
  const %eps6 : f32[] = dense<1e-06>
  const %eps5 : f32[] = dense<1e-05>
  %0 : f32[2, 8] = onnx.Cast(%x) {to = 1}
  %1 : f32[2, 8] = onnx.Pow(%0, %two)
  %2 : f32[2, 1] = onnx.ReduceMean(%1) {axes = [-1], keepdims = 1}
  %3 : f32[2, 1] = onnx.Add(%2, %eps6)
  %4 : f32[2, 1] = onnx.Sqrt(%3)
  %5 : f32[2, 1] = onnx.Div(%one, %4)
  %6 : f32[2, 8] = onnx.Mul(%0, %5)
  %7 : f32[2, 8] = onnx.Cast(%6) {to = 1}
  %8 : f32[2, 8] = onnx.Mul(%w, %7)
  %9 : f32[2, 8] = onnx.Mul(%8, %8)
  %10 : f32[2, 1] = onnx.ReduceMean(%9) {axes = [-1], keepdims = 1}
  %11 : f32[2, 1] = onnx.Add(%10, %eps5)
  %12 : f32[2, 1] = onnx.Sqrt(%11)
  %13 : f32[2, 8] = onnx.Div(%8, %12)
  %14 : f32[2, 8] = onnx.Mul(%13, %w)
  %15 : f32[2, 8] = onnx.Sigmoid(%14)
  %16 : f32[2, 8] = onnx.Mul(%14, %15)
  %17 : f32[2, 8] = onnx.Mul(%16, %x)
  output "y" = %17
}
