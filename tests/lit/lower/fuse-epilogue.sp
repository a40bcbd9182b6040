// fuse-epilogue (lower/FuseEpilogue.h): the MLP's first linear and its GELU
// become linear_gelu, the backward's fc2 input gradient and the GELU's
// gradient linear_gelu_grad, and each residual branch's dropout and add
// dropout_add; in a bf16 (or fp16) program nothing fuses, since there the
// intermediate is rounded to 16 bits before the second op reads it.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer --lower --program-passes=fuse-epilogue | FileCheck %s --implicit-check-not="= gelu(" --implicit-check-not="= gelu_grad("
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer --lower --dtype bf16 --program-passes=fuse-epilogue | FileCheck %s --check-prefix=BF16 --implicit-check-not=linear_gelu --implicit-check-not=dropout_add

// The add of the two embeddings has no dropout before it: left alone.
// CHECK: [[X:%[0-9]+]] : f32[1, 4, 8] = add({{.*}}) [role = "embed_add"]
// CHECK-NEXT: [[E:%[0-9]+]] : f32[1, 4, 8], {{.*}} = dropout([[X]]) {key = [0, 0], ratio = 0.1} [role = "embed_dropout"]
// The attention's residual branch: the projection's dropout adds the residual.
// CHECK: [[P:%[0-9]+]] : f32[1, 4, 8] = linear({{.*}}, %proj.w, %proj.b) {trans_w = 1} [layer = 0, role = "proj"]
// CHECK-NEXT: [[H:%[0-9]+]] : f32[1, 4, 8], {{%[0-9]+}} : u8[1, 4, 8] = dropout_add([[P]], [[E]]) {key = [1, 1], ratio = 0.1} [layer = 0, role = "attn_dropout"]
// The MLP: fc1 writes its result and the GELU of it; fc2 reads the GELU.
// CHECK: [[LN:%[0-9]+]] : f32[1, 4, 8], {{.*}} = layer_norm([[H]], %ln2.w, %ln2.b) {{.*}}[layer = 0, role = "ln2"]
// CHECK-NEXT: [[Z:%[0-9]+]] : f32[1, 4, 32], [[Y:%[0-9]+]] : f32[1, 4, 32] = linear_gelu([[LN]], %fc.w, %fc.b) {approximate = "none", trans_w = 1} [layer = 0, role = "fc1"]
// CHECK-NEXT: [[F:%[0-9]+]] : f32[1, 4, 8] = linear([[Y]], %fc2.w, %fc2.b) {trans_w = 1} [layer = 0, role = "fc2"]
// CHECK-NEXT: {{%[0-9]+}} : f32[1, 4, 8], {{%[0-9]+}} : u8[1, 4, 8] = dropout_add([[F]], [[H]]) {key = [1, 2], ratio = 0.1} [layer = 0, role = "mlp_dropout"]
// Backward: fc2's input gradient and the GELU's gradient in one, which reads
// fc1's saved result; fc1's gradients read what it writes.
// CHECK: [[D:%[0-9]+]] : f32[1, 4, 8] = dropout_grad({{.*}}role = "mlp_dropout", phase = bwd]
// CHECK: [[DZ:%[0-9]+]] : f32[1, 4, 32] = linear_gelu_grad([[D]], %fc2.w, [[Z]]) {approximate = "none", trans_w = 0} [layer = 0, role = "act", phase = bwd]
// CHECK-NEXT: linear([[DZ]], %fc.w) {trans_w = 0} [layer = 0, role = "fc1", phase = bwd]
// CHECK-NEXT: linear_grad_w([[LN]], [[DZ]]) {trans_w = 1} [layer = 0, role = "fc1", phase = bwd]

// bf16: every pair is left as it was lowered.
// BF16: [[P:%[0-9]+]] : bf16[1, 4, 8] = linear({{.*}}) {trans_w = 1} [layer = 0, role = "proj"]
// BF16-NEXT: [[D:%[0-9]+]] : bf16[1, 4, 8], {{.*}} = dropout([[P]]) {{.*}}[layer = 0, role = "attn_dropout"]
// BF16-NEXT: add({{.*}}, [[D]]) [layer = 0, role = "residual1"]
// BF16: [[Z:%[0-9]+]] : bf16[1, 4, 32] = linear({{.*}}) {trans_w = 1} [layer = 0, role = "fc1"]
// BF16-NEXT: gelu([[Z]]) {approximate = "none"} [layer = 0, role = "act"]
// BF16: [[G:%[0-9]+]] : bf16[1, 4, 32] = linear({{.*}}) {trans_w = 0} [layer = 0, role = "fc2", phase = bwd]
// BF16: gelu_grad([[Z]], [[G]]) {approximate = "none"} [layer = 0, role = "act", phase = bwd]
