graph @g {
  input %x : f32[4294967296, 4294967296, 4294967296]
  output "y" = %x
}
