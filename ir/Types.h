//===- Types.h - Element types and static tensor types ---------*- C++ -*-===//
//
// Every IR value has a dtype and a fully static shape. Symbolic dimensions of
// an imported model are bound (from --batch/--seq) before values reach the IR.
//
//===----------------------------------------------------------------------===//
#ifndef SP_IR_TYPES_H
#define SP_IR_TYPES_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include <cstdint>
#include <optional>
#include <string>

namespace sp {

enum class DType : uint8_t { F32, F16, BF16, F64, I64, I32, I8, U8, Bool };

llvm::StringRef dtypeName(DType T);
std::optional<DType> parseDType(llvm::StringRef Name);
/// Bytes per element.
unsigned dtypeSize(DType T);
bool isFloat(DType T);

/// A static tensor type: element type and shape (rank 0 is a scalar).
struct TensorType {
  DType Dtype = DType::F32;
  llvm::SmallVector<int64_t, 4> Shape;

  TensorType() = default;
  TensorType(DType D, llvm::ArrayRef<int64_t> S)
      : Dtype(D), Shape(S.begin(), S.end()) {}

  unsigned rank() const { return Shape.size(); }
  int64_t numElements() const;
  int64_t numBytes() const { return numElements() * dtypeSize(Dtype); }
  bool hasShape(llvm::ArrayRef<int64_t> S) const {
    return llvm::ArrayRef<int64_t>(Shape) == S;
  }
  int64_t dim(int I) const { return Shape[I < 0 ? I + rank() : I]; }
  bool operator==(const TensorType &O) const {
    return Dtype == O.Dtype && Shape == O.Shape;
  }
  bool operator!=(const TensorType &O) const { return !(*this == O); }
  /// "f32[4, 64, 256]", or "f32[]" for a scalar.
  std::string str() const;
};

/// How a value is laid out over the tensor-parallel group (GSPMD style).
/// Unset until a sharding pass annotates it. Printed as
///   #replicated, #replicated(sum_grad), #partial,
///   #split(dim=D, parts=T[, blocks=B][, padded=P])
/// and, for a value that is one data-parallel rank's flat chunk of such a
/// value (ZeRO), with dp_chunks=D among the fields:
///   #replicated(dp_chunks=D), #split(dim=.., parts=.., dp_chunks=D)
struct Sharding {
  enum Kind : uint8_t { None, Replicated, Split, Partial };
  Kind K = None;
  /// Split: the axis, and the number of ranks it is split over.
  int Dim = -1;
  int Parts = 1;
  /// Split: the axis holds Blocks equal blocks (a fused QKV weight) and each
  /// block is split over the ranks; rank r holds part r of every block.
  int Blocks = 1;
  /// Split: the axis's global size after padding to a multiple of Parts
  /// (a vocabulary not divisible by t); 0 when not padded. Padding is zero.
  int64_t Padded = 0;
  /// Replicated parameter used on sequence-sharded data: each rank's gradient
  /// is partial and is summed over the group.
  bool SumGrad = false;
  /// ZeRO (sp-compile --zero 1): the value is this data-parallel rank's
  /// flat chunk of ceil(n / DataChunks) elements of a value of n elements
  /// (zero-padded to DataChunks chunks), one chunk per data-parallel rank;
  /// the fields above then describe that whole value (a split's Dim is an
  /// axis of it, not of the chunk). 0: not a chunk.
  int DataChunks = 0;

  static Sharding replicated(bool SumGrad = false) {
    Sharding S;
    S.K = Replicated;
    S.SumGrad = SumGrad;
    return S;
  }
  static Sharding split(int Dim, int Parts, int Blocks = 1, int64_t Padded = 0) {
    Sharding S;
    S.K = Split;
    S.Dim = Dim;
    S.Parts = Parts;
    S.Blocks = Blocks;
    S.Padded = Padded;
    return S;
  }
  static Sharding partial() {
    Sharding S;
    S.K = Partial;
    return S;
  }
  bool operator==(const Sharding &O) const {
    return K == O.K && Dim == O.Dim && Parts == O.Parts && Blocks == O.Blocks &&
           Padded == O.Padded && SumGrad == O.SumGrad &&
           DataChunks == O.DataChunks;
  }
  bool operator!=(const Sharding &O) const { return !(*this == O); }
  std::string str() const;
};

/// The elements of one of Parts equal flat chunks of N elements (the last
/// zero-padded): a data-parallel rank's share under ZeRO.
inline int64_t dataChunkElements(int64_t N, int64_t Parts) {
  return (N + Parts - 1) / Parts;
}

} // namespace sp

#endif // SP_IR_TYPES_H
