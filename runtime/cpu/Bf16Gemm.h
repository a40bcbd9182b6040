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
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CPU_BF16GEMM_H
#define SP_RUNTIME_CPU_BF16GEMM_H

#include <cstdint>

namespace sp::cpu {

/// Whether this CPU has VDPBF16PS.
bool hasBf16Dot();

/// Whether the bf16 plans' GEMMs use it: hasBf16Dot(), unless the
/// environment sets SP_CPU_BF16_DOT=0 (then they run as float32 GEMMs on
/// widened copies) or a test chose otherwise with setBf16DotEnabled.
bool bf16DotEnabled();
void setBf16DotEnabled(bool On);

enum class Bf16Kernel { Native, Emulated };

/// Row-major C[M,N] = Beta * C + op(A)[M,K] op(B)[K,N]: A and B bfloat16
/// bits (op(A) = A stored [M,K] with leading dimension Lda, or A^T stored
/// [K,M]; likewise B), C float32. Beta is 0 (C is overwritten, never read)
/// or 1. Native needs hasBf16Dot().
void gemmBf16(bool TransA, bool TransB, int64_t M, int64_t N, int64_t K,
              const uint16_t *A, int64_t Lda, const uint16_t *B, int64_t Ldb,
              float Beta, float *C, int64_t Ldc,
              Bf16Kernel Kernel = Bf16Kernel::Native);

/// The number of float32 roundings on the path of one element of C: the
/// error bound of a K-term product is gamma(n) = n u / (1 - n u) times
/// sum |a||b| (+ |C| when Beta is 1), u = 2^-24 (tests).
int64_t bf16GemmRoundings(int64_t K, float Beta);

} // namespace sp::cpu

#endif // SP_RUNTIME_CPU_BF16GEMM_H
