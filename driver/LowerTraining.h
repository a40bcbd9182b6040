//===- LowerTraining.h - A compiled training graph to programs --*- C++ -*-===//
//
// The last step of sp-compile: the training graph becomes the programs a
// plan holds. Without pipeline options that is one program; with them, the
// schedule (lower/Schedule.h) is lowered into one compact program per pipeline
// rank (lower/UnrollSchedule.h). Every program's memory is planned.
//
//===----------------------------------------------------------------------===//
#ifndef SP_DRIVER_LOWERTRAINING_H
#define SP_DRIVER_LOWERTRAINING_H

#include "passes/Pass.h"
#include "lower/Schedule.h"
#include "lower/UnrollSchedule.h"

namespace sp {

struct LoweredPlan {
  /// One program per pipeline rank (one without pipeline options).
  std::vector<Program> Stages;
  /// One microbatch through the whole model, for the per-layer reports
  /// (with pipeline options, only when asked for: see lowerTrainingGraph).
  Program OneMicrobatch;
  /// The schedule the stage programs run (one rank, one microbatch
  /// without pipeline options).
  Schedule Sched;
};

/// Lowers G. With pipeline options the programs are checked to be free of
/// deadlocks (verifyPipelinePrograms), and OneMicrobatch, which only the
/// reports read, is lowered when WithOneMicrobatch (else it is left empty:
/// lowerOneMicrobatch makes it later).
llvm::Expected<LoweredPlan> lowerTrainingGraph(const Graph &G,
                                               const PassContext &Ctx,
                                               bool WithOneMicrobatch = true);

/// LP.OneMicrobatch, lowered from G, when lowerTrainingGraph left it empty.
llvm::Error lowerOneMicrobatch(const Graph &G, const PassContext &Ctx,
                               LoweredPlan &LP);

ScheduleKind scheduleKind(PipelineSchedule S);

/// The compute steps of a schedule, as lowerPipeline takes them.
PipelineLayout computeSteps(const Schedule &S);

} // namespace sp

#endif // SP_DRIVER_LOWERTRAINING_H
