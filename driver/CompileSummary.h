//===- CompileSummary.h - What sp-compile prints and its report page -*- C++ -*-===//
//
// The summary sp-compile prints after a compilation (the model, the plan's
// arena and model state, the collectives, the stored activations beside
// the family's formula, the FLOPs, the pipeline's stages and bubble) and
// the self-contained HTML report page of --html (html/HtmlReport.h),
// both from a Compilation.
//
//===----------------------------------------------------------------------===//
#ifndef SP_DRIVER_COMPILESUMMARY_H
#define SP_DRIVER_COMPILESUMMARY_H

#include "driver/Compile.h"
#include "llvm/Support/raw_ostream.h"

namespace sp {

/// The summary of compilation C of graph G (after the passes) under Ctx;
/// Seconds: the compile time.
void printCompileSummary(const Compilation &C, const Graph &G,
                         const PassContext &Ctx, double Seconds,
                         llvm::raw_ostream &OS);

/// --html: the report page of compilation C of the model Source, made by
/// the command line Command.
llvm::Error writeCompilePage(llvm::StringRef Path, const Compilation &C,
                             const PassContext &Ctx, llvm::StringRef Source,
                             llvm::StringRef Command);

} // namespace sp

#endif // SP_DRIVER_COMPILESUMMARY_H
