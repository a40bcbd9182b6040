//===- Executor.h - Runs a plan's program on a backend ---------*- C++ -*-===//
//
// Has its backend (runtime/Backend.h; the CPU one by default) allocate the
// plan's arena once (exactly ArenaBytes), loads the parameters into it,
// zeroes the optimizer state, feeds the inputs by role, and runs the
// program's instructions in order: each is a backend call (the pipeline
// messages too, over the pipeline group).
//
// A pipelined rank's compact program (plan/Program.h) runs step by step:
// each schedule step runs its template's instructions with every buffer at
// the step's instance (KernelCall::Where: a slot of its region, its
// microbatch's input, the step scratch) and the step's send and recv tags,
// dropout microbatch and first accumulate bound into a copy of the few
// instructions that have them. Nothing is written out per microbatch, so
// the executor holds the templates and one small table of instances, not
// microbatches x layers instructions. A backend that plans over the whole
// instruction list (the CUDA one) runs the program written out
// (expandProgram), which makes the same calls in the same order.
//
// Gradient rule: every instruction fully writes its outputs. Kernels that
// accumulate (weight, bias, embedding and LayerNorm-parameter gradients) get
// their output zeroed first; gradients of a value used twice are summed by
// explicit add instructions in the program.
//
// Dropout masks come from Philox keyed by (seed, layer, site, step, global
// element index): the same run seed and step give the same masks on any
// layout, and a new step gives new masks.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_EXECUTOR_H
#define SP_RUNTIME_EXECUTOR_H

#include "ir/ContextLayout.h"
#include "plan/Plan.h"
#include "runtime/Backend.h"
#include "runtime/DataLoader.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/ProcessGrid.h"
#include "llvm/Support/Error.h"
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>

namespace sp {

struct RunOptions {
  uint64_t Seed = 1234;
  /// Overrides every dropout ratio (0 turns dropout off).
  std::optional<double> Dropout;
  /// This rank's tensor-parallel group (not owned); null runs one rank.
  Communicator *Comm = nullptr;
  /// This rank's pipeline group (the same tensor-parallel rank of every
  /// stage; its rank is the stage); null for a plan without stages.
  Communicator *PipeComm = nullptr;
  /// This rank's data-parallel group (the replicas of its stage and
  /// tensor-parallel rank, and with context parallelism every context rank
  /// of each: runtime/comm/ProcessGrid.h); null without either.
  Communicator *DataComm = nullptr;
  /// This rank's context-parallel group (its replica's ranks that hold the
  /// other positions of the sequence); null without context parallelism.
  Communicator *ContextComm = nullptr;
  /// Record when every instruction of a training step starts and ends.
  bool Trace = false;
  /// Makes the backend the plan runs on; unset: the CPU backend.
  std::function<std::unique_ptr<Backend>()> MakeBackend;
  /// Accept a float64 plan (widenToFloat64): the tests' measure of float32
  /// rounding. Its views have Data64, not Data; checkpoints and exports,
  /// which hold float32, do not take them.
  bool AllowFloat64 = false;
  /// Run a compact (pipelined) program written out (expandProgram), as on a
  /// backend that does not run templates, instead of step by step over its
  /// templates; the two runs are the same calls in the same order.
  bool ExpandCompact = false;
};

/// One instruction's run, for a timeline (Chrome's trace format).
struct TraceEvent {
  int Instruction;
  double StartUs, DurationUs; // steady clock, shared by the processes of a host
  int64_t Step;
  /// Timed on the device: the stream it ran on (0 compute, 1
  /// communication); -1: timed on the host, around the call and a wait.
  int Stream = -1;
  /// A compact program's run: the schedule step that ran the instruction
  /// (Program::Steps), whose template holds it; -1 in a flat program.
  int ScheduleStep = -1;
};

struct MemoryStats {
  int64_t ArenaBytes = 0;      // allocated = the plan's planned peak
  int64_t PersistentBytes = 0; // parameters, optimizer state, inputs
  /// Measured while running: the highest arena address any instruction
  /// touched, and the largest sum of live temporaries at one instruction.
  int64_t HighWaterBytes = 0;
  int64_t PeakLiveTempBytes = 0;
  /// Measured in the last training step from the writes and reads the
  /// instructions made: the high-water mark of the stored activations
  /// (temporaries a forward instruction wrote and a backward or recompute
  /// instruction read, live from the write to the last read), and their
  /// bytes by the layer of their first backward-side reader (-1: outside the
  /// layers).
  int64_t StoredActivationBytes = 0;
  std::map<int, int64_t> StoredActivationBytesByLayer;
};

/// Wall time spent in each phase's instructions (forward, backward,
/// recompute, optimizer), summed over every training step so far.
struct TimeStats {
  double PhaseSeconds[4] = {0, 0, 0, 0};
  int64_t Steps = 0;
};

/// A named tensor in the arena (fp32 on the CPU backend): this rank's part
/// of it when Shard splits it.
struct TensorView {
  std::string Name;
  TensorType Type;
  float *Data; // null in a float64 run: Data64 holds it
  Sharding Shard;
  /// Shape of the whole tensor (the source parameter's shape).
  TensorType FullType;
  // With Shard.DataChunks (a ZeRO gradient), Data holds only this
  // data-parallel rank's flat chunk of the Type-shaped tensor: read it
  // through gather().
  /// A float64 run's data (RunOptions::AllowFloat64); null in a float32 run.
  double *Data64 = nullptr;
  /// The tensor is Data times Scale: a loss-scaled gradient's 1 / the loss
  /// scale, which gather() applies.
  double Scale = 1;
  int64_t size() const { return Type.numElements(); }
};

class Executor {
public:
  /// Checks the plan (fp32 activations, known ops), allocates the arena and
  /// loads the parameters. Errors name the parameter or the instruction.
  static llvm::Expected<std::unique_ptr<Executor>> create(const Plan &P,
                                                          RunOptions Opts);
  ~Executor();

  /// Token ids: [batch, seq] each. Token ids must be below vocab().
  int64_t batch() const { return Batch; }
  int64_t seq() const { return Seq; }
  /// Context parallelism: which positions of a row of seq() this rank's
  /// tokens, targets and logits hold (Parts 1 without), and its cp rank.
  const ContextLayout &context() const { return Context; }
  int contextRank() const { return ContextRank; }
  int64_t vocab() const { return Vocab; }

  /// One training step: forward, backward and the AdamW update with learning
  /// rate LR; Step is 1-based (AdamW bias correction, dropout stream).
  /// The loss is the mean cross entropy over the counted targets (those
  /// that are not IgnoreTarget), 0 when there are none.
  llvm::Expected<double> trainStep(const TokenBatch &B, double LR,
                                   int64_t Step);
  /// fp16's dynamic loss scaling (a plan with a "loss_scale" entry, as
  /// torch.amp.GradScaler and Megatron do it): the backward starts from the
  /// loss times Scale, the optimizer divides the gradients by it; a step
  /// whose gradients hold an inf or a nan updates nothing (not the weights,
  /// not the moments, not AdamW's step count), halves Scale and restarts
  /// the count; Interval clean steps in a row double it. Scale is a power
  /// of two, so scaling and unscaling are exact.
  struct LossScaling {
    double Scale = 1;
    int64_t Interval = 2000;
    int64_t GoodSteps = 0; // clean steps since the scale last changed
  };
  /// The plan's loss scaling, or none.
  const std::optional<LossScaling> &lossScaling() const { return Scaling; }
  /// Restores the scale and its count from a checkpoint (resuming).
  void restoreLossScaling(double Scale, int64_t GoodSteps) {
    if (Scaling) {
      Scaling->Scale = Scale;
      Scaling->GoodSteps = GoodSteps;
    }
  }
  /// Steps whose update was skipped so far (AdamW's step count is the step
  /// less these); a checkpoint keeps it.
  int64_t skippedUpdates() const { return Skipped; }
  void restoreSkippedUpdates(int64_t N) { Skipped = N; }
  /// Whether the last trainStep skipped its update (gradients overflowed).
  bool lastStepSkipped() const { return LastSkipped; }
  /// The global L2 norm of the last trainStep's gradients before clipping
  /// (over every rank's, unscaled), or NaN when the plan computes none (no
  /// gradient clipping).
  double lastGradNorm() const { return LastGradNorm; }

  /// The forward alone, without dropout and without an update: the loss.
  /// The logits stay readable (logits()) until the next call.
  llvm::Expected<double> evalLoss(const TokenBatch &B);

  /// The tensor views below point to host memory: into the arena when the
  /// backend's memory is the host's, else into a host mirror of it that
  /// download() refreshes (after a step, before reading views) and upload()
  /// writes back (parameters and optimizer state, after writing views, as a
  /// checkpoint restore does). Both are no-ops on a host-memory backend.
  llvm::Error download();
  llvm::Error upload();

  /// Parameters, by their ONNX initializer names, in plan order.
  std::vector<TensorView> parameters() const;
  /// The gradient of a parameter from the last trainStep (before clipping;
  /// gather() unscales a loss-scaled one).
  std::optional<TensorView> gradient(llvm::StringRef Param) const;
  /// AdamW moments ("adam.m.<param>", "adam.v.<param>").
  std::vector<TensorView> optimizerState() const;
  /// Where each tensor of parameters() and then optimizerState() (in that
  /// order) sits in the model, whatever the layout: for a checkpoint that
  /// another layout resumes (runtime/Checkpoint.h).
  struct ModelTensor {
    /// The parameter's name (a pipeline stage's copy of a tied weight, named
    /// "W@stage", is W), or for a moment "adam.m:" / "adam.v:" and its
    /// parameter's key; the moment's parameter is the one its adamw updates.
    std::string Key;
    /// The whole tensor's shape (the source parameter's).
    std::vector<int64_t> Whole;
    /// Its layout over the tensor-parallel group (a moment's is its
    /// parameter's), and with ZeRO over the replicas (DataChunks).
    Sharding Shard;
  };
  llvm::Expected<std::vector<ModelTensor>> modelTensors() const;
  /// The logits of the last evalLoss: of the whole batch (every
  /// microbatch's, in order) on the stage that computes them (the last);
  /// none on the other stages of a pipelined plan.
  std::optional<TensorView> logits() const;
  /// The whole tensor of a view, assembled from every rank's part (a
  /// collective: every rank of the group must call it, in the same order).
  llvm::Expected<std::vector<float>> gather(const TensorView &V) const;
  /// The same in float64, from a run of either precision.
  llvm::Expected<std::vector<double>> gather64(const TensorView &V) const;
  /// Whether the plan computes in float64.
  bool float64() const { return Wide; }
  int rank() const { return Comm->rank(); }
  int groupSize() const { return Comm->size(); }
  /// This rank's pipeline stage, and the number of stages.
  int stage() const { return PipeComm ? PipeComm->rank() : 0; }
  int numStages() const { return PipeComm ? PipeComm->size() : 1; }
  /// Microbatches per step (the batch is their concatenation).
  int64_t microbatches() const { return Microbatches; }
  MemoryStats memory() const { return Stats; }
  /// The backend's dense GEMM peak for the plan's compute type (FLOP/s;
  /// Backend::peakFlops), 0 when it does not know it.
  double peakFlops() const { return Back->peakFlops(ComputeDtype); }
  TimeStats timing() const { return Times; }
  /// With RunOptions::Trace: every instruction run so far.
  llvm::ArrayRef<TraceEvent> trace() const { return Events; }
  const Program &program() const { return Prog; }

private:
  Executor() = default;
  llvm::Error run(Phase Last, int64_t Step, bool Training);
  llvm::Error runInstruction(const Instruction &I, int64_t Step,
                             bool Training);
  /// A compact program: points Where and InstanceOf at schedule step K's
  /// instances and binds its template's instructions to the step.
  void enterStep(size_t K);
  /// Where buffer B is in the arena (in a compact program, this step's
  /// instance of it).
  char *at(int B) const {
    return Compact ? Where[B] : Arena + Prog.Buffers[B].Offset;
  }
  /// The instruction the backend runs for Prog.Instrs[I] (bound to this
  /// step in a compact program).
  const Instruction &instr(int I) const {
    return Compact && BoundOf[I] >= 0 ? Bound[BoundOf[I]] : Prog.Instrs[I];
  }
  /// Refuses a plan with an input the runtime cannot feed (no role, or a
  /// type its role does not allow).
  llvm::Error checkInputs() const;
  /// Writes every input by its role: tokens, targets and the attention
  /// mask from the batch, positions 0..seq-1, zero token types, each
  /// microbatch's loss weight, lr and step.
  llvm::Error feedInputs(const TokenBatch &B, double LR, int64_t Step);
  /// The f32 or f64 scalar in buffer B (this step's instance of it), read
  /// back from the backend.
  llvm::Expected<double> readReal(int B) const;
  /// The loss of the last step, read back from the backend.
  llvm::Expected<double> loss() const;
  /// Buffer's host memory: in the arena, or in the mirror.
  char *ptr(int Buffer) const;
  template <typename T>
  llvm::Expected<std::vector<T>> gatherAs(const TensorView &V) const;

  llvm::Error loadParameter(const ProgramBuffer &B);
  TensorView view(int Buffer, std::string Name) const;
  /// Points V at buffer B's data (Data or Data64, by the plan's precision).
  void setData(TensorView &V, int B) const;
  /// A flat program, or a pipelined rank's compact one, which runs step by
  /// step over its templates (or written out: RunOptions::ExpandCompact,
  /// or a backend that does not run templates).
  Program Prog;
  /// Set for a compact program: its instances and steps, each buffer's
  /// address and instance in the step running now, and the instructions a
  /// step binds (Bound[BoundOf[I]] is instruction I's, -1: none).
  std::optional<CompactRun> Compact;
  std::vector<char *> Where;
  std::vector<int> InstanceOf, BoundOf;
  std::vector<Instruction> Bound;
  /// The inputs to feed: every instance of a microbatch's input.
  struct Feed {
    int Buffer, Microbatch;
    int64_t Offset;
  };
  std::vector<Feed> Feeds;
  RunOptions Opts;
  TimeStats Times;
  std::vector<TraceEvent> Events;
  Communicator *PipeComm = nullptr;
  int64_t Microbatches = 1;
  /// Context parallelism (the plan's cp): which positions of each row of
  /// Seq this rank's token and target inputs hold; Parts 1 without.
  ContextLayout Context;
  int ContextRank = 0;
  /// --cp-comm a2a+ring: the cp group's all-to-all and ring groups.
  ContextGroupSplit ContextSplit;
  std::unique_ptr<Communicator> OwnComm;
  Communicator *Comm = nullptr;
  int64_t Batch = 0, Seq = 0, Vocab = 0;
  std::unique_ptr<Backend> Back;
  char *Arena = nullptr; // the backend's memory
  /// The host mirror of a device arena (empty on a host-memory backend).
  std::vector<char> Mirror;
  std::vector<char> Staging; // host bytes of one input on its way in
  MemoryStats Stats;
  int LogitsBuffer = -1;
  /// Per instruction of Prog: whether it writes the logits (the head's
  /// last forward instruction; a microbatch's in an unrolled program).
  std::vector<bool> WritesLogits;
  /// A pipelined or microbatched program's logits, one microbatch's
  /// buffer at a time (the arena reuses each after its last reader), copied
  /// here as evalLoss makes them: the whole batch's, microbatch-major.
  std::vector<char> EvalLogits;
  bool Unrolled = false; // a program unrolled over microbatches or stages
  bool Wide = false; // a float64 plan
  std::string ComputeDtype = "f32"; // the plan's "dtype"
  std::optional<LossScaling> Scaling;
  int64_t Skipped = 0;
  /// The factor the loss weights were fed with: the loss scale in a
  /// training step of a plan that scales, else 1.
  double FeedScale = 1;
  double LastGradScale = 1; // the last step's 1 / loss scale
  /// This step's gradients overflowed: its optimizer instructions are
  /// skipped.
  bool SkipUpdate = false, LastSkipped = false;
  double LastGradNorm = NAN;
  /// Set when the plan cannot train: the optimizer input it lacks.
  std::string MissingOptimizerInput;
};

} // namespace sp

#endif // SP_RUNTIME_EXECUTOR_H
