//===- Program.h - The lowered per-rank program ----------------*- C++ -*-===//
//
// What sp-compile hands to sp-run: an ordered list of instructions over
// numbered buffers, and for every buffer its place in one arena. The memory
// planner (lower/MemoryPlan.cpp) fills in the offsets; the runtime allocates
// exactly ArenaBytes and never allocates again.
//
// A plan directory holds manifest.json (format version, model facts, options)
// and program.json (this structure). Parameters reference their source data
// (ONNX initializers or external data) rather than copying it.
//
//===----------------------------------------------------------------------===//
#ifndef SP_PLAN_PROGRAM_H
#define SP_PLAN_PROGRAM_H

#include "ir/IR.h"
#include "llvm/Support/Error.h"
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sp {

/// Bumped whenever the plan format changes; sp-run refuses other versions.
constexpr int PlanFormatVersion = 3;

struct ProgramBuffer {
  enum Kind : uint8_t { Input, Param, State, Const, Temp };
  std::string Name; // leaf name, or "%N" for the result numbered N
  TensorType Type;  // the element type the kernels compute in
  Kind K = Temp;
  int64_t Bytes = 0;   // planned size (with the plan's activation dtype)
  int64_t Offset = -1; // in the arena
  /// Live range of a temporary, as instruction indices [Def, LastUse].
  int Def = -1, LastUse = -1;
  /// Param and Const: where the initial bytes are.
  std::shared_ptr<TensorData> Data;
  /// How the value is laid out over the tensor-parallel group: a split
  /// parameter's Data is the whole source, of which each rank loads a slice.
  Sharding Shard;
  /// Layer and role of the producing node (memory accounting by role).
  int Layer = -1;
  std::string Role;
  /// Input: what the runtime feeds it with, and for a pipelined plan the
  /// microbatch whose rows it holds (-1: the whole batch, or not batched).
  InputRole Feed = InputRole::None;
  int Microbatch = -1;
  bool isPersistent() const { return K != Temp; }
};

struct Instruction {
  OpKind Op;
  llvm::SmallVector<int, 4> In, Out; // buffer ids
  AttrList Attrs;
  int Layer = -1;
  std::string Role;
  Phase Ph = Phase::Forward;
  std::string Name;
  /// A collective: the index of the later GEMM it runs beside
  /// (lower/Overlap.h); the two touch disjoint arena bytes. -1: none.
  int Beside = -1;
};

struct Program {
  std::vector<ProgramBuffer> Buffers;
  std::vector<Instruction> Instrs;
  /// Named results the runtime reads: "loss", "grad:<parameter>".
  std::vector<std::pair<std::string, int>> Outputs;
  /// Bytes of the persistent region (inputs, parameters, state, constants)
  /// at the bottom of the arena, and of the whole arena (the planned peak).
  int64_t PersistentBytes = 0, ArenaBytes = 0;

  int findBuffer(llvm::StringRef Name) const;
  int output(llvm::StringRef Name) const;
};

nlohmann::json programToJson(const Program &P);
/// True if J is a JSON integer in [Min, Max] (json::get converts floats and
/// wraps large integers instead).
bool isIntegerIn(const nlohmann::json &J, int64_t Min, int64_t Max);
/// Errors name the field that is malformed.
llvm::Expected<Program> programFromJson(const nlohmann::json &J);

} // namespace sp

#endif // SP_PLAN_PROGRAM_H
