// lower-collectives: f disappears, f-bar becomes all_reduce, g all_gather,
// g-bar reduce_scatter; sp_split stays.
// RUN: sp-opt %s --passes=lower-collectives --verify-each | FileCheck %s
// No-op on a graph without collectives:
// RUN: sp-opt %inputs/one-layer.sp --passes=lower-collectives > %t
// RUN: sp-opt %inputs/one-layer.sp | diff - %t

// CHECK-NOT: tp_copy
// CHECK: %0 : f32[2, 4, 8] = all_reduce(%x) [role = "attn_fbar"]
// CHECK-NEXT: %1 : f32[2, 8, 8] = all_gather(%0) {dim = 1, parts = 2} [role = "mlp_f"]
// CHECK-NEXT: %2 : f32[2, 4, 8] = reduce_scatter(%1) {dim = 1, parts = 2} [role = "mlp_fbar"]
// CHECK-NEXT: %3 : f32[2, 2, 8] = sp_split(%2) {dim = 1, parts = 2} [role = "pos_split"]
// CHECK-NEXT: output "y" = %3

graph @collectives {
  input %x : f32[2, 4, 8]
  %0 : f32[2, 4, 8] = tp_copy(%x) [role = "attn_f"]
  %1 : f32[2, 4, 8] = tp_reduce(%0) [role = "attn_fbar"]
  %2 : f32[2, 8, 8] = sp_gather(%1) {dim = 1, parts = 2, regather = 1} [role = "mlp_f"]
  %3 : f32[2, 4, 8] = sp_scatter(%2) {dim = 1, parts = 2} [role = "mlp_fbar"]
  %4 : f32[2, 2, 8] = sp_split(%3) {dim = 1, parts = 2} [role = "pos_split"]
  output "y" = %4
}
