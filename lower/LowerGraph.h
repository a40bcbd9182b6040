//===- LowerGraph.h - A training graph to one program -----------*- C++ -*-===//
//
// Lowering without pipeline stages: one instruction per node in program
// order, one buffer per value (the pipelined unrolling is UnrollSchedule.h).
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_LOWERGRAPH_H
#define SP_LOWER_LOWERGRAPH_H

#include "plan/Program.h"

namespace sp {

/// Lowers a training graph. Activation buffers of a floating-point type are
/// sized with ActivationDtype (layer_norm statistics, logits and the loss
/// stay f32, as the paper counts them); kernels compute in the IR's type.
llvm::Expected<Program> lowerGraph(const Graph &G, DType ActivationDtype);

} // namespace sp

#endif // SP_LOWER_LOWERGRAPH_H
