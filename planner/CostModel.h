//===- CostModel.h - Step time of a parallel layout on a cluster -*- C++
//-*-===//
//
// The cost model of the auto-parallel planner (issue 16), stated in full. A
// layout is t (tensor), p (pipeline ranks) x m (chunks per rank), d (data
// replicas) and N microbatches per step; its work per virtual stage and
// microbatch (GEMM FLOPs, tensor-parallel collective bytes, the message to
// the next stage) comes from compiled programs, not from formulas. Then:
//
//   compute      GEMM FLOPs / (peak FLOP/s x GEMM efficiency), plus the
//                other instructions (norms, activations, softmax, dropout,
//                residual adds, the loss), which are memory-bound: the bytes
//                they read and write over the HBM bandwidth
//   tensor comm  ring collectives over the t ranks of a group (not overlapped
//                with the GEMMs): an all-reduce of S bytes takes
//                2 (t-1)/t S / B + 2 (t-1) L, an all-gather or reduce-scatter
//                (S: the gathered tensor) (t-1)/t S / B + (t-1) L, where B
//                and L are the bandwidth and latency of the link the group
//                uses: NVLink inside a node, the network across nodes
//   context      the ring of context parallelism (c ranks): each attention
//                passes its key/value block on c - 1 times forward and
//                2c - 1 times backward (with the key/value gradients), each
//                transfer S / B + L over the link of the cp group, overlapped
//                with that attention's own GEMMs: only what exceeds them is
//                exposed. The all-to-all (--cp-comm a2a) trades (c - 1) / c
//                of every tensor of the core, c - 1 messages each, exposed.
//                The hierarchical a2a+ring (--cp-a2a k) trades (k - 1) / k
//                of them over the link of its groups of k consecutive cp
//                ranks (exposed), then runs the ring across the c / k groups
//                over theirs, as above with c / k ranks
//   pipeline     a message of S bytes between neighbouring stages takes
//                S / B + L; the step's schedule (1F1B, interleaved, ZB-H1,
//                GPipe) is timed by the schedule simulator (lower/Schedule.h)
//                from each virtual stage's forward and backward times: its
//                makespan includes the bubble
//   data         a ring all-reduce of every gradient over the d replicas.
//                One stage: it overlaps the last microbatch's backward and
//                only what exceeds that is exposed. Pipelined: exposed, after
//                the last backward (where sp's pipelined plans run it)
//   optimizer    memory-bound: its HBM bytes (AdamW reads the fp32
//                parameter, gradient and moments and writes the parameter
//                and moments) over the HBM bandwidth
//   step         makespan + the largest rank's exposed data-parallel sum and
//                optimizer
//   MFU          forward and backward GEMM FLOPs of the step over
//                GPUs x peak x step time; HFU counts the recomputation too
//
// The world's ranks are laid out as sp-run lays them out: rank
// ((d P + p) C + c) T + t, so a tensor group is T consecutive ranks, context
// neighbours are T apart, pipeline neighbours T C apart and replicas T C P
// apart; a group lies inside a node when every rank of it does. Gradients
// are summed over the d x c ranks of a (p, t).
//
//===----------------------------------------------------------------------===//
#ifndef SP_PLANNER_COSTMODEL_H
#define SP_PLANNER_COSTMODEL_H

#include "lower/Schedule.h"
#include "passes/Pass.h"
#include "plan/Plan.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <string>

namespace sp {

/// A cluster of identical GPUs in nodes. The defaults describe the paper's
/// machine: DGX A100 80GB nodes (8 GPUs, NVLink 3, one 200 Gb/s HDR
/// InfiniBand port per GPU).
struct ClusterSpec {
  std::string Name = "DGX A100 80GB";
  int GpusPerNode = 8;
  double MemoryBytes = 80.0 * (1ull << 30);
  /// Dense fp16/bf16 tensor-core FLOP/s of one GPU, and its float32 FLOP/s
  /// (without TF32): an fp32 plan is estimated at the latter.
  double PeakFlops = 312e12, Fp32PeakFlops = 19.5e12;
  /// The fraction of PeakFlops that the large GEMMs of a layer reach.
  double GemmEfficiency = 0.75;
  /// Bytes per second of one GPU's memory.
  double HbmBandwidth = 2.039e12;
  /// Bytes per second, each direction, and seconds per message: NVLink
  /// inside a node, the network between nodes (per GPU).
  double IntraNodeBandwidth = 300e9, IntraNodeLatency = 5e-6;
  double InterNodeBandwidth = 25e9, InterNodeLatency = 10e-6;
};

/// A cluster described in JSON: an object with any of "name",
/// "gpus_per_node", "memory_bytes", "peak_flops", "fp32_peak_flops",
/// "gemm_efficiency",
/// "hbm_bandwidth", "intra_node_bandwidth", "intra_node_latency",
/// "inter_node_bandwidth", "inter_node_latency" (bytes, FLOP/s, bytes/s,
/// seconds); the rest keep the defaults. An unknown field, a value of the
/// wrong type, or a value that is not positive (an efficiency above 1) is an
/// error naming the field.
llvm::Expected<ClusterSpec> parseClusterSpec(llvm::StringRef Json);
llvm::Expected<ClusterSpec> readClusterSpec(llvm::StringRef Path);

/// A link: bytes per second and seconds per message.
struct Link {
  double Bandwidth, Latency;
};

/// Calls ring collectives moving S bytes in all over N ranks (S: the whole
/// tensors, the all-gathers' results, the reduce-scatters' inputs); 0 for
/// N = 1. Each call pays the latency of its N - 1 (all-reduce: 2 (N - 1))
/// ring steps.
double allReduceSeconds(double Bytes, int N, Link L, int Calls = 1);
double allGatherSeconds(double Bytes, int N, Link L, int Calls = 1);
double reduceScatterSeconds(double Bytes, int N, Link L, int Calls = 1);

/// The parallel layout.
struct ParallelLayout {
  int T = 1, P = 1, M = 1, D = 1;
  /// Context-parallel ranks per replica (--cp), and its all-to-all
  /// groups' size: 1 (the ring), C (--cp-comm a2a) or K (a2a+ring).
  int C = 1, CpAllToAll = 1;
  int Microbatches = 1;
  ScheduleKind Schedule = ScheduleKind::OneFOneB;
  int gpus() const { return T * P * C * D; }
};

/// The link a group of N ranks Stride apart uses (world rank layout above):
/// NVLink when every group of them lies inside a node, else the network.
Link groupLink(const ClusterSpec &C, int Stride, int N);

/// Tensor-parallel collectives per microbatch: bytes of each kind and how
/// many calls move them.
struct CollectiveBytes {
  double AllReduce = 0, AllGather = 0, ReduceScatter = 0;
  int AllReduceCalls = 0, AllGatherCalls = 0, ReduceScatterCalls = 0;
  /// collective-matmul's ring shifts: the bytes each sends to its neighbour
  /// (t - 1 of them carry an all-gather's), one latency each. The model
  /// adds them to the step like the other collectives: it credits no
  /// overlap, here or beside the backward's GEMMs.
  double RingShift = 0;
  int RingShiftCalls = 0;
};

/// One virtual stage's work on one of its ranks (the t ranks of a stage do
/// the same), per microbatch unless said otherwise.
struct StageWork {
  double ForwardFlops = 0, BackwardFlops = 0, RecomputeFlops = 0;
  /// With a split backward (ZB-H1): the weight-gradient part, not counted
  /// in BackwardFlops.
  double WeightGradFlops = 0;
  /// HBM bytes the memory-bound instructions read and write, by the same
  /// parts.
  double ForwardBytes = 0, BackwardBytes = 0, RecomputeBytes = 0,
         WeightGradBytes = 0;
  /// The forward's collectives, and the backward's (with its
  /// recomputation's).
  CollectiveBytes ForwardComm, BackwardComm;
  /// The activation this stage sends to the next (and receives its
  /// gradient back); 0 for the last.
  double MessageBytes = 0;
  /// Context parallelism's ring (reports/CollectiveReport.h), per
  /// microbatch: the bytes one rank sends to the next, the messages, and
  /// the attention GEMM FLOPs each transfer overlaps, forward and backward.
  double RingForwardBytes = 0, RingBackwardBytes = 0;
  int RingForwardMessages = 0, RingBackwardMessages = 0;
  double RingForwardFlops = 0, RingBackwardFlops = 0;
  /// Its all-to-all (--cp-comm a2a, a2a+ring): the bytes one rank sends
  /// and the messages, not overlapped.
  double AllToAllForwardBytes = 0, AllToAllBackwardBytes = 0;
  int AllToAllForwardMessages = 0, AllToAllBackwardMessages = 0;
  /// Per step: the gradients summed over the replicas, and the optimizer's
  /// HBM traffic.
  double GradientBytes = 0, OptimizerBytes = 0;
  /// Per step, outside the microbatches (a pipelined rank's prologue and
  /// epilogue: the 16-bit parameter copies, sums over the tensor group):
  /// HBM bytes of memory-bound instructions, GEMM FLOPs, collectives.
  double StepBytes = 0, StepFlops = 0;
  CollectiveBytes StepComm;
};

/// The work of each virtual stage of a compiled plan, per microbatch, as
/// estimateStep takes it (stage c P + r: chunk c of pipeline rank r's
/// templates; one stage for a plan without a pipeline), counted from the
/// programs' instructions: GEMM FLOPs by phase (a fused attention's
/// backward recomputes its scores: recompute FLOPs) and by template (a
/// ZB-H1 weight-gradient template's are WeightGradFlops), the "tp"
/// collectives' bytes and calls, the forward's sends, the "dp" gradient
/// sums (all-reduce operands, reduce-scatter inputs) and AdamW's HBM
/// traffic (parameter and moments read and written, gradient read). A
/// rank's sums, optimizer, prologue and epilogue go to its first chunk, the
/// last two as once-per-step work.
std::vector<StageWork> planWork(const Plan &P);

/// What a step costs, in seconds, and the utilization it gives.
struct StepEstimate {
  double Seconds = 0;
  /// The schedule's makespan (compute, tensor collectives, messages and
  /// the bubble), and its bubble fraction (lower/Schedule.h).
  double PipelineSeconds = 0, BubbleFraction = 0;
  /// Of the busiest rank, over the step: GEMMs, memory-bound instructions
  /// and tensor collectives.
  double ComputeSeconds = 0, MemoryBoundSeconds = 0, TensorCommSeconds = 0;
  /// The exposed data-parallel sum, and the optimizer with the rest of the
  /// once-per-step work (the largest rank's).
  double DataParallelSeconds = 0, OptimizerSeconds = 0;
  /// Counted GEMM FLOPs of the step over all GPUs: forward and backward,
  /// and with the recomputation.
  double ModelFlops = 0, HardwareFlops = 0;
  double Mfu = 0, Hfu = 0;
};

/// The step time of layout Y on cluster C, given the work of each of its
/// P M virtual stages (stage c P + r is chunk c of rank r). Errors on a
/// layout the schedule cannot run (N not a multiple of P when interleaved,
/// a wrong number of stages, a non-positive size).
llvm::Expected<StepEstimate> estimateStep(const ClusterSpec &C,
                                          const ParallelLayout &Y,
                                          llvm::ArrayRef<StageWork> Stages);

/// The layout a plan compiled with Ctx runs (its t, p, m, d, microbatches
/// and schedule).
ParallelLayout layoutOf(const PassContext &Ctx);

/// The GEMM peak C gives a plan of activations Dtype: the 16-bit tensor-core
/// peak, or the float32 one for an fp32 plan.
double gemmPeak(const ClusterSpec &C, DType Dtype);

/// The step of plan P, compiled with Ctx, on C: estimateStep of its
/// layout and its stages' work (planWork), at its dtype's GEMM peak.
llvm::Expected<StepEstimate> estimatePlan(const ClusterSpec &C,
                                          const PassContext &Ctx,
                                          const Plan &P);

} // namespace sp

#endif // SP_PLANNER_COSTMODEL_H
