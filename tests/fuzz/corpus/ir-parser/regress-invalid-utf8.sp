graph @g {
  input %"a\ff" : f32[1]
  output "o" = %"a\ff"
}
