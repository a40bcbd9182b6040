graph @g {
  const %c : f32[] = dense<-nan>
  const %d : f64[2] = dense<[-nan, 1.0]>
  %0 : f32[] = onnx.Add(%c, %c) {r = -nan}
  output "o" = %0
  output "p" = %d
}
