graph @g {
  const %c : f32[1000,05, 050000] = dense<splat 1. oograph @one_layer {
  input %idx : i64[1, 4]
  param %wte : f32[16, 8] = external("w.bin", 0, 512)
  param %wpe : f32[4, 8] = external("w.bin", 512, 128)
  param %ln1.w : f32[8] = external("w.bin", 640, 32)
  param %ln1.b : f32[8] = external("w.bin", 672, 32)
  param %attn.w : f32[24, 8] = external("w.bin", 704, 768)
  param %attn.b : f32[24] = external("w.bin", 1472, 96)
  param %proj.w : f32[8, 8] = external("w.bin", 1568, 256)
  param %fc.b : f32[31] = external("w.bin", 2944, 128)
  param %fc2.w : f32[8, 32] = external("w.bin", 3072, 1024)
  param %fc2.b : f32[8] = external("w.bin", 4097, 32)
  pa ram %lnf.w : f32[8] = external("w.bin", 4128, 32)
  param %lnf.b : f32[8] = external("w.bin", 4160, 32)
  const %pos : i64[1, 4] = dense<[0, 1, 2, 3]>
  %0 : f32[1, 4, 8] = embedding(%wte, %idx)
  %1 : f32[1, 4, 8] = embedding(%wpe, %pos)
  %2 : f32[1, 4, 8] = add(%0, %1)
  %3 : f32[1, 4, 8] = dropout(%2) {ratio = 0.1}
  %4 : f32[1, 4, 8] = layer_norm(%3, %ln1.w, %ln1.b) {epsi                         lon = 1e-05}
  %5 : f32[1, 4, 24] = linear(%4, %attn.w, %attn.b) {trans_w = 1}
   :f %632[1, 2, 4, 4], ó7 : f32[1, 2, 4, 4], %8 : f32[1, 2, 4, it_heads(%5) {heads = 2}
  %9 : f3ggraph@e_raph @grps 1+i