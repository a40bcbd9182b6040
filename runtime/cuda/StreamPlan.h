//===- StreamPlan.h - Which stream each instruction runs on ------*- C++ -*-===//
//
// The CUDA backend runs a program on two streams: computation (kernels,
// GEMMs) on the compute stream, and the collectives and pipeline messages
// (NCCL) on the communication stream, so that communication overlaps the
// computation that does not depend on it. The backend's contract
// (runtime/Backend.h) is that every call sees the effects of the calls
// before it, so where an instruction on one stream touches arena bytes an
// earlier instruction on the other stream touches (read after write, write
// after read, write after write), it must wait for an event recorded after
// that instruction.
//
// This is decided here, on the host and ahead of time, from the program
// alone, so it is unit-tested without a device (tests/gpu/HostLogicTest.cpp):
//
//  - the hazards are on arena byte ranges, not buffer ids, because the
//    memory plan reuses the bytes of dead temporaries for new ones;
//  - an instruction waits for at most one event per other stream: the last
//    conflicting instruction there (a stream runs in order, so that event
//    covers everything before it on that stream), and not at all when an
//    earlier wait of its stream already covers it;
//  - adamw updates its parameter and moments in place, and gather_param
//    (ZeRO) its parameter: their inputs count as written.
//
// With Overlap false every instruction goes on the compute stream (no
// events): the fallback and the reference ordering.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_STREAMPLAN_H
#define SP_RUNTIME_CUDA_STREAMPLAN_H

#include "plan/Program.h"
#include <cstdint>
#include <vector>

namespace sp::cuda {

enum class StreamKind : uint8_t { Compute = 0, Comm = 1 };
constexpr int NumStreams = 2;

/// Whether an op's work is communication (NCCL on the communication stream):
/// the tensor- and data-parallel collectives and the pipeline messages.
/// grad_norm and the vocabulary-parallel loss reduce a few scalars inside a
/// computation and stay on the compute stream; sp_split is a local copy.
bool isCommunication(OpKind Op);

struct StreamStep {
  StreamKind Stream = StreamKind::Compute;
  /// Instructions (indices, on other streams) whose recorded event this one
  /// waits for before it runs; at most one per other stream.
  std::vector<int> WaitFor;
  /// Whether an event is recorded after this instruction (some later
  /// instruction waits for it).
  bool RecordEvent = false;
};

struct StreamPlan {
  std::vector<StreamStep> Steps; // one per instruction
  int numWaits() const;
  int numEvents() const;
};

/// The arena byte range [Begin, End) an instruction reads or writes.
struct ByteRange {
  int64_t Begin, End;
  bool overlaps(const ByteRange &O) const {
    return Begin < O.End && O.Begin < End;
  }
};

/// The byte ranges instruction I reads and writes (the in-place operands
/// of adamw and gather_param count as written).
void instructionRanges(const Program &P, const Instruction &I,
                       std::vector<ByteRange> &Reads,
                       std::vector<ByteRange> &Writes);

StreamPlan planStreams(const Program &P, bool Overlap = true);

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_STREAMPLAN_H
