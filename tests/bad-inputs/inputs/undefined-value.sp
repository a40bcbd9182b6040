graph @g {
  input %x : f32[2, 4]
  %0 : f32[2, 4] = gelu(%z)
  output "y" = %0
}
