// A valid graph: the sp-opt cases that are about flags and passes read it.
graph @g {
  input %x : f32[2, 4]
  %0 : f32[2, 4] = gelu(%x)
  output "y" = %0
}
