//===- Estimate.cpp - The cost model's estimate of a compiled plan --------===//
#include "planner/Estimate.h"
#include "support/Format.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

/// The plan's step on cluster M by the cost model (planner/CostModel.h): the
/// summary's lines, and "estimate" in the report.
Expected<std::string> estimateCompilation(const ClusterSpec &M,
                                          const PassContext &Ctx,
                                          Compilation &C) {
  ParallelLayout Y = layoutOf(Ctx);
  bool Fp32 = Ctx.ActivationDtype == DType::F32;
  double Peak = gemmPeak(M, Ctx.ActivationDtype);
  auto E = estimatePlan(M, Ctx, *C.P);
  if (!E)
    return E.takeError();
  C.Facts["estimate"] = {
      {"cluster", M.Name},
      {"gpus", Y.gpus()},
      {"peak_flops", Peak},
      {"gemm_efficiency", M.GemmEfficiency},
      {"step_seconds", E->Seconds},
      {"pipeline_seconds", E->PipelineSeconds},
      {"bubble", E->BubbleFraction},
      {"gemm_seconds", E->ComputeSeconds},
      {"memory_bound_seconds", E->MemoryBoundSeconds},
      {"tensor_comm_seconds", E->TensorCommSeconds},
      {"data_parallel_seconds", E->DataParallelSeconds},
      {"optimizer_seconds", E->OptimizerSeconds},
      {"model_flops", E->ModelFlops},
      {"hardware_flops", E->HardwareFlops},
      {"mfu", E->Mfu},
      {"hfu", E->Hfu}};
  // Three decimals in s, ms or us.
  auto T = humanSeconds;
  return formatv("estimate on {0} x {1} ({2} GEMMs at {3:P0} of {4:F1} "
                 "TFLOP/s): step {5} = pipeline {6} (bubble {7:F1}%) + "
                 "exposed data-parallel sum {8} + optimizer {9}\n  busiest "
                 "rank: GEMMs {10}, memory-bound ops {14}, tensor collectives "
                 "{11}; MFU {12:F1}%, HFU {13:F1}%\n",
                 Y.gpus(), M.Name, Fp32 ? "fp32" : "16-bit",
                 M.GemmEfficiency, Peak / 1e12, T(E->Seconds),
                 T(E->PipelineSeconds), 100 * E->BubbleFraction,
                 T(E->DataParallelSeconds), T(E->OptimizerSeconds),
                 T(E->ComputeSeconds), T(E->TensorCommSeconds), 100 * E->Mfu,
                 100 * E->Hfu, T(E->MemoryBoundSeconds))
      .str();
}

} // namespace sp
