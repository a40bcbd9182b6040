//===- PassManager.h - Runs a list of passes -------------------*- C++ -*-===//
//
// The pass manager, not the passes, owns the cross-cutting flags:
//   --passes=a,b,c       the passes to run (tools give a default)
//   --print-after-all    print the IR after every pass (to stderr)
//   --print-after=NAME   print the IR after the named pass(es)
//   --dump-dir=DIR       write DIR/NN-name.sp after every pass (00-input.sp
//                        first), one numbered file per pass
//   --verify-each        run the verifier after every pass
//   --time-passes        print each pass's wall time at the end
//
//===----------------------------------------------------------------------===//
#ifndef SP_PASSES_PASSMANAGER_H
#define SP_PASSES_PASSMANAGER_H

#include "passes/Pass.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/CommandLine.h"
#include <string>
#include <vector>

namespace sp {

struct PassManagerOptions {
  bool PrintAfterAll = false;
  std::vector<std::string> PrintAfter;
  std::string DumpDir;
  bool VerifyEach = false;
  bool TimePasses = false;
  llvm::raw_ostream *PrintStream = &llvm::errs();
};

/// Registers the flags above with llvm::cl; call before ParseCommandLine.
/// Returns their option category.
llvm::cl::OptionCategory &registerPassManagerCLOptions();
/// Reads the flags into options (after ParseCommandLine).
PassManagerOptions passManagerOptionsFromCL();
/// The --passes value, or Default if the flag was not given.
std::string passesFromCL(llvm::StringRef Default);
/// Fills the pass options (--tp, --sp) into Ctx; fails on bad values.
llvm::Error passOptionsFromCL(PassContext &Ctx);
/// A positive byte count ("123", "1.5GiB", "800M", "80GB") given to Flag,
/// or an error naming the flag and showing Examples of what it takes.
llvm::Expected<int64_t> byteFlag(llvm::StringRef Flag,
                                 const std::string &Value,
                                 llvm::StringRef Examples);

class PassManager {
public:
  explicit PassManager(PassManagerOptions Opts) : Opts(std::move(Opts)) {}

  void addPass(std::unique_ptr<Pass> P) { Passes.push_back(std::move(P)); }
  /// Adds "a,b,c". Fails on an unknown name, listing the known ones.
  llvm::Error addPasses(llvm::StringRef Passes);

  /// Runs every pass in order. Stops at the first failure; the error names
  /// the pass.
  llvm::Error run(Graph &G, PassContext &Ctx);

private:
  PassManagerOptions Opts;
  std::vector<std::unique_ptr<Pass>> Passes;
};

} // namespace sp

#endif // SP_PASSES_PASSMANAGER_H
