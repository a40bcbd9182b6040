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
/// Unset until a sharding pass annotates it.
struct Sharding {
  enum Kind : uint8_t { None, Replicated, Split, Partial };
  Kind K = None;
  int Dim = -1; // for Split
  bool operator==(const Sharding &O) const { return K == O.K && Dim == O.Dim; }
  std::string str() const;
};

} // namespace sp

#endif // SP_IR_TYPES_H
