graph @mlp {
  input %x : f32[2, 4]
  param %w : f32[4, 4] = external("w.bin", 0, 64)
  %0 : f32[2, 4] = linear(%x, %w) {trans_w = 0}
  %1 : f32[2, 4] = gelu(%0) {approximate = "none"}
  output "y" = %1
}
