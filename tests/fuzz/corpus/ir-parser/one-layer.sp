graph @one_layer {
  input %idx : i64[1, 4]
  param %wte : f32[16, 8] = external("w.bin", 0, 512)
  param %wpe : f32[4, 8] = external("w.bin", 512, 128)
  param %ln1.w : f32[8] = external("w.bin", 640, 32)
  param %ln1.b : f32[8] = external("w.bin", 672, 32)
  param %attn.w : f32[24, 8] = external("w.bin", 704, 768)
  param %attn.b : f32[24] = external("w.bin", 1472, 96)
  param %proj.w : f32[8, 8] = external("w.bin", 1568, 256)
  param %proj.b : f32[8] = external("w.bin", 1824, 32)
  param %ln2.w : f32[8] = external("w.bin", 1856, 32)
  param %ln2.b : f32[8] = external("w.bin", 1888, 32)
  param %fc.w : f32[32, 8] = external("w.bin", 1920, 1024)
  param %fc.b : f32[32] = external("w.bin", 2944, 128)
  param %fc2.w : f32[8, 32] = external("w.bin", 3072, 1024)
  param %fc2.b : f32[8] = external("w.bin", 4096, 32)
  param %lnf.w : f32[8] = external("w.bin", 4128, 32)
  param %lnf.b : f32[8] = external("w.bin", 4160, 32)
  const %pos : i64[1, 4] = dense<[0, 1, 2, 3]>
  %0 : f32[1, 4, 8] = embedding(%wte, %idx)
  %1 : f32[1, 4, 8] = embedding(%wpe, %pos)
  %2 : f32[1, 4, 8] = add(%0, %1)
  %3 : f32[1, 4, 8] = dropout(%2) {ratio = 0.1}
  %4 : f32[1, 4, 8] = layer_norm(%3, %ln1.w, %ln1.b) {epsilon = 1e-05}
  %5 : f32[1, 4, 24] = linear(%4, %attn.w, %attn.b) {trans_w = 1}
  %6 : f32[1, 2, 4, 4], %7 : f32[1, 2, 4, 4], %8 : f32[1, 2, 4, 4] = split_heads(%5) {heads = 2}
  %9 : f32[1, 2, 4, 4] = batch_matmul(%6, %7) {trans_b = 1}
  %10 : f32[1, 2, 4, 4] = scale(%9) {alpha = 0.5}
  %11 : f32[1, 2, 4, 4] = causal_mask(%10) {fill = -inf}
  %12 : f32[1, 2, 4, 4] = softmax(%11)
  %13 : f32[1, 2, 4, 4] = dropout(%12) {ratio = 0.1}
  %14 : f32[1, 2, 4, 4] = batch_matmul(%13, %8) {trans_b = 0}
  %15 : f32[1, 4, 8] = merge_heads(%14)
  %16 : f32[1, 4, 8] = linear(%15, %proj.w, %proj.b) {trans_w = 1}
  %17 : f32[1, 4, 8] = dropout(%16) {ratio = 0.1}
  %18 : f32[1, 4, 8] = add(%3, %17)
  %19 : f32[1, 4, 8] = layer_norm(%18, %ln2.w, %ln2.b) {epsilon = 1e-05}
  %20 : f32[1, 4, 32] = linear(%19, %fc.w, %fc.b) {trans_w = 1}
  %21 : f32[1, 4, 32] = gelu(%20) {approximate = "none"}
  %22 : f32[1, 4, 8] = linear(%21, %fc2.w, %fc2.b) {trans_w = 1}
  %23 : f32[1, 4, 8] = dropout(%22) {ratio = 0.1}
  %24 : f32[1, 4, 8] = add(%18, %23)
  %25 : f32[1, 4, 8] = layer_norm(%24, %lnf.w, %lnf.b) {epsilon = 1e-05}
  %26 : f32[1, 4, 16] = linear(%25, %wte) {trans_w = 1}
  output "logits" = %26
}
