graph @g {
  input %x : f32[2, 4]
  %0 : f32[2, 5] = gelu(%x)
  output "y" = %0
}
