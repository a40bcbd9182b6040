graph @g {
  const %c : f32[3] = dense<[1.0, 2.0]>
  output "y" = %c
}
