graph @g {
  input %x : f32[2, 4]
  %0 : f32[2, 4] = gelu(%1)
  %1 : f32[2, 4] = gelu(%x)
  output "y" = %0
}
