//===- Executor.cpp - Runs a plan's program on a backend ------------------===//
#include "runtime/Executor.h"
#include "runtime/TensorLayout.h"
#include "runtime/cpu/CpuBackend.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/FormatVariadic.h"
#include <chrono>
#include <cmath>
#include <cstring>

using namespace llvm;

namespace sp {

namespace {

std::string describe(const Instruction &I, size_t Index) {
  std::string S = formatv("instruction {0} ({1}", Index, opName(I.Op)).str();
  if (I.Layer >= 0)
    S += formatv(", layer {0}", I.Layer).str();
  if (I.Role != Role::None)
    S += ", " + roleName(I.Role).str();
  return S + ", " + phaseName(I.Ph).str() + ")";
}

/// The first of lr and step the program has no input for ("" if both).
std::string missingOptimizerInput(const Program &Prog) {
  for (InputRole R : {InputRole::LearningRate, InputRole::Step})
    if (none_of(Prog.Buffers, [&](const ProgramBuffer &B) {
          return B.K == ProgramBuffer::Input && B.Feed == R;
        }))
      return inputRoleName(R).str();
  return "";
}

} // namespace

Executor::~Executor() {
  if (Back && Arena)
    Back->release(Arena);
}

char *Executor::ptr(int Buffer) const {
  assert(Buffer >= 0 && size_t(Buffer) < Prog.Buffers.size());
  char *Base = Mirror.empty() ? Arena : const_cast<char *>(Mirror.data());
  return Base + Prog.Buffers[Buffer].Offset;
}

/// Writes V into a real-valued scalar or element of type T (f32 or f64).
static void writeReal(char *Dst, DType T, double V) {
  if (T == DType::F64)
    *reinterpret_cast<double *>(Dst) = V;
  else
    *reinterpret_cast<float *>(Dst) = float(V);
}

Error Executor::download() {
  if (Mirror.empty())
    return Error::success();
  return Back->copyToHost(Mirror.data(), Arena, Mirror.size());
}

Error Executor::upload() {
  if (Mirror.empty())
    return Error::success();
  for (const ProgramBuffer &B : Prog.Buffers)
    if (B.K == ProgramBuffer::Param || B.K == ProgramBuffer::State)
      if (auto E = Back->copyToBackend(Arena + B.Offset,
                                       Mirror.data() + B.Offset,
                                       B.Type.numBytes()))
        return E;
  return Error::success();
}

Expected<std::unique_ptr<Executor>> Executor::create(const Plan &P,
                                                     RunOptions Opts) {
  std::string Dtype = P.Manifest.value("dtype", "f32");
  bool Wide = Dtype == "f64" && Opts.AllowFloat64;
  // Mixed precision: activations in a 16-bit type, f32 parameters (the
  // masters), gradients and optimizer state.
  std::optional<DType> Half;
  if (Dtype == "bf16" || Dtype == "f16")
    Half = parseDType(Dtype);
  if (Dtype != "f32" && !Wide && !Half)
    return makeError("the plan has " + Dtype +
                     " activations; sp-run runs fp32, bf16 and fp16 plans "
                     "(recompile with --dtype fp32)");
  std::unique_ptr<Executor> E(new Executor());
  E->Wide = Wide;
  E->ComputeDtype = Dtype;
  E->Opts = Opts;
  E->Comm = Opts.Comm;
  if (!E->Comm) {
    E->OwnComm = createSingleRankCommunicator();
    E->Comm = E->OwnComm.get();
  }
  int TP = P.Manifest.value("tp", 1);
  if (TP != E->Comm->size())
    return makeError(formatv("the plan was compiled for a tensor-parallel "
                             "group of {0} ranks (--tp {0}); it runs on {1}",
                             TP, E->Comm->size()));
  int PP = P.numStages();
  int Stages = Opts.PipeComm ? Opts.PipeComm->size() : 1;
  if (PP != Stages)
    return makeError(formatv("the plan was compiled for {0} pipeline stages "
                             "(--pp {0}); it runs on {1}",
                             PP, Stages));
  E->PipeComm = PP > 1 ? Opts.PipeComm : nullptr;
  E->Back = Opts.MakeBackend ? Opts.MakeBackend()
                             : std::make_unique<CpuBackend>();
  if (!E->Back)
    return makeError("RunOptions::MakeBackend made no backend (a factory "
                     "called twice, or one whose backend failed to start)");
  // A pipelined rank's compact program runs step by step over its
  // templates, or as its steps written out.
  const Program &Stage = P.stage(E->stage());
  if (Stage.compact() && E->Back->runsCompactPrograms() &&
      !Opts.ExpandCompact) {
    auto Run = prepareCompactRun(Stage);
    if (!Run)
      return makeError(toString(Run.takeError()));
    E->Compact = std::move(*Run);
    E->Prog = Stage;
  } else {
    auto Flat = expandProgram(Stage);
    if (!Flat)
      return makeError(toString(Flat.takeError()));
    E->Prog = std::move(*Flat);
  }
  E->Microbatches = P.Manifest.value("microbatches", int64_t(1));
  const Program &Prog = E->Prog;
  // One real type throughout: f32, or f64 in a float64 plan.
  DType Real = Wide ? DType::F64 : DType::F32, Other = Wide ? DType::F32
                                                            : DType::F64;
  for (const ProgramBuffer &B : Prog.Buffers) {
    // (prepareCompactRun placed a compact program's instances)
    if (!E->Compact && (B.Offset < 0 || B.Offset + B.Bytes > Prog.ArenaBytes))
      return makeError("buffer '" + B.Name +
                       "' lies outside the arena; the plan is corrupt");
    bool OtherHalf = (B.Type.Dtype == DType::BF16 ||
                      B.Type.Dtype == DType::F16) &&
                     B.Type.Dtype != Half;
    if (B.Type.Dtype == Other || OtherHalf)
      return makeError("buffer '" + B.Name + "' is " + B.Type.str() +
                       " in a plan of " + Dtype +
                       " activations; the plan is corrupt");
    if (B.Type.Dtype == Half && B.K != ProgramBuffer::Temp)
      return makeError("buffer '" + B.Name + "' is " + B.Type.str() +
                       ": a mixed-precision plan keeps its parameters, "
                       "optimizer state and inputs in f32; the plan is "
                       "corrupt");
  }
  // The model's interface: the token ids, the targets, the vocabulary.
  const nlohmann::json &Model = P.Manifest.value("model", nlohmann::json());
  // Mixed precision reads a parameter through its cast copy.
  DenseMap<int, int> CastOf;
  for (const Instruction &In : Prog.Instrs)
    if (In.Op == OpKind::Cast && In.In.size() == 1 && In.Out.size() == 1)
      CastOf[In.Out[0]] = In.In[0];
  // The logits: what the head's last forward instruction writes (a
  // collective-matmul ring's ring_concat, not its chunk products, which
  // another instruction of the head reads).
  DenseSet<int> ReadByHead;
  for (const Instruction &In : Prog.Instrs)
    if (In.Role == Role::LmHead && In.Ph == Phase::Forward)
      ReadByHead.insert(In.In.begin(), In.In.end());
  E->WritesLogits.assign(Prog.Instrs.size(), false);
  for (size_t I = 0; I < Prog.Instrs.size(); ++I) {
    const Instruction &In = Prog.Instrs[I];
    E->WritesLogits[I] = In.Role == Role::LmHead && In.Ph == Phase::Forward &&
                         !In.Out.empty() && !ReadByHead.count(In.Out[0]);
  }
  for (size_t I = 0; I < Prog.Instrs.size(); ++I) {
    const Instruction &In = Prog.Instrs[I];
    if (In.Op == OpKind::Embedding && In.Role == Role::Embed) {
      const ProgramBuffer &Ids = Prog.Buffers[In.In[1]];
      auto Cast = CastOf.find(In.In[0]);
      const ProgramBuffer &Table =
          Prog.Buffers[Cast != CastOf.end() ? Cast->second : In.In[0]];
      E->Vocab = (Table.Data ? Table.Data->type() : Table.Type).Shape[0];
      if (Ids.Type.rank() != 2)
        return makeError("the token ids must be [batch, seq]");
      E->Batch = Ids.Type.Shape[0];
      E->Seq = Ids.Type.Shape[1];
    }
    if (E->WritesLogits[I])
      E->LogitsBuffer = In.Out[0];
  }
  // Context parallelism: the token ids are this rank's positions of rows
  // of the plan's (the model's) sequence.
  const int Cp = P.Manifest.value("cp", 1);
  if (E->Vocab && Cp > 1)
    E->Seq *= Cp;
  if (!E->Vocab && Model.is_object()) // a later pipeline stage
    for (auto [Field, Slot] : {std::pair{"vocab", &E->Vocab},
                               {"batch", &E->Batch},
                               {"seq", &E->Seq}})
      *Slot = Model.value(Field, int64_t(0));
  E->Context = ContextLayout{Cp, Cp > 1, E->Seq};
  if (Cp > 1) {
    if (!Opts.ContextComm || Opts.ContextComm->size() != Cp)
      return makeError(formatv("the plan is context-parallel over {0} ranks "
                               "(--cp {0}); run it with a context-parallel "
                               "group of that size (sp-run's grid)",
                               Cp));
    if (!E->Context.divides())
      return makeError(formatv("the plan's sequence {0} does not divide into "
                               "2 x {1} chunks; the plan is corrupt",
                               E->Seq, Cp));
    E->ContextRank = Opts.ContextComm->rank();
  }
  E->Batch *= E->Microbatches;
  E->Unrolled = E->Microbatches > 1 || E->PipeComm;
  if (!E->Vocab || !E->Batch || Prog.output("loss") < 0)
    return makeError("the plan is not a training program of a detected "
                     "Transformer (no token embedding or loss)");
  // Every instruction's attributes must be its op's (a required one
  // missing would read as its default), every input one the runtime knows
  // how to feed, and every collective's group one this run has.
  for (size_t K = 0; K < Prog.Instrs.size(); ++K) {
    const Instruction &In = Prog.Instrs[K];
    std::string Why = checkAttrs(In.Op, In.Attrs);
    if (!Why.empty())
      return makeError(describe(In, K) + ": " + Why);
  }
  if (auto Err = E->checkInputs())
    return Err;
  size_t MaxInputBytes = 0;
  for (const ProgramBuffer &B : Prog.Buffers)
    if (B.K == ProgramBuffer::Input)
      MaxInputBytes = std::max<size_t>(MaxInputBytes, B.Type.numBytes());
  E->Staging.resize(MaxInputBytes);
  for (size_t K = 0; K < Prog.Instrs.size(); ++K) {
    const Instruction &In = Prog.Instrs[K];
    if (defaultGroup(In.Op).empty())
      continue;
    std::string Group = collectiveGroup(In.Op, In.Attrs);
    if (!resolveGroup(Group, E->Comm, E->PipeComm, Opts.DataComm,
                      Opts.ContextComm))
      return makeError(
          formatv("{0} communicates over group '{1}', which "
                  "this run does not have (it has tp{2}{3}{4})",
                  describe(In, K), Group, E->PipeComm ? ", pp" : "",
                  Opts.DataComm ? ", dp" : "", Opts.ContextComm ? ", cp" : ""));
    // Stage-to-stage messages go through the pipeline group.
    bool Message = In.Op == OpKind::Send || In.Op == OpKind::Recv ||
                   In.Op == OpKind::PipeAllReduce ||
                   In.Op == OpKind::PipeBroadcast;
    if (Message && Group != "pp")
      return makeError(describe(In, K) +
                       ": stage-to-stage messages go over the pp group");
  }
  E->MissingOptimizerInput = missingOptimizerInput(Prog);
  if (P.Manifest.contains("loss_scale")) {
    const nlohmann::json &J = P.Manifest["loss_scale"];
    LossScaling S;
    S.Scale = J.value("initial", 0.0);
    S.Interval = J.value("growth_interval", int64_t(0));
    int Exp = 0;
    if (!(S.Scale >= 1) || std::frexp(S.Scale, &Exp) != 0.5 ||
        S.Interval < 1)
      return makeError("the plan's loss_scale needs an initial scale that is "
                       "a power of two >= 1 and a growth_interval >= 1; "
                       "recompile it");
    E->Scaling = S;
  }

  if (Cp > 1 && !E->Back->runsContextParallel())
    return makeError("the plan is context-parallel (--cp " + Twine(Cp) +
                     "); the " + E->Back->name() +
                     " backend does not run that yet (run it with --device "
                     "cpu, or compile without --cp)");
  // Hierarchical: the cp group split into its all-to-all groups and the
  // rings across them (a collective over the cp group, whose ranks all
  // create this plan's executor).
  const int CpA2a = P.Manifest.value("cp_a2a", 1);
  if (Cp > 1 && P.Manifest.value("cp_comm", "ring") == "a2a+ring") {
    if (!E->Back->runsHierarchicalContextParallel())
      return makeError("the plan's context parallelism is hierarchical "
                       "(--cp-comm a2a+ring); the " +
                       E->Back->name() +
                       " backend does not run that yet (run it with --device "
                       "cpu, or recompile with --cp-comm ring or a2a)");
    auto Split = splitContext(*Opts.ContextComm, CpA2a);
    if (!Split)
      return Split.takeError();
    E->ContextSplit = std::move(*Split);
  }
  if (Half && !E->Back->runsMixedPrecision())
    return makeError("the plan has " + Dtype + " activations; the " +
                     E->Back->name().str() +
                     " backend runs fp32 plans only (recompile with --dtype "
                     "fp32, or run it on the CPU backend)");
  auto Arena = E->Back->allocate(Prog.ArenaBytes);
  if (!Arena)
    return Arena.takeError();
  E->Arena = *Arena;
  if (!E->Back->hostMemory())
    E->Mirror.assign(Prog.ArenaBytes, 0);
  if (E->Compact) {
    const CompactRun &R = *E->Compact;
    E->Where.assign(Prog.Buffers.size(), nullptr);
    E->InstanceOf = R.WholeInstance;
    // (a step buffer's instances are all at its offset)
    for (size_t B = 0; B < Prog.Buffers.size(); ++B)
      if (R.WholeInstance[B] >= 0 || Prog.Buffers[B].Scope == BufferScope::Step)
        E->Where[B] = E->Arena + Prog.Buffers[B].Offset;
    E->BoundOf.assign(Prog.Instrs.size(), -1);
    for (size_t I = 0; I < Prog.Instrs.size(); ++I)
      if (bindsPerStep(Prog.Instrs[I])) {
        E->BoundOf[I] = E->Bound.size();
        E->Bound.push_back(Prog.Instrs[I]);
      }
  }
  for (size_t Id = 0; Id < Prog.Buffers.size(); ++Id) {
    const ProgramBuffer &B = Prog.Buffers[Id];
    if (B.K != ProgramBuffer::Input)
      continue;
    if (E->Compact && B.Scope == BufferScope::Microbatch)
      for (int K = 0; K < Prog.Microbatches; ++K)
        E->Feeds.push_back({int(Id), K, B.Offset + K * B.Stride});
    else
      E->Feeds.push_back({int(Id), B.Microbatch, B.Offset});
  }
  E->Stats.ArenaBytes = Prog.ArenaBytes;
  E->Stats.PersistentBytes = Prog.PersistentBytes;

  for (const ProgramBuffer &B : Prog.Buffers) {
    if (!B.Data)
      continue;
    if (B.K == ProgramBuffer::Param && B.Type.Dtype != Real)
      return makeError("parameter '" + B.Name + "' is " + B.Type.str() +
                       "; the CPU backend trains f32 parameters");
    if (auto Err = E->loadParameter(B))
      return Err;
  }
  return E;
}

/// Checks ids against [0, Vocab) and their count against the batch.
/// Batch x Seq ids in [0, Vocab), or IgnoreTarget where Ignorable.
static Error checkIds(StringRef What, ArrayRef<int64_t> Ids, int64_t Batch,
                      int64_t Seq, int64_t Vocab, bool Ignorable = false) {
  if (int64_t(Ids.size()) != Batch * Seq)
    return makeError(formatv("expected {0} x {1} {2}s, got {3}", Batch, Seq,
                             What, Ids.size()));
  for (size_t I = 0; I < Ids.size(); ++I)
    if ((Ids[I] < 0 || Ids[I] >= Vocab) &&
        !(Ignorable && Ids[I] == IgnoreTarget))
      return makeError(formatv("{0} {1} at position {2} is outside the "
                               "vocabulary [0, {3})",
                               What, Ids[I], I, Vocab));
  return Error::success();
}

Error Executor::checkInputs() const {
  for (const ProgramBuffer &B : Prog.Buffers) {
    if (B.K != ProgramBuffer::Input)
      continue;
    auto Bad = [&](const Twine &Why) {
      return makeError("input '" + B.Name + "' (" + B.Type.str() + ", fed as " +
                       inputRoleName(B.Feed) + ") " + Why);
    };
    const TensorType &T = B.Type;
    // A float64 plan's real inputs are f64 where the plan's are f32.
    DType D = Wide && T.Dtype == DType::F64 ? DType::F32 : T.Dtype;
    switch (B.Feed) {
    case InputRole::None:
      return makeError("input '" + B.Name + "' (" + T.str() +
                       ") has no role, so nothing would feed it; recompile "
                       "the plan with this sp-compile (it binds every input "
                       "or refuses the model)");
    case InputRole::Tokens:
    case InputRole::Targets:
    case InputRole::Positions:
    case InputRole::TokenTypes:
      if (!roleDtypeOk(B.Feed, D))
        return Bad("must be i64");
      [[fallthrough]];
    case InputRole::Mask: {
      // Under context parallelism the tokens and targets are this rank's
      // positions; positions, token types and the mask stay whole.
      const int64_t Cols =
          B.Feed == InputRole::Tokens || B.Feed == InputRole::Targets
              ? Context.local()
              : Seq;
      if (!roleShapeOk(B.Feed, T, Batch / Microbatches, Cols))
        return Bad(formatv("must be [{0}, {1}]", Batch / Microbatches, Cols));
      if (!roleDtypeOk(B.Feed, D))
        return Bad("must be f32, i64, i32 or bool");
      break;
    }
    case InputRole::LearningRate:
    case InputRole::Step:
    case InputRole::LossWeight:
      if (!roleDtypeOk(B.Feed, D) || T.rank() != 0)
        return Bad("must be an f32 scalar");
      break;
    }
  }
  return Error::success();
}



Error Executor::feedInputs(const TokenBatch &Data, double LR, int64_t Step) {
  if (auto E = checkIds("token id", Data.Tokens, Batch, Seq, Vocab))
    return E;
  if (auto E = checkIds("target", Data.Targets, Batch, Seq, Vocab,
                        /*Ignorable=*/true))
    return E;
  if (!Data.Real.empty() && int64_t(Data.Real.size()) != Batch * Seq)
    return makeError(formatv("expected {0} x {1} mask values, got {2}", Batch,
                             Seq, Data.Real.size()));
  // This rank's positions of a row (all of them without context
  // parallelism).
  const auto Runs = Context.runs(ContextRank);
  // The counted targets of rows [Row0, Row0 + Rows), at this rank's
  // positions.
  auto Counted = [&](int64_t Row0, int64_t Rows) {
    int64_t N = 0;
    for (int64_t R = Row0; R < Row0 + Rows; ++R)
      for (const ContextLayout::Run &Run : Runs)
        N += count_if(ArrayRef<int64_t>(Data.Targets)
                          .slice(R * Seq + Run.Global, Run.Length),
                      [](int64_t T) { return T != IgnoreTarget; });
    return N;
  };
  int64_t StepCounted = Counted(0, Batch);
  // Data parallelism: the step's batch is every replica's rows, and each
  // microbatch's loss weight its share of all of their counted targets.
  // (With context parallelism the group holds every context rank of each
  // replica too, so this counts every position of their rows.)
  if (Opts.DataComm)
    if (auto E = Opts.DataComm->allReduceSum(&StepCounted, 1))
      return E;
  for (const Feed &F : Feeds) {
    const ProgramBuffer &B = Prog.Buffers[F.Buffer];
    // Written on the host (Staging holds the largest input), then copied
    // into the backend's arena.
    char *Dst = Staging.data();
    // A microbatch's buffer holds rows [K b, (K + 1) b) of the batch.
    int64_t Rows = Batch / Microbatches;
    int64_t Row0 = F.Microbatch >= 0 ? F.Microbatch * Rows : 0;
    switch (B.Feed) {
    case InputRole::Tokens:
    case InputRole::Targets: {
      const int64_t *Src =
          (B.Feed == InputRole::Tokens ? Data.Tokens : Data.Targets).data();
      const int64_t Local = Context.local();
      for (int64_t R = 0; R < Rows; ++R)
        for (const ContextLayout::Run &Run : Runs)
          std::memcpy(Dst + (R * Local + Run.Local) * sizeof(int64_t),
                      Src + (Row0 + R) * Seq + Run.Global,
                      Run.Length * sizeof(int64_t));
      break;
    }
    case InputRole::Positions: {
      auto *P = reinterpret_cast<int64_t *>(Dst);
      for (int64_t R = 0, PosRows = B.Type.Shape[0]; R < PosRows; ++R)
        for (int64_t S = 0; S < Seq; ++S)
          P[R * Seq + S] = S;
      break;
    }
    case InputRole::TokenTypes:
      std::memset(Dst, 0, B.Type.numBytes());
      break;
    case InputRole::Mask: // 1 = attend (a token), 0 = padding
      for (int64_t I = 0, N = Rows * Seq; I < N; ++I) {
        int M = Data.Real.empty() ? 1 : Data.Real[Row0 * Seq + I];
        switch (B.Type.Dtype) {
        case DType::I64:
          reinterpret_cast<int64_t *>(Dst)[I] = M;
          break;
        case DType::I32:
          reinterpret_cast<int32_t *>(Dst)[I] = M;
          break;
        case DType::Bool:
          Dst[I] = char(M);
          break;
        default: // f32 (f64), checked when the executor was created
          writeReal(Dst + I * dtypeSize(B.Type.Dtype), B.Type.Dtype, M);
          break;
        }
      }
      break;
    case InputRole::LossWeight: // the microbatch's share of the targets
      // (times the loss scale: a power of two, so the loss scales exactly)
      writeReal(Dst, B.Type.Dtype,
                StepCounted ? double(Counted(Row0, Rows)) / StepCounted *
                                  FeedScale
                            : 0.0);
      break;
    case InputRole::LearningRate:
      writeReal(Dst, B.Type.Dtype, LR);
      break;
    case InputRole::Step: // AdamW's count: skipped steps do not count
      writeReal(Dst, B.Type.Dtype,
                double(Step - Skipped));
      break;
    case InputRole::None:
      llvm_unreachable("checked when the executor was created");
    }
    if (auto E = Back->copyToBackend(Arena + F.Offset, Dst, B.Type.numBytes()))
      return E;
  }
  return Error::success();
}

Expected<double> Executor::readReal(int B) const {
  const char *Src = at(B);
  if (Prog.Buffers[B].Type.Dtype == DType::F64) {
    double D = 0;
    if (auto E = Back->copyToHost(&D, Src, sizeof D))
      return E;
    return D;
  }
  float F = 0;
  if (auto E = Back->copyToHost(&F, Src, sizeof F))
    return E;
  return double(F);
}

Expected<double> Executor::loss() const {
  if (auto E = Back->synchronize())
    return E;
  auto Read = readReal(Prog.output("loss"));
  if (!Read)
    return Read.takeError();
  double L = *Read / FeedScale;
  // Each replica's loss is its rows' part of the step's mean.
  if (Opts.DataComm)
    if (auto E = Opts.DataComm->allReduceSum(&L, 1))
      return E;
  return L;
}

Expected<double> Executor::trainStep(const TokenBatch &Data, double LR,
                                     int64_t Step) {
  if (Step < 1)
    return makeError("steps are 1-based");
  if (!MissingOptimizerInput.empty())
    return makeError("the plan has no optimizer step (no '" +
                     MissingOptimizerInput + "' input)");
  FeedScale = Scaling ? Scaling->Scale : 1;
  SkipUpdate = false;
  LastGradNorm = NAN;
  if (auto E = feedInputs(Data, LR, Step))
    return E;
  if (auto E = run(Phase::Optimizer, Step, /*Training=*/true))
    return E;
  auto L = loss();
  LastSkipped = SkipUpdate;
  if (Scaling) {
    LossScaling &S = *Scaling;
    if (SkipUpdate) {
      ++Skipped;
      S.GoodSteps = 0;
      S.Scale = std::max(1.0, S.Scale / 2);
    } else if (++S.GoodSteps == S.Interval) {
      S.GoodSteps = 0;
      S.Scale *= 2;
    }
  }
  LastGradScale = 1 / FeedScale;
  FeedScale = 1;
  return L;
}

Expected<double> Executor::evalLoss(const TokenBatch &Data) {
  // The forward instructions alone, in program order: in an unrolled
  // schedule they are every microbatch's forward on this stage, with the
  // stage-to-stage messages of the forward (a collective over the pipeline
  // group: every stage evaluates).
  FeedScale = 1;
  if (auto E = feedInputs(Data, /*LR=*/0, /*Step=*/0))
    return E;
  if (auto E = run(Phase::Forward, /*Step=*/0, /*Training=*/false))
    return E;
  return loss();
}

void Executor::enterStep(size_t K) {
  const CompactRun &R = *Compact;
  for (int U = R.UseBegin[K]; U < R.UseBegin[K + 1]; ++U) {
    auto [B, N] = R.Uses[U];
    Where[B] = Arena + R.Instances[N].Offset;
    InstanceOf[B] = N;
  }
  const ProgramStep &S = Prog.Steps[K];
  const ProgramTemplate &T = Prog.Templates[S.Template];
  for (int I = T.Begin; I < T.End; ++I)
    if (BoundOf[I] >= 0)
      bindStep(Prog.Instrs[I], S.Microbatch, Prog.TagStride,
               R.FirstStep[S.Template] == int(K), Bound[BoundOf[I]]);
}

Error Executor::run(Phase Last, int64_t Step, bool Training) {
  // A backend that times its calls on the device traces without a wait per
  // call, so that the trace shows what it ran at the same time.
  bool DeviceTrace = Training && Opts.Trace && Back->timesOnDevice();
  // The calls it timed, in call order: (instruction, schedule step).
  std::vector<std::pair<int, int>> Timed;
  double TraceStartUs = 0;
  // Trace times: microseconds of the steady clock.
  auto Us = [](std::chrono::steady_clock::time_point T) {
    return std::chrono::duration<double, std::micro>(T.time_since_epoch())
        .count();
  };
  if (DeviceTrace) {
    if (auto E = Back->synchronize())
      return E;
    TraceStartUs = Us(std::chrono::steady_clock::now());
    if (auto E = Back->startTiming())
      return E;
  }
  // A flat program runs as one step of all its instructions; a compact one
  // step by step, each its template's instructions over the step's buffer
  // instances. The memory counts are over instances, at positions in run
  // order (a flat program's buffers and instructions).
  const CompactRun *R = Compact ? &*Compact : nullptr;
  size_t NumSteps = R ? Prog.Steps.size() : 1;
  int NumPositions = R ? R->positions() : int(Prog.Instrs.size());
  size_t NumInstances = R ? R->Instances.size() : Prog.Buffers.size();
  auto BufferOf = [&](int N) { return R ? R->Instances[N].Buffer : N; };
  auto OffsetOf = [&](int N) {
    return R ? R->Instances[N].Offset : Prog.Buffers[N].Offset;
  };
  auto LastUseOf = [&](int N) {
    return R ? R->Instances[N].LastUse : Prog.Buffers[N].LastUse;
  };
  auto InstanceOfBuffer = [&](int B) { return R ? InstanceOf[B] : B; };
  // The instructions of step K: Prog.Instrs[Begin, End) at positions from
  // Base.
  auto Range = [&](size_t K) {
    if (!R)
      return std::tuple{0, int(Prog.Instrs.size()), 0};
    const ProgramTemplate &T = Prog.Templates[Prog.Steps[K].Template];
    return std::tuple{T.Begin, T.End, R->StepBegin[K]};
  };
  auto Describe = [&](const Instruction &In, size_t K, int I) {
    if (!R)
      return describe(In, I);
    const ProgramStep &S = Prog.Steps[K];
    const ProgramTemplate &T = Prog.Templates[S.Template];
    std::string At =
        formatv("schedule step {0} ({1}", K, templateKindName(T.Kind)).str();
    if (T.Chunk >= 0)
      At += formatv(" of chunk {0}, microbatch {1}", T.Chunk, S.Microbatch)
                .str();
    return At + "), " + describe(In, I);
  };
  int64_t Live = 0, CapturedLogits = 0;
  std::vector<int64_t> FreeAt(NumPositions + 1, 0);
  // What the instructions write and read, for the stored-activation count:
  // per instance, the position that last wrote it (its phase, and whether
  // a cast), the last that read it, and the layer of the first backward or
  // recompute instruction that read it after a forward one wrote it.
  struct Access {
    int WrittenAt = -1, LastRead = -1, BackLayer = 0;
    bool BackRead = false, Forward = false, Cast = false;
  };
  std::vector<Access> Seen(NumInstances);
  for (size_t K = 0; K < NumSteps; ++K) {
    if (R)
      enterStep(K);
    auto [Begin, End, Base] = Range(K);
    for (int I = Begin; I < End; ++I) {
      const Instruction &In = instr(I);
      int Pos = Base + I - Begin;
      // An unrolled schedule interleaves the phases: the ones after Last
      // are skipped, not the rest of the program.
      if (In.Ph > Last || (SkipUpdate && In.Ph == Phase::Optimizer))
        continue;
      for (int B : In.Out) {
        int N = InstanceOfBuffer(B);
        int64_t Bytes = Prog.Buffers[B].Bytes;
        Live += Bytes;
        FreeAt[std::min<size_t>(LastUseOf(N), NumPositions)] += Bytes;
        Stats.HighWaterBytes =
            std::max(Stats.HighWaterBytes, OffsetOf(N) + Bytes);
        Seen[N].WrittenAt = Pos;
        Seen[N].Forward = In.Ph == Phase::Forward;
        Seen[N].Cast = In.Op == OpKind::Cast;
      }
      bool BackSide = In.Ph == Phase::Backward || In.Ph == Phase::Recompute;
      for (int B : In.In) {
        Access &A = Seen[InstanceOfBuffer(B)];
        A.LastRead = Pos;
        if (BackSide && !A.BackRead && A.WrittenAt >= 0 && A.Forward) {
          A.BackRead = true;
          A.BackLayer = In.Layer;
        }
      }
      if (Training)
        Stats.PeakLiveTempBytes = std::max(Stats.PeakLiveTempBytes, Live);
      auto Start = std::chrono::steady_clock::now();
      if (auto E = runInstruction(In, Step, Training))
        return createStringError(inconvertibleErrorCode(), "%s: %s",
                                 Describe(In, K, I).c_str(),
                                 toString(std::move(E)).c_str());
      // The gradients' global norm, for the log; with loss scaling every
      // rank reads the same norm (grad_norm sums over every group), so
      // every rank skips the same steps.
      if (Training && In.Op == OpKind::GradNorm) {
        if (auto E = Back->synchronize())
          return E;
        auto Norm = readReal(In.Out[0]);
        if (!Norm)
          return Norm.takeError();
        LastGradNorm = *Norm;
        if (Scaling)
          SkipUpdate = !std::isfinite(*Norm);
      }
      if (!Training && Unrolled && WritesLogits[I]) {
        // This microbatch's logits, before the arena reuses their bytes.
        const ProgramBuffer &L = Prog.Buffers[In.Out[0]];
        size_t Bytes = L.Type.numBytes();
        EvalLogits.resize(Bytes * Microbatches);
        if (CapturedLogits >= Microbatches)
          return makeError("the program computes more logits than it has "
                           "microbatches");
        if (auto E = Back->copyToHost(EvalLogits.data() +
                                          CapturedLogits * Bytes,
                                      at(In.Out[0]), Bytes))
          return E;
        ++CapturedLogits;
      }
      if (Training) {
        // A device backend queues its calls: the trace waits for each one,
        // the phase times for the last of each run of one phase (so a
        // phase's total is its wall time, the in-between calls' their
        // queueing time).
        bool PhaseEnds = I + 1 == End ? K + 1 == NumSteps
                                      : Prog.Instrs[I + 1].Ph != In.Ph;
        if (I + 1 == End && K + 1 < NumSteps) {
          // (the next instruction is the next step's first that runs)
          size_t Next = K + 1;
          while (Next < NumSteps && std::get<0>(Range(Next)) ==
                                        std::get<1>(Range(Next)))
            ++Next;
          PhaseEnds = Next == NumSteps ||
                      Prog.Instrs[std::get<0>(Range(Next))].Ph != In.Ph;
        }
        bool HostTrace = Opts.Trace && !DeviceTrace;
        if (!Back->hostMemory() && (HostTrace || PhaseEnds))
          if (auto E = Back->synchronize())
            return createStringError(inconvertibleErrorCode(), "%s: %s",
                                     Describe(In, K, I).c_str(),
                                     toString(std::move(E)).c_str());
        auto Stop = std::chrono::steady_clock::now();
        Times.PhaseSeconds[int(In.Ph)] +=
            std::chrono::duration<double>(Stop - Start).count();
        int Sched = R ? int(K) : -1;
        if (DeviceTrace)
          Timed.push_back({I, Sched});
        else if (Opts.Trace)
          Events.push_back(
              {I, Us(Start), Us(Stop) - Us(Start), Step, -1, Sched});
      }
      Live -= FreeAt[Pos];
    }
  }
  if (CapturedLogits && CapturedLogits != Microbatches)
    return makeError(formatv("the program computed the logits of {0} of its "
                             "{1} microbatches",
                             CapturedLogits, Microbatches)
                         .str());
  if (DeviceTrace) {
    auto Times = Back->collectTimes();
    if (!Times)
      return Times.takeError();
    if (Times->size() != Timed.size())
      return createStringError(inconvertibleErrorCode(),
                               "the %s backend timed %zu calls of %zu",
                               Back->name().str().c_str(), Times->size(),
                               Timed.size());
    for (size_t K = 0; K < Timed.size(); ++K) {
      const Backend::DeviceTime &T = (*Times)[K];
      Events.push_back({Timed[K].first, TraceStartUs + T.StartUs,
                        T.DurationUs, Step, T.Stream, Timed[K].second});
    }
  }
  if (Training) {
    ++Times.Steps;
    std::vector<int64_t> Delta(NumPositions + 2, 0);
    Stats.StoredActivationBytesByLayer.clear();
    for (size_t N = 0; N < NumInstances; ++N) {
      const Access &A = Seen[N];
      const ProgramBuffer &B = Prog.Buffers[BufferOf(N)];
      // (a parameter's 16-bit copy is model state, not an activation)
      if (!A.BackRead || B.isPersistent() || A.Cast)
        continue;
      Delta[A.WrittenAt] += B.Bytes;
      Delta[A.LastRead + 1] -= B.Bytes;
      Stats.StoredActivationBytesByLayer[A.BackLayer] += B.Bytes;
    }
    int64_t Cur = 0, Peak = 0;
    for (int64_t D : Delta)
      Peak = std::max(Peak, Cur += D);
    Stats.StoredActivationBytes = Peak;
  }
  return Error::success();
}

Error Executor::runInstruction(const Instruction &I, int64_t Step,
                               bool Training) {
  return Back->run(KernelCall{
      I, Prog, Arena, Step, Training, Opts.Dropout, Opts.Seed, *Comm, PipeComm,
      Opts.DataComm, 1 / FeedScale, Compact ? Where.data() : nullptr,
      Opts.ContextComm, ContextSplit.Inner.get(), ContextSplit.Outer.get()});
}

void Executor::setData(TensorView &V, int B) const {
  V.Data = Wide ? nullptr : reinterpret_cast<float *>(ptr(B));
  V.Data64 = Wide ? reinterpret_cast<double *>(ptr(B)) : nullptr;
}

TensorView Executor::view(int B, std::string Name) const {
  const ProgramBuffer &PB = Prog.Buffers[B];
  TensorView V{std::move(Name), PB.Type, nullptr, PB.Shard,
               PB.Data ? PB.Data->type() : PB.Type};
  setData(V, B);
  return V;
}

std::vector<TensorView> Executor::parameters() const {
  std::vector<TensorView> R;
  for (size_t B = 0; B < Prog.Buffers.size(); ++B)
    if (Prog.Buffers[B].K == ProgramBuffer::Param)
      R.push_back(view(B, Prog.Buffers[B].Name));
  return R;
}

std::vector<TensorView> Executor::optimizerState() const {
  std::vector<TensorView> R;
  for (size_t B = 0; B < Prog.Buffers.size(); ++B)
    if (Prog.Buffers[B].K == ProgramBuffer::State)
      R.push_back(view(B, Prog.Buffers[B].Name));
  return R;
}

Expected<std::vector<Executor::ModelTensor>> Executor::modelTensors() const {
  auto KeyOf = [&](int B) {
    return StringRef(Prog.Buffers[B].Name).split('@').first.str();
  };
  auto Whole = [&](int B) { return wholeShape(Prog.Buffers[B]); };
  std::vector<ModelTensor> R;
  for (size_t B = 0; B < Prog.Buffers.size(); ++B)
    if (Prog.Buffers[B].K == ProgramBuffer::Param)
      R.push_back({KeyOf(B), Whole(B), Prog.Buffers[B].Shard});
  // Each moment belongs to the parameter its adamw updates.
  std::vector<std::pair<int, std::string>> Owner(Prog.Buffers.size(),
                                                 {-1, ""});
  for (const Instruction &I : Prog.Instrs)
    if (I.Op == OpKind::AdamW) {
      Owner[I.In[2]] = {I.In[0], "adam.m:"};
      Owner[I.In[3]] = {I.In[0], "adam.v:"};
    }
  for (size_t B = 0; B < Prog.Buffers.size(); ++B) {
    if (Prog.Buffers[B].K != ProgramBuffer::State)
      continue;
    auto [P, Prefix] = Owner[B];
    if (P < 0)
      return createStringError(inconvertibleErrorCode(),
                               "state '%s' is no adamw's moment",
                               Prog.Buffers[B].Name.c_str());
    Sharding S = Prog.Buffers[P].Shard;
    S.DataChunks = Prog.Buffers[B].Shard.DataChunks;
    R.push_back({Prefix + KeyOf(P), Whole(P), S});
  }
  return R;
}

std::optional<TensorView> Executor::gradient(StringRef Param) const {
  int B = Prog.output(("grad:" + Param).str());
  int P = Prog.findBuffer(Param);
  if (B < 0 || P < 0)
    return std::nullopt;
  // A gradient is laid out like its parameter (summed ones are whole).
  TensorView V = view(P, Param.str());
  setData(V, B);
  if (V.Shard.K != Sharding::Split)
    V.Shard = Sharding::replicated();
  // ZeRO: this replica's flat chunk of it (gather() joins them).
  V.Shard.DataChunks = Prog.Buffers[B].Shard.DataChunks;
  V.Scale = LastGradScale;
  return V;
}

std::optional<TensorView> Executor::logits() const {
  if (LogitsBuffer < 0 || (Unrolled && EvalLogits.empty()))
    return std::nullopt;
  TensorView V = view(LogitsBuffer, "logits");
  if (Unrolled) {
    // Every microbatch's, copied out as they were made (microbatch-major).
    V.Type.Shape[0] *= Microbatches;
    V.Data = Wide ? nullptr
                  : reinterpret_cast<float *>(
                        const_cast<char *>(EvalLogits.data()));
    V.Data64 = Wide ? reinterpret_cast<double *>(
                          const_cast<char *>(EvalLogits.data()))
                    : nullptr;
    V.FullType = V.Type;
  }
  if (V.Shard.K == Sharding::Split) { // vocabulary-parallel
    V.FullType = V.Type;
    V.FullType.Shape[V.Shard.Dim] *= V.Shard.Parts;
  }
  return V;
}

} // namespace sp
