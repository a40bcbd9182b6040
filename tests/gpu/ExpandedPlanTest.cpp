//===- ExpandedPlanTest.cpp - Fused plans run as the CUDA backend runs them ===//
//
// The CUDA backend runs an attention or attention_grad instruction whose
// heads exceed its blockwise kernels' as the unfused ops it stands for
// (runtime/cuda/AttentionPlan.h). Here a CPU
// backend that does the same (ExpandingBackend: the attention instructions
// through runAsExpansion, every other one as the CPU backend's own) trains
// whole fused plans compiled from exported models, and its losses and
// gradients are compared with the CPU backend's by the layout rule of
// TrainCompare.h (within 8 times the CPU's own float32 error from the plan
// run in float64). This is the expansion's host logic on the models users
// bring, where AttentionPlan.* covers it on single ops:
//   - models/tiny/gpt-tiny.onnx always: GPT-2's fused QKV read in place
//     (attention {packed}), causal, dropout;
//   - each ONNX file of SP_EXPANSION_MODELS (colon-separated), which
//     check_expanded_plans.sh exports with models/export_family.py: an
//     HF-style Llama (grouped-query heads, rotary, the padding bias before
//     the causal fill) and a BERT encoder (padding mask, no causal mask).
// Sensitivity, measured: the expansion with a scale 1e-3 off fails it
// (gradient error ratios 41 to 72 against the bound of 8), and so does a
// dropout without the op's Philox key; a scale 1e-5 off does not (on these
// small random models the change is below float32 rounding), which the
// op-level AttentionPlan.* tests catch. Coverage: one device (t = 1)
// only; the expansion's dropout index under tensor parallelism (q's, or
// packed qkv's, heads split over the ranks) is not run here.
//
//===----------------------------------------------------------------------===//
#include "frontend/OnnxImporter.h"
#include "driver/Compile.h"
#include "plan/Plan.h"
#include "runtime/cpu/CpuBackend.h"
#include "AttentionCase.h"
#include "TrainCompare.h"
#include "gtest/gtest.h"
#include "llvm/ADT/StringRef.h"
#include <cstdlib>

using namespace sp;
using namespace llvm;

namespace {

/// The CPU backend, with attention instructions run as the CUDA backend
/// runs them.
class ExpandingBackend : public Backend {
public:
  /// Count: attention instructions run (it outlives the executor that owns
  /// this backend).
  explicit ExpandingBackend(int &Count) : Count(Count) {}
  StringRef name() const override { return "cpu (attention expanded)"; }
  Expected<char *> allocate(size_t Bytes) override {
    return Cpu.allocate(Bytes);
  }
  void release(char *Arena) override { Cpu.release(Arena); }
  Error copyToBackend(char *Dst, const void *Src, size_t Bytes) override {
    return Cpu.copyToBackend(Dst, Src, Bytes);
  }
  Error copyToHost(void *Dst, const char *Src, size_t Bytes) override {
    return Cpu.copyToHost(Dst, Src, Bytes);
  }
  bool hostMemory() const override { return true; }
  Error run(const KernelCall &C) override {
    if (C.I.Op == OpKind::Attention || C.I.Op == OpKind::AttentionGrad) {
      ++Count;
      return runAsExpansion(Cpu, C);
    }
    return Cpu.run(C);
  }
  Error synchronize() override { return Cpu.synchronize(); }

private:
  int &Count;
  CpuBackend Cpu;
};

/// Trains Path's fused plan on the expanding backend against the CPU.
void expectExpansionTrainsAsTheCpu(StringRef Path) {
  auto Count = std::make_shared<int>(0);
  expectFusedPlanTrainsAsTheCpu(
      Path,
      [Count] { return std::unique_ptr<Backend>(new ExpandingBackend(*Count)); },
      Count.get(), "expanded");
}

TEST(ExpandedPlan, GptTinyTrainsAsTheCpu) {
  expectExpansionTrainsAsTheCpu(SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx");
}

TEST(ExpandedPlan, ExportedFamiliesTrainAsTheCpu) {
  auto Paths = exportedFamilyModels();
  if (Paths.empty())
    GTEST_SKIP() << "SP_EXPANSION_MODELS is not set: the exported Llama and "
                    "BERT models are trained by check_expanded_plans.sh";
  for (const std::string &Path : Paths)
    expectExpansionTrainsAsTheCpu(Path);
}

} // namespace
