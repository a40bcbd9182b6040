//===- OnnxImporter.h - ONNX ModelProto to IR ------------------*- C++ -*-===//
//
// Loads an ONNX model (with external data resolved relative to the model file;
// a location that escapes the model's folder is refused), binds symbolic
// dimensions, runs ONNX's shape inference, folds constant shape subgraphs and
// maps the rest to onnx.* IR ops. Trainable initializers become parameters;
// initializers that are not trained (buffers such as a causal mask, and the
// constants exporters write) become constants. Parameter data stays in the
// file and is read lazily.
//
//===----------------------------------------------------------------------===//
#ifndef SP_FRONTEND_ONNXIMPORTER_H
#define SP_FRONTEND_ONNXIMPORTER_H

#include "ir/IR.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"
#include <memory>

namespace sp {

struct ImportOptions {
  /// Values for symbolic dimensions, by dim_param name. The names "batch"
  /// and "seq" are set from --batch/--seq; any other symbolic dim of the
  /// model may be given too.
  llvm::StringMap<int64_t> DimValues;
  /// Also bind symbolic dims by position of the first graph input
  /// (dim 0 = batch, dim 1 = seq) when their names differ from the above.
  int64_t Batch = 0, Seq = 0;
};

/// Imports the model at Path. Errors name the file and, where it applies, the
/// node (name and op type) or the dimension and what to do about it.
llvm::Expected<std::unique_ptr<Graph>> importOnnx(llvm::StringRef Path,
                                                  const ImportOptions &Opts);

/// Registers the loader that reads initializers stored inside .onnx files
/// lazily (TensorData::setOnnxInitializerLoader). importOnnx calls it.
void registerOnnxDataLoader();

/// Drops the models that loader has parsed, so that the next load reads its
/// file again. It tells a rewritten file by its size and modification time,
/// which a file rewritten within one tick of the file system's clock can
/// keep: a process that rewrites a model under the same path (the fuzzer)
/// calls this in between.
void forgetOnnxModels();

} // namespace sp

#endif // SP_FRONTEND_ONNXIMPORTER_H
