//===- ExecutorParallel.cpp - Tensor-parallel pieces of the executor -----===//
//
// What a rank of a tensor-parallel group does beyond the single-device
// kernels: read its slice of a parameter, run the concrete collectives
// (activations are [batch, seq, hidden], so a sequence chunk is not
// contiguous and gathers/scatters reorder through a rank-major scratch
// buffer), the vocabulary-parallel embedding and cross entropy, and assemble
// whole tensors for dumps.
//
//===----------------------------------------------------------------------===//
#include "runtime/Executor.h"
#include "llvm/Support/FormatVariadic.h"
#include <cmath>
#include <cstring>
#include <limits>

using namespace llvm;

namespace sp {

namespace {

/// The source index along a split axis of local index J on rank R, or -1 for
/// padding. The axis of the whole tensor (padded to Padded when set) holds
/// Blocks blocks, each split in Parts equal parts; rank R holds part R of
/// every block.
int64_t sourceIndex(const Sharding &S, int64_t SourceSize, int64_t LocalSize,
                    int R, int64_t J) {
  int64_t Full = S.Padded ? S.Padded : SourceSize;
  int64_t BlockSize = Full / S.Blocks, PerBlock = LocalSize / S.Blocks;
  int64_t G = (J / PerBlock) * BlockSize + R * PerBlock + J % PerBlock;
  return G < SourceSize ? G : -1;
}

struct AxisView {
  int64_t Outer = 1, Inner = 1;
};

AxisView around(const TensorType &T, int Dim) {
  AxisView A;
  for (int I = 0; I < Dim; ++I)
    A.Outer *= T.Shape[I];
  for (int I = Dim + 1; I < int(T.rank()); ++I)
    A.Inner *= T.Shape[I];
  return A;
}

} // namespace

Error Executor::loadParameter(const ProgramBuffer &B) {
  auto Bytes = B.Data->load();
  if (!Bytes)
    return createStringError(inconvertibleErrorCode(), "cannot load '%s': %s",
                             B.Name.c_str(),
                             toString(Bytes.takeError()).c_str());
  const TensorType &Src = B.Data->type();
  if (int64_t(Bytes->size()) != Src.numBytes())
    return createStringError(inconvertibleErrorCode(),
                             "'%s' has the wrong size", B.Name.c_str());
  char *Dst = Arena + B.Offset;
  if (B.Shard.K != Sharding::Split) {
    std::memcpy(Dst, Bytes->data(), Bytes->size());
    return Error::success();
  }
  // This rank's slice, read from the whole source.
  const Sharding &S = B.Shard;
  AxisView A = around(B.Type, S.Dim);
  int64_t Local = B.Type.Shape[S.Dim], Source = Src.Shape[S.Dim];
  size_t Elt = dtypeSize(B.Type.Dtype), Row = A.Inner * Elt;
  for (int64_t O = 0; O < A.Outer; ++O)
    for (int64_t J = 0; J < Local; ++J) {
      char *To = Dst + (O * Local + J) * Row;
      int64_t G = sourceIndex(S, Source, Local, rank(), J);
      if (G < 0)
        std::memset(To, 0, Row); // vocabulary padding
      else
        std::memcpy(To, Bytes->data() + (O * Source + G) * Row, Row);
    }
  return Error::success();
}

Expected<std::vector<float>> Executor::gather(const TensorView &V) const {
  std::vector<float> Full(V.FullType.numElements());
  if (V.Shard.K != Sharding::Split) {
    std::memcpy(Full.data(), V.Data, Full.size() * sizeof(float));
    return Full;
  }
  const Sharding &S = V.Shard;
  int Parts = groupSize();
  std::vector<float> All(V.size() * Parts);
  if (auto E = Comm->allGather(All.data(), V.Data, V.size()))
    return std::move(E);
  AxisView A = around(V.Type, S.Dim);
  int64_t Local = V.Type.Shape[S.Dim], Source = V.FullType.Shape[S.Dim];
  for (int R = 0; R < Parts; ++R)
    for (int64_t O = 0; O < A.Outer; ++O)
      for (int64_t J = 0; J < Local; ++J) {
        int64_t G = sourceIndex(S, Source, Local, R, J);
        if (G >= 0)
          std::memcpy(&Full[(O * Source + G) * A.Inner],
                      &All[R * V.size() + (O * Local + J) * A.Inner],
                      A.Inner * sizeof(float));
      }
  return Full;
}

Error Executor::allGather(float *Out, const float *In, const TensorType &Local,
                          int Dim, int Parts) const {
  int64_t N = Local.numElements();
  AxisView A = around(Local, Dim);
  if (A.Outer == 1)
    return Comm->allGather(Out, In, N);
  std::vector<float> Scratch(N * Parts); // [rank][outer][local][inner]
  if (auto E = Comm->allGather(Scratch.data(), In, N))
    return E;
  int64_t Chunk = Local.Shape[Dim] * A.Inner;
  for (int R = 0; R < Parts; ++R)
    for (int64_t O = 0; O < A.Outer; ++O)
      std::memcpy(Out + (O * Parts + R) * Chunk, &Scratch[R * N + O * Chunk],
                  Chunk * sizeof(float));
  return Error::success();
}

Error Executor::reduceScatter(float *Out, const float *In,
                              const TensorType &Full, int Dim,
                              int Parts) const {
  int64_t N = Full.numElements() / Parts;
  AxisView A = around(Full, Dim);
  if (A.Outer == 1)
    return Comm->reduceScatterSum(Out, In, N);
  std::vector<float> Scratch(N * Parts); // rank-major
  int64_t Chunk = Full.Shape[Dim] / Parts * A.Inner;
  for (int R = 0; R < Parts; ++R)
    for (int64_t O = 0; O < A.Outer; ++O)
      std::memcpy(&Scratch[R * N + O * Chunk], In + (O * Parts + R) * Chunk,
                  Chunk * sizeof(float));
  return Comm->reduceScatterSum(Out, Scratch.data(), N);
}

void Executor::takeChunk(float *Out, const float *In, const TensorType &Full,
                         int Dim, int Parts) const {
  AxisView A = around(Full, Dim);
  int64_t Chunk = Full.Shape[Dim] / Parts * A.Inner;
  for (int64_t O = 0; O < A.Outer; ++O)
    std::memcpy(Out + O * Chunk, In + (O * Parts + rank()) * Chunk,
                Chunk * sizeof(float));
}

/// Each rank holds the logits of vocabulary rows [r V, (r + 1) V); columns
/// at or past Valid (global) are padding. The row maximum, the sum of
/// exponentials and the target logit are reduced over the group, so no rank
/// holds the full logits. Computes the mean loss over the rows whose target
/// is not Ignore (Loss) or its gradient (DLogits), whichever is non-null.
Error Executor::vocabParallelCrossEntropy(float *Loss, float *DLogits,
                                          const float *Logits,
                                          const int64_t *Targets, int64_t N,
                                          int64_t V, int64_t Valid,
                                          std::optional<int64_t> Ignore,
                                          double DLoss) const {
  int64_t Start = rank() * V;
  int64_t Mine = std::clamp<int64_t>(Valid - Start, 0, V);
  std::vector<float> Max(N, -std::numeric_limits<float>::infinity()),
      Sum(N, 0.f), Target(N, 0.f);
  auto Counted = [&](int64_t I) { return !Ignore || Targets[I] != *Ignore; };
  int64_t NumCounted = 0;
  for (int64_t I = 0; I < N; ++I) {
    if (Counted(I) && (Targets[I] < 0 || Targets[I] >= Valid))
      return createStringError(inconvertibleErrorCode(),
                               "target %lld of row %lld is outside the "
                               "vocabulary",
                               (long long)Targets[I], (long long)I);
    NumCounted += Counted(I);
    for (int64_t J = 0; J < Mine; ++J)
      Max[I] = std::max(Max[I], Logits[I * V + J]);
  }
  if (auto E = Comm->allReduceMax(Max.data(), N))
    return E;
  for (int64_t I = 0; I < N; ++I) {
    double S = 0;
    for (int64_t J = 0; J < Mine; ++J)
      S += std::exp(double(Logits[I * V + J]) - Max[I]);
    Sum[I] = float(S);
    int64_t T = Targets[I] - Start;
    if (Counted(I) && T >= 0 && T < Mine)
      Target[I] = Logits[I * V + T];
  }
  if (auto E = Comm->allReduceSum(Sum.data(), N))
    return E;
  // As the one-device kernel: the mean over the counted rows, 0 (and zero
  // gradients) when none is counted.
  if (Loss) {
    if (auto E = Comm->allReduceSum(Target.data(), N))
      return E;
    double L = 0;
    for (int64_t I = 0; I < N; ++I)
      if (Counted(I))
        L += std::log(double(Sum[I])) + Max[I] - Target[I];
    *Loss = NumCounted ? float(L / NumCounted) : 0.f;
    return Error::success();
  }
  double Scale = NumCounted ? DLoss / NumCounted : 0.0;
  for (int64_t I = 0; I < N; ++I)
    for (int64_t J = 0; J < V; ++J) {
      if (!Counted(I)) {
        DLogits[I * V + J] = 0.f;
        continue;
      }
      double P = J < Mine ? std::exp(double(Logits[I * V + J]) - Max[I]) / Sum[I]
                          : 0.0;
      if (Start + J == Targets[I])
        P -= 1;
      DLogits[I * V + J] = float(P * Scale);
    }
  return Error::success();
}

} // namespace sp
