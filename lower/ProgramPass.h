//===- ProgramPass.h - The rewrites of a lowered program --------*- C++ -*-===//
//
// A program pass rewrites a lowered program (plan/Program.h) in place, after
// lowering and before the memory plan: the peephole fusions, the causal
// marks of the attention products, the data-parallel buckets and the
// placement of the collectives. They are listed once, in the order they run,
// in lower/ProgramPasses.def; finalizeProgram runs that list
// (runProgramPasses(P)), and sp-opt --lower --program-passes=a,b runs named
// ones on a program lowered from textual IR, for the lit tests
// (tests/lit/lower/).
//
// As the graph passes (passes/Pass.h), a program pass is a stateless object
// made by the factory the table names; each is defined in the file of its
// rewrite, which is a function of the program (rewritePass wraps it), but
// for the gradient buckets' two, in ProgramPass.cpp for now.
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_PROGRAMPASS_H
#define SP_LOWER_PROGRAMPASS_H

#include "plan/Program.h"
#include "llvm/Support/Error.h"
#include <memory>
#include <string>

namespace sp {

class ProgramPass {
public:
  virtual ~ProgramPass() = default;
  /// The registered kebab-case name.
  virtual llvm::StringRef name() const = 0;
  /// Rewrites P, which is not memory-planned yet. An error names what the
  /// pass could not rewrite.
  virtual llvm::Error run(Program &P) = 0;
};

#define SP_PROGRAM_PASS(Name, Factory, Summary)                                \
  std::unique_ptr<ProgramPass> Factory();
#include "lower/ProgramPasses.def"

/// A registered program pass: lower/ProgramPasses.def lists them all.
struct ProgramPassInfo {
  const char *Name;
  const char *Summary;
  std::unique_ptr<ProgramPass> (*Create)();
};
/// In the order finalizeProgram runs them.
llvm::ArrayRef<ProgramPassInfo> registeredProgramPasses();
const ProgramPassInfo *lookupProgramPass(llvm::StringRef Name);

/// Runs the named passes on P, in the order given. An unknown name is an
/// error before any pass runs; a failing pass's error is prefixed with its
/// name.
llvm::Error runProgramPasses(Program &P, llvm::ArrayRef<std::string> Names);
/// Runs every registered pass in the table's order (finalizeProgram's
/// rewrites).
llvm::Error runProgramPasses(Program &P);

/// The pass of a rewrite that is one function of the program and cannot
/// fail (its result, a count, is dropped): every rewrite so far.
template <typename Fn>
std::unique_ptr<ProgramPass> rewritePass(llvm::StringRef Name, Fn Rewrite) {
  class RewritePass final : public ProgramPass {
  public:
    RewritePass(llvm::StringRef Name, Fn Rewrite)
        : Name(Name), Rewrite(std::move(Rewrite)) {}
    llvm::StringRef name() const override { return Name; }
    llvm::Error run(Program &P) override {
      Rewrite(P);
      return llvm::Error::success();
    }

  private:
    llvm::StringRef Name;
    Fn Rewrite;
  };
  return std::make_unique<RewritePass>(Name, std::move(Rewrite));
}

} // namespace sp

#endif // SP_LOWER_PROGRAMPASS_H
