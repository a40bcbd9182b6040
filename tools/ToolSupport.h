//===- ToolSupport.h - Shared pieces of the command-line tools -*- C++ -*-===//
//
// What sp-compile, sp-opt and sp-tokenize share: the import flags and
// loading a model. The number formats (support/Format.h) and the one-line
// errors (support/Diagnostics.h) come with it.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TOOLS_TOOLSUPPORT_H
#define SP_TOOLS_TOOLSUPPORT_H

#include "frontend/OnnxImporter.h"
#include "ir/IR.h"
#include "plan/AtomicFile.h"
#include "support/Diagnostics.h"
#include "support/Format.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sp {

/// The import flags shared by the tools: --batch, --seq and --dim NAME=N.
/// Call before ParseCommandLine; returns their category.
llvm::cl::OptionCategory &registerImportCLOptions();
/// Reads them (after ParseCommandLine); fails on a malformed --dim or a
/// non-positive size, naming the flag.
llvm::Expected<ImportOptions> importOptionsFromCL();

/// Loads a model: ONNX (by the .onnx extension) or textual IR ("-" reads
/// stdin).
llvm::Expected<std::unique_ptr<Graph>> loadGraph(llvm::StringRef Path,
                                                 const ImportOptions &Opts);

} // namespace sp

#endif // SP_TOOLS_TOOLSUPPORT_H
