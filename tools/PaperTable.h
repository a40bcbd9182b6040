//===- PaperTable.h - sp-compile --paper-table and --figure7 ----*- C++ -*-===//
//
// Compiles the paper's configurations (no parallelism, tensor parallelism,
// + sequence parallelism, + selective recomputation, full recomputation,
// tensor (and sequence) parallelism with a fused attention core; and with
// --pp the whole first stage, Eq. 5 and 6) of each model, prints our
// activation bytes per layer against Table 2's formula, and writes Figure 7
// and a JSON report when asked.
//
//===----------------------------------------------------------------------===//
#ifndef SP_REPORTS_PAPERTABLE_H
#define SP_REPORTS_PAPERTABLE_H

#include "frontend/OnnxImporter.h"
#include "passes/Pass.h"
#include "llvm/Support/raw_ostream.h"
#include <string>
#include <vector>

namespace sp {

/// Figure7 and Report: file paths, or empty for none.
llvm::Error runPaperTable(llvm::ArrayRef<std::string> Models,
                          const ImportOptions &IO, const PassContext &Base,
                          llvm::StringRef Figure7, llvm::StringRef Report,
                          llvm::raw_ostream &Out);

} // namespace sp

#endif // SP_REPORTS_PAPERTABLE_H
