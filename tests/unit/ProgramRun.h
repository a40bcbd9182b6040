//===- ProgramRun.h - Hand-built programs run on the CPU backend -*- C++ -*-===//
//
// What the peephole fusion tests (FuseSoftmaxTest, FuseEpilogueTest)
// share: instruction tags, the consistency of a rewritten program's live
// ranges, a run of every instruction on the CPU backend, random inputs.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TESTS_UNIT_PROGRAMRUN_H
#define SP_TESTS_UNIT_PROGRAMRUN_H

#include "frontend/OnnxImporter.h"
#include "lower/MemoryPlan.h"
#include "lower/ProgramBuilder.h"
#include "driver/Compile.h"
#include "runtime/cpu/CpuBackend.h"
#include "gtest/gtest.h"
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace sp::test {

inline Tags tags(Phase Ph, Role R) {
  Tags T;
  T.Layer = 0;
  T.Role = R;
  T.Ph = Ph;
  return T;
}

/// Every temporary is defined by the instruction its Def names and lives
/// until its last reader (or the end, for an output).
inline void expectConsistent(const Program &P) {
  std::vector<int> Def(P.Buffers.size(), -1), Last(P.Buffers.size(), -1);
  for (size_t K = 0; K < P.Instrs.size(); ++K) {
    for (int B : P.Instrs[K].Out)
      if (Def[B] < 0)
        Def[B] = int(K);
    // accumulate writes its sum in place
    if (P.Instrs[K].Op == OpKind::Accumulate && Def[P.Instrs[K].In[0]] < 0)
      Def[P.Instrs[K].In[0]] = int(K);
    for (int B : P.Instrs[K].In)
      Last[B] = int(K);
  }
  for (const auto &[Name, Id] : P.Outputs)
    Last[Id] = int(P.Instrs.size());
  for (size_t B = 0; B < P.Buffers.size(); ++B) {
    const ProgramBuffer &PB = P.Buffers[B];
    if (PB.K != ProgramBuffer::Temp)
      continue;
    EXPECT_EQ(PB.Def, Def[B]) << PB.Name;
    EXPECT_EQ(PB.LastUse, std::max(Def[B], Last[B])) << PB.Name;
    EXPECT_EQ(PB.Name, "%" + std::to_string(B));
  }
}

/// What a fused program must be: consistent, a fixed point of Fuse (a
/// second run finds nothing), and, memory-planned, a program.json that
/// reads back (the fused ops' shape rules accept what the pass wrote).
inline void expectSettled(Program &P, int (*Fuse)(Program &)) {
  expectConsistent(P);
  EXPECT_EQ(Fuse(P), 0);
  planMemory(P);
  auto Back = programFromJson(programToJson(P));
  ASSERT_TRUE(bool(Back)) << llvm::toString(Back.takeError());
  EXPECT_EQ(Back->Instrs.size(), P.Instrs.size());
}

/// The default model (models/tiny/gpt-tiny.onnx) compiled with Ctx: each
/// stage's program with its steps written out (a compact program's
/// instructions as they run), each checked consistent and its program.json
/// to read back.
inline std::vector<Program> defaultModelPrograms(PassContext &Ctx) {
  registerOnnxDataLoader();
  auto G = llvm::cantFail(
      importOnnx(SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx", ImportOptions()));
  auto C = compileToPlan(*G, Ctx, CompileOptions());
  EXPECT_TRUE(bool(C)) << llvm::toString(C.takeError());
  std::vector<Program> Flat;
  if (!C)
    return Flat;
  for (int S = 0; S < C->P->numStages(); ++S) {
    const Program &P = C->P->stage(S);
    auto F = expandProgram(P);
    EXPECT_TRUE(bool(F)) << llvm::toString(F.takeError());
    if (!F)
      return {};
    expectConsistent(*F);
    auto Back = programFromJson(programToJson(P));
    EXPECT_TRUE(bool(Back)) << llvm::toString(Back.takeError());
    Flat.push_back(std::move(*F));
  }
  return Flat;
}

/// Runs every instruction of P (memory-planned) on the CPU backend with
/// the given inputs (by buffer name); returns the named outputs' bytes.
inline std::map<std::string, std::vector<char>>
runOnCpu(const Program &P, const std::map<std::string, std::vector<char>> &In) {
  CpuBackend Cpu;
  std::vector<char> Arena(P.ArenaBytes);
  auto Tensor = createSingleRankCommunicator();
  for (const ProgramBuffer &B : P.Buffers)
    if (auto It = In.find(B.Name); It != In.end())
      std::memcpy(Arena.data() + B.Offset, It->second.data(), B.Bytes);
  for (const Instruction &I : P.Instrs) {
    KernelCall C{I,       P,   Arena.data(), 1,      true, std::nullopt,
                 1234567, *Tensor, nullptr,   nullptr};
    llvm::Error E = Cpu.run(C);
    EXPECT_FALSE(bool(E)) << llvm::toString(std::move(E));
  }
  std::map<std::string, std::vector<char>> Out;
  for (const auto &[Name, Id] : P.Outputs) {
    const ProgramBuffer &B = P.Buffers[Id];
    Out[Name].assign(Arena.data() + B.Offset, Arena.data() + B.Offset + B.Bytes);
  }
  return Out;
}

template <typename T>
std::vector<char> randomBytes(int64_t N, unsigned Seed) {
  std::mt19937 Rng(Seed);
  std::normal_distribution<double> D(0, 3);
  std::vector<T> V(N);
  for (T &X : V)
    X = T(D(Rng));
  std::vector<char> B(N * sizeof(T));
  std::memcpy(B.data(), V.data(), B.size());
  return B;
}

} // namespace sp::test

#endif // SP_TESTS_UNIT_PROGRAMRUN_H
