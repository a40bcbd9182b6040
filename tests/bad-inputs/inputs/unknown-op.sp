graph @g {
  input %x : f32[2, 4]
  %0 : f32[2, 4] = frobnicate(%x)
  output "y" = %0
}
