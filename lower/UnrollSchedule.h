//===- UnrollSchedule.h - A pipeline schedule into programs ----*- C++ -*-===//
//
// A pipelined training step is one program per pipeline rank, compact
// (plan/Program.h): a template for each of the rank's model chunks and step
// kinds (forward, backward, and with a split backward the weight-gradient
// part), lowered once over a symbolic microbatch with the sends and
// receives at the stage cuts and the accumulation of what the optimizer
// reads; a prologue (the 16-bit parameter copies) and an epilogue (the
// optimizer, the outputs); and the schedule's steps over them. So the plan
// grows with the model, not with microbatches x stages.
//
// Memory follows the schedule (lower/Finalize.cpp): a value one step makes
// and a later step of the same microbatch reads (a forward's activations,
// which its backward reads) lives in a slot of its chunk, one slot per
// microbatch in flight, the count the schedule gives; what lives within one
// step is scratch that every step reuses; the sums over microbatches and
// the parameter copies live for the whole step.
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_UNROLLSCHEDULE_H
#define SP_LOWER_UNROLLSCHEDULE_H

#include "lower/Schedule.h"
#include "plan/Program.h"
#include "llvm/ADT/DenseSet.h"
#include <vector>

namespace sp {

/// One compute step of a rank: the forward, backward or weight-gradient
/// part of the backward of model chunk Chunk (virtual stage Chunk * P +
/// rank) on one microbatch.
struct PipelineStep {
  StepKind Kind = StepKind::Forward; // Forward, Backward or WeightGrad
  int Microbatch = 0;
  int Chunk = 0;
};

struct PipelineLayout {
  int Stages = 1;       // P pipeline ranks
  int Chunks = 1;       // M model chunks per rank
  int Microbatches = 1; // N
  /// Backward steps run the input-gradient part of a stage's backward only,
  /// WeightGrad steps the rest (see splitBackward).
  bool SplitBackward = false;
  /// The compute steps of every rank, in schedule order.
  std::vector<std::vector<PipelineStep>> Steps;
};

/// Lowers a training graph whose nodes carry their virtual stage (the
/// pipeline pass's tags) into one compact program per pipeline rank
/// (finalizeProgram then plans its memory; expandProgram writes its steps
/// out).
///
/// - The model's batch is the microbatch: every per-microbatch input
///   (tokens, targets, positions, mask, token types, loss weight) is a
///   Microbatch buffer, instance K ("<name>.K") fed with microbatch K, and
///   dropouts learn their step's microbatch, so that their masks are those
///   of the whole batch.
/// - A value used on another stage than its producer's is sent right after
///   the step that makes it and received right before the step that needs
///   it (tag: microbatch and value), carrying its sharded shape.
/// - Values the optimizer reads (gradients) and the loss are summed over the
///   microbatches by accumulate instructions, in the order the steps run
///   (the first copies); each microbatch's loss is weighted by its loss_weight
///   input (its share of the step's counted targets), so the gradients and
///   the loss are the means over the whole batch.
/// - With a split backward, a Backward step runs the nodes the stage's
///   outgoing gradients depend on and a WeightGrad step the rest; each
///   gradient is still summed over the microbatches in microbatch order, so
///   a step's results are bitwise those of the unsplit schedule. An
///   all_gather of the Backward step whose result the WeightGrad step reads
///   (under SP, a row-parallel layer's output gradient) runs again in the
///   WeightGrad step, so that only its 1/t input waits between the two.
/// - Optimizer nodes run once after the last step on the rank of their
///   stage; grad_norm (stage -1) runs on every rank over that rank's
///   gradients and sums over the pipeline; the loss is broadcast from the
///   last stage.
llvm::Expected<std::vector<Program>>
lowerPipeline(const Graph &G, DType ActivationDtype, const PipelineLayout &L);

/// The program of one pipeline rank alone (for reports on schedules too
/// large to lower for every rank).
llvm::Expected<Program> lowerPipelineRank(const Graph &G,
                                          DType ActivationDtype,
                                          const PipelineLayout &L, int Rank);

/// The backward nodes of a split backward that belong to WeightGrad steps:
/// per virtual stage, the backward (and recompute) nodes that the gradients
/// it sends to the previous stage do not depend on (the weight gradients,
/// and what only they read). On the first stage, which sends nothing, that
/// is its whole backward. Nodes must carry their stages (the pipeline
/// pass's tags).
llvm::Expected<llvm::DenseSet<const Node *>>
weightGradNodes(const Graph &G, int NumStages);

/// Simulates the programs (a compact one step by step, its templates'
/// messages with each step's tags) with buffered sends and collectives that
/// wait for all their participants: fails when a rank would wait forever
/// (naming the ranks, steps and instructions that are stuck) or a message
/// is never received.
llvm::Error verifyPipelinePrograms(llvm::ArrayRef<Program> Programs);

} // namespace sp

#endif // SP_LOWER_UNROLLSCHEDULE_H
