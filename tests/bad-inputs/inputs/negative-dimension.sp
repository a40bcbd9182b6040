graph @g {
  input %x : f32[2, -4]
  output "y" = %x
}
