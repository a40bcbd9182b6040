//===- OpCase.h - A program of a few instructions run on a backend -*- C++ -*-===//
//
// The kernel tests' harness (KernelTest, AttentionCase): buffers in an
// arena with their input data, instructions, and a run on any backend with
// the one step, seed and training flag every kernel test uses.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TESTS_GPU_OPCASE_H
#define SP_TESTS_GPU_OPCASE_H

#include "ir/Float16.h"
#include "runtime/Backend.h"
#include "runtime/comm/Communicator.h"
#include "llvm/ADT/ScopeExit.h"
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace sp {

/// A call of I in P at Arena (or at Where's pointers) as every kernel test
/// makes it: step 3, training, the same seed, one tensor rank.
inline KernelCall testCall(const Instruction &I, const Program &P, char *Arena,
                           Communicator &Tensor,
                           std::optional<double> Drop = std::nullopt,
                           char *const *Where = nullptr) {
  KernelCall C{I,    P,    Arena, /*Step=*/3, /*Training=*/true,
               Drop, /*Seed=*/0x5eed1234abcdull, Tensor, nullptr,
               nullptr};
  C.Where = Where;
  return C;
}

/// A program (usually of one instruction) and its input data; run() runs
/// every instruction in order.
struct OpCase {
  Program P;
  std::vector<std::vector<char>> Data; // per buffer; empty: zeros
  std::mt19937 Rng{42};

  int buffer(DType T, std::vector<int64_t> Shape) {
    ProgramBuffer B;
    // (Appended, not "%" + to_string: GCC 12's -Wrestrict misfires on that.)
    B.Name = "%";
    B.Name += std::to_string(P.Buffers.size());
    B.Type = TensorType(T, Shape);
    B.Bytes = B.Type.numBytes();
    B.Offset = P.ArenaBytes;
    P.ArenaBytes += (B.Bytes + 255) / 256 * 256;
    P.Buffers.push_back(B);
    Data.emplace_back();
    return int(P.Buffers.size()) - 1;
  }
  /// An f32 input of normal values (times Scale, plus Shift).
  int floats(std::vector<int64_t> Shape, float Scale = 1, float Shift = 0) {
    int B = buffer(DType::F32, Shape);
    int64_t N = P.Buffers[B].Type.numElements();
    std::normal_distribution<float> D(0, 1);
    std::vector<float> V(N);
    for (float &X : V)
      X = D(Rng) * Scale + Shift;
    setFloats(B, V);
    return B;
  }
  /// A bf16 or fp16 input: normal values (times Scale) rounded to T.
  int halfs(DType T, std::vector<int64_t> Shape, float Scale = 1) {
    int B = buffer(T, Shape);
    int64_t N = P.Buffers[B].Type.numElements();
    std::normal_distribution<float> D(0, 1);
    std::vector<uint16_t> V(N);
    for (uint16_t &X : V) {
      float F = D(Rng) * Scale;
      X = T == DType::BF16 ? floatToBFloat16(F) : floatToHalf(F);
    }
    Data[B].assign(reinterpret_cast<const char *>(V.data()),
                   reinterpret_cast<const char *>(V.data() + V.size()));
    return B;
  }
  void setFloats(int B, const std::vector<float> &V) {
    Data[B].assign(reinterpret_cast<const char *>(V.data()),
                   reinterpret_cast<const char *>(V.data() + V.size()));
  }
  int ids(std::vector<int64_t> Shape, int64_t Lo, int64_t Hi) {
    int B = buffer(DType::I64, Shape);
    int64_t N = P.Buffers[B].Type.numElements();
    std::vector<int64_t> V(N);
    for (int64_t &X : V)
      X = Lo + int64_t(Rng() % uint64_t(Hi - Lo));
    Data[B].assign(reinterpret_cast<const char *>(V.data()),
                   reinterpret_cast<const char *>(V.data() + V.size()));
    return B;
  }
  int mask(std::vector<int64_t> Shape) {
    int B = buffer(DType::U8, Shape);
    Data[B].resize(P.Buffers[B].Type.numElements());
    for (char &C : Data[B])
      C = char(Rng() % 4 != 0);
    return B;
  }
  Instruction &op(OpKind Op, std::vector<int> In, std::vector<int> Out) {
    Instruction I;
    I.Op = Op;
    I.In.assign(In.begin(), In.end());
    I.Out.assign(Out.begin(), Out.end());
    P.Instrs.push_back(I);
    return P.Instrs.back();
  }

  /// Runs the instruction on B; returns every buffer's bytes after it.
  llvm::Expected<std::vector<std::vector<char>>> run(Backend &B,
                                               std::optional<double> Drop =
                                                   std::nullopt) {
    auto Arena = B.allocate(P.ArenaBytes);
    if (!Arena)
      return Arena.takeError();
    auto Free = llvm::make_scope_exit([&] { B.release(*Arena); });
    for (size_t K = 0; K < P.Buffers.size(); ++K)
      if (!Data[K].empty())
        if (auto E = B.copyToBackend(*Arena + P.Buffers[K].Offset,
                                     Data[K].data(), Data[K].size()))
          return E;
    auto Tensor = createSingleRankCommunicator();
    for (const Instruction &I : P.Instrs)
      if (auto E = B.run(testCall(I, P, *Arena, *Tensor, Drop)))
        return E;
    if (auto E = B.synchronize())
      return E;
    std::vector<std::vector<char>> Out(P.Buffers.size());
    for (size_t K = 0; K < P.Buffers.size(); ++K) {
      Out[K].resize(P.Buffers[K].Type.numBytes());
      if (auto E = B.copyToHost(Out[K].data(), *Arena + P.Buffers[K].Offset,
                                Out[K].size()))
        return E;
    }
    return Out;
  }
};

} // namespace sp

#endif // SP_TESTS_GPU_OPCASE_H
