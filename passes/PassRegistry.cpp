//===- PassRegistry.cpp - The table of passes -----------------------------===//
#include "passes/Passes.h"

namespace sp {

static const PassInfo Registry[] = {
#define SP_PASS(Name, Factory, Summary) {Name, Summary, &Factory},
#include "passes/Passes.def"
};

llvm::ArrayRef<PassInfo> registeredPasses() { return Registry; }

const PassInfo *lookupPass(llvm::StringRef Name) {
  for (const PassInfo &P : Registry)
    if (Name == P.Name)
      return &P;
  return nullptr;
}

} // namespace sp
