//===- Register.cpp - The CPU backend in the backend registry -------------===//
//
// --device cpu (runtime/BackendRegistry.h): CpuBackend, its process-wide
// kernel threads and peak, and the notes sp-run prints about how this CPU
// runs a plan: how a 16-bit plan computes (the AVX-512 BF16 or AMX GEMM
// kernels, or float32 on widened copies) and, when OpenBLAS chose older
// kernels than this CPU runs (a VM that hides its model), the
// OPENBLAS_CORETYPE that would pick its own.
//
//===----------------------------------------------------------------------===//
#include "plan/Plan.h"
#include "runtime/BackendRegistry.h"
#include "runtime/cpu/Bf16Gemm.h"
#include "runtime/cpu/CpuBackend.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

/// How the CPU computes a plan of Dtype (runtime/cpu/CpuBackend.cpp); empty
/// for float32.
static std::string computeNote(StringRef Dtype) {
  if (Dtype == "bf16")
    return cpu::bf16DotEnabled()
               ? formatv("bf16 compute: GEMMs on {0} (float32 sums){1}; "
                         "other ops in float32; each result rounded once",
                         cpu::bf16KernelName(cpu::Bf16Kernel::Best),
                         cpu::hasAmxBf16() && !cpu::amxEnabled()
                             ? ", not AMX (SP_CPU_AMX=0)"
                             : "")
                     .str()
               : formatv("bf16 compute: float32 on widened copies, each "
                         "result rounded once ({0})",
                         cpu::hasBf16Dot() || cpu::hasAmxBf16()
                             ? "SP_CPU_BF16_DOT=0"
                             : "this CPU has no AVX-512 BF16 or AMX")
                     .str();
  if (Dtype == "f16")
    return "fp16 compute: float32 on widened copies, each result rounded "
           "once";
  return "";
}

/// A CPU whose BLAS runs older kernels than it could says so (a VM that
/// hides the CPU model), on the line of the GEMM rate that shows it.
static std::string blasNote() {
  std::string Chosen, Better = CpuBackend::betterBlasCore(&Chosen);
  if (Better.empty())
    return "";
  return formatv("; note: OpenBLAS runs its {0} kernels on this "
                 "{1} CPU (its model is hidden, as in many VMs): "
                 "export OPENBLAS_CORETYPE={2} for faster GEMMs",
                 Chosen, Better == "SkylakeX" ? "AVX-512" : "AVX2", Better)
      .str();
}

void registerCpuBackend() {
  BackendEntry E;
  E.Name = "cpu";
  E.Description = "cpu (default)";
  E.PeakIsPerProcess = true;
  E.PeakSource = "this CPU's measured float32 GEMM rate";
  E.Create = [](const BackendContext &) -> Expected<std::unique_ptr<Backend>> {
    return std::make_unique<CpuBackend>();
  };
  E.Notes = [](const Plan &P, const BackendContext &) {
    BackendNotes N;
    if (std::string Line = computeNote(P.Manifest.value("dtype", "f32"));
        !Line.empty())
      N.Lines.push_back(std::move(Line));
    N.PeakNote = blasNote();
    return N;
  };
  E.SetThreads = [](int Threads) { CpuBackend::setThreads(Threads); };
  BackendRegistry::instance().add(std::move(E));
}

} // namespace sp
