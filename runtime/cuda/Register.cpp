//===- Register.cpp - The CUDA backend in the backend registry ------------===//
//
// --device cuda[:N] (runtime/BackendRegistry.h): one GPU per rank, through
// the entry points of CudaBackend.h (present in every build: without CUDA
// they say sp was built without it). Its own flags (--tf32,
// --cuda-attention, --cuda-numerics, --cuda-epilogues) become CudaBackendOptions, and its
// notes say how the GPU runs a plan: 16-bit GEMMs on tensor cores, the
// fused attention core, biases in cuBLASLt's epilogue.
//
//===----------------------------------------------------------------------===//
#include "plan/Plan.h"
#include "runtime/BackendRegistry.h"
#include "runtime/cuda/CudaBackend.h"
#include "llvm/ADT/STLExtras.h"

using namespace llvm;

namespace sp {

static Expected<std::unique_ptr<Backend>>
createForRank(const BackendContext &C) {
  CudaBackendOptions O;
  O.Device = C.DeviceIndex;
  // Thread ranks: rank r takes GPU (N or 0) + r, since the launcher's local
  // rank is the whole process's.
  if (C.ThreadRanks && C.World)
    O.Device = C.DeviceIndex.value_or(0) + C.World->rank();
  O.World = C.World;
  O.Tensor = C.Tensor;
  O.Pipeline = C.Pipeline;
  O.Data = C.Data;
  O.Context = C.Context;
  O.AllowTF32 = C.flag("tf32") == "true";
  O.BlockwiseAttention = C.flag("cuda-attention") != "unfused";
  O.CublasLtEpilogues = C.flag("cuda-epilogues") == "true";
  O.Numerics = C.flag("cuda-numerics") == "exact" ? cuda::Numerics::Exact
                                                   : cuda::Numerics::Fast;
  O.AgreeBeforeCollectives = C.AgreeBeforeCollectives;
  return createCudaBackend(O);
}

static BackendNotes notesFor(const Plan &P, const BackendContext &C) {
  BackendNotes N;
  std::string Dtype = P.Manifest.value("dtype", "f32");
  if (Dtype == "bf16" || Dtype == "f16")
    N.Lines.push_back((Dtype == "bf16" ? "bf16" : "fp16") +
                      std::string(" compute: GEMMs on tensor cores (float32 "
                                  "sums), other ops in float32 on widened "
                                  "copies; each result rounded once"));
  // How the GPU runs a fused attention core (AttentionPlan.h; under
  // context parallelism always the blockwise kernels, said below).
  const bool Cp = P.Manifest.value("cp", 1) > 1;
  if (!Cp && any_of(P.Prog.Instrs, [](const Instruction &I) {
        return I.Op == OpKind::Attention;
      }))
    N.Lines.push_back(
        C.flag("cuda-attention") != "unfused"
            ? "attention core: the blockwise kernels (heads above 128 as "
              "unfused ops)"
            : "attention core: its unfused ops on a float32 workspace "
              "(--cuda-attention unfused)");
  if (Cp)
    N.Lines.push_back(
        P.Manifest.value("cp_comm", std::string("ring")) == "a2a"
            ? "context parallelism: the all-to-all over NCCL, the blockwise "
              "attention kernels on this rank's heads"
            : "context parallelism: the ring over NCCL (each block's "
              "transfer beside the attention on the one before), on the "
              "blockwise attention kernels");
  if (C.flag("cuda-numerics") == "exact")
    N.Lines.push_back("kernels: exact (the CPU backend's bits but for the "
                      "GEMMs' sums)");
  if (C.flag("cuda-epilogues") == "true")
    N.Lines.push_back("linear biases: in the GEMM's epilogue (cuBLASLt) "
                      "where it offers an algorithm");
  return N;
}

void registerCudaBackend() {
  BackendEntry E;
  E.Name = "cuda";
  E.Description = "cuda (one GPU per rank: an MPI rank's local rank, a "
                  "thread rank's index; cuda:N starts at GPU N)";
  E.IndexMeaning = "a GPU index";
  E.Flags = {
      {"tf32",
       "--device cuda: fp32 GEMMs on TF32 tensor cores (10-bit mantissa "
       "inputs; off by default, as the comparisons with the CPU backend "
       "need)",
       {},
       ""},
      {"cuda-attention",
       "--device cuda: how a plan's fused attention core runs: blockwise "
       "(default: kernels that store no scores) or unfused (its unfused "
       "ops on a score-sized workspace)",
       {"blockwise", "unfused"},
       "blockwise|unfused"},
      {"cuda-numerics",
       "--device cuda: the memory-bound kernels' arithmetic: fast (default: "
       "float32 in the GPU's order, deterministic) or exact (the CPU "
       "backend's bits, the checking mode)",
       {"fast", "exact"},
       "fast|exact"},
      {"cuda-epilogues",
       "--device cuda: add a linear layer's bias in the GEMM's epilogue "
       "(cuBLASLt) instead of writing it into the output first (off by "
       "default)",
       {},
       ""}};
  E.NoFloat64Reason = "the CUDA kernels are float32";
  E.PeakSource = "the GPUs' dense GEMM peak";
  // Before anything is read or written: a GPU this process can use.
  E.CheckAvailable = [] { return checkCudaDevice(); };
  E.Create = createForRank;
  E.Notes = notesFor;
  BackendRegistry::instance().add(std::move(E));
}

} // namespace sp
