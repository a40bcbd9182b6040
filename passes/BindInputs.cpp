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
//   token_types  the ids of the token-type embedding (role type_embed)
//   mask         the attention mask of the padding masks (role pad_mask)
//
// --input NAME=ROLE binds an input the structure does not explain, and must
// agree with the structure when it does. The one guess the structure makes
// may be overruled: an input-indexed table added to the token embedding is
// taken for positions when it has a row per position (token types when it
// has fewer rows), so --input NAME=token_types (or =positions) settles it
// and retags the embedding. Each bound input's type is checked here, so a
// plan never holds an input sp-run would refuse. An input nothing uses is dropped
// (it cannot change a result); any other input left without a role is an
// error naming it, so a plan can never hold an input the runtime would not
// fill. Inputs that later passes add (targets, lr, step) carry their roles
// from birth.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {
namespace {

/// What the structure says each input is, and why (for diagnostics).
struct Found {
  InputRole Role = InputRole::None;
  std::string Why;
  /// The embedding whose positions/token-types guess a flag may overrule.
  Node *Guess = nullptr;
};

DenseMap<Value *, Found> structuralRoles(Graph &G) {
  DenseMap<Value *, Found> R;
  auto Mark = [&](Value *V, InputRole Role, StringRef Why,
                  Node *Guess = nullptr) {
    if (V->isInput() && !R.count(V))
      R[V] = {Role, Why.str(), Guess};
  };
  for (Node &N : G.nodes()) {
    Role R = N.tags().Role;
    if (N.tags().Ph != Phase::Forward)
      continue;
    if (R == Role::Embed)
      Mark(N.operand(1), InputRole::Tokens, "the ids of the token embedding");
    else if (R == Role::PosEmbed)
      Mark(N.operand(1), InputRole::Positions,
           "the ids of a table with a row per position added to the tokens",
           &N);
    else if (R == Role::TypeEmbed)
      Mark(N.operand(1), InputRole::TokenTypes,
           "the ids of a table with fewer rows than positions added to the "
           "tokens",
           &N);
    else if (R == Role::PadMask)
      Mark(N.operand(1), InputRole::Mask,
           "the attention mask added to the scores as (1 - m) * fill");
    else if (R == Role::RopeCos || R == Role::RopeSin)
      Mark(N.operand(1), InputRole::Positions,
           "the positions the rotary tables are looked up by");
  }
  return R;
}

/// What sp-run can fill (ir/IR.h: roleShapeOk, roleDtypeOk): ids are i64
/// [b, s] (positions also [1, s]); a mask is [b, s] of f32, i64, i32 or bool.
Error checkTypes(Graph &G) {
  const Value *Tokens = G.inputWithRole(InputRole::Tokens);
  if (!Tokens || Tokens->type().rank() != 2)
    return Error::success(); // detect-transformer reports the token shape
  int64_t B = Tokens->type().Shape[0], S = Tokens->type().Shape[1];
  for (const auto &I : G.inputs()) {
    const TensorType &T = I->type();
    InputRole R = I->inputRole();
    if (!isModelInputRole(R))
      continue;
    if (!roleShapeOk(R, T, B, S) || !roleDtypeOk(R, T.Dtype))
      return makeError(formatv(
          "input '{0}' is bound as {1} but is {2}; sp-run feeds {1} as {3}",
          I->name(), inputRoleName(R), T.str(),
          R == InputRole::Mask
              ? formatv("[{0}, {1}] of f32, i64, i32 or bool", B, S).str()
              : formatv("i64[{0}, {1}]", B, S).str()));
  }
  return Error::success();
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
      return makeError("no input feeds the token embedding; run "
                       "detect-transformer first");
    // Flags first: each must name an input and agree with the structure.
    DenseMap<Value *, InputRole> Flagged;
    for (const auto &[Name, Role] : Ctx.InputBindings) {
      Value *V = G.lookup(Name);
      if (!V || !V->isInput()) {
        std::string Names;
        for (const auto &I : G.inputs())
          Names += (Names.empty() ? "'" : ", '") + I->name() + "'";
        return makeError(formatv("--input {0}={1}: the model has no input "
                                 "'{0}'; its inputs are {2}",
                                 Name, inputRoleName(Role), Names));
      }
      auto It = Structural.find(V);
      bool Overrule = It != Structural.end() && It->second.Guess &&
                      (Role == InputRole::Positions ||
                       Role == InputRole::TokenTypes);
      if (Overrule && Role == InputRole::Positions) {
        const TensorType &Table = It->second.Guess->operand(0)->type();
        int64_t Seq = V->type().rank() ? V->type().dim(-1) : 1;
        if (Table.Shape[0] < Seq)
          return makeError(formatv(
              "--input {0}=positions: '{0}' indexes a table of {1} rows, "
              "fewer than the {2} positions sp-run would feed; it is the "
              "token types",
              Name, Table.Shape[0], Seq));
      }
      if (Overrule) {
        It->second.Guess->tags().Role =
            Role == InputRole::Positions ? sp::Role::PosEmbed
                                         : sp::Role::TypeEmbed;
        It->second.Role = Role;
      }
      if (It != Structural.end() && It->second.Role != Role)
        return makeError(formatv("--input {0}={1}: input '{0}' is {2}, so "
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
        return makeError(formatv(
            "input '{0}' ({1}) is not the token ids, position ids, attention "
            "mask or token types of the recognised model, so sp-run could not "
            "feed it; remove it from the export, or bind it with --input "
            "{0}={2}",
            V->name(), V->type().str(), "tokens|mask|positions|token_types"));
    }
    for (Value *V : Unused) {
      Ctx.remarks() << "bind-inputs: input '" << V->name()
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
            return makeError(formatv("inputs '{0}' and '{1}' are both bound "
                                     "as {2}; a model has one",
                                     First->name(), I->name(),
                                     inputRoleName(R)));
          First = I.get();
        }
    }
    if (auto E = checkTypes(G))
      return E;
    for (const auto &I : G.inputs())
      Ctx.remarks() << "bind-inputs: '" << I->name() << "' is "
                   << inputRoleName(I->inputRole()) << "\n";
    return Error::success();
  }
};

} // namespace

std::unique_ptr<Pass> createBindInputsPass() {
  return std::make_unique<BindInputsPass>();
}

} // namespace sp
