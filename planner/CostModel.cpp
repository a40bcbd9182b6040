//===- CostModel.cpp - Step time of a parallel layout on a cluster --------===//
#include "planner/CostModel.h"
#include "analysis/Cost.h"
#include "driver/LowerTraining.h"
#include "reports/CollectiveReport.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include <algorithm>
#include <nlohmann/json.hpp>

using namespace llvm;

namespace sp {

Expected<ClusterSpec> parseClusterSpec(StringRef Text) {
  nlohmann::json J = nlohmann::json::parse(Text.begin(), Text.end(), nullptr,
                                           /*allow_exceptions=*/false);
  if (J.is_discarded() || !J.is_object())
    return makeError("a cluster description is a JSON object");
  ClusterSpec C;
  struct Field {
    const char *Name;
    double *Value;
    bool AtMostOne;
  };
  const Field Numbers[] = {
      {"memory_bytes", &C.MemoryBytes, false},
      {"peak_flops", &C.PeakFlops, false},
      {"fp32_peak_flops", &C.Fp32PeakFlops, false},
      {"gemm_efficiency", &C.GemmEfficiency, true},
      {"hbm_bandwidth", &C.HbmBandwidth, false},
      {"intra_node_bandwidth", &C.IntraNodeBandwidth, false},
      {"intra_node_latency", &C.IntraNodeLatency, false},
      {"inter_node_bandwidth", &C.InterNodeBandwidth, false},
      {"inter_node_latency", &C.InterNodeLatency, false},
  };
  for (auto &Item : J.items()) {
    // (Named, not bound: a lambda below reads the key.)
    const std::string &Key = Item.key();
    const nlohmann::json &Value = Item.value();
    if (Key == "name") {
      if (!Value.is_string())
        return makeError("cluster field 'name' must be a string");
      C.Name = Value.get<std::string>();
      continue;
    }
    if (Key == "gpus_per_node") {
      if (!Value.is_number_integer() || Value.get<int64_t>() < 1 ||
          Value.get<int64_t>() > 1 << 20)
        return makeError("cluster field 'gpus_per_node' must be a positive "
                         "integer");
      C.GpusPerNode = Value.get<int>();
      continue;
    }
    const Field *F = std::find_if(
        std::begin(Numbers), std::end(Numbers),
        [&](const Field &X) { return Key == X.Name; });
    if (F == std::end(Numbers))
      return makeError(formatv("unknown cluster field '{0}' (known: name, "
                               "gpus_per_node, memory_bytes, peak_flops, "
                               "fp32_peak_flops, "
                               "gemm_efficiency, hbm_bandwidth, "
                               "intra_node_bandwidth, intra_node_latency, "
                               "inter_node_bandwidth, inter_node_latency)",
                               Key));
    // Latencies may be zero; everything else divides.
    bool Latency = StringRef(Key).endswith("latency");
    double V = Value.is_number() ? Value.get<double>() : -1;
    if (!Value.is_number() || !(Latency ? V >= 0 : V > 0) ||
        (F->AtMostOne && V > 1) || !std::isfinite(V))
      return makeError(formatv("cluster field '{0}' must be a {1} number{2}",
                               Key, Latency ? "non-negative" : "positive",
                               F->AtMostOne ? " at most 1" : ""));
    *F->Value = V;
  }
  return C;
}

Expected<ClusterSpec> readClusterSpec(StringRef Path) {
  auto Buf = MemoryBuffer::getFile(Path);
  if (!Buf)
    return makeError("cannot read cluster description '" + Path +
                     "': " + Buf.getError().message());
  auto C = parseClusterSpec((*Buf)->getBuffer());
  if (!C)
    return makeError(Path + ": " + toString(C.takeError()));
  return C;
}

double allReduceSeconds(double Bytes, int N, Link L, int Calls) {
  if (N <= 1)
    return 0;
  return 2.0 * (N - 1) / N * Bytes / L.Bandwidth +
         2.0 * (N - 1) * Calls * L.Latency;
}

double allGatherSeconds(double Bytes, int N, Link L, int Calls) {
  if (N <= 1)
    return 0;
  return double(N - 1) / N * Bytes / L.Bandwidth +
         double(N - 1) * Calls * L.Latency;
}

double reduceScatterSeconds(double Bytes, int N, Link L, int Calls) {
  return allGatherSeconds(Bytes, N, L, Calls);
}

Link groupLink(const ClusterSpec &C, int Stride, int N) {
  // Groups start at multiples of Stride within a span of Stride x N ranks;
  // all of them fit a node when the span does and tiles the node evenly.
  int64_t Span = int64_t(Stride) * N;
  bool Inside = N <= 1 || (Span <= C.GpusPerNode && C.GpusPerNode % Span == 0);
  return Inside ? Link{C.IntraNodeBandwidth, C.IntraNodeLatency}
                : Link{C.InterNodeBandwidth, C.InterNodeLatency};
}

static double tensorSeconds(const CollectiveBytes &B, int T, Link L) {
  return allReduceSeconds(B.AllReduce, T, L, B.AllReduceCalls) +
         allGatherSeconds(B.AllGather, T, L, B.AllGatherCalls) +
         reduceScatterSeconds(B.ReduceScatter, T, L, B.ReduceScatterCalls) +
         (T > 1 ? B.RingShift / L.Bandwidth + B.RingShiftCalls * L.Latency
                : 0);
}

/// Adds instructions [Begin, End) of P to W: their phase says forward or
/// backward; Weight puts the backward's GEMMs under WeightGradFlops.
/// Once: the instructions run once per step, not per microbatch.
static void addWork(const Program &P, int Begin, int End, bool Weight,
                    bool Once, StageWork &W) {
  auto Bytes = [&](int Id) { return double(P.Buffers[Id].Bytes); };
  for (int K = Begin; K < End; ++K) {
    const Instruction &I = P.Instrs[K];
    bool Forward = I.Ph == Phase::Forward;
    double F = gemmFlops(P, I);
    // A memory-bound instruction: every operand read, every result
    // written (an accumulate reads its result too; close enough).
    bool Moves = F == 0 &&
                 (defaultGroup(I.Op).empty() || I.Op == OpKind::RingConcat) &&
                 I.Op != OpKind::Send && I.Op != OpKind::Recv &&
                 I.Ph != Phase::Optimizer;
    double Traffic = 0;
    if (Moves)
      for (const auto *Ids : {&I.In, &I.Out})
        for (int Id : *Ids)
          Traffic += Bytes(Id);
    // The epilogue fusions (lower/FuseEpilogue.h) run on the GPU as the
    // pairs they replace, so their second pass moves its bytes still: the
    // GELU reads z and writes y; its gradient reads z and the product and
    // writes over the product; the add after a dropout reads and writes
    // the sum again.
    if (I.Op == OpKind::LinearGelu)
      Traffic += 2 * Bytes(I.Out[0]);
    else if (I.Op == OpKind::LinearGeluGrad)
      Traffic += 3 * Bytes(I.Out[0]);
    else if (I.Op == OpKind::DropoutAdd)
      Traffic += 2 * Bytes(I.Out[0]);
    // A causal product (lower/CausalProducts.h) runs whole on the GPU and
    // then zeroes its upper triangle in a pass over the result. (The CPU
    // skips the masked blocks instead; the GEMM's FLOPs stay the model's.)
    else if (I.Op == OpKind::BatchMatMul &&
             attrInt(I.Op, I.Attrs, "causal"))
      Traffic += 2 * Bytes(I.Out[0]);
    // Likewise a causal dropout's mask (draws not skipped there).
    else if (I.Op == OpKind::Dropout && I.Out.size() > 1 &&
             attrInt(I.Op, I.Attrs, "causal"))
      Traffic += 2 * Bytes(I.Out[1]);
    if (Once && I.Ph != Phase::Optimizer) {
      W.StepFlops += F;
      W.StepBytes += Traffic;
    } else if (I.Ph == Phase::Forward) {
      W.ForwardFlops += F;
      W.ForwardBytes += Traffic;
    } else if (I.Ph == Phase::Backward) {
      double Again = recomputeGemmFlops(P, I);
      W.RecomputeFlops += Again;
      (Weight ? W.WeightGradFlops : W.BackwardFlops) += F - Again;
      (Weight ? W.WeightGradBytes : W.BackwardBytes) += Traffic;
    } else if (I.Ph == Phase::Recompute) {
      W.RecomputeFlops += F;
      W.RecomputeBytes += Traffic;
    }
    if (I.Op == OpKind::AdamW)
      W.OptimizerBytes +=
          2 * std::min(Bytes(I.In[0]), Bytes(I.In[2])) + Bytes(I.In[1]) +
          2 * (Bytes(I.In[2]) + Bytes(I.In[3])); // ZeRO: the chunk
    if (I.Op == OpKind::Send && Forward)
      W.MessageBytes = std::max(W.MessageBytes, Bytes(I.In[0]));
    // Context parallelism's exchanges (reports/CollectiveReport.h); the
    // ring's run beside the attention's own GEMMs, the all-to-all's not.
    if (ContextTraffic CT = contextTraffic(P, I); CT.Parts > 1 && !Once) {
      (CT.Forward ? W.RingForwardBytes : W.RingBackwardBytes) += CT.RingBytes;
      (CT.Forward ? W.RingForwardMessages : W.RingBackwardMessages) +=
          CT.RingMessages;
      if (CT.RingMessages)
        (CT.Forward ? W.RingForwardFlops : W.RingBackwardFlops) += F;
      (CT.Forward ? W.AllToAllForwardBytes : W.AllToAllBackwardBytes) +=
          CT.AllToAllBytes;
      (CT.Forward ? W.AllToAllForwardMessages : W.AllToAllBackwardMessages) +=
          CT.AllToAllMessages;
    }
    if (defaultGroup(I.Op).empty())
      continue;
    std::string Group = collectiveGroup(I.Op, I.Attrs);
    double Moved = 0;
    for (int Id : I.Op == OpKind::ReduceScatter ? I.In : I.Out)
      Moved += Bytes(Id);
    if (Group == "dp" &&
        (I.Op == OpKind::AllReduce || I.Op == OpKind::ReduceScatter))
      W.GradientBytes += Moved;
    if (Group != "tp")
      continue;
    CollectiveBytes &C = Once      ? W.StepComm
                         : Forward ? W.ForwardComm
                                   : W.BackwardComm;
    if (I.Op == OpKind::AllReduce) {
      C.AllReduce += Moved;
      ++C.AllReduceCalls;
    } else if (I.Op == OpKind::AllGather) {
      C.AllGather += Bytes(I.Out[0]);
      ++C.AllGatherCalls;
    } else if (I.Op == OpKind::ReduceScatter) {
      C.ReduceScatter += Bytes(I.In[0]);
      ++C.ReduceScatterCalls;
    } else if (I.Op == OpKind::RingShift) {
      C.RingShift += Bytes(I.In[0]);
      ++C.RingShiftCalls;
    }
  }
}

std::vector<StageWork> planWork(const Plan &Pl) {
  int Ranks = Pl.numStages(), Chunks = 1;
  for (int R = 0; R < Ranks; ++R)
    for (const ProgramTemplate &T : Pl.stage(R).Templates)
      Chunks = std::max(Chunks, T.Chunk + 1);
  std::vector<StageWork> Work(Ranks * Chunks);
  for (int R = 0; R < Ranks; ++R) {
    const Program &P = Pl.stage(R);
    if (!P.compact()) {
      addWork(P, 0, P.Instrs.size(), /*Weight=*/false, /*Once=*/false,
              Work[R]);
      continue;
    }
    for (const ProgramTemplate &T : P.Templates)
      addWork(P, T.Begin, T.End, T.Kind == TemplateKind::WeightGrad,
              /*Once=*/T.Chunk < 0, Work[std::max(T.Chunk, 0) * Ranks + R]);
  }
  return Work;
}

Expected<StepEstimate> estimateStep(const ClusterSpec &C,
                                    const ParallelLayout &Y,
                                    ArrayRef<StageWork> Stages) {
  if (Y.T < 1 || Y.P < 1 || Y.M < 1 || Y.D < 1 || Y.C < 1 || Y.Microbatches < 1)
    return makeError(formatv("layout t {0} p {1} m {2} d {3} c {4} with {5} "
                             "microbatches: every size must be positive",
                             Y.T, Y.P, Y.M, Y.D, Y.C, Y.Microbatches));
  if (Y.CpAllToAll < 1 || Y.C % Y.CpAllToAll)
    return makeError(formatv("c {0} with all-to-all groups of {1}: the "
                             "groups must divide the cp ranks",
                             Y.C, Y.CpAllToAll));
  int V = Y.P * Y.M;
  if (int(Stages.size()) != V)
    return makeError(formatv("{0} stages of work for p {1} x m {2} = {3} "
                             "virtual stages",
                             Stages.size(), Y.P, Y.M, V));
  auto S = buildSchedule(Y.Schedule, Y.P, Y.M, Y.Microbatches);
  if (!S)
    return S.takeError();
  double Rate = C.PeakFlops * C.GemmEfficiency;
  Link Tensor = groupLink(C, 1, Y.T), Context = groupLink(C, Y.T, Y.C),
       Pipe = groupLink(C, Y.T * Y.C, Y.P),
       Replicas = groupLink(C, Y.T * Y.C * Y.P, Y.D);
  // Gradients are summed over the d x c ranks: a ring as slow as its
  // slowest link.
  Link Sums = Y.C == 1                                 ? Replicas
              : Y.D == 1                               ? Context
              : Replicas.Bandwidth < Context.Bandwidth ? Replicas
                                                       : Context;
  // Context parallelism: the all-to-all inside groups of A consecutive cp
  // ranks (A = C: the plain all-to-all), exposed; the ring across the C / A
  // groups (A = 1: the plain ring), beyond the attention GEMMs it overlaps.
  const int A = std::max(1, Y.CpAllToAll);
  const Link AllToAll = groupLink(C, Y.T, A),
             Ring = groupLink(C, Y.T * A, Y.C / A);
  auto RingExposed = [&](double Bytes, int Messages, double Flops) {
    double Comm = Bytes / Ring.Bandwidth + Messages * Ring.Latency;
    return std::max(0.0, Comm - Flops / Rate);
  };
  auto AllToAllSeconds = [&](double Bytes, int Messages) {
    return Bytes / AllToAll.Bandwidth + Messages * AllToAll.Latency;
  };
  bool Split = S->splitsBackward();
  StepCosts Costs;
  Costs.Forward.assign(V, 0);
  Costs.Backward.assign(V, 0);
  Costs.Recompute.assign(V, 0);
  Costs.WeightGrad.assign(V, 0);
  double Message = 0;
  StepEstimate E;
  // Per rank: its GEMMs and tensor collectives over the step, its
  // gradients' sum, its optimizer, and the backward of its last
  // microbatch (what a one-stage plan's sum overlaps).
  std::vector<double> Gemm(Y.P, 0), Mem(Y.P, 0), Comm(Y.P, 0), Sum(Y.P, 0),
      Update(Y.P, 0), LastBackward(Y.P, 0);
  double Hbm = C.HbmBandwidth;
  for (int K = 0; K < V; ++K) {
    const StageWork &W = Stages[K];
    int Rank = K % Y.P;
    double FwdComm =
        tensorSeconds(W.ForwardComm, Y.T, Tensor) +
        RingExposed(W.RingForwardBytes, W.RingForwardMessages,
                    W.RingForwardFlops) +
        AllToAllSeconds(W.AllToAllForwardBytes, W.AllToAllForwardMessages);
    double BwdComm =
        tensorSeconds(W.BackwardComm, Y.T, Tensor) +
        RingExposed(W.RingBackwardBytes, W.RingBackwardMessages,
                    W.RingBackwardFlops) +
        AllToAllSeconds(W.AllToAllBackwardBytes, W.AllToAllBackwardMessages);
    double WeightGrad = W.WeightGradFlops / Rate + W.WeightGradBytes / Hbm;
    Costs.Forward[K] = W.ForwardFlops / Rate + W.ForwardBytes / Hbm + FwdComm;
    Costs.Recompute[K] = W.RecomputeFlops / Rate + W.RecomputeBytes / Hbm;
    Costs.Backward[K] = W.BackwardFlops / Rate + W.BackwardBytes / Hbm +
                        BwdComm + (Split ? 0 : WeightGrad);
    Costs.WeightGrad[K] = Split ? WeightGrad : 0;
    double Flops = W.ForwardFlops + W.BackwardFlops + W.WeightGradFlops;
    Gemm[Rank] += Y.Microbatches * (Flops + W.RecomputeFlops) / Rate;
    Mem[Rank] += Y.Microbatches *
                 (W.ForwardBytes + W.BackwardBytes + W.RecomputeBytes +
                  W.WeightGradBytes) /
                 Hbm;
    Comm[Rank] += Y.Microbatches * (FwdComm + BwdComm);
    E.ModelFlops += double(Y.Microbatches) * Flops * Y.T * Y.C * Y.D;
    E.HardwareFlops +=
        double(Y.Microbatches) * (Flops + W.RecomputeFlops) * Y.T * Y.C * Y.D;
    // One ring over all of the stage's gradients (buckets pipeline).
    Sum[Rank] +=
        allReduceSeconds(W.GradientBytes, Y.D * Y.C, Sums, W.GradientBytes > 0);
    Update[Rank] += (W.OptimizerBytes + W.StepBytes) / Hbm +
                    W.StepFlops / Rate + tensorSeconds(W.StepComm, Y.T, Tensor);
    LastBackward[Rank] +=
        Costs.Recompute[K] + Costs.Backward[K] + Costs.WeightGrad[K];
    Message = std::max(Message, W.MessageBytes);
  }
  if (Y.P > 1)
    Costs.Comm = Message / Pipe.Bandwidth + Pipe.Latency;
  auto Times = simulateTimes(*S, Costs);
  if (!Times)
    return Times.takeError();
  E.PipelineSeconds = Times->Makespan;
  E.BubbleFraction = Times->bubbleFraction();
  double Tail = 0;
  for (int R = 0; R < Y.P; ++R) {
    double Exposed =
        Y.P == 1 ? std::max(0.0, Sum[R] - LastBackward[R]) : Sum[R];
    if (Exposed + Update[R] >= Tail) {
      Tail = Exposed + Update[R];
      E.DataParallelSeconds = Exposed;
      E.OptimizerSeconds = Update[R];
    }
    if (Gemm[R] + Mem[R] + Comm[R] >
        E.ComputeSeconds + E.MemoryBoundSeconds + E.TensorCommSeconds) {
      E.ComputeSeconds = Gemm[R];
      E.MemoryBoundSeconds = Mem[R];
      E.TensorCommSeconds = Comm[R];
    }
  }
  E.Seconds = E.PipelineSeconds + Tail;
  double Capacity = double(Y.gpus()) * C.PeakFlops * E.Seconds;
  E.Mfu = Capacity > 0 ? E.ModelFlops / Capacity : 0;
  E.Hfu = Capacity > 0 ? E.HardwareFlops / Capacity : 0;
  return E;
}

ParallelLayout layoutOf(const PassContext &Ctx) {
  const PipelineOptions &PO = Ctx.Pipeline;
  ParallelLayout Y;
  Y.T = Ctx.TensorParallel;
  Y.D = std::max(1, Ctx.DataParallel);
  Y.C = std::max(1, Ctx.ContextParallel);
  Y.CpAllToAll = Ctx.ContextComm == "a2a"        ? Y.C
                 : Ctx.ContextComm == "a2a+ring" ? Ctx.ContextAllToAll
                                                 : 1;
  if (PO.enabled()) {
    Y.P = PO.Stages;
    Y.M = PO.Interleave;
    Y.Microbatches = PO.Microbatches;
    Y.Schedule = scheduleKind(PO.Schedule);
  }
  return Y;
}

double gemmPeak(const ClusterSpec &C, DType Dtype) {
  return Dtype == DType::F32 ? C.Fp32PeakFlops : C.PeakFlops;
}

Expected<StepEstimate> estimatePlan(const ClusterSpec &C,
                                    const PassContext &Ctx, const Plan &P) {
  ClusterSpec M = C;
  M.PeakFlops = gemmPeak(C, Ctx.ActivationDtype);
  return estimateStep(M, layoutOf(Ctx), planWork(P));
}

} // namespace sp
