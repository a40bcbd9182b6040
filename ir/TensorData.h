//===- TensorData.h - Constant and parameter payloads ----------*- C++ -*-===//
//
// Parameters and constants reference their bytes instead of holding them, so
// that a 175B-parameter graph compiles without its weights. The bytes are
// read on first use (load()) from one of:
//   - inline data (small constants, folded shape computations);
//   - an ONNX external-data file: path, byte offset, length;
//   - an initializer stored inside an ONNX model file: path, name. Reading it
//     goes through a loader the ONNX frontend registers.
//
//===----------------------------------------------------------------------===//
#ifndef SP_IR_TENSORDATA_H
#define SP_IR_TENSORDATA_H

#include "ir/Types.h"
#include "llvm/Support/Error.h"
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sp {

struct DataRef {
  enum Kind : uint8_t { Inline, External, OnnxInitializer };
  Kind K = Inline;
  std::string Path;   // External, OnnxInitializer
  std::string Key;    // OnnxInitializer: the initializer name
  int64_t Offset = 0; // External
  int64_t Length = 0; // External
};

class TensorData {
public:
  /// Inline data owned by the graph.
  static std::shared_ptr<TensorData> makeInline(TensorType T,
                                                std::vector<char> Bytes);
  static std::shared_ptr<TensorData> makeRef(TensorType T, DataRef Ref);

  const TensorType &type() const { return Type; }
  const DataRef &ref() const { return Ref; }
  bool isInline() const { return Ref.K == DataRef::Inline; }
  bool isLoaded() const { return Bytes != nullptr; }

  /// Returns the bytes, reading them on first use. Fails with a message that
  /// names the file if the data is missing or short.
  llvm::Expected<llvm::ArrayRef<char>> load() const;

  /// Element access for loaded inline data (folding, small constants).
  template <typename T> llvm::ArrayRef<T> as() const {
    assert(Bytes && "tensor data is not loaded");
    return {reinterpret_cast<const T *>(Bytes->data()),
            Bytes->size() / sizeof(T)};
  }
  /// Reads element I converted to double / int64 (any dtype).
  double getDouble(int64_t I) const;
  int64_t getInt(int64_t I) const;

  using OnnxLoader = std::function<llvm::Expected<std::vector<char>>(
      llvm::StringRef Path, llvm::StringRef Name)>;
  static void setOnnxInitializerLoader(OnnxLoader L);

private:
  TensorType Type;
  DataRef Ref;
  mutable std::shared_ptr<const std::vector<char>> Bytes;
};

} // namespace sp

#endif // SP_IR_TENSORDATA_H
