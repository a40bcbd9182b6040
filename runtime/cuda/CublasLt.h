//===- CublasLt.h - A linear layer's bias in the GEMM's epilogue -*- C++
//-*-===//
//
// sp-run --cuda-epilogues: a linear layer with a bias (linear, and the GEMM
// of linear_gelu) is one cublasLtMatmul with CUBLASLT_EPILOGUE_BIAS, where
// the backend otherwise writes the bias into every row of the output and
// runs the GEMM with beta = 1 (a pass over the output and a read of it):
//
//   out[r, o] = sum_i x[r, i] op(w)[i, o] + bias[o]    (float32 accumulate)
//
// Row-major out [Rows, OutF] is column-major D [OutF, Rows] = op(W)^T X^T,
// and the bias, one per row of D, is broadcast along D's columns, as
// cuBLASLt's epilogue does. The sum is the GEMM's, in its order, with the
// bias added once at the end (the CPU adds it first: the two agree within
// the GEMM's rounding, as every cuBLAS product does with the CPU's).
// cuBLASLt's GELU epilogues are not used: they offer the tanh form only
// and compute it in their own float arithmetic, where the backend's GELU
// kernel gives the CPU's bits (README, "Running on a GPU cluster").
//
// cuBLASLt is loaded (dlopen) when the first backend that asks for it is
// made, as cuBLAS is. The heuristic is told the pointers' alignments (it
// assumes 256 bytes otherwise; the arena aligns to 64) and its choice is
// kept per shape, operand type and alignments; when it offers no algorithm
// (or the algorithm refuses the call) the caller runs the bias and the
// GEMM as before. No workspace: the plan's memory stays the arena.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_CUBLASLT_H
#define SP_RUNTIME_CUDA_CUBLASLT_H

#include "llvm/Support/Error.h"
#include <cublasLt.h>
#include <map>
#include <memory>
#include <tuple>

namespace sp::cuda {

struct CublasLtApi;

class CublasLt {
public:
  /// Loads cuBLASLt (once per process) and makes a handle; an error names
  /// what is missing.
  static llvm::Expected<std::unique_ptr<CublasLt>> create();
  ~CublasLt();
  CublasLt(const CublasLt &) = delete;
  CublasLt &operator=(const CublasLt &) = delete;

  /// Out[Rows, OutF] = X[Rows, InF] op(W) + Bias[OutF] on stream S, row
  /// major; W is [InF, OutF], or [OutF, InF] with TransW. X and W are of
  /// type AB (CUDA_R_32F, or both 16-bit, read in place), Out and Bias of
  /// type DT: float32, or AB's 16-bit type (the float32 sum plus the bias
  /// rounded once). TF32: float32 operands on the tensor cores. False
  /// (nothing queued) when cuBLASLt has no algorithm for it.
  llvm::Expected<bool> linearBias(cudaStream_t S, bool TransW, int64_t Rows,
                                  int64_t OutF, int64_t InF, const void *X,
                                  const void *W, cudaDataType_t AB,
                                  const void *Bias, void *Out,
                                  cudaDataType_t DT, bool TF32);

private:
  CublasLt() = default;
  /// The descriptors and the heuristic's algorithm of one shape, operand
  /// type and set of pointer alignments (the Key).
  struct Plan {
    cublasLtMatmulDesc_t Desc = nullptr;
    cublasLtMatrixLayout_t A = nullptr, B = nullptr, D = nullptr;
    cublasLtMatmulAlgo_t Algo{};
    bool Found = false;
  };
  /// What a plan depends on: the shape, the operand type, TF32, and the
  /// alignments in bytes of X, W, Bias and Out.
  struct Key {
    int64_t Rows, OutF, InF;
    bool TransW;
    cudaDataType_t AB;
    bool TF32;
    uint32_t AlignX, AlignW, AlignBias, AlignOut;
    cudaDataType_t DT;
    auto tie() const {
      return std::tie(Rows, OutF, InF, TransW, AB, TF32, AlignX, AlignW,
                      AlignBias, AlignOut, DT);
    }
    bool operator<(const Key &O) const { return tie() < O.tie(); }
  };
  /// K's plan, made on first use (Bias: a bias pointer of K's alignment,
  /// which the heuristic reads).
  llvm::Expected<Plan *> planOf(const Key &K, const void *Bias);
  const CublasLtApi *Api = nullptr;
  cublasLtHandle_t Handle = nullptr;
  std::map<Key, Plan> Plans;
};

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_CUBLASLT_H
