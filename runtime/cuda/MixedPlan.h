//===- MixedPlan.h - How a 16-bit instruction runs on the GPU ----*- C++ -*-===//
//
// The CUDA backend runs a bf16 or fp16 plan by the CPU backend's rule
// (runtime/cpu/CpuBackend.cpp, runMixed): an instruction that touches a
// 16-bit buffer runs the float32 kernel on float32 copies of its 16-bit
// buffers, the operands widened first (exact) and each 16-bit result
// rounded once to nearest even after. One exception: a GEMM (linear,
// linear_grad_w, batch_matmul) whose two operands share a 16-bit type reads
// them where they are, on the tensor cores (float32 sums of exact
// products), so only its other buffers are copied.
//
// The memory-bound kernels that dominate a 16-bit step (elementwise,
// LayerNorm, softmax, dropout) skip the copies instead: they load and store
// 16-bit elements themselves, widening and rounding each one exactly as
// the copies would (runsIn16Bit; cuda::Elems in CudaKernels.h).
//
// Which buffers are copied, where in the stream's scratch region, and which
// are converted before and after the kernel is decided here on the host
// from the instruction and the buffers' types alone, so it is unit-tested
// without a device (tests/gpu/HostLogicTest.cpp); CudaBackend's
// dispatchMixed follows it.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_MIXEDPLAN_H
#define SP_RUNTIME_CUDA_MIXEDPLAN_H

#include "plan/Program.h"
#include <cstdint>
#include <vector>

namespace sp::cuda {

/// One buffer of the instruction, once (an in-place operand is also a
/// result), in the order of first use (operands, then results).
struct MixedBuffer {
  int Id;              // the buffer in the program
  int64_t Offset = -1; // its float32 copy in the region; -1: used in place
  bool Widen = false;  // copied in before the kernel (bf16/fp16 -> f32)
  bool Narrow = false; // rounded back after it (f32 -> bf16/fp16)
};

struct MixedPlan {
  std::vector<MixedBuffer> Buffers;
  /// The instruction with its buffer ids renumbered into Local.
  Instruction Local;
  /// Local's buffers: the copies as f32 at their region offsets, the
  /// others as they are (offset -1).
  Program LocalProgram;
  int64_t RegionBytes = 0;
  /// A GEMM reading its two 16-bit operands in place (tensor cores).
  bool Gemm16 = false;
};

/// Whether an instruction reads or writes a bf16 or fp16 buffer.
bool touches16Bit(const Instruction &I,
                  const std::vector<ProgramBuffer> &Buffers);

/// Whether I's kernel reads and writes its bf16 and fp16 buffers in place
/// (the kernels taking cuda::Elems: same-shape add and mul, GELU, LayerNorm,
/// bias grad, softmax, dropout, their gradients, a cast to or from float32,
/// and the blockwise attention core), with the bits of the copies' path
/// (the attention core: its float32 arithmetic on the widened operands,
/// each result rounded once), so it needs no plan. Its
/// tensors must share one type, its parameter gradients be float32; other
/// mixes run on copies.
bool runsIn16Bit(const Instruction &I,
                 const std::vector<ProgramBuffer> &Buffers);

/// The plan of I over Buffers. SideEffects: I writes its operands in place
/// (opDef(I.Op).SideEffects), so every copy is converted both ways.
MixedPlan planMixed(const Instruction &I,
                    const std::vector<ProgramBuffer> &Buffers,
                    bool SideEffects);

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_MIXEDPLAN_H
