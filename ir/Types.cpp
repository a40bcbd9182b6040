//===- Types.cpp ----------------------------------------------------------===//
#include "ir/Types.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/ErrorHandling.h"

using namespace llvm;

namespace sp {

namespace {
struct DTypeInfo {
  DType T;
  const char *Name;
  unsigned Size;
};
constexpr DTypeInfo DTypes[] = {
    {DType::F32, "f32", 4}, {DType::F16, "f16", 2}, {DType::BF16, "bf16", 2},
    {DType::F64, "f64", 8}, {DType::I64, "i64", 8}, {DType::I32, "i32", 4},
    {DType::I8, "i8", 1},   {DType::U8, "u8", 1},   {DType::Bool, "bool", 1},
};
} // namespace

StringRef dtypeName(DType T) { return DTypes[unsigned(T)].Name; }
unsigned dtypeSize(DType T) { return DTypes[unsigned(T)].Size; }

std::optional<DType> parseDType(StringRef Name) {
  for (const DTypeInfo &I : DTypes)
    if (Name == I.Name)
      return I.T;
  return std::nullopt;
}

bool isFloat(DType T) {
  return T == DType::F32 || T == DType::F16 || T == DType::BF16 ||
         T == DType::F64;
}

int64_t TensorType::numElements() const {
  // The readers (importer, parser, plan reader) accept at most 2^48
  // elements, and the ONNX shape rules refuse larger results, but a type
  // can still be built with a larger count: it saturates at 2^59, so that
  // neither this nor numBytes() (at most 8 bytes an element) overflows, and
  // any size check refuses it.
  constexpr int64_t Saturated = int64_t(1) << 59;
  int64_t N = 1;
  for (int64_t D : Shape)
    if (__builtin_mul_overflow(N, D, &N) || N > Saturated)
      return is_contained(Shape, 0) ? 0 : Saturated;
  return N;
}

std::string TensorType::str() const {
  std::string S = dtypeName(Dtype).str() + "[";
  for (unsigned I = 0; I < Shape.size(); ++I) {
    if (I)
      S += ", ";
    S += std::to_string(Shape[I]);
  }
  return S + "]";
}

std::string Sharding::str() const {
  switch (K) {
  case None:
    return "";
  case Replicated: {
    std::string S = "#replicated";
    if (SumGrad && DataChunks)
      return S + "(sum_grad, dp_chunks=" + std::to_string(DataChunks) + ")";
    if (DataChunks)
      return S + "(dp_chunks=" + std::to_string(DataChunks) + ")";
    return SumGrad ? S + "(sum_grad)" : S;
  }
  case Split: {
    std::string S = "#split(dim=" + std::to_string(Dim) +
                    ", parts=" + std::to_string(Parts);
    if (Blocks != 1)
      S += ", blocks=" + std::to_string(Blocks);
    if (Padded)
      S += ", padded=" + std::to_string(Padded);
    if (DataChunks)
      S += ", dp_chunks=" + std::to_string(DataChunks);
    return S + ")";
  }
  case Partial:
    return "#partial";
  }
  llvm_unreachable("unknown sharding kind");
}

} // namespace sp
