//===- Bf16Gemm.h - bfloat16 GEMM on the AVX-512 BF16 dot product -*- C++ -*-===//
//
// The GEMMs of a bf16 plan on a CPU with AVX-512 BF16 (VDPBF16PS: Intel
// Cooper Lake and Sapphire Rapids on, AMD Zen 4 on). The operands stay
// bfloat16: they are packed into the kernel's panels (pairs of k side by
// side, as the instruction multiplies them) and never widened to float32
// buffers. Each product of two bfloat16 values is exact in float32 and the
// sums are float32, as in the float32 GEMM the other CPUs run on widened
// copies, so the rule a bf16 result follows is the same: float32
// accumulation, one rounding to bfloat16 where it is stored. Only the order
// of the float32 additions differs, as it differs between BLAS kernels.
//
// The order is fixed by the blocking, never by the thread count: C is split
// into tiles over the kernel threads, and each element sums its k in blocks
// of KC, pair by pair, the blocks added to C in order.
//
// A portable twin of the micro-kernel (Bf16Kernel::Emulated) follows the
// instruction's definition (Intel SDM, VDPBF16PS: per pair, the odd product
// then the even one, each a float32 FMA rounded to nearest even, denormal
// inputs and results flushed to zero). It runs the same packing and
// blocking, so they are tested on every CPU.
//
// On a CPU with AMX (Intel Sapphire Rapids on) the GEMMs run on its tiles
// instead (Bf16Kernel::Amx: TDPBF16PS, a 16 x 32 by 32 x 16 product per
// instruction, several times VDPBF16PS's rate). Same blocking of C over the
// threads and of k into blocks of 256; each 32 x 32 block of C is loaded
// into four tiles, takes the block's k (per pair the even product, then the
// odd one, each a float32 FMA as above) and is stored back. Its twin
// (Bf16Kernel::AmxEmulated) runs the same packing on every CPU.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CPU_BF16GEMM_H
#define SP_RUNTIME_CPU_BF16GEMM_H

#include <cstdint>

namespace sp::cpu {

/// Whether this CPU has VDPBF16PS.
bool hasBf16Dot();

/// Whether the bf16 plans' GEMMs run on a bf16 kernel (Bf16Kernel::Best):
/// hasBf16Dot() or hasAmxBf16(), unless the environment sets
/// SP_CPU_BF16_DOT=0 (then they run as float32 GEMMs on widened copies) or
/// a test chose otherwise with setBf16DotEnabled.
bool bf16DotEnabled();
void setBf16DotEnabled(bool On);

/// Whether this CPU has AMX-BF16 and Linux lets this process use its tiles
/// (arch_prctl ARCH_REQ_XCOMP_PERM, asked for on the first call).
bool hasAmxBf16();

/// Whether Bf16Kernel::Best picks AMX: hasAmxBf16(), unless the environment
/// sets SP_CPU_AMX=0 (then VDPBF16PS) or a test chose otherwise.
bool amxEnabled();
void setAmxEnabled(bool On);

enum class Bf16Kernel {
  Native,      // VDPBF16PS (hasBf16Dot())
  Emulated,    // its portable twin
  Amx,         // TDPBF16PS (hasAmxBf16())
  AmxEmulated, // its portable twin
  Best,        // Amx where amxEnabled(), else Native where the CPU has it,
               // else Emulated
};

/// Best resolved on this CPU; any other kernel is itself.
Bf16Kernel resolveBf16Kernel(Bf16Kernel Kernel);
/// "AMX (TDPBF16PS)", "AVX-512 BF16 (VDPBF16PS)", ... (after resolving).
const char *bf16KernelName(Bf16Kernel Kernel);

/// Row-major C[M,N] = Beta * C + op(A)[M,K] op(B)[K,N]: A and B bfloat16
/// bits (op(A) = A stored [M,K] with leading dimension Lda, or A^T stored
/// [K,M]; likewise B), C float32. Beta is 0 (C is overwritten, never read)
/// or 1. Native needs hasBf16Dot(), Amx hasAmxBf16().
void gemmBf16(bool TransA, bool TransB, int64_t M, int64_t N, int64_t K,
              const uint16_t *A, int64_t Lda, const uint16_t *B, int64_t Ldb,
              float Beta, float *C, int64_t Ldc,
              Bf16Kernel Kernel = Bf16Kernel::Best);

/// The number of float32 roundings on the path of one element of C: the
/// error bound of a K-term product is gamma(n) = n u / (1 - n u) times
/// sum |a||b| (+ |C| when Beta is 1), u = 2^-24 (tests). The AMX kernels
/// round K times (their sums start from C), within this count.
int64_t bf16GemmRoundings(int64_t K, float Beta);

} // namespace sp::cpu

#endif // SP_RUNTIME_CPU_BF16GEMM_H
