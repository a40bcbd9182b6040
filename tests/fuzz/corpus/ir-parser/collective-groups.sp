graph @groups {
  input %x : f32[2, 4]
  %0 : f32[2, 4] = all_reduce(%x) {group = "dp"}
  %1 : f32[2, 4] = all_reduce(%0) [role = "tp_sum"]
  %2 : f32[2, 4] = add(%x, %x)
  output "y" = %1
  output "z" = %2
}
