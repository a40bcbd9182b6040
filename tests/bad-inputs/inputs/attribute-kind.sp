graph @g {
  input %x : f32[2, 4]
  %0 : f32[2, 4] = gelu(%x) {approximate = 3}
  output "y" = %0
}
