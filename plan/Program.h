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
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sp {

/// Bumped whenever the plan format changes; sp-run refuses other versions.
constexpr int PlanFormatVersion = 4;

/// How many instances of a buffer a run of a compact program makes (see
/// Program::Templates); every buffer of a flat program is Whole.
enum class BufferScope : uint8_t {
  Whole,      // one for the whole run
  Step,       // one per step that runs its template: scratch, reused
  Slot,       // one per microbatch in flight in its region (Program::Slots)
  Microbatch, // an input fed per microbatch: instance k at Offset + k Stride
};

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
  sp::Role Role = sp::Role::None;
  /// Input: what the runtime feeds it with, and for a pipelined plan the
  /// microbatch whose rows it holds (-1: the whole batch, or not batched).
  InputRole Feed = InputRole::None;
  int Microbatch = -1;
  /// In a compact program: how many instances the run makes. A Slot
  /// buffer's Offset is within a slot of its region; a Step buffer's is in
  /// the scratch region all steps share; a Microbatch input's instances are
  /// Stride bytes apart.
  BufferScope Scope = BufferScope::Whole;
  int Region = -1; // Slot: its index in Program::Slots
  int64_t Stride = 0;
  bool isPersistent() const { return K != Temp; }
};

struct Instruction {
  OpKind Op;
  llvm::SmallVector<int, 4> In, Out; // buffer ids
  AttrList Attrs;
  int Layer = -1;
  sp::Role Role = sp::Role::None;
  Phase Ph = Phase::Forward;
  std::string Name;
  /// A collective: the index of the later GEMM it runs beside
  /// (lower/Overlap.h); the two touch disjoint arena bytes. -1: none.
  int Beside = -1;
};

/// What a template of a compact program runs: the casts of the parameters
/// before the first step, a chunk's forward, backward or weight-gradient
/// part of the backward on one microbatch, or the optimizer and the
/// outputs after the last step.
enum class TemplateKind : uint8_t {
  Prologue,
  Forward,
  Backward,
  WeightGrad,
  Epilogue
};
llvm::StringRef templateKindName(TemplateKind K); // "forward", ...
/// As program.json spells them: "input", "param", ..., and "whole",
/// "step", "slot", "microbatch".
llvm::StringRef bufferKindName(ProgramBuffer::Kind K);
llvm::StringRef bufferScopeName(BufferScope S);

struct ProgramTemplate {
  TemplateKind Kind = TemplateKind::Forward;
  int Chunk = -1;         // -1 for the prologue and the epilogue
  int Begin = 0, End = 0; // its instructions: Instrs[Begin, End)
};

/// One step of a compact program's run: Template on Microbatch (-1 for the
/// prologue and the epilogue).
struct ProgramStep {
  int Template = 0;
  int Microbatch = -1;
};

/// The slots of one region: Count copies of its Slot buffers, Stride bytes
/// apart from Offset. A region holds the values of one model chunk that one
/// step kind makes and a later one reads last (a forward's activations its
/// backward reads; with a split backward also forward to weight gradient,
/// and backward to weight gradient), so each lives as many steps as the
/// schedule keeps it. A microbatch takes the lowest free slot of a region
/// at its first step that uses the region and frees it after its last
/// (assignSlots).
struct SlotRegion {
  int Chunk = 0;
  int64_t Offset = 0, Stride = 0;
  int Count = 0;
};

/// A program is flat (an instruction list run once per training step) or
/// compact: a pipelined rank's program as templates over the schedule's
/// steps (lower/UnrollSchedule.h). A compact program's Instrs are its
/// templates one after another; a run binds each step's template to that
/// step's microbatch and slot (bindStep): send and recv tags gain
/// Microbatch x TagStride, dropouts learn their microbatch, and each
/// accumulate is told whether it is the first of its template's steps. The
/// CPU executor runs the steps so (prepareCompactRun); expandProgram
/// writes them out as a flat program, for the CUDA backend and the tests.
struct Program {
  std::vector<ProgramBuffer> Buffers;
  std::vector<Instruction> Instrs;
  std::vector<ProgramTemplate> Templates; // empty: a flat program
  std::vector<ProgramStep> Steps;
  std::vector<SlotRegion> Slots;
  int Microbatches = 1;
  int64_t TagStride = 1;
  bool compact() const { return !Templates.empty(); }
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

/// The flat program a compact program runs (a flat program is returned as
/// it is): every step's template instructions with the step's buffer
/// instances, their live ranges, and the offsets the compact memory plan
/// gives them, as prepareCompactRun finds and checks them. Errors name what
/// is inconsistent (a step's template, slot or microbatch out of range, a
/// slot buffer of another chunk, an instance outside the arena, two live
/// buffers sharing bytes).
llvm::Expected<Program> expandProgram(const Program &C);

/// A buffer instance of a compact program as it runs (expandProgram makes
/// one buffer of each): compact buffer Buffer for Microbatch (-1 for a
/// whole-run buffer), at Offset in the arena.
struct InstanceInfo {
  int Buffer;
  int Microbatch;
  int64_t Offset;
};

/// One instruction of a compact program as it runs: template instruction
/// Instr of step Step, at Position in the written-out program; Instance
/// maps a compact buffer id to its instance there.
struct StepInstr {
  int Step, Instr, Position;
  llvm::function_ref<int(int)> Instance;
};

/// Walks a compact program's steps in order without writing them out (what
/// expandProgram and the plan's memory analyses share). Instances are
/// numbered 0, 1, ... in the order Made is called: the whole-run and input
/// buffers' first, then a slot buffer's at its microbatch's first step that
/// uses it, and a step buffer's in each step that uses it. Checks the
/// program first (checkCompactProgram, assignSlots); returns the instance
/// of each of its outputs.
llvm::Expected<std::vector<int>>
walkSteps(const Program &C,
          llvm::function_ref<void(const InstanceInfo &)> Made,
          llvm::function_ref<void(const StepInstr &)> Visit);

/// The slot of every region each step of a compact program uses: Slot[K]
/// lists (region, slot) for step K. Errors when a region has more
/// microbatches in flight than its Count (with CheckCounts), or a step uses
/// a region of another chunk. With CheckCounts false it only measures:
/// Counts[R] is the most slots region R needs.
struct SlotAssignment {
  std::vector<llvm::SmallVector<std::pair<int, int>, 3>> Slot;
  std::vector<int> Counts;
};
llvm::Expected<SlotAssignment> assignSlots(const Program &C,
                                           bool CheckCounts = true);

/// Sets the live range of every temporary Pick selects from its uses: from
/// the first instruction that reads or writes it (an accumulate writes its
/// operand) to the last, a collective's operands and results until the
/// GEMM it runs beside, an output past the end; [0, 0] when unused. Names
/// every temporary, picked or not, "%<its id>".
void setUseRanges(Program &P,
                  llvm::function_ref<bool(const ProgramBuffer &)> Pick);

/// How a compact program runs without being written out: what the executor
/// keeps instead of expandProgram's flat program. A position counts the
/// instructions in run order, step by step, as in the written-out program.
struct CompactRun {
  struct Instance {
    int Buffer, Microbatch; // as InstanceInfo
    int64_t Offset;
    /// Live range in positions, as setUseRanges gives the written-out
    /// program's buffer: a temporary's from its first use to its last (an
    /// output's to the end); a persistent buffer's the whole run.
    int Def, LastUse;
  };
  std::vector<Instance> Instances;
  /// Per buffer: its instance when it is whole-run, else -1.
  std::vector<int> WholeInstance;
  /// Per step: the position of its first instruction; back() = positions.
  std::vector<int> StepBegin;
  /// Per step K: Uses[UseBegin[K], UseBegin[K + 1]) lists (buffer,
  /// instance) for every buffer of another scope its template uses.
  std::vector<int> UseBegin;
  std::vector<std::pair<int, int>> Uses;
  /// The instance of each of Program::Outputs.
  std::vector<int> Outputs;
  /// Per template: the first step that runs it (-1: none).
  std::vector<int> FirstStep;
  int positions() const { return StepBegin.back(); }
};

/// Walks a compact program's steps once (walkSteps) and, with CheckPlaces,
/// checks that no two live instances share a byte and that every instance
/// lies in the arena (what a run relies on; the compiler's own analyses of
/// a program it has just planned skip it). Errors name what is
/// inconsistent.
llvm::Expected<CompactRun> prepareCompactRun(const Program &C,
                                             bool CheckPlaces = true);

/// What a step changes in a template instruction T when it runs it on
/// Microbatch (-1: the prologue or epilogue) into X, a copy of T: send and
/// recv tags gain Microbatch x TagStride, an op over microbatches learns
/// its microbatch, and an accumulate whether it runs in its template's
/// first step.
void bindStep(const Instruction &T, int Microbatch, int64_t TagStride,
              bool FirstStep, Instruction &X);
/// Whether bindStep may change T.
bool bindsPerStep(const Instruction &T);

/// Checks a compact program's templates, steps, slots and buffer scopes
/// (what expandProgram relies on).
llvm::Error checkCompactProgram(const Program &C);

/// Fails when two temporaries live at the same instruction share a byte of
/// the arena, naming them.
llvm::Error checkNoOverlap(const Program &P);

} // namespace sp

#endif // SP_PLAN_PROGRAM_H
