//===- Executor.cpp - Runs a plan on the CPU ------------------------------===//
#include "runtime/Executor.h"
#include "runtime/cpu/Kernels.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MathExtras.h"
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

using namespace llvm;

namespace sp {

namespace cpu = sp::cpu;

namespace {

Error planError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), Msg);
}

std::string describe(const Instruction &I, size_t Index) {
  std::string S = formatv("instruction {0} ({1}", Index, opName(I.Op)).str();
  if (I.Layer >= 0)
    S += formatv(", layer {0}", I.Layer).str();
  if (!I.Role.empty())
    S += ", " + I.Role;
  return S + ", " + phaseName(I.Ph).str() + ")";
}

cpu::GeluApprox geluApprox(const AttrList &A) {
  return A.getString("approximate", "none") == "tanh" ? cpu::GeluApprox::Tanh
                                                      : cpu::GeluApprox::None;
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

Executor::~Executor() { std::free(Arena); }

float *Executor::ptr(int Buffer) const {
  assert(Buffer >= 0 && size_t(Buffer) < Prog.Buffers.size());
  return reinterpret_cast<float *>(Arena + Prog.Buffers[Buffer].Offset);
}

Expected<std::unique_ptr<Executor>> Executor::create(const Plan &P,
                                                     RunOptions Opts) {
  std::string Dtype = P.Manifest.value("dtype", "f32");
  if (Dtype != "f32")
    return planError("the plan has " + Dtype +
                     " activations; the CPU backend runs fp32 plans "
                     "(recompile with --dtype fp32)");
  std::unique_ptr<Executor> E(new Executor());
  E->Opts = Opts;
  E->Comm = Opts.Comm;
  if (!E->Comm) {
    E->OwnComm = createSingleRankCommunicator();
    E->Comm = E->OwnComm.get();
  }
  int TP = P.Manifest.value("tp", 1);
  if (TP != E->Comm->size())
    return planError(formatv("the plan was compiled for a tensor-parallel "
                             "group of {0} ranks (--tp {0}); it runs on {1}",
                             TP, E->Comm->size()));
  int PP = P.numStages();
  int Stages = Opts.PipeComm ? Opts.PipeComm->size() : 1;
  if (PP != Stages)
    return planError(formatv("the plan was compiled for {0} pipeline stages "
                             "(--pp {0}); it runs on {1}",
                             PP, Stages));
  E->PipeComm = PP > 1 ? Opts.PipeComm : nullptr;
  E->Prog = P.stage(E->stage());
  E->Microbatches = P.Manifest.value("microbatches", int64_t(1));
  const Program &Prog = E->Prog;
  for (const ProgramBuffer &B : Prog.Buffers)
    if (B.Offset < 0 || B.Offset + B.Bytes > Prog.ArenaBytes)
      return planError("buffer '" + B.Name +
                       "' lies outside the arena; the plan is corrupt");
  // The model's interface: the token ids, the targets, the vocabulary.
  const nlohmann::json &Model = P.Manifest.value("model", nlohmann::json());
  for (size_t I = 0; I < Prog.Instrs.size(); ++I) {
    const Instruction &In = Prog.Instrs[I];
    if (In.Op == OpKind::Embedding && In.Role == "embed") {
      const ProgramBuffer &Ids = Prog.Buffers[In.In[1]];
      const ProgramBuffer &Table = Prog.Buffers[In.In[0]];
      E->Vocab = (Table.Data ? Table.Data->type() : Table.Type).Shape[0];
      if (Ids.Type.rank() != 2)
        return planError("the token ids must be [batch, seq]");
      E->Batch = Ids.Type.Shape[0];
      E->Seq = Ids.Type.Shape[1];
    }
    if (In.Role == "lm_head" && In.Ph == Phase::Forward)
      E->LogitsBuffer = In.Out[0];
  }
  if (!E->Vocab && Model.is_object()) // a later pipeline stage
    for (auto [Field, Slot] : {std::pair{"vocab", &E->Vocab},
                               {"batch", &E->Batch},
                               {"seq", &E->Seq}})
      *Slot = Model.value(Field, int64_t(0));
  E->Batch *= E->Microbatches;
  if (!E->Vocab || !E->Batch || Prog.output("loss") < 0)
    return planError("the plan is not a training program of a detected "
                     "Transformer (no token embedding or loss)");
  // Every input must be one the runtime knows how to feed.
  if (auto Err = E->checkInputs())
    return std::move(Err);
  E->MissingOptimizerInput = missingOptimizerInput(Prog);

  size_t Size = alignTo(std::max<int64_t>(Prog.ArenaBytes, 64), 64);
  E->Arena = static_cast<char *>(std::aligned_alloc(64, Size));
  if (!E->Arena)
    return planError(formatv("cannot allocate the {0}-byte arena", Size));
  std::memset(E->Arena, 0, Size);
  E->Stats.ArenaBytes = Prog.ArenaBytes;
  E->Stats.PersistentBytes = Prog.PersistentBytes;

  for (const ProgramBuffer &B : Prog.Buffers) {
    if (!B.Data)
      continue;
    if (B.K == ProgramBuffer::Param && B.Type.Dtype != DType::F32)
      return planError("parameter '" + B.Name + "' is " + B.Type.str() +
                       "; the CPU backend trains f32 parameters");
    if (auto Err = E->loadParameter(B))
      return std::move(Err);
  }
  return E;
}

/// Checks ids against [0, Vocab) and their count against the batch.
/// Batch x Seq ids in [0, Vocab), or IgnoreTarget where Ignorable.
static Error checkIds(StringRef What, ArrayRef<int64_t> Ids, int64_t Batch,
                      int64_t Seq, int64_t Vocab, bool Ignorable = false) {
  if (int64_t(Ids.size()) != Batch * Seq)
    return planError(formatv("expected {0} x {1} {2}s, got {3}", Batch, Seq,
                             What, Ids.size()));
  for (size_t I = 0; I < Ids.size(); ++I)
    if ((Ids[I] < 0 || Ids[I] >= Vocab) &&
        !(Ignorable && Ids[I] == IgnoreTarget))
      return planError(formatv("{0} {1} at position {2} is outside the "
                               "vocabulary [0, {3})",
                               What, Ids[I], I, Vocab));
  return Error::success();
}

Error Executor::checkInputs() const {
  for (const ProgramBuffer &B : Prog.Buffers) {
    if (B.K != ProgramBuffer::Input)
      continue;
    auto Bad = [&](const Twine &Why) {
      return planError("input '" + B.Name + "' (" + B.Type.str() + ", fed as " +
                       inputRoleName(B.Feed) + ") " + Why);
    };
    const TensorType &T = B.Type;
    switch (B.Feed) {
    case InputRole::None:
      return planError("input '" + B.Name + "' (" + T.str() +
                       ") has no role, so nothing would feed it; recompile "
                       "the plan with this sp-compile (it binds every input "
                       "or refuses the model)");
    case InputRole::Tokens:
    case InputRole::Targets:
    case InputRole::Positions:
    case InputRole::TokenTypes:
      if (T.Dtype != DType::I64)
        return Bad("must be i64");
      [[fallthrough]];
    case InputRole::Mask:
      if (T.rank() != 2 || T.Shape[1] != Seq ||
          (T.Shape[0] != Batch / Microbatches &&
           !(B.Feed == InputRole::Positions && T.Shape[0] == 1)))
        return Bad(formatv("must be [{0}, {1}]", Batch / Microbatches, Seq));
      if (B.Feed == InputRole::Mask && T.Dtype != DType::F32 &&
          T.Dtype != DType::I64 && T.Dtype != DType::I32 &&
          T.Dtype != DType::Bool)
        return Bad("must be f32, i64, i32 or bool");
      break;
    case InputRole::LearningRate:
    case InputRole::Step:
    case InputRole::LossWeight:
      if (T != TensorType(DType::F32, {}))
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
    return planError(formatv("expected {0} x {1} mask values, got {2}", Batch,
                             Seq, Data.Real.size()));
  // The counted targets of rows [Row0, Row0 + Rows).
  auto Counted = [&](int64_t Row0, int64_t Rows) {
    return int64_t(count_if(
        ArrayRef<int64_t>(Data.Targets).slice(Row0 * Seq, Rows * Seq),
        [](int64_t T) { return T != IgnoreTarget; }));
  };
  int64_t StepCounted = Counted(0, Batch);
  for (size_t Id = 0; Id < Prog.Buffers.size(); ++Id) {
    const ProgramBuffer &B = Prog.Buffers[Id];
    if (B.K != ProgramBuffer::Input)
      continue;
    char *Dst = Arena + B.Offset;
    // A microbatch's buffer holds rows [K b, (K + 1) b) of the batch.
    int64_t Rows = Batch / Microbatches;
    int64_t Row0 = B.Microbatch >= 0 ? B.Microbatch * Rows : 0;
    switch (B.Feed) {
    case InputRole::Tokens:
    case InputRole::Targets: {
      const int64_t *Src =
          (B.Feed == InputRole::Tokens ? Data.Tokens : Data.Targets).data();
      std::memcpy(Dst, Src + Row0 * Seq, Rows * Seq * sizeof(int64_t));
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
        default: // f32, checked when the executor was created
          reinterpret_cast<float *>(Dst)[I] = float(M);
          break;
        }
      }
      break;
    case InputRole::LossWeight: // the microbatch's share of the targets
      *reinterpret_cast<float *>(Dst) =
          StepCounted ? float(double(Counted(Row0, Rows)) / StepCounted) : 0.f;
      break;
    case InputRole::LearningRate:
      *reinterpret_cast<float *>(Dst) = float(LR);
      break;
    case InputRole::Step:
      *reinterpret_cast<float *>(Dst) = float(Step);
      break;
    case InputRole::None:
      llvm_unreachable("checked when the executor was created");
    }
  }
  return Error::success();
}

Expected<double> Executor::trainStep(const TokenBatch &Data, double LR,
                                     int64_t Step) {
  if (Step < 1)
    return planError("steps are 1-based");
  if (!MissingOptimizerInput.empty())
    return planError("the plan has no optimizer step (no '" +
                     MissingOptimizerInput + "' input)");
  if (auto E = feedInputs(Data, LR, Step))
    return std::move(E);
  if (auto E = run(Phase::Optimizer, Step, /*Training=*/true))
    return std::move(E);
  return *ptr(Prog.output("loss"));
}

Expected<double> Executor::evalLoss(const TokenBatch &Data) {
  if (PipeComm || Microbatches > 1)
    return planError("evaluating a pipelined plan is not supported yet; "
                     "compile the model without --pp and --microbatches to "
                     "evaluate it");
  if (auto E = feedInputs(Data, /*LR=*/0, /*Step=*/0))
    return std::move(E);
  if (auto E = run(Phase::Forward, /*Step=*/0, /*Training=*/false))
    return std::move(E);
  return *ptr(Prog.output("loss"));
}

Error Executor::run(Phase Last, int64_t Step, bool Training) {
  int64_t Live = 0;
  size_t NumInstrs = Prog.Instrs.size();
  std::vector<int64_t> FreeAt(NumInstrs + 1, 0);
  // What the instructions write and read, for the stored-activation count.
  std::vector<int> WrittenAt(Prog.Buffers.size(), -1),
      LastRead(Prog.Buffers.size(), -1), FirstBackRead(Prog.Buffers.size(), -1);
  for (size_t I = 0; I < NumInstrs; ++I) {
    const Instruction &In = Prog.Instrs[I];
    if (In.Ph > Last)
      break;
    for (int B : In.Out) {
      const ProgramBuffer &PB = Prog.Buffers[B];
      Live += PB.Bytes;
      FreeAt[std::min<size_t>(PB.LastUse, NumInstrs)] += PB.Bytes;
      Stats.HighWaterBytes =
          std::max(Stats.HighWaterBytes, PB.Offset + PB.Bytes);
      WrittenAt[B] = I;
    }
    bool BackSide = In.Ph == Phase::Backward || In.Ph == Phase::Recompute;
    for (int B : In.In) {
      LastRead[B] = I;
      if (BackSide && FirstBackRead[B] < 0 && WrittenAt[B] >= 0 &&
          Prog.Instrs[WrittenAt[B]].Ph == Phase::Forward)
        FirstBackRead[B] = I;
    }
    if (Training)
      Stats.PeakLiveTempBytes = std::max(Stats.PeakLiveTempBytes, Live);
    auto Start = std::chrono::steady_clock::now();
    if (auto E = runInstruction(In, Step, Training))
      return createStringError(inconvertibleErrorCode(), "%s: %s",
                               describe(In, I).c_str(),
                               toString(std::move(E)).c_str());
    if (Training) {
      auto End = std::chrono::steady_clock::now();
      Times.PhaseSeconds[int(In.Ph)] +=
          std::chrono::duration<double>(End - Start).count();
      if (Opts.Trace) {
        auto Us = [](std::chrono::steady_clock::time_point T) {
          return std::chrono::duration<double, std::micro>(
                     T.time_since_epoch())
              .count();
        };
        Events.push_back({int(I), Us(Start), Us(End) - Us(Start), Step});
      }
    }
    Live -= FreeAt[I];
  }
  if (Training) {
    ++Times.Steps;
    std::vector<int64_t> Delta(NumInstrs + 2, 0);
    Stats.StoredActivationBytesByLayer.clear();
    for (size_t B = 0; B < Prog.Buffers.size(); ++B) {
      if (FirstBackRead[B] < 0 || Prog.Buffers[B].isPersistent())
        continue;
      int64_t Bytes = Prog.Buffers[B].Bytes;
      Delta[WrittenAt[B]] += Bytes;
      Delta[LastRead[B] + 1] -= Bytes;
      Stats.StoredActivationBytesByLayer[Prog.Instrs[FirstBackRead[B]].Layer] +=
          Bytes;
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
  const auto &Bufs = Prog.Buffers;
  auto In = [&](unsigned K) { return ptr(I.In[K]); };
  auto Out = [&](unsigned K) { return ptr(I.Out[K]); };
  auto InT = [&](unsigned K) -> const TensorType & {
    return Bufs[I.In[K]].Type;
  };
  auto OutT = [&](unsigned K) -> const TensorType & {
    return Bufs[I.Out[K]].Type;
  };
  auto Ids = [&](unsigned K) {
    return reinterpret_cast<const int64_t *>(In(K));
  };
  auto Zero = [&](unsigned K) {
    std::memset(Out(K), 0, OutT(K).numBytes());
  };
  auto Check = [](cpu::Status S) -> Error {
    if (S.ok())
      return Error::success();
    std::string Msg = S.Message;
    if (S.Index >= 0)
      Msg += formatv(" (element {0}, value {1})", S.Index, S.Value).str();
    return planError(Msg);
  };
  auto ShapeOf = [](const TensorType &T) {
    return cpu::Shape(T.Shape.data(), T.Shape.size());
  };
  double Ratio = Opts.Dropout.value_or(I.Attrs.getFloat("ratio", 0.0));
  if (!Training)
    Ratio = 0;

  switch (I.Op) {
  case OpKind::Embedding: {
    const TensorType &T = InT(0);
    int64_t N = InT(1).numElements(), V = T.Shape[0], H = T.Shape[1];
    if (!I.Attrs.getInt("vocab_parallel", 0))
      return Check(cpu::embedding(Out(0), In(0), Ids(1), N, V, H));
    // This rank's rows [r V, (r + 1) V); other ids contribute zeros.
    float *Y = Out(0);
    for (int64_t R = 0; R < N; ++R) {
      int64_t Id = Ids(1)[R] - rank() * V;
      if (Id >= 0 && Id < V)
        std::memcpy(Y + R * H, In(0) + Id * H, H * sizeof(float));
      else
        std::memset(Y + R * H, 0, H * sizeof(float));
    }
    return Error::success();
  }
  case OpKind::EmbeddingGrad: {
    Zero(0);
    const TensorType &T = OutT(0);
    int64_t N = InT(0).numElements(), V = T.Shape[0], H = T.Shape[1];
    if (!I.Attrs.getInt("vocab_parallel", 0))
      return Check(cpu::embeddingBackward(Out(0), In(1), Ids(0), N, V, H));
    for (int64_t R = 0; R < N; ++R) {
      int64_t Id = Ids(0)[R] - rank() * V;
      if (Id >= 0 && Id < V)
        for (int64_t J = 0; J < H; ++J)
          Out(0)[Id * H + J] += In(1)[R * H + J];
    }
    return Error::success();
  }
  case OpKind::AllReduce:
    std::memcpy(Out(0), In(0), InT(0).numBytes());
    return Comm->allReduceSum(Out(0), OutT(0).numElements());
  case OpKind::AllGather:
    return allGather(Out(0), In(0), InT(0), I.Attrs.getInt("dim", 0),
                     I.Attrs.getInt("parts", 1));
  case OpKind::ReduceScatter:
    return reduceScatter(Out(0), In(0), InT(0), I.Attrs.getInt("dim", 0),
                         I.Attrs.getInt("parts", 1));
  case OpKind::SpSplit:
    takeChunk(Out(0), In(0), InT(0), I.Attrs.getInt("dim", 0),
              I.Attrs.getInt("parts", 1));
    return Error::success();
  case OpKind::Add:
    if (InT(0).Shape == InT(1).Shape) {
      cpu::add(Out(0), In(0), In(1), OutT(0).numElements());
      return Error::success();
    }
    return Check(cpu::addBroadcast(Out(0), ShapeOf(OutT(0)), In(0),
                                   ShapeOf(InT(0)), In(1), ShapeOf(InT(1))));
  case OpKind::ReduceTo:
    return Check(cpu::reduceToShape(Out(0), ShapeOf(OutT(0)), In(0),
                                    ShapeOf(InT(0))));
  case OpKind::LayerNorm: {
    int64_t H = InT(0).dim(-1), Rows = InT(0).numElements() / H;
    std::vector<float> Scratch;
    float *Mean, *Rstd;
    if (I.Out.size() == 3) {
      Mean = Out(1);
      Rstd = Out(2);
    } else {
      Scratch.resize(2 * Rows);
      Mean = Scratch.data();
      Rstd = Scratch.data() + Rows;
    }
    cpu::layerNorm(Out(0), Mean, Rstd, In(0), In(1), In(2), Rows, H,
                   I.Attrs.getFloat("epsilon", 1e-5));
    return Error::success();
  }
  case OpKind::LayerNormGrad: {
    int64_t H = InT(1).dim(-1), Rows = InT(1).numElements() / H;
    Zero(1);
    Zero(2);
    cpu::layerNormBackward(Out(0), Out(1), Out(2), In(0), In(1), In(2), In(3),
                           In(4), Rows, H);
    return Error::success();
  }
  case OpKind::Linear: {
    int64_t InF = InT(0).dim(-1), OutF = OutT(0).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    cpu::linear(Out(0), In(0), In(1), I.In.size() > 2 ? In(2) : nullptr, Rows,
                InF, OutF, I.Attrs.getInt("trans_w", 0));
    return Error::success();
  }
  case OpKind::LinearGradW: {
    int64_t InF = InT(0).dim(-1), OutF = InT(1).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    Zero(0);
    cpu::linearBackwardWeight(Out(0), In(0), In(1), Rows, InF, OutF,
                              I.Attrs.getInt("trans_w", 0));
    return Error::success();
  }
  case OpKind::BiasGrad: {
    int64_t OutF = InT(0).dim(-1);
    Zero(0);
    cpu::biasBackward(Out(0), In(0), InT(0).numElements() / OutF, OutF);
    return Error::success();
  }
  case OpKind::Gelu:
    cpu::gelu(Out(0), In(0), InT(0).numElements(), geluApprox(I.Attrs));
    return Error::success();
  case OpKind::GeluGrad:
    cpu::geluBackward(Out(0), In(0), In(1), InT(0).numElements(),
                      geluApprox(I.Attrs));
    return Error::success();
  case OpKind::RmsNorm: {
    int64_t H = InT(0).dim(-1), Rows = InT(0).numElements() / H;
    cpu::rmsNorm(Out(0), I.Out.size() > 1 ? Out(1) : nullptr, In(0), In(1),
                 Rows, H, I.Attrs.getFloat("epsilon", 1e-6));
    return Error::success();
  }
  case OpKind::RmsNormGrad: {
    int64_t H = InT(1).dim(-1), Rows = InT(1).numElements() / H;
    Zero(1);
    cpu::rmsNormBackward(Out(0), Out(1), In(0), In(1), In(2), In(3), Rows, H);
    return Error::success();
  }
  case OpKind::Silu:
    cpu::silu(Out(0), In(0), InT(0).numElements());
    return Error::success();
  case OpKind::SiluGrad:
    cpu::siluBackward(Out(0), In(0), In(1), InT(0).numElements());
    return Error::success();
  case OpKind::Mul:
    if (InT(0).Shape == InT(1).Shape) {
      cpu::mul(Out(0), In(0), In(1), OutT(0).numElements());
      return Error::success();
    }
    return Check(cpu::mulBroadcast(Out(0), ShapeOf(OutT(0)), In(0),
                                   ShapeOf(InT(0)), In(1), ShapeOf(InT(1))));
  case OpKind::Rope:
  case OpKind::RopeGrad: {
    const TensorType &X = InT(0);
    int64_t B = X.Shape[0], A = X.Shape[1], S = X.Shape[2], D = X.Shape[3];
    int64_t CB = InT(1).Shape[0];
    bool Interleaved = I.Attrs.getInt("interleaved", 0);
    if (I.Op == OpKind::Rope)
      cpu::rope(Out(0), In(0), In(1), In(2), B, A, S, D, CB, Interleaved);
    else
      cpu::ropeBackward(Out(0), In(0), In(1), In(2), B, A, S, D, CB,
                        Interleaved);
    return Error::success();
  }
  case OpKind::RepeatHeads: {
    const TensorType &X = InT(0);
    cpu::repeatHeads(Out(0), In(0), X.Shape[0], X.Shape[1],
                     I.Attrs.getInt("repeats", 1), X.Shape[2], X.Shape[3]);
    return Error::success();
  }
  case OpKind::RepeatHeadsGrad: {
    const TensorType &X = OutT(0);
    cpu::repeatHeadsBackward(Out(0), In(0), X.Shape[0], X.Shape[1],
                             I.Attrs.getInt("repeats", 1), X.Shape[2],
                             X.Shape[3]);
    return Error::success();
  }
  case OpKind::ToHeads: { // merge_heads' inverse
    const TensorType &X = OutT(0);
    cpu::mergeHeadsBackward(Out(0), In(0), X.Shape[0], X.Shape[2], X.Shape[1],
                            X.Shape[3]);
    return Error::success();
  }
  case OpKind::SplitHeads: {
    const TensorType &Q = OutT(0);
    cpu::splitHeads(Out(0), Out(1), Out(2), In(0), Q.Shape[0], Q.Shape[2],
                    Q.Shape[1], Q.Shape[3]);
    return Error::success();
  }
  case OpKind::SplitHeadsGrad: {
    const TensorType &Q = InT(0);
    cpu::splitHeadsBackward(Out(0), In(0), In(1), In(2), Q.Shape[0],
                            Q.Shape[2], Q.Shape[1], Q.Shape[3]);
    return Error::success();
  }
  case OpKind::MergeHeads: {
    const TensorType &X = InT(0);
    cpu::mergeHeads(Out(0), In(0), X.Shape[0], X.Shape[2], X.Shape[1],
                    X.Shape[3]);
    return Error::success();
  }
  case OpKind::MergeHeadsGrad: {
    const TensorType &X = OutT(0);
    cpu::mergeHeadsBackward(Out(0), In(0), X.Shape[0], X.Shape[2], X.Shape[1],
                            X.Shape[3]);
    return Error::success();
  }
  case OpKind::BatchMatMul: {
    bool TA = I.Attrs.getInt("trans_a", 0), TB = I.Attrs.getInt("trans_b", 0);
    const TensorType &C = OutT(0);
    int64_t M = C.dim(-2), N = C.dim(-1);
    int64_t K = TA ? InT(0).dim(-2) : InT(0).dim(-1);
    int64_t Batch = C.numElements() / (M * N);
    if (InT(0).numElements() != Batch * M * K ||
        InT(1).numElements() != Batch * K * N)
      return planError("batch_matmul with broadcast batch dimensions is not "
                       "supported by the CPU backend");
    cpu::batchMatMul(Out(0), In(0), In(1), Batch, M, N, K, TA, TB);
    return Error::success();
  }
  case OpKind::Scale:
    cpu::scale(Out(0), In(0), InT(0).numElements(),
               I.Attrs.getFloat("alpha", 1.0));
    return Error::success();
  case OpKind::CausalMask: {
    const TensorType &X = InT(0);
    int64_t Sq = X.dim(-2), Sk = X.dim(-1);
    cpu::causalMask(Out(0), In(0), X.numElements() / (Sq * Sk), Sq, Sk,
                    I.Attrs.getFloat("fill", 0.0));
    return Error::success();
  }
  case OpKind::PaddingMask: {
    // bias = (1 - keep) * fill in float, as the exported graph computes it
    // (HF Llama's form: fill where 1 - keep is not 0).
    const TensorType &X = InT(0), &M = InT(1);
    int64_t B = X.Shape[0], K = X.dim(-1);
    const float Fill = float(I.Attrs.getFloat("fill", 0.0));
    const bool Where = I.Attrs.getInt("where", 0);
    const char *Keep = reinterpret_cast<const char *>(In(1));
    std::vector<float> Bias(B * K);
    for (int64_t E = 0; E < B * K; ++E) {
      float V;
      switch (M.Dtype) {
      case DType::I64:
        V = float(reinterpret_cast<const int64_t *>(Keep)[E]);
        break;
      case DType::I32:
        V = float(reinterpret_cast<const int32_t *>(Keep)[E]);
        break;
      case DType::Bool:
        V = Keep[E] ? 1.0f : 0.0f;
        break;
      case DType::F32:
        V = reinterpret_cast<const float *>(Keep)[E];
        break;
      default:
        return planError("padding_mask: unsupported mask type " + M.str());
      }
      float Inv = 1.0f - V;
      Bias[E] = Where ? (Inv != 0.0f ? Fill : 0.0f) : Inv * Fill;
    }
    cpu::addKeyBias(Out(0), In(0), Bias.data(), B, X.numElements() / (B * K),
                    K);
    return Error::success();
  }
  case OpKind::Softmax: {
    int64_t N = InT(0).dim(-1);
    cpu::softmax(Out(0), In(0), InT(0).numElements() / N, N);
    return Error::success();
  }
  case OpKind::SoftmaxGrad: {
    int64_t N = InT(0).dim(-1);
    cpu::softmaxBackward(Out(0), In(0), In(1), InT(0).numElements() / N, N);
    return Error::success();
  }
  case OpKind::Dropout: {
    auto Key = I.Attrs.getInts("key");
    if (Key.size() != 2)
      return planError("dropout has no Philox key; recompile the plan");
    cpu::DropoutKey K{Opts.Seed, uint32_t(Key[0]), uint32_t(Key[1]),
                      uint32_t(Step)};
    uint8_t *Mask =
        I.Out.size() > 1 ? reinterpret_cast<uint8_t *>(Out(1)) : nullptr;
    // The mask of an element depends on its index in the whole tensor, so it
    // is the same on any layout.
    // A microbatch is rows [K b, (K + 1) b) of the whole batch.
    const TensorType &Local = InT(0);
    const Sharding &S = Bufs[I.In[0]].Shard;
    int64_t Mb = I.Attrs.getInt("microbatch", 0),
            NumMb = I.Attrs.getInt("microbatches", 1);
    if (S.K != Sharding::Split && NumMb == 1)
      return Check(cpu::dropout(Out(0), Mask, In(0), Ratio, K,
                                cpu::GlobalIndex::whole(ShapeOf(Local))));
    SmallVector<int64_t, 4> Full(Local.Shape.begin(), Local.Shape.end()),
        Offset(Local.rank(), 0);
    if (S.K == Sharding::Split) {
      Full[S.Dim] *= S.Parts;
      Offset[S.Dim] = rank() * Local.Shape[S.Dim];
    }
    Full[0] *= NumMb;
    Offset[0] += Mb * Local.Shape[0];
    return Check(cpu::dropout(
        Out(0), Mask, In(0), Ratio, K,
        cpu::GlobalIndex::block(cpu::Shape(Full.data(), Full.size()),
                                ShapeOf(Local),
                                cpu::Shape(Offset.data(), Offset.size()))));
  }
  case OpKind::DropoutGrad:
    cpu::dropoutBackward(Out(0), In(0),
                         reinterpret_cast<const uint8_t *>(In(1)),
                         InT(0).numElements(), Ratio);
    return Error::success();
  case OpKind::CrossEntropy:
  case OpKind::CrossEntropyGrad: {
    int64_t V = InT(0).dim(-1), N = InT(1).numElements();
    int64_t Valid = I.Attrs.getInt("valid_vocab", V);
    std::optional<int64_t> Ignore;
    if (I.Attrs.has("ignore_index"))
      Ignore = I.Attrs.getInt("ignore_index", 0);
    bool Grad = I.Op == OpKind::CrossEntropyGrad;
    if (I.Attrs.getInt("vocab_parallel", 0))
      return vocabParallelCrossEntropy(Grad ? nullptr : Out(0),
                                       Grad ? Out(0) : nullptr, In(0), Ids(1),
                                       N, V, Valid, Ignore,
                                       Grad ? *In(2) : 0.0);
    if (Grad)
      return Check(cpu::crossEntropyBackward(Out(0), In(0), Ids(1), *In(2), N,
                                             V, Valid, Ignore));
    return Check(cpu::crossEntropy(Out(0), In(0), Ids(1), N, V, Valid, Ignore));
  }
  case OpKind::GradNorm: {
    // Split gradients: every rank holds a part, sum them over the group;
    // replicated ones are the same on every rank, count them once.
    double Split = 0, Whole = 0;
    for (unsigned K = 0; K < I.In.size(); ++K)
      (Bufs[I.In[K]].Shard.K == Sharding::Split ? Split : Whole) +=
          cpu::sumSquares(In(K), InT(K).numElements());
    if (Comm->size() > 1) {
      float S = float(Split);
      if (auto E = Comm->allReduceSum(&S, 1))
        return E;
      Split = S;
    }
    // Each stage's gradients: sum the squares over the pipeline.
    double Total = Split + Whole;
    if (I.Attrs.getInt("pipeline", 0) && PipeComm) {
      float T = float(Total);
      if (auto E = PipeComm->allReduceSum(&T, 1))
        return E;
      Total = T;
    }
    *Out(0) = float(std::sqrt(Total));
    return Error::success();
  }
  case OpKind::AdamW: {
    double MaxNorm = I.Attrs.getFloat("max_norm", 0.0);
    float Scale =
        MaxNorm > 0 ? cpu::clipCoefficient(*In(4), float(MaxNorm)) : 1.0f;
    cpu::adamw(In(0), In(1), In(2), In(3), InT(0).numElements(), *In(5),
               I.Attrs.getFloat("beta1", 0.9), I.Attrs.getFloat("beta2", 0.999),
               I.Attrs.getFloat("eps", 1e-8),
               I.Attrs.getFloat("weight_decay", 0.0), Scale,
               int64_t(*In(6)));
    return Error::success();
  }
  // Pipeline: point to point between the stages of one tensor-parallel
  // rank, through the pipeline group.
  case OpKind::Send:
  case OpKind::Recv:
  case OpKind::PipeAllReduce:
  case OpKind::PipeBroadcast:
    return pipelineOp(I);
  default:
    return planError("the CPU backend has no kernel for this op");
  }
}

Error Executor::pipelineOp(const Instruction &I) {
  if (!PipeComm)
    return planError("a pipeline instruction in a plan run without pipeline "
                     "stages");
  const auto &Bufs = Prog.Buffers;
  int Tag = I.Attrs.getInt("tag", 0), Peer = I.Attrs.getInt("peer", -1);
  switch (I.Op) {
  case OpKind::Send:
    return PipeComm->send(ptr(I.In[0]), Bufs[I.In[0]].Type.numBytes(), Peer,
                          Tag);
  case OpKind::Recv:
    return PipeComm->recv(ptr(I.Out[0]), Bufs[I.Out[0]].Type.numBytes(), Peer,
                          Tag);
  case OpKind::PipeBroadcast: {
    int Root = I.Attrs.getInt("root", 0);
    if (stage() == Root)
      std::memcpy(ptr(I.Out[0]), ptr(I.In[0]), Bufs[I.Out[0]].Type.numBytes());
    return PipeComm->broadcast(ptr(I.Out[0]), Bufs[I.Out[0]].Type.numBytes(),
                               Root);
  }
  case OpKind::PipeAllReduce: {
    // The first listed rank sums the parts in list order and sends the sum
    // back: every rank gets the same bits.
    auto Ranks = I.Attrs.getInts("ranks");
    float *Y = ptr(I.Out[0]);
    int64_t N = Bufs[I.Out[0]].Type.numElements(), Bytes = N * 4;
    std::memcpy(Y, ptr(I.In[0]), Bytes);
    if (Ranks.empty() || !is_contained(Ranks, int64_t(stage())))
      return planError("pipe_all_reduce does not list this stage");
    if (stage() != Ranks[0]) {
      if (auto E = PipeComm->send(Y, Bytes, Ranks[0], Tag))
        return E;
      return PipeComm->recv(Y, Bytes, Ranks[0], Tag);
    }
    std::vector<float> Part(N);
    for (size_t K = 1; K < Ranks.size(); ++K) {
      if (auto E = PipeComm->recv(Part.data(), Bytes, Ranks[K], Tag))
        return E;
      for (int64_t J = 0; J < N; ++J)
        Y[J] += Part[J];
    }
    for (size_t K = 1; K < Ranks.size(); ++K)
      if (auto E = PipeComm->send(Y, Bytes, Ranks[K], Tag))
        return E;
    return Error::success();
  }
  default:
    llvm_unreachable("not a pipeline op");
  }
}

TensorView Executor::view(int B, std::string Name) const {
  const ProgramBuffer &PB = Prog.Buffers[B];
  return {std::move(Name), PB.Type, ptr(B), PB.Shard,
          PB.Data ? PB.Data->type() : PB.Type};
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

std::optional<TensorView> Executor::gradient(StringRef Param) const {
  int B = Prog.output(("grad:" + Param).str());
  int P = Prog.findBuffer(Param);
  if (B < 0 || P < 0)
    return std::nullopt;
  // A gradient is laid out like its parameter (summed ones are whole).
  TensorView V = view(P, Param.str());
  V.Data = ptr(B);
  if (V.Shard.K != Sharding::Split)
    V.Shard = Sharding::replicated();
  return V;
}

std::optional<TensorView> Executor::logits() const {
  if (LogitsBuffer < 0)
    return std::nullopt;
  TensorView V = view(LogitsBuffer, "logits");
  if (V.Shard.K == Sharding::Split) { // vocabulary-parallel
    V.FullType = V.Type;
    V.FullType.Shape[V.Shard.Dim] *= V.Shard.Parts;
  }
  return V;
}

} // namespace sp
