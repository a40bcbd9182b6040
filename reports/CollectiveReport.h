//===- CollectiveReport.h - Bytes each rank moves per layer ----*- C++ -*-===//
//
// Computed from the lowered program: every all_reduce, all_gather and
// reduce_scatter instruction, with the bytes one rank sends under ring
// algorithms on a group of t:
//
//   all_reduce      2 (t - 1) / t * bytes of the tensor
//   all_gather      (t - 1) / t * bytes of the gathered (full) tensor
//   reduce_scatter  (t - 1) / t * bytes of the full input
//
// (the bytes use the plan's activation dtype). Communication recomputation
// (the backward all-gathers that rebuild a saved sequence shard) is counted
// apart from the forward and backward conjugates, so that TP and TP+SP can
// be compared as the paper does: both move 8 (t - 1) / t * s*b*h*bytes per
// layer in their conjugate collectives. The collectives the plan runs
// beside a GEMM (lower/Overlap.h) are named with it.
//
//===----------------------------------------------------------------------===//
#ifndef SP_REPORTS_COLLECTIVEREPORT_H
#define SP_REPORTS_COLLECTIVEREPORT_H

#include "plan/Program.h"
#include "llvm/Support/raw_ostream.h"
#include <nlohmann/json.hpp>
#include <vector>

namespace sp {

struct CollectiveUse {
  OpKind Op;
  std::string Role;
  Phase Ph;
  bool Regather = false;
  int64_t Bytes = 0; // sent per rank
  /// The GEMM it runs beside (lower/Overlap.h), "op role"; empty: none.
  std::string Beside;
};

struct LayerCollectives {
  int Layer = -1; // -1: embedding, head, gradient sums
  int64_t Forward = 0, Backward = 0, Regather = 0;
  /// Of these, the bytes of the collectives that run beside a GEMM.
  int64_t Overlapped = 0;
  std::vector<CollectiveUse> Uses;
};

/// Per layer (index Layer + 1, so the non-layer part is first), for a group
/// of T ranks.
std::vector<LayerCollectives> collectiveReport(const Program &P, int T);

/// What one attention instruction {cp > 1} sends per rank (Parts 1, nothing,
/// for any other instruction): the all-to-all's bytes and messages (nothing
/// overlaps them; over the all-to-all group), the ring's (beside the
/// instruction's own GEMMs; over the ring), and what it holds in flight.
/// The report above and the cost model (planner/CostModel.h) both read it.
struct ContextTraffic {
  int Parts = 1;
  /// The all-to-all group's size: 1 (the ring), C (a2a) or K (a2a+ring).
  int AllToAll = 1;
  bool Forward = false;
  int64_t AllToAllBytes = 0, RingBytes = 0, InFlightBytes = 0;
  int AllToAllMessages = 0, RingMessages = 0;
  /// The ring's key/value block, and of RingMessages those that carry its
  /// dK, dV sums (the backward's).
  int64_t BlockBytes = 0;
  int RingGradientMessages = 0;
};
/// Context parallelism's exchanges (runtime/cpu/ContextAttention.h), read off
/// the attention instructions {cp > 1} of one microbatch's program: each
/// rank sends its key/value block on C - 1 times in the forward; in the
/// backward the block again C - 1 times and its key/value gradients C times
/// (the last shift hands them to their owner). Bytes in the plan's dtype.
/// The ring holds the block it computes on and the one arriving: 2 key/value
/// blocks in flight (4 with their gradients in the backward), outside the
/// planned arena. The all-to-all (--cp-comm a2a, group of C; a2a+ring,
/// groups of K) sends (K - 1) / K of the tensors it trades (q, k, v out and
/// o, lse back; the backward's do, q, k, v, o, lse out and dq, dk, dv
/// back), and holds the rank's heads of its group's positions in flight;
/// a2a+ring's ring then passes the traded key/value block (the same bytes
/// as the rank's own) around C / K groups.
struct ContextRing {
  int Parts = 1;
  bool Zigzag = false;
  /// The all-to-all group's size: 1 (the ring), C (a2a) or K (a2a+ring).
  int AllToAll = 1;
  int64_t PositionsPerRank = 0;
  int Layers = 0;         // attention instructions in the forward
  int64_t BlockBytes = 0; // one layer's key and value block on the ring
  /// Sent per rank, all layers: by the ring, and by the all-to-all.
  int64_t ForwardBytes = 0, BackwardBytes = 0;
  int64_t AllToAllForwardBytes = 0, AllToAllBackwardBytes = 0;
  int64_t InFlightBytes = 0; // the backward's, one layer
  /// One attention layer's traffic (the program's last), forward and
  /// backward: the report's transfers in order.
  ContextTraffic ForwardLayer, BackwardLayer;
  /// The ring's participants: C / all-to-all size.
  int ringSize() const { return Parts / AllToAll; }
  /// "ring", "a2a" or "a2a+ring".
  const char *comm() const;
};
/// Parts 1 when the program has no ring.
ContextRing contextRingReport(const Program &P);

ContextTraffic contextTraffic(const Program &P, const Instruction &I);
nlohmann::json contextRingToJson(const ContextRing &R);
void printContextRing(const ContextRing &R, llvm::raw_ostream &OS);

nlohmann::json collectivesToJson(const std::vector<LayerCollectives> &R);
void printCollectives(const std::vector<LayerCollectives> &R, int T,
                      llvm::raw_ostream &OS);

} // namespace sp

#endif // SP_REPORTS_COLLECTIVEREPORT_H
