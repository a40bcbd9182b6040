//===- ToolSupport.h - Shared pieces of the command-line tools -*- C++ -*-===//
#ifndef SP_TOOLS_TOOLSUPPORT_H
#define SP_TOOLS_TOOLSUPPORT_H

#include "frontend/OnnxImporter.h"
#include "ir/IR.h"
#include "plan/AtomicFile.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include <functional>
#include <memory>

namespace sp {

/// A byte count for people: "5.28 MiB", "2.23 TiB".
std::string humanBytes(double Bytes);

/// Prints "TOOL: error: MESSAGE" on one line and returns the exit code 1.
int reportError(llvm::StringRef Tool, llvm::Error E);

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
