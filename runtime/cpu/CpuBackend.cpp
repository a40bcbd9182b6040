//===- CpuBackend.cpp - The CPU backend ------------------------------------===//
//
// Every instruction's kernel on the host: runtime/cpu/Kernels.h for the
// computation, OpenBLAS for the GEMMs, and the communicator of the call's
// tensor group for the collectives. Activations are [batch, seq, hidden], so
// a sequence chunk is not contiguous: gathers and scatters along an inner
// axis reorder through a rank-major scratch buffer. The vocabulary-parallel
// loss reduces the row max, the sum of exponentials and the target logit
// over the group, so no rank holds the full logits.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/CpuBackend.h"
#include "ir/Float16.h"
#include "ir/OpDef.h"
#include "runtime/CollectiveWalk.h"
#include "runtime/ContextCopy.h"
#include "runtime/KernelShapes.h"
#include "runtime/TensorLayout.h"
#include "runtime/cpu/Attention.h"
#include "runtime/cpu/Bf16Gemm.h"
#include "runtime/cpu/Collectives.h"
#include "runtime/cpu/ContextAttention.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Parallel.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MathExtras.h"
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

using namespace llvm;

namespace sp {

using namespace cpu::comm;

namespace {


cpu::GeluApprox geluApprox(const Instruction &I) {
  return attrString(I.Op, I.Attrs, "approximate") == "tanh"
             ? cpu::GeluApprox::Tanh
             : cpu::GeluApprox::None;
}

} // namespace

Backend::~Backend() = default;

Expected<ParamChunk> adamwChunk(const KernelCall &C) {
  const Instruction &I = C.I;
  int64_t N = C.Prog.Buffers[I.In[0]].Type.numElements();
  int64_t Parts = attrInt(I.Op, I.Attrs, "zero_parts");
  if (!Parts)
    return ParamChunk{0, N};
  if (!C.Data || C.Data->size() != Parts)
    return makeError(formatv("adamw {{zero_parts = {0}} needs a "
                             "data-parallel group of that size (this run "
                             "has {1})",
                             Parts, C.Data ? C.Data->size() : 1));
  int64_t Chunk = C.Prog.Buffers[I.In[1]].Type.numElements();
  int64_t Begin = std::min(N, C.Data->rank() * Chunk);
  return ParamChunk{Begin, std::min(N - Begin, Chunk)};
}

extern "C" void openblas_set_num_threads(int NumThreads);
extern "C" char *openblas_get_corename(void);

std::string CpuBackend::betterBlasCore(llvm::StringRef Chosen, bool Avx512,
                                       bool Avx2Fma) {
  // OpenBLAS's cores without AVX2 (older than Haswell), by its names.
  static const char *const Old[] = {"Prescott",    "Core2",     "Penryn",
                                    "Dunnington",  "Nehalem",   "Atom",
                                    "Sandybridge", "Bulldozer", "Piledriver"};
  if (llvm::none_of(Old, [&](const char *Name) {
        return Chosen.equals_insensitive(Name);
      }))
    return "";
  return Avx512 ? "SkylakeX" : Avx2Fma ? "Haswell" : "";
}

std::string CpuBackend::betterBlasCore(std::string *Chosen) {
  std::string Core = openblas_get_corename();
  if (Chosen)
    *Chosen = Core;
  __builtin_cpu_init();
  return betterBlasCore(Core,
                        __builtin_cpu_supports("avx512f") &&
                            __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl") &&
                            __builtin_cpu_supports("avx512dq"),
                        __builtin_cpu_supports("avx2") &&
                            __builtin_cpu_supports("fma"));
}

void CpuBackend::setThreads(int Threads) {
  openblas_set_num_threads(1);
  cpu::setKernelThreads(Threads);
}

double CpuBackend::peakFlops(StringRef) const {
  static double Peak = [] {
    // At least one of gemm's tiles per kernel thread (tiles of 2^28 to
    // 2^29 multiply-adds once there are 4; cpu::gemmTiles), up to 16
    // threads (64 MiB of operands).
    const int64_t N = 1024,
                  M = 512 * std::clamp(cpu::kernelThreads(), 2, 16);
    std::vector<float> A(M * N), B(N * N), C(M * N);
    for (int64_t I = 0; I < M * N; ++I)
      A[I] = float(I % 7) * 0.25f;
    for (int64_t I = 0; I < N * N; ++I)
      B[I] = float(I % 5) * 0.5f;
    double Best = 0;
    for (int Rep = 0; Rep < 4; ++Rep) { // the first warms the threads
      auto Start = std::chrono::steady_clock::now();
      cpu::gemm<float>(false, false, M, N, N, 1.0f, A.data(), N, B.data(), N,
                       0.0f, C.data(), N);
      double S = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - Start)
                     .count();
      if (Rep && S > 0)
        Best = std::max(Best, 2.0 * double(M * N * N) / S);
    }
    return Best;
  }();
  return Peak;
}

Expected<char *> CpuBackend::allocate(size_t Bytes) {
  size_t Size = alignTo(std::max<size_t>(Bytes, 64), 64);
  char *A = static_cast<char *>(std::aligned_alloc(64, Size));
  if (!A)
    return createStringError(inconvertibleErrorCode(),
                             "cannot allocate the %zu-byte arena", Size);
  std::memset(A, 0, Size);
  return A;
}

void CpuBackend::release(char *Arena) { std::free(Arena); }

Error CpuBackend::copyToBackend(char *Dst, const void *Src, size_t Bytes) {
  std::memcpy(Dst, Src, Bytes);
  return Error::success();
}

Error CpuBackend::copyToHost(void *Dst, const char *Src, size_t Bytes) {
  std::memcpy(Dst, Src, Bytes);
  return Error::success();
}

/// Whether an instruction computes in float64 (a plan from widenToFloat64):
/// its float buffers are f64. Plain plans compute in float32.
static bool isFloat64(const KernelCall &C) {
  for (const auto *List : {&C.I.Out, &C.I.In})
    for (int B : *List)
      if (C.Prog.Buffers[B].Type.Dtype == DType::F64)
        return true;
  return false;
}

/// The additive padding bias of padding_mask (and of attention's keep
/// operand): Bias[e] = (1 - keep[e]) * Fill in T, as the exported graph
/// computes it, or with Where (HF Llama's form) Fill where 1 - keep is not 0.
template <typename T>
static Error keyBias(T *Bias, const char *Keep, const TensorType &M,
                     double FillD, bool Where) {
  const T Fill = T(FillD);
  for (int64_t E = 0, N = M.numElements(); E < N; ++E) {
    T V;
    switch (M.Dtype) {
    case DType::I64:
      V = T(reinterpret_cast<const int64_t *>(Keep)[E]);
      break;
    case DType::I32:
      V = T(reinterpret_cast<const int32_t *>(Keep)[E]);
      break;
    case DType::Bool:
      V = Keep[E] ? T(1) : T(0);
      break;
    case DType::F32:
      V = T(reinterpret_cast<const float *>(Keep)[E]);
      break;
    case DType::F64:
      V = T(reinterpret_cast<const double *>(Keep)[E]);
      break;
    default:
      return makeError("padding mask: unsupported mask type " + M.str());
    }
    T Inv = T(1) - V;
    Bias[E] = Where ? (Inv != T(0) ? Fill : T(0)) : Inv * Fill;
  }
  return Error::success();
}

template <typename T> static Error runKernel(const KernelCall &C) {
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  auto In = [&](unsigned K) { return C.in<T>(K); };
  auto Out = [&](unsigned K) { return C.out<T>(K); };
  auto InT = [&](unsigned K) -> const TensorType & { return C.inType(K); };
  auto OutT = [&](unsigned K) -> const TensorType & { return C.outType(K); };
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
    return makeError(Msg);
  };
  auto ShapeOf = [](const TensorType &Ty) {
    return cpu::Shape(Ty.Shape.data(), Ty.Shape.size());
  };
  int Rank = C.Tensor.rank();
  // Attributes with their declared defaults (ir/ops/).
  auto AInt = [&](StringRef Name) { return attrInt(I.Op, I.Attrs, Name); };
  auto AFloat = [&](StringRef Name) { return attrFloat(I.Op, I.Attrs, Name); };
  // Dropout's ratio: the run's override or the plan's; off when evaluating.
  auto Ratio = [&] {
    return C.Training ? C.Dropout.value_or(AFloat("ratio")) : 0.0;
  };

  switch (I.Op) {
  case OpKind::Embedding: {
    const TensorType &Table = InT(0);
    int64_t N = InT(1).numElements(), V = Table.Shape[0], H = Table.Shape[1];
    if (!AInt("vocab_parallel"))
      return Check(cpu::embedding(Out(0), In(0), Ids(1), N, V, H));
    // This rank's rows [r V, (r + 1) V); other ids contribute zeros.
    T *Y = Out(0);
    for (int64_t R = 0; R < N; ++R) {
      int64_t Id = Ids(1)[R] - Rank * V;
      if (Id >= 0 && Id < V)
        std::memcpy(Y + R * H, In(0) + Id * H, H * sizeof(T));
      else
        std::memset(Y + R * H, 0, H * sizeof(T));
    }
    return Error::success();
  }
  case OpKind::EmbeddingGrad: {
    Zero(0);
    const TensorType &Table = OutT(0);
    int64_t N = InT(0).numElements(), V = Table.Shape[0], H = Table.Shape[1];
    if (!AInt("vocab_parallel"))
      return Check(cpu::embeddingBackward(Out(0), In(1), Ids(0), N, V, H));
    for (int64_t R = 0; R < N; ++R) {
      int64_t Id = Ids(0)[R] - Rank * V;
      if (Id >= 0 && Id < V)
        for (int64_t J = 0; J < H; ++J)
          Out(0)[Id * H + J] += In(1)[R * H + J];
    }
    return Error::success();
  }
  case OpKind::Send:
  case OpKind::Recv:
  case OpKind::PipeBroadcast:
  case OpKind::PipeAllReduce:
    return pipelineMessage<T>(C);
  case OpKind::Cast: // runMixed rounds the f32 copy into the result
    std::memcpy(Out(0), In(0), InT(0).numBytes());
    return Error::success();
  case OpKind::GatherParam: {
    Communicator *G = C.group(collectiveGroup(I.Op, I.Attrs));
    if (!G || G->size() != AInt("parts"))
      return makeError(formatv("gather_param of {0} parts needs a "
                               "data-parallel group of that size",
                               AInt("parts")));
    return gatherParams<T>(*G, C);
  }
  case OpKind::AllReduce:
  case OpKind::AllGather:
  case OpKind::ReduceScatter:
  case OpKind::SpSplit:
    return collective<T>(C);
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
    std::vector<T> Scratch;
    T *Mean, *Rstd;
    if (I.Out.size() == 3) {
      Mean = Out(1);
      Rstd = Out(2);
    } else {
      Scratch.resize(2 * Rows);
      Mean = Scratch.data();
      Rstd = Scratch.data() + Rows;
    }
    cpu::layerNorm(Out(0), Mean, Rstd, In(0), In(1), In(2), Rows, H,
                   AFloat("epsilon"));
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
                InF, OutF, AInt("trans_w"));
    return Error::success();
  }
  case OpKind::LinearGelu: {
    int64_t InF = InT(0).dim(-1), OutF = OutT(0).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    cpu::linearGelu(Out(0), Out(1), In(0), In(1),
                    I.In.size() > 2 ? In(2) : nullptr, Rows, InF, OutF,
                    AInt("trans_w"), geluApprox(I));
    return Error::success();
  }
  case OpKind::LinearGeluGrad: {
    int64_t InF = InT(0).dim(-1), OutF = OutT(0).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    cpu::linearGeluBackward(Out(0), In(0), In(1), In(2), Rows, InF, OutF,
                            AInt("trans_w"), geluApprox(I));
    return Error::success();
  }
  case OpKind::LinearGradW: {
    int64_t InF = InT(0).dim(-1), OutF = InT(1).dim(-1);
    int64_t Rows = InT(0).numElements() / InF;
    Zero(0);
    cpu::linearBackwardWeight(Out(0), In(0), In(1), Rows, InF, OutF,
                              AInt("trans_w"));
    return Error::success();
  }
  case OpKind::BiasGrad: {
    int64_t OutF = InT(0).dim(-1);
    Zero(0);
    cpu::biasBackward(Out(0), In(0), InT(0).numElements() / OutF, OutF);
    return Error::success();
  }
  case OpKind::Gelu:
    cpu::gelu(Out(0), In(0), InT(0).numElements(), geluApprox(I));
    return Error::success();
  case OpKind::GeluGrad:
    cpu::geluBackward(Out(0), In(0), In(1), InT(0).numElements(),
                      geluApprox(I));
    return Error::success();
  case OpKind::RmsNorm: {
    int64_t H = InT(0).dim(-1), Rows = InT(0).numElements() / H;
    cpu::rmsNorm(Out(0), I.Out.size() > 1 ? Out(1) : nullptr, In(0), In(1),
                 Rows, H, AFloat("epsilon"));
    return Error::success();
  }
  case OpKind::RmsNormGrad: {
    int64_t H = InT(1).dim(-1), Rows = InT(1).numElements() / H;
    Zero(1);
    cpu::rmsNormBackward(Out(0), Out(1), In(0), In(1), In(2), In(3), Rows, H);
    return Error::success();
  }
    // The activations of ir/Ops.def's SP_UNARY_OP lines.
#define SP_OP(Enum, Name)
#define SP_UNARY_OP(Enum, Name, OnnxName)                                      \
  case OpKind::Enum:                                                           \
    cpu::activation(cpu::Activation::Enum, Out(0), In(0),                      \
                    InT(0).numElements());                                     \
    return Error::success();                                                   \
  case OpKind::Enum##Grad:                                                     \
    cpu::activationBackward(cpu::Activation::Enum, Out(0), In(0), In(1),       \
                            InT(0).numElements());                             \
    return Error::success();
#include "ir/Ops.def"
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
    int64_t Rot = InT(1).Shape[2]; // the tables' width: partial rotary
    bool Interleaved = AInt("interleaved");
    if (I.Op == OpKind::Rope)
      cpu::rope(Out(0), In(0), In(1), In(2), B, A, S, D, CB, Interleaved, Rot);
    else
      cpu::ropeBackward(Out(0), In(0), In(1), In(2), B, A, S, D, CB,
                        Interleaved, Rot);
    return Error::success();
  }
  case OpKind::RepeatHeads: {
    const TensorType &X = InT(0);
    cpu::repeatHeads(Out(0), In(0), X.Shape[0], X.Shape[1],
                     AInt("repeats"), X.Shape[2], X.Shape[3]);
    return Error::success();
  }
  case OpKind::RepeatHeadsGrad: {
    const TensorType &X = OutT(0);
    cpu::repeatHeadsBackward(Out(0), In(0), X.Shape[0], X.Shape[1],
                             AInt("repeats"), X.Shape[2],
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
                    Q.Shape[1], Q.Shape[3], AInt("per_head"));
    return Error::success();
  }
  case OpKind::SplitHeadsGrad: {
    const TensorType &Q = InT(0);
    cpu::splitHeadsBackward(Out(0), In(0), In(1), In(2), Q.Shape[0], Q.Shape[2],
                            Q.Shape[1], Q.Shape[3], AInt("per_head"));
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
    auto G = batchMatMulShape(C, "CPU");
    if (!G)
      return G.takeError();
    cpu::batchMatMul(Out(0), In(0), In(1), G->Batch, G->M, G->N, G->K,
                     G->TransA, G->TransB, AInt("causal"), AInt("causal_a"));
    return Error::success();
  }
  case OpKind::Scale:
    cpu::scale(Out(0), In(0), InT(0).numElements(),
               AFloat("alpha"));
    return Error::success();
  case OpKind::CausalMask: {
    const TensorType &X = InT(0);
    int64_t Sq = X.dim(-2), Sk = X.dim(-1);
    cpu::causalMask(Out(0), In(0), X.numElements() / (Sq * Sk), Sq, Sk,
                    AFloat("fill"));
    return Error::success();
  }
  case OpKind::PaddingMask: {
    const TensorType &X = InT(0);
    int64_t B = X.Shape[0], K = X.dim(-1);
    std::vector<T> Bias(B * K);
    if (auto E = keyBias<T>(Bias.data(), C.buffer(I.In[1]), InT(1),
                            AFloat("fill"), AInt("where")))
      return E;
    cpu::addKeyBias(Out(0), In(0), Bias.data(), B, X.numElements() / (B * K),
                    K);
    return Error::success();
  }
  case OpKind::Attention:
  case OpKind::AttentionGrad: {
    // (q, k, v, keep?) -> o, lse, or (do, q, k, v, o, lse, keep?) -> dq,
    // dk, dv: runtime/cpu/Attention.h. Packed: (qkv, keep?) -> o, lse, or
    // (do, qkv, o, lse, keep?) -> dqkv.
    const bool Fwd = I.Op == OpKind::Attention;
    const unsigned Q = Fwd ? 0 : 1, Qkv = attentionInputs(I.Op, I.Attrs);
    const bool Packed = Qkv == 1;
    cpu::AttentionShape Sh;
    if (Packed) { // qkv [b, s, 3 a d]
      const TensorType &X = InT(Q);
      int64_t Heads = AInt("heads");
      Sh = {X.Shape[0], Heads, Heads, X.Shape[1], X.Shape[1],
            X.Shape[2] / (3 * Heads)};
    } else {
      const TensorType &QT = InT(Q), &KT = InT(Q + 1);
      Sh = {QT.Shape[0], QT.Shape[1], KT.Shape[1],
            QT.Shape[2], KT.Shape[2], QT.Shape[3]};
    }
    // Context parallelism: q, k, v are this rank's positions, keep covers
    // the whole sequence's keys.
    const int Cp = int(AInt("cp"));
    Communicator *CpGroup = C.group("cp");
    if (Cp > 1 && (!CpGroup || CpGroup->size() != Cp))
      return makeError(formatv("attention {{cp = {0}} needs a "
                               "context-parallel group of {0} ranks",
                               Cp));
    const ContextLayout Layout{Cp, AInt("cp_zigzag") != 0, Sh.Sk * Cp};
    cpu::AttentionCore Core;
    Core.Scale = AFloat("scale");
    Core.Causal = AInt("causal");
    Core.Fill = AFloat("fill");
    Core.PadFirst = AInt("pad_first");
    Core.Merged = AInt("merged");
    Core.Packed = Packed;
    std::vector<T> Bias;
    const unsigned KeepAt = attentionKeepOperand(I.Op, I.Attrs);
    if (I.In.size() > KeepAt) {
      Bias.resize(Sh.Batch * Layout.Seq);
      if (auto E = keyBias<T>(Bias.data(), C.buffer(I.In[KeepAt]),
                              InT(KeepAt), AFloat("pad_fill"),
                              AInt("pad_where")))
        return E;
    }
    SmallVector<int64_t, 4> Full = {Sh.Batch, Sh.Heads, Sh.Sq, Sh.Sk},
                            Local = Full, Offset(4, 0);
    // (Under cp the ring sets the queries' and keys' part per block.)
    if (AInt("dropout")) {
      auto Key = attrInts(I.Op, I.Attrs, "key");
      if (Key.size() != 2)
        return makeError("attention has no Philox key; recompile the plan");
      Core.Dropout = Ratio();
      Core.Key = cpu::DropoutKey{C.Seed, uint32_t(Key[0]), uint32_t(Key[1]),
                                 uint32_t(C.Step)};
      // The probabilities' block of the whole [b, a, s, t] tensor, as the
      // dropout this op replaced would find it: heads split over the tensor
      // group, rows of the microbatch and the data-parallel replica.
      const Sharding &S = Bufs[I.In[Q]].Shard;
      const int HeadsDim = Packed ? 2 : 1; // qkv [b, s, 3 h], q [b, a, s, d]
      if (S.K == Sharding::Split && S.Dim != HeadsDim)
        return makeError("attention: q is split along a dimension other "
                         "than its heads");
      GlobalBlock G = globalBlock(
          Local,
          S.K == Sharding::Split ? Sharding::split(1, S.Parts) : Sharding(),
          Rank, AInt("microbatch"), AInt("microbatches"), C.replica(),
          C.replicas());
      Full.assign(G.Full.begin(), G.Full.end());
      Offset.assign(G.Offset.begin(), G.Offset.end());
      if (Cp > 1)
        Full[2] = Full[3] = Layout.Seq;
    }
    Core.Probs = cpu::GlobalIndex::block(cpu::Shape(Full.data(), 4),
                                         cpu::Shape(Local.data(), 4),
                                         cpu::Shape(Offset.data(), 4));
    const T *BiasP = Bias.empty() ? nullptr : Bias.data();
    if (Cp > 1) { // the ring (runtime/cpu/ContextAttention.h)
      if (Packed)
        return makeError("attention {cp > 1, packed = 1}: the ring needs q, "
                         "k and v apart; recompile the plan");
      // ring: the cp group's ring; a2a: its all-to-all, then a ring of
      // one; a2a+ring: the all-to-all groups and the rings across them.
      const std::string Comm = attrString(I.Op, I.Attrs, "cp_comm");
      cpu::ContextGroups Groups{nullptr, CpGroup};
      if (Comm == "a2a") {
        Groups = {CpGroup, nullptr};
      } else if (Comm == "a2a+ring") {
        const int64_t K = AInt("cp_a2a");
        if (!C.ContextInner || !C.ContextOuter || C.ContextInner->size() != K ||
            C.ContextOuter->size() * K != Cp)
          return makeError(formatv("attention {{cp = {0}, cp_a2a = {1}} "
                                   "needs the cp group split into "
                                   "all-to-all groups of {1} ranks and the "
                                   "rings across them",
                                   Cp, K));
        Groups = {C.ContextInner, C.ContextOuter};
      } else if (Comm != "ring") {
        return makeError("attention: cp_comm '" + Comm +
                         "' is not ring, a2a or a2a+ring; recompile the plan");
      }
      if (Fwd)
        return cpu::contextAttentionForward(Out(0), Out(1), In(0), In(1), In(2),
                                            BiasP, Sh, Core, Groups, Layout);
      return cpu::contextAttentionBackward(Out(0), Out(1), Out(2), In(0), In(1),
                                           In(2), In(3), In(4), In(5), BiasP,
                                           Sh, Core, Groups, Layout);
    }
    // q, k, v (and dq, dk, dv): three tensors, or the packed one's column
    // blocks.
    const int64_t H = Sh.Heads * Sh.D;
    const T *QKV[3];
    for (int K = 0; K < 3; ++K)
      QKV[K] = Packed ? In(Q) + K * H : In(Q + K);
    if (Fwd)
      return Check(cpu::attentionForward(Out(0), Out(1), QKV[0], QKV[1],
                                         QKV[2], BiasP, Sh, Core));
    T *D[3];
    for (int K = 0; K < 3; ++K)
      D[K] = Packed ? Out(0) + K * H : Out(K);
    const unsigned O = Q + Qkv; // o, then lse
    return Check(cpu::attentionBackward(D[0], D[1], D[2], In(0), QKV[0],
                                        QKV[1], QKV[2], In(O), In(O + 1),
                                        BiasP, Sh, Core));
  }
  case OpKind::Softmax:
  case OpKind::SoftmaxGrad: {
    // Fused (lower/FuseAttention.cpp): scale, causal_mask and softmax, and
    // backwards softmax_grad, the mask and the scale, with the bits of the
    // unfused sequence (the kernels run its operations row by row). A scale
    // by 1 is the identity.
    bool Fwd = I.Op == OpKind::Softmax;
    const TensorType &X = InT(0);
    int64_t N = X.dim(-1), Elems = X.numElements();
    bool Causal = AInt("causal");
    if (Causal && X.rank() < 2)
      return makeError(Twine(opName(I.Op)) + " {causal} expects rank >= 2 "
                                             "scores");
    int64_t Sq = Causal ? X.dim(-2) : 1;
    if (N == 0 || Sq == 0)
      return Error::success();
    double Alpha = AFloat("alpha"), Fill = Causal ? AFloat("fill") : 0.0;
    if (Fwd)
      cpu::scaledCausalSoftmax(Out(0), In(0), Elems / (Sq * N), Sq, N, Alpha,
                               Causal, Fill);
    else
      cpu::scaledCausalSoftmaxBackward(Out(0), In(0), In(1), Elems / (Sq * N),
                                       Sq, N, Alpha, Causal, Fill);
    return Error::success();
  }
  case OpKind::Dropout:
  case OpKind::DropoutAdd: {
    // dropout_add: the residual added as each piece is written.
    const T *Addend = I.Op == OpKind::DropoutAdd ? In(1) : nullptr;
    auto Key = attrInts(I.Op, I.Attrs, "key");
    if (Key.size() != 2)
      return makeError("dropout has no Philox key; recompile the plan");
    cpu::DropoutKey K{C.Seed, uint32_t(Key[0]), uint32_t(Key[1]),
                      uint32_t(C.Step)};
    uint8_t *Mask =
        I.Out.size() > 1 ? reinterpret_cast<uint8_t *>(Out(1)) : nullptr;
    // The mask of an element depends on its index in the whole tensor, so it
    // is the same on any layout.
    // A microbatch is rows [K b, (K + 1) b) of the whole batch, and a
    // data-parallel replica R of D holds the step's microbatches
    // [R M, (R + 1) M) of D M (the rows its data loader reads).
    const TensorType &Local = InT(0);
    const Sharding &S = Bufs[I.In[0]].Shard;
    const int64_t NumMb = AInt("microbatches") * C.replicas();
    // causal (lower/CausalProducts.h): no draws above the diagonal of the
    // last two dimensions, which must be whole on this rank.
    bool Causal = I.Op == OpKind::Dropout && AInt("causal");
    if (Causal && S.K == Sharding::Split && S.Dim >= int(Local.rank()) - 2)
      return makeError("dropout {causal} of a tensor split along its last "
                       "two dimensions; the plan is corrupt");
    const int Cp = int(AInt("cp"));
    if (S.K != Sharding::Split && NumMb == 1 && Cp == 1)
      return Check(cpu::dropout(Out(0), Mask, In(0), Ratio(), K,
                                cpu::GlobalIndex::whole(ShapeOf(Local)),
                                Addend, Causal));
    GlobalBlock G =
        globalBlock(Local.Shape, S, Rank, AInt("microbatch"),
                    AInt("microbatches"), C.replica(), C.replicas());
    if (Cp > 1) { // axis cp_dim is this rank's positions of the sequence
      Communicator *CpGroup = C.group("cp");
      if (!CpGroup || CpGroup->size() != Cp)
        return makeError(formatv("dropout {{cp = {0}} needs a "
                                 "context-parallel group of {0} ranks",
                                 Cp));
      std::string Why =
          withContext(G, Local.Shape, int(AInt("cp_dim")), CpGroup->rank(), Cp,
                      AInt("cp_zigzag") != 0);
      if (!Why.empty())
        return makeError("dropout: " + Why);
    }
    cpu::GlobalIndex GI = cpu::GlobalIndex::block(
        cpu::Shape(G.Full.data(), G.Full.size()), ShapeOf(Local),
        cpu::Shape(G.Offset.data(), G.Offset.size()));
    for (size_t D = 0; D < G.Seam.size() && D < size_t(cpu::MaxRank); ++D) {
      GI.Seam[D] = G.Seam[D];
      GI.Jump[D] = G.Jump[D];
    }
    return Check(
        cpu::dropout(Out(0), Mask, In(0), Ratio(), K, GI, Addend, Causal));
  }
  case OpKind::DropoutGrad:
    cpu::dropoutBackward(Out(0), In(0),
                         reinterpret_cast<const uint8_t *>(In(1)),
                         InT(0).numElements(), Ratio());
    return Error::success();
  case OpKind::CrossEntropy:
  case OpKind::CrossEntropyGrad: {
    CrossEntropyShape X = crossEntropyShape(C);
    if (X.VocabParallel)
      return vocabParallelCrossEntropy(C.Tensor, X.Grad ? nullptr : Out(0),
                                       X.Grad ? Out(0) : nullptr, In(0),
                                       Ids(1), X.N, X.V, X.Valid, X.Ignore,
                                       X.Grad ? *In(2) : 0.0);
    if (X.Grad)
      return Check(cpu::crossEntropyBackward(Out(0), In(0), Ids(1), *In(2),
                                             X.N, X.V, X.Valid, X.Ignore));
    return Check(
        cpu::crossEntropy(Out(0), In(0), Ids(1), X.N, X.V, X.Valid, X.Ignore));
  }
  case OpKind::GradNorm: {
    // Split gradients: every rank holds a part, sum them over the group;
    // replicated ones are the same on every rank, count them once. The sums
    // over the groups are in double, so that how the gradients are cut
    // (tensor-parallel parts, ZeRO chunks) moves the norm by about 1e-16,
    // far below float32's rounding of it.
    double Split = 0, Whole = 0;
    for (unsigned K = 0; K < I.In.size(); ++K)
      (Bufs[I.In[K]].Shard.K == Sharding::Split ? Split : Whole) +=
          cpu::sumSquares(In(K), InT(K).numElements());
    if (C.Tensor.size() > 1)
      if (auto E = C.Tensor.allReduceSum(&Split, 1))
        return E;
    double Total = Split + Whole;
    // ZeRO: each replica holds a chunk of every gradient; sum over them.
    if (AInt("zero")) {
      if (!C.Data)
        return makeError("grad_norm {zero = 1} in a plan run without "
                         "data-parallel replicas");
      if (auto E = C.Data->allReduceSum(&Total, 1))
        return E;
    }
    // Each stage's gradients: sum the squares over the pipeline, in double
    // too (a float sum's rounding would depend on the order the
    // communicator adds the stages in: MPI's and the threads' differ).
    if (AInt("pipeline") && C.Pipeline)
      if (auto E = C.Pipeline->allReduceSum(&Total, 1))
        return E;
    // Loss scaling: the norm of the unscaled gradients (a power of two's
    // square, exact).
    *Out(0) = T(std::sqrt(Total * C.GradScale * C.GradScale));
    return Error::success();
  }
  case OpKind::Accumulate: {
    int64_t N = InT(1).numElements();
    if (AInt("first"))
      std::memcpy(In(0), In(1), N * sizeof(T));
    else
      cpu::add(In(0), In(0), In(1), N);
    return Error::success();
  }
  case OpKind::AdamW: {
    double MaxNorm = AFloat("max_norm");
    T Scale = MaxNorm > 0 ? cpu::clipCoefficient(*In(4), T(MaxNorm)) : T(1);
    Scale *= T(C.GradScale); // loss scaling: a power of two, exact
    auto Chunk = adamwChunk(C); // with ZeRO, g, m, v are this rank's chunk
    if (!Chunk)
      return Chunk.takeError();
    cpu::adamw(In(0) + Chunk->Begin, In(1), In(2), In(3), Chunk->Count, *In(5),
               AFloat("beta1"), AFloat("beta2"),
               AFloat("eps"),
               AFloat("weight_decay"), Scale,
               int64_t(*In(6)));
    return Error::success();
  }
  default:
    return makeError("the CPU backend has no kernel for this op");
  }
}

static bool isHalf(DType T) { return T == DType::BF16 || T == DType::F16; }

/// Float32 scratch of this thread, at least Bytes (64-byte aligned).
static Expected<char *> scratch(int64_t Bytes) {
  struct Free {
    void operator()(char *P) const { std::free(P); }
  };
  thread_local std::unique_ptr<char, Free> Scratch;
  thread_local int64_t ScratchBytes = 0;
  if (Bytes > ScratchBytes) {
    Scratch.reset(static_cast<char *>(
        std::aligned_alloc(64, alignTo(std::max<int64_t>(Bytes, 1), 64))));
    if (!Scratch) {
      ScratchBytes = 0;
      return makeError(
          formatv("cannot allocate {0} bytes of float32 scratch", Bytes));
    }
    ScratchBytes = Bytes;
  }
  return Scratch.get();
}

/// A GEMM instruction of a bf16 plan (linear, linear_grad_w, batch_matmul)
/// on a CPU with the AVX-512 BF16 dot product: its bf16 operands are read
/// where they are (cpu::gemmBf16 packs them), its float32 sums land in the
/// result when that is float32 (a weight's gradient), else in float32
/// scratch that is rounded to bf16 once. The rule is runMixed's (float32
/// accumulation, one rounding); only the order of the float32 additions is
/// the kernel's. Returns false for any other instruction, which runMixed
/// then runs.
static Expected<bool> runBf16Gemm(const KernelCall &C) {
  const Instruction &I = C.I;
  if (I.Op != OpKind::Linear && I.Op != OpKind::LinearGradW &&
      I.Op != OpKind::BatchMatMul)
    return false;
  const auto &Bufs = C.Prog.Buffers;
  auto Type = [&](int B) -> const TensorType & { return Bufs[B].Type; };
  if (I.In.size() < 2 || I.Out.size() != 1 ||
      Type(I.In[0]).Dtype != DType::BF16 ||
      Type(I.In[1]).Dtype != DType::BF16)
    return false;
  for (int B : {I.Out[0], I.In.size() > 2 ? I.In[2] : I.Out[0]})
    if (Type(B).Dtype != DType::BF16 && Type(B).Dtype != DType::F32)
      return false;
  auto Bf16 = [&](int B) {
    return reinterpret_cast<const uint16_t *>(C.buffer(B));
  };
  const TensorType &Y = Type(I.Out[0]);
  const bool Narrow = Y.Dtype == DType::BF16;
  float *Sums = reinterpret_cast<float *>(C.buffer(I.Out[0]));
  if (Narrow) {
    auto S = scratch(Y.numElements() * int64_t(sizeof(float)));
    if (!S)
      return S.takeError();
    Sums = reinterpret_cast<float *>(*S);
  }
  auto AInt = [&](StringRef Name) { return attrInt(I.Op, I.Attrs, Name); };
  switch (I.Op) {
  case OpKind::Linear: { // Y = X op(W) (+ bias)
    int64_t InF = Type(I.In[0]).dim(-1), OutF = Y.dim(-1);
    int64_t Rows = Type(I.In[0]).numElements() / InF;
    bool TransW = AInt("trans_w");
    float Beta = 0;
    if (I.In.size() > 2) {
      const char *Bias = C.buffer(I.In[2]);
      if (Type(I.In[2]).Dtype == DType::BF16)
        cpu::widen16(Sums, reinterpret_cast<const uint16_t *>(Bias), OutF,
                     true);
      else
        std::memcpy(Sums, Bias, OutF * sizeof(float));
      for (int64_t R = 1; R < Rows; ++R)
        std::memcpy(Sums + R * OutF, Sums, OutF * sizeof(float));
      Beta = 1;
    }
    cpu::gemmBf16(false, TransW, Rows, OutF, InF, Bf16(I.In[0]), InF,
                  Bf16(I.In[1]), TransW ? InF : OutF, Beta, Sums, OutF);
    break;
  }
  case OpKind::LinearGradW: { // DW = X^T DY, or DY^T X when W is [Out, In]
    int64_t InF = Type(I.In[0]).dim(-1), OutF = Type(I.In[1]).dim(-1);
    int64_t Rows = Type(I.In[0]).numElements() / InF;
    if (AInt("trans_w"))
      cpu::gemmBf16(true, false, OutF, InF, Rows, Bf16(I.In[1]), OutF,
                    Bf16(I.In[0]), InF, 0, Sums, InF);
    else
      cpu::gemmBf16(true, false, InF, OutF, Rows, Bf16(I.In[0]), InF,
                    Bf16(I.In[1]), OutF, 0, Sums, OutF);
    break;
  }
  default: { // batch_matmul
    if (AInt("causal") || AInt("causal_a"))
      return false; // the float32 kernel's causal blocks (runMixed)
    bool TA = AInt("trans_a"), TB = AInt("trans_b");
    int64_t M = Y.dim(-2), N = Y.dim(-1);
    int64_t K = TA ? Type(I.In[0]).dim(-2) : Type(I.In[0]).dim(-1);
    int64_t Batch = Y.numElements() / (M * N);
    if (Type(I.In[0]).numElements() != Batch * M * K ||
        Type(I.In[1]).numElements() != Batch * K * N)
      return false; // runMixed reports the broadcast batch
    const uint16_t *A = Bf16(I.In[0]), *B = Bf16(I.In[1]);
    cpu::parallelFor(Batch, 1, [&](int64_t P0, int64_t P1) {
      for (int64_t P = P0; P < P1; ++P)
        cpu::gemmBf16(TA, TB, M, N, K, A + P * M * K, TA ? M : K,
                      B + P * K * N, TB ? K : N, 0, Sums + P * M * N, N);
    });
    break;
  }
  }
  if (Narrow) {
    cpu::narrow16(reinterpret_cast<uint16_t *>(C.buffer(I.Out[0])), Sums,
                  Y.numElements(), true);
  }
  return true;
}

/// Mixed precision: an instruction that touches a bf16 or fp16 buffer runs
/// the float32 kernel on float32 copies of its buffers (exact widening), and
/// each 16-bit result is its float32 result rounded to nearest even. So every
/// op accumulates in float32 (GEMMs, reductions, collectives, the norm
/// statistics), and rounds once, where it stores.
static Error runMixed(const KernelCall &C) {
  if (cpu::bf16DotEnabled()) {
    auto Done = runBf16Gemm(C);
    if (!Done)
      return Done.takeError();
    if (*Done)
      return Error::success();
  }
  const Instruction &I = C.I;
  const auto &Bufs = C.Prog.Buffers;
  // The instruction's buffers, each once (an in-place operand is also a
  // result): the 16-bit ones as float32 in a scratch arena of this thread,
  // the others where they are.
  Program Local;
  Instruction LI = I;
  SmallVector<int, 8> Ids;
  int64_t Size = 0;
  auto Map = [&](int &B) {
    auto It = find(Ids, B);
    if (It != Ids.end()) {
      B = It - Ids.begin();
      return;
    }
    ProgramBuffer PB = Bufs[B];
    PB.Offset = -1;
    if (isHalf(PB.Type.Dtype)) {
      PB.Type.Dtype = DType::F32;
      PB.Bytes = PB.Type.numBytes();
      PB.Offset = Size;
      Size += alignTo(std::max<int64_t>(PB.Bytes, 1), 64);
    }
    Local.Buffers.push_back(std::move(PB));
    Ids.push_back(B);
    B = Ids.size() - 1;
  };
  for (int &B : LI.In)
    Map(B);
  for (int &B : LI.Out)
    Map(B);
  auto Scratch = scratch(Size);
  if (!Scratch)
    return Scratch.takeError();
  SmallVector<char *, 8> Where;
  for (size_t K = 0; K < Ids.size(); ++K)
    Where.push_back(Local.Buffers[K].Offset >= 0
                        ? *Scratch + Local.Buffers[K].Offset
                        : C.buffer(Ids[K]));
  auto Convert = [&](size_t K, bool ToFloat) {
    DType T = Bufs[Ids[K]].Type.Dtype;
    auto *H = reinterpret_cast<uint16_t *>(C.buffer(Ids[K]));
    auto *F = reinterpret_cast<float *>(Where[K]);
    int64_t N = Bufs[Ids[K]].Type.numElements();
    if (ToFloat)
      cpu::widen16(F, H, N, T == DType::BF16);
    else
      cpu::narrow16(H, F, N, T == DType::BF16);
  };
  // The operands, and the results an op with side effects writes in place
  // (the kernels overwrite their other results).
  bool InPlace = opDef(I.Op).SideEffects;
  for (size_t K = 0; K < Ids.size(); ++K)
    if (Local.Buffers[K].Offset >= 0 &&
        (InPlace || is_contained(I.In, Ids[K])))
      Convert(K, /*ToFloat=*/true);
  if (auto E = runKernel<float>(KernelCall{
          LI, Local, nullptr, C.Step, C.Training, C.Dropout, C.Seed, C.Tensor,
          C.Pipeline, C.Data, C.GradScale, Where.data(), C.Context}))
    return E;
  for (size_t K = 0; K < Ids.size(); ++K)
    if (Local.Buffers[K].Offset >= 0 &&
        (InPlace || is_contained(I.Out, Ids[K])))
      Convert(K, /*ToFloat=*/false);
  return Error::success();
}

/// ring_shift and ring_concat (runtime/CollectiveWalk.h's ringWalk) move
/// bytes, in whatever type the plan stores: the same code for float32,
/// float64 and the 16-bit types. The shift's sends are buffered, so the
/// ring cannot deadlock.
static Error runRing(const KernelCall &C) {
  auto G = groupOf(C);
  if (!G)
    return G.takeError();
  struct Steps {
    Communicator &G;
    Error copy(void *Dst, const void *Src, int64_t Bytes) {
      std::memmove(Dst, Src, Bytes);
      return Error::success();
    }
    Error shift(const void *Send, int Next, void *Recv, int Prev,
                int64_t Bytes) {
      // The tag keeps the ring's messages apart from any other use of the
      // group's point-to-point channel.
      constexpr int RingTag = 0x52494e47; // "RING"
      if (auto E = G.send(Send, Bytes, Next, RingTag))
        return E;
      return G.recv(Recv, Bytes, Prev, RingTag);
    }
    Error place(void *Whole, const void *Chunk, const RingCopy &R, int Parts) {
      placeChunk(Whole, Chunk, R.Outer, R.ChunkBytes, Parts, R.Slot);
      return Error::success();
    }
  };
  return ringWalk(C, **G, Steps{**G});
}

/// cp_slice and cp_pad: copies of bytes along the sequence axis, whatever
/// the type (token, position ids or activations).
static Error runContextCopy(const KernelCall &C) {
  auto X = contextCopyCall(C);
  if (!X)
    return X.takeError();
  contextCopy(X->Whole, X->Local, X->WholeType, X->Dim, X->Layout, X->Rank,
              X->Slice);
  return Error::success();
}

Error CpuBackend::run(const KernelCall &C) {
  if (C.I.Op == OpKind::RingShift || C.I.Op == OpKind::RingConcat)
    return runRing(C);
  if (C.I.Op == OpKind::CpSlice || C.I.Op == OpKind::CpPad)
    return runContextCopy(C);
  if (isFloat64(C))
    return runKernel<double>(C);
  for (const auto *List : {&C.I.Out, &C.I.In})
    for (int B : *List)
      if (isHalf(C.Prog.Buffers[B].Type.Dtype))
        return runMixed(C);
  return runKernel<float>(C);
}

} // namespace sp
