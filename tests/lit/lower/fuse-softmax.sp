// fuse-softmax (lower/FuseSoftmax.h): in a program lowered from the unfused
// attention core, the scale, causal_mask and softmax of the forward become
// one softmax {alpha, causal, fill}, and the backward's softmax_grad,
// causal_mask and scale one softmax_grad; the intermediates' instructions
// and buffers are dropped and the buffers renumbered.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer --lower | FileCheck %s --check-prefix=NONE
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer --lower --program-passes=fuse-softmax | FileCheck %s --implicit-check-not="scale(" --implicit-check-not="causal_mask("
// A padding_mask between the scale and the causal mask (this file's graph)
// keeps the scale out of the forward's softmax.
// RUN: sp-opt %s --passes=detect-transformer,bind-inputs,autodiff,lower-collectives,optimizer --lower --program-passes=fuse-softmax | FileCheck %s --check-prefix=PAD

// Lowered without the program passes, the chain is three instructions each
// way.
// NONE: [[S:%[0-9]+]] : f32[1, 2, 4, 4] = batch_matmul({{.*}}role = "qk"]
// NONE-NEXT: [[A:%[0-9]+]] : f32[1, 2, 4, 4] = scale([[S]]) {alpha = 0.5} [layer = 0, role = "scale"]
// NONE-NEXT: [[M:%[0-9]+]] : f32[1, 2, 4, 4] = causal_mask([[A]]) {fill = -inf} [layer = 0, role = "mask"]
// NONE-NEXT: softmax([[M]]) [layer = 0, role = "softmax"]
// NONE: [[G:%[0-9]+]] : f32[1, 2, 4, 4] = softmax_grad({{.*}}) [layer = 0, role = "softmax", phase = bwd]
// NONE-NEXT: [[GM:%[0-9]+]] : f32[1, 2, 4, 4] = causal_mask([[G]]) {fill = 0.0} [layer = 0, role = "mask", phase = bwd]
// NONE-NEXT: [[GS:%[0-9]+]] : f32[1, 2, 4, 4] = scale([[GM]]) {alpha = 0.5} [layer = 0, role = "scale", phase = bwd]
// NONE-NEXT: batch_matmul([[GS]], {{.*}}role = "qk", phase = bwd]

// Fused: the softmax reads the scores and its result is the next buffer (the
// scale's and the mask's are gone); the backward's softmax_grad writes what
// the products of dQ and dK read.
// CHECK: %[[#S:]] : f32[1, 2, 4, 4] = batch_matmul({{.*}}role = "qk"]
// CHECK-NEXT: %[[#S+1]] : f32[1, 2, 4, 4] = softmax(%[[#S]]) {alpha = 0.5, causal = 1, fill = -inf} [layer = 0, role = "softmax"]
// CHECK: [[D:%[0-9]+]] : f32[1, 2, 4, 4] = dropout_grad({{.*}}role = "attn_core_dropout", phase = bwd]
// CHECK-NEXT: [[G:%[0-9]+]] : f32[1, 2, 4, 4] = softmax_grad(%[[#S+1]], [[D]]) {alpha = 0.5, causal = 1, fill = 0.0} [layer = 0, role = "softmax", phase = bwd]
// CHECK-NEXT: batch_matmul([[G]], {{.*}}) {trans_b = 0} [layer = 0, role = "qk", phase = bwd]
// CHECK-NEXT: batch_matmul([[G]], {{.*}}) {trans_a = 1} [layer = 0, role = "qk", phase = bwd]

// Padded: the causal mask still folds into the softmax, the scale does not
// (it reaches the softmax only through the padding mask); the backward,
// where the padding mask has no instruction, fuses whole.
// PAD: input %keep : i64[1, 4] as mask
// PAD: [[A:%[0-9]+]] : f32[1, 2, 4, 4] = scale({{.*}}) {alpha = 0.5} [layer = 0, role = "scale"]
// PAD-NEXT: [[PM:%[0-9]+]] : f32[1, 2, 4, 4] = padding_mask([[A]], %keep) {fill = -10000.0} [layer = 0, role = "pad_mask"]
// PAD-NEXT: [[P:%[0-9]+]] : f32[1, 2, 4, 4] = softmax([[PM]]) {causal = 1, fill = -inf} [layer = 0, role = "softmax"]
// PAD-NOT: causal_mask(
// PAD: softmax_grad([[P]], {{.*}}) {alpha = 0.5, causal = 1, fill = 0.0} [layer = 0, role = "softmax", phase = bwd]
// PAD-NOT: scale(

// Inputs/one-layer.sp with a padding mask (input %keep) on the scaled scores.
graph @padded {
  input %idx : i64[1, 4]
  input %keep : i64[1, 4]
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
  %11 : f32[1, 2, 4, 4] = padding_mask(%10, %keep) {fill = -10000.0}
  %12 : f32[1, 2, 4, 4] = causal_mask(%11) {fill = -inf}
  %13 : f32[1, 2, 4, 4] = softmax(%12)
  %14 : f32[1, 2, 4, 4] = dropout(%13) {ratio = 0.1}
  %15 : f32[1, 2, 4, 4] = batch_matmul(%14, %8) {trans_b = 0}
  %16 : f32[1, 4, 8] = merge_heads(%15)
  %17 : f32[1, 4, 8] = linear(%16, %proj.w, %proj.b) {trans_w = 1}
  %18 : f32[1, 4, 8] = dropout(%17) {ratio = 0.1}
  %19 : f32[1, 4, 8] = add(%3, %18)
  %20 : f32[1, 4, 8] = layer_norm(%19, %ln2.w, %ln2.b) {epsilon = 1e-05}
  %21 : f32[1, 4, 32] = linear(%20, %fc.w, %fc.b) {trans_w = 1}
  %22 : f32[1, 4, 32] = gelu(%21) {approximate = "none"}
  %23 : f32[1, 4, 8] = linear(%22, %fc2.w, %fc2.b) {trans_w = 1}
  %24 : f32[1, 4, 8] = dropout(%23) {ratio = 0.1}
  %25 : f32[1, 4, 8] = add(%19, %24)
  %26 : f32[1, 4, 8] = layer_norm(%25, %lnf.w, %lnf.b) {epsilon = 1e-05}
  %27 : f32[1, 4, 16] = linear(%26, %wte) {trans_w = 1}
  output "logits" = %27
}
