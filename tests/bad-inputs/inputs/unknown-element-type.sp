graph @g {
  input %x : f99[2, 4]
  output "y" = %x
}
