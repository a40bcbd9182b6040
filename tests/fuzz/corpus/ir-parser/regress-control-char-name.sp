graph @g {
  input %"a\01b" : f32[1]
  output "o" = %"a\01b"
}
