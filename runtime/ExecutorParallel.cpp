//===- ExecutorParallel.cpp - Tensor-parallel pieces of the executor -----===//
//
// What a rank of a tensor-parallel group does around the kernels (which the
// backend runs, collectives included): read its slice of a parameter, and
// assemble whole tensors for dumps.
//
//===----------------------------------------------------------------------===//
#include "runtime/Executor.h"
#include "runtime/TensorLayout.h"
#include <cstring>

using namespace llvm;

namespace sp {

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
  ArrayRef<char> Raw = *Bytes;
  std::vector<char> Wide;
  if (B.Type.Dtype == DType::F64 && Src.Dtype == DType::F32) {
    // A float64 plan (widenToFloat64) loads the float32 source exactly.
    Wide.resize(Src.numElements() * sizeof(double));
    const float *From = reinterpret_cast<const float *>(Raw.data());
    double *To = reinterpret_cast<double *>(Wide.data());
    for (int64_t I = 0, N = Src.numElements(); I < N; ++I)
      To[I] = From[I];
    Raw = Wide;
  }
  if (B.Shard.K != Sharding::Split)
    return Back->copyToBackend(Arena + B.Offset, Raw.data(), Raw.size());
  // This rank's slice, read from the whole source.
  std::vector<char> Slice(B.Type.numBytes());
  char *Dst = Slice.data();
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
        std::memcpy(To, Raw.data() + (O * Source + G) * Row, Row);
    }
  return Back->copyToBackend(Arena + B.Offset, Slice.data(), Slice.size());
}

Expected<std::vector<float>> Executor::gather(const TensorView &V) const {
  if (!V.Data)
    return createStringError(inconvertibleErrorCode(),
                             "'%s' is float64; gather64 reads it",
                             V.Name.c_str());
  return gatherAs<float>(V);
}

Expected<std::vector<double>> Executor::gather64(const TensorView &V) const {
  if (V.Data64)
    return gatherAs<double>(V);
  auto F = gatherAs<float>(V);
  if (!F)
    return F.takeError();
  return std::vector<double>(F->begin(), F->end());
}

template <typename T>
Expected<std::vector<T>> Executor::gatherAs(const TensorView &V) const {
  if (V.Scale != 1) {
    TensorView Plain = V;
    Plain.Scale = 1;
    auto Full = gatherAs<T>(Plain);
    if (Full)
      for (T &X : *Full)
        X = T(X * V.Scale);
    return Full;
  }
  const T *Data;
  if constexpr (std::is_same_v<T, double>)
    Data = V.Data64;
  else
    Data = V.Data;
  std::vector<T> Joined;
  if (int Chunks = V.Shard.DataChunks) {
    // A ZeRO chunk: this rank's part of the whole over the replicas first.
    Communicator *D = Opts.DataComm;
    if (!D || D->size() != Chunks)
      return createStringError(inconvertibleErrorCode(),
                               "'%s' is a chunk over %d data-parallel ranks; "
                               "this run has %d",
                               V.Name.c_str(), Chunks, D ? D->size() : 1);
    int64_t Chunk = dataChunkElements(V.size(), Chunks);
    Joined.resize(Chunk * Chunks);
    if (auto E = D->allGather(Joined.data(), Data, Chunk))
      return E;
    Joined.resize(V.size());
    Data = Joined.data();
  }
  std::vector<T> Full(V.FullType.numElements());
  if (V.Shard.K != Sharding::Split) {
    std::memcpy(Full.data(), Data, Full.size() * sizeof(T));
    return Full;
  }
  const Sharding &S = V.Shard;
  int Parts = groupSize();
  std::vector<T> All(V.size() * Parts);
  if (auto E = Comm->allGather(All.data(), Data, V.size()))
    return E;
  AxisView A = around(V.Type, S.Dim);
  int64_t Local = V.Type.Shape[S.Dim], Source = V.FullType.Shape[S.Dim];
  for (int R = 0; R < Parts; ++R)
    for (int64_t O = 0; O < A.Outer; ++O)
      for (int64_t J = 0; J < Local; ++J) {
        int64_t G = sourceIndex(S, Source, Local, R, J);
        if (G >= 0)
          std::memcpy(&Full[(O * Source + G) * A.Inner],
                      &All[R * V.size() + (O * Local + J) * A.Inner],
                      A.Inner * sizeof(T));
      }
  return Full;
}

} // namespace sp
