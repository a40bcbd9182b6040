//===- OnnxExport.h - Trained weights back into an ONNX model --*- C++ -*-===//
//
// Writes a copy of the source model whose initializers named in the map hold
// the new (trained) float32 values; every other part of the model, names and
// dims included, is kept. New weights are stored as inline raw_data. If the
// model would then exceed protobuf's 2 GB limit, the weights go to external
// data in one file next to the output ("OUT.data", offsets 64-byte aligned),
// as ONNX's own convert_model_to_external_data does. Initializers the source
// kept in external data are carried over by value the same way, so the copy
// never depends on the source's files. Both files are written atomically.
//
//===----------------------------------------------------------------------===//
#ifndef SP_FRONTEND_ONNXEXPORT_H
#define SP_FRONTEND_ONNXEXPORT_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"
#include <cstdint>

namespace sp {

struct OnnxExportOptions {
  /// Largest serialized model kept in one file; above it, tensors of at
  /// least 1 KiB go to external data. (Tests lower it.)
  uint64_t MaxInlineBytes = (uint64_t(1) << 31) - (uint64_t(64) << 20);
};

/// Writes Output: the model at Source with the initializers named in Weights
/// replaced. Every name must be a float32 initializer of the source with as
/// many elements as its data; errors name the file and the initializer.
llvm::Error
exportOnnxWeights(llvm::StringRef Source, llvm::StringRef Output,
                  const llvm::StringMap<llvm::ArrayRef<float>> &Weights,
                  const OnnxExportOptions &Opts = {});

} // namespace sp

#endif // SP_FRONTEND_ONNXEXPORT_H
