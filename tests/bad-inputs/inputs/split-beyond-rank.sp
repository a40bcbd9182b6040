graph @g {
  input %x : f32[2, 4] #split(dim=5, parts=2)
  output "y" = %x
}
