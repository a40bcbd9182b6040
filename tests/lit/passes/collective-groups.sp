// A collective communicates over the group its op declares (tp for the
// tensor-parallel ones, pp for the pipeline messages) unless it names
// another: a data-parallel all_reduce names dp. The name is printed and kept;
// an op that does not communicate cannot have one.
// RUN: sp-opt %s --verify-each | FileCheck %s
// CHECK: all_reduce(%x) {group = "dp"}
// CHECK-NEXT: all_reduce(%{{[0-9]+}}) [role = "mlp_fbar"]
// RUN: sed -e 's/add(%x, %x)$/add(%x, %x) {group = "tp"}/' %s > %t.bad.sp
// RUN: not sp-opt %t.bad.sp --verify-each 2>&1 | FileCheck %s --check-prefix=BAD
// BAD: error: {{.*}}(add): has a group but does not communicate
graph @groups {
  input %x : f32[2, 4]
  %0 : f32[2, 4] = all_reduce(%x) {group = "dp"}
  %1 : f32[2, 4] = all_reduce(%0) [role = "mlp_fbar"]
  %2 : f32[2, 4] = add(%x, %x)
  output "y" = %1
  output "z" = %2
}
