//===- BindInputs.cpp - Give every graph input the role the runtime feeds -===//
//
// The runtime fills a graph input by its role, never by its name: exporters
// call the token ids idx, input_ids or tokens, and a name-bound runtime
// would leave any other spelling unfed and train on whatever memory holds.
// After detect-transformer has tagged the model, this pass reads the roles
// off the structure:
//
//   tokens       the ids of the token embedding (role embed)
//   positions    the ids of the position embedding (role pos_embed) or of
//                the rotary tables (rope_cos, rope_sin) when they are an
//                input rather than a folded arange
//
// --input NAME=ROLE binds an input the structure does not explain, and must
// agree with the structure when it does. An input nothing uses is dropped
// (it cannot change a result); any other input left without a role is an
// error naming it, so a plan can never hold an input the runtime would not
// fill. Inputs that later passes add (targets, lr, step) carry their roles
// from birth.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {
namespace {

Error bindError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(), Msg);
}

/// What the structure says each input is, and why (for diagnostics).
struct Found {
  InputRole Role = InputRole::None;
  std::string Why;
};

DenseMap<Value *, Found> structuralRoles(Graph &G) {
  DenseMap<Value *, Found> R;
  auto Mark = [&](Value *V, InputRole Role, StringRef Why) {
    if (V->isInput() && !R.count(V))
      R[V] = {Role, Why.str()};
  };
  for (Node &N : G.nodes()) {
    const std::string &Role = N.tags().Role;
    if (N.tags().Ph != Phase::Forward)
      continue;
    if (Role == "embed")
      Mark(N.operand(1), InputRole::Tokens, "the ids of the token embedding");
    else if (Role == "pos_embed")
      Mark(N.operand(1), InputRole::Positions,
           "the ids of the position embedding");
    else if (Role == "rope_cos" || Role == "rope_sin")
      Mark(N.operand(1), InputRole::Positions,
           "the positions the rotary tables are looked up by");
  }
  return R;
}

class BindInputsPass : public Pass {
public:
  StringRef name() const override { return "bind-inputs"; }

  Error run(Graph &G, PassContext &Ctx) override {
    auto Structural = structuralRoles(G);
    if (!G.inputWithRole(InputRole::Tokens) &&
        none_of(Structural, [](const auto &KV) {
          return KV.second.Role == InputRole::Tokens;
        }))
      return bindError("no input feeds the token embedding; run "
                       "detect-transformer first");
    // Flags first: each must name an input and agree with the structure.
    DenseMap<Value *, InputRole> Flagged;
    for (const auto &[Name, Role] : Ctx.InputBindings) {
      Value *V = G.lookup(Name);
      if (!V || !V->isInput()) {
        std::string Names;
        for (const auto &I : G.inputs())
          Names += (Names.empty() ? "'" : ", '") + I->name() + "'";
        return bindError(formatv("--input {0}={1}: the model has no input "
                                 "'{0}'; its inputs are {2}",
                                 Name, inputRoleName(Role), Names));
      }
      auto It = Structural.find(V);
      if (It != Structural.end() && It->second.Role != Role)
        return bindError(formatv("--input {0}={1}: input '{0}' is {2}, so "
                                 "sp feeds it as {3}; drop the flag or bind "
                                 "it as {3}",
                                 Name, inputRoleName(Role), It->second.Why,
                                 inputRoleName(It->second.Role)));
      Flagged[V] = Role;
    }
    SmallVector<Value *, 4> Unused;
    for (const auto &I : G.inputs()) {
      Value *V = I.get();
      if (V->inputRole() != InputRole::None)
        continue;
      if (auto It = Structural.find(V); It != Structural.end())
        V->setInputRole(It->second.Role);
      else if (auto F = Flagged.find(V); F != Flagged.end())
        V->setInputRole(F->second);
      else if (!V->hasUsers())
        Unused.push_back(V);
      else
        return bindError(formatv(
            "input '{0}' ({1}) is not the token ids, position ids, attention "
            "mask or token types of the recognised model, so sp-run could not "
            "feed it; remove it from the export, or bind it with --input "
            "{0}={2}",
            V->name(), V->type().str(), "tokens|mask|positions|token_types"));
    }
    for (Value *V : Unused) {
      *Ctx.Remarks << "bind-inputs: input '" << V->name()
                   << "' is unused; dropped\n";
      G.eraseLeaf(V);
    }
    // One input per role the runtime fills from the batch.
    for (InputRole R : {InputRole::Tokens, InputRole::Positions,
                        InputRole::Mask, InputRole::TokenTypes}) {
      const Value *First = nullptr;
      for (const auto &I : G.inputs())
        if (I->inputRole() == R) {
          if (First)
            return bindError(formatv("inputs '{0}' and '{1}' are both bound "
                                     "as {2}; a model has one",
                                     First->name(), I->name(),
                                     inputRoleName(R)));
          First = I.get();
        }
    }
    for (const auto &I : G.inputs())
      *Ctx.Remarks << "bind-inputs: '" << I->name() << "' is "
                   << inputRoleName(I->inputRole()) << "\n";
    return Error::success();
  }
};

} // namespace

std::unique_ptr<Pass> createBindInputsPass() {
  return std::make_unique<BindInputsPass>();
}

} // namespace sp
