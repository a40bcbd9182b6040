//===- CompileTool.h - What sp-compile is asked to do ------------*- C++ -*-===//
//
// sp-compile's flags as one struct that checks itself (validate: the flags
// against each other, and every output file and folder writable, before
// anything is read or written, so that a bad --report never fails after the
// plan is written), and the writing of what a compilation produced: the
// plan, the report, the Gantt chart and the ONNX graphs. The tool
// (tools/sp-compile.cpp) parses the flags into it and calls these.
//
//===----------------------------------------------------------------------===//
#ifndef SP_DRIVER_COMPILETOOL_H
#define SP_DRIVER_COMPILETOOL_H

#include "driver/Compile.h"
#include "llvm/Support/raw_ostream.h"
#include <optional>
#include <string>
#include <vector>

namespace sp {

struct CompileToolOptions {
  std::vector<std::string> Inputs;
  /// -o, --report, --html, --gantt, --figure7, --export-graphs ("": none).
  std::string Output, Report, Html, Gantt, Figure7, ExportGraphs;
  bool PaperTable = false, Quiet = false;
  /// --estimate, --cluster FILE.json.
  bool Estimate = false;
  std::string Cluster;
  /// --auto with --gpus, --gpu-memory and --global-batch (unset: not
  /// given).
  bool Auto = false;
  std::optional<int> AutoGpus;
  std::optional<std::string> AutoMemory;
  std::optional<int64_t> AutoBatch;
  /// --dtype, and fp16's --loss-scale and --loss-scale-window (unset: not
  /// given; 65536 and 2000).
  DType ActDtype = DType::F32;
  std::optional<double> LossScale;
  std::optional<int64_t> LossScaleWindow;
  OptimizerOptions Optimizer;

  /// Checks the flags, their combinations with the pass options in Ctx and
  /// the outputs' places; fills Ctx's precision and optimizer options.
  /// Fails naming the flag and what to do.
  llvm::Error validate(PassContext &Ctx) const;
  /// --gpu-memory in bytes (validate has checked it).
  int64_t autoMemoryBytes() const;
  /// The cost model's cluster (--estimate, --cluster or --auto), if any.
  bool wantsCluster() const { return Estimate || !Cluster.empty() || Auto; }
};

/// The outputs' places (-o's and --export-graphs' folders) and the model
/// count, after validate and before anything is read.
llvm::Error checkCompileOutputs(const CompileToolOptions &O);

/// What asks for a training graph (-o, --html, --export-graphs, --estimate)
/// when the passes made none.
llvm::Error checkTrainingOutputs(const CompileToolOptions &O,
                                 const Compilation &C);

/// Writes what O asks for of compilation C (Seconds: the compile time, in
/// the report): --export-graphs, -o, --gantt and --report, in that order,
/// each named in its error; with !O.Quiet, a line for each written.
llvm::Error writeCompileOutputs(const CompileToolOptions &O,
                                const PassContext &Ctx, const Compilation &C,
                                double Seconds, llvm::raw_ostream &OS);

} // namespace sp

#endif // SP_DRIVER_COMPILETOOL_H
