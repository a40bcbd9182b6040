// bucket-param-gathers (lower/GradientBuckets.h): under ZeRO (--zero 1) the
// data-parallel pass gathers each updated parameter's chunks with a
// gather_param of its own after the updates; here consecutive ones become
// one gather_param of several parameters, greedily up to bucket_bytes of
// parameters each.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer,data-parallel --dp 2 --zero 1 --lower | FileCheck %s --check-prefix=NONE
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer,data-parallel --dp 2 --zero 1 --lower --program-passes=bucket-param-gathers | FileCheck %s --check-prefix=ONE
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer,data-parallel --dp 2 --zero 1 --dp-bucket 1000 --lower --program-passes=bucket-param-gathers | FileCheck %s --check-prefix=SMALL
// Without ZeRO the parameters are updated whole on every replica: nothing
// to gather, the program is left as lowered.
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer,data-parallel --dp 2 --lower > %t.lowered
// RUN: sp-opt %inputs/one-layer.sp --passes=detect-transformer,autodiff,lower-collectives,optimizer,data-parallel --dp 2 --lower --program-passes=bucket-param-gathers > %t.bucketed
// RUN: diff %t.lowered %t.bucketed

// NONE: adamw(%lnf.b,
// NONE-NEXT: gather_param(%wte) {bucket_bytes = 26214400, parts = 2} loc("dp_gather.wte") [role = "dp_param_gather", phase = opt]
// NONE-NEXT: gather_param(%wpe) {bucket_bytes = 26214400, parts = 2} loc("dp_gather.wpe")

// ONE: adamw(%lnf.b,
// ONE-NEXT: gather_param(%wte, %wpe, %ln1.w, %ln1.b, %attn.w, %attn.b, %proj.w, %proj.b, %ln2.w, %ln2.b, %fc.w, %fc.b, %fc2.w, %fc2.b, %lnf.w, %lnf.b) {bucket_bytes = 26214400, parts = 2} loc("dp_gather_bucket.0") [role = "dp_param_gather", phase = opt]
// ONE-NOT: gather_param

// At most 1000 bytes: fc.w and fc2.w (1 KiB each) are buckets of their own,
// and so is fc.b between them.
// SMALL: adamw(%lnf.b,
// SMALL-NEXT: gather_param(%wte, %wpe, %ln1.w, %ln1.b) {bucket_bytes = 1000, parts = 2} loc("dp_gather_bucket.0")
// SMALL-NEXT: gather_param(%attn.w, %attn.b) {{.*}} loc("dp_gather_bucket.1")
// SMALL-NEXT: gather_param(%proj.w, %proj.b, %ln2.w, %ln2.b) {{.*}} loc("dp_gather_bucket.2")
// SMALL-NEXT: gather_param(%fc.w) {{.*}} loc("dp_gather_bucket.3")
// SMALL-NEXT: gather_param(%fc.b) {{.*}} loc("dp_gather_bucket.4")
// SMALL-NEXT: gather_param(%fc2.w) {{.*}} loc("dp_gather_bucket.5")
// SMALL-NEXT: gather_param(%fc2.b, %lnf.w, %lnf.b) {{.*}} loc("dp_gather_bucket.6")
// SMALL-NOT: gather_param
