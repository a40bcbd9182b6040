//===- OpDef.cpp - The table of op definitions ----------------------------===//
#include "ir/OpDef.h"
#include "ir/ops/OpTable.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

GradBuilder::~GradBuilder() = default;

Error GradBuilder::error(const Twine &Msg) const {
  return createStringError(inconvertibleErrorCode(), "%s: %s",
                           N.describe().c_str(), Msg.str().c_str());
}

namespace ops {

Error expectRank(const ShapeArgs &A, unsigned I, unsigned MinRank) {
  if (A.type(I).rank() < MinRank)
    return makeError(formatv("operand {0} has rank {1}, expected at least {2}",
                             I, A.type(I).rank(), MinRank));
  return Error::success();
}

Expected<TypeList> sameAsOperand0(const ShapeArgs &A) {
  return TypeList{A.type(0)};
}

Sharding elementwiseLayout(Sharding S) {
  S.SumGrad = false;
  S.DataChunks = 0;
  S.Blocks = 1;
  S.Padded = 0;
  return S;
}

Sharding keepLayout(const Node &N) {
  return elementwiseLayout(N.operand(0)->sharding());
}

/// The gradient op of a unary op (UnaryOps below).
static OpKind gradOpOf(OpKind Op);

OpDef unaryOp(std::vector<OpAttrDecl> Attrs) {
  return {.MinOperands = 1,
          .MaxOperands = 1,
          .Attrs = std::move(Attrs),
          .Shape = sameAsOperand0,
          .Saved = [](const Node &N) -> SmallVector<Value *, 4> {
            return {N.operand(0)};
          },
          .Grad = [](GradBuilder &B) -> Error {
            const Node &N = B.N;
            B.accumulate(
                N.operand(0),
                B.emit(gradOpOf(N.op()), {N.operand(0), B.grad(0)}, N.attrs())
                    ->result());
            return Error::success();
          }};
}

OpDef unaryGradOp(std::vector<OpAttrDecl> Attrs) {
  return {.MinOperands = 2, // (x, dy) -> dx
          .MaxOperands = 2,
          .Attrs = std::move(Attrs),
          .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
            if (A.type(0) != A.type(1))
              return makeError(formatv("x {0} and dy {1} differ",
                                       A.type(0).str(), A.type(1).str()));
            return TypeList{A.type(0)};
          }};
}

} // namespace ops

namespace {

constexpr size_t NumOps = 0
#define SP_OP(Enum, Name) +1
#include "ir/Ops.def"
    ;

/// The unary ops and their gradient ops: the SP_UNARY_OP lines of
/// ir/Ops.def, and gelu (defined in ModelOps.cpp for its attribute).
struct UnaryPair {
  OpKind Op, Grad;
};
const UnaryPair UnaryOps[] = {
    {OpKind::Gelu, OpKind::GeluGrad},
#define SP_OP(Enum, Name)
#define SP_UNARY_OP(Enum, Name, OnnxName) {OpKind::Enum, OpKind::Enum##Grad},
#include "ir/Ops.def"
};

const OpTable &table() {
  static const OpTable T = [] {
    OpTable T(NumOps);
    addModelOps(T);
    addTrainingOps(T);
    addParallelOps(T);
    for (const UnaryPair &P : UnaryOps)
      if (!T[size_t(P.Op)].Shape) {
        T[size_t(P.Op)] = ops::unaryOp();
        T[size_t(P.Grad)] = ops::unaryGradOp();
      }
    // Every core op is defined: a new SP_OP line without a definition
    // fails here, at the first use of the table, not at its first node.
    for (size_t I = 0; I < NumOps; ++I)
      if (!isOnnxOp(OpKind(I)) && !T[I].Shape && T[I].Group.empty())
        report_fatal_error(Twine("op '") + opName(OpKind(I)) +
                           "' has no definition (ir/ops/)");
    return T;
  }();
  return T;
}

} // namespace

namespace ops {
static OpKind gradOpOf(OpKind Op) {
  for (const UnaryPair &P : UnaryOps)
    if (P.Op == Op)
      return P.Grad;
  llvm_unreachable("not a unary op");
}
} // namespace ops

const OpDef &opDef(OpKind Op) { return table()[size_t(Op)]; }

bool isActivation(OpKind Op) {
  return any_of(UnaryOps, [&](const UnaryPair &P) { return P.Op == Op; });
}

SmallVector<OpKind, 4> activationOps() {
  SmallVector<OpKind, 4> Ops;
  for (const UnaryPair &P : UnaryOps)
    Ops.push_back(P.Op);
  return Ops;
}

SmallVector<Value *, 4> savedForBackward(const Node &N) {
  SavedRule R = opDef(N.op()).Saved;
  return R ? R(N) : SmallVector<Value *, 4>();
}

Sharding resultLayout(const Node &N) {
  LayoutRule R = opDef(N.op()).Layout;
  return R ? R(N) : ops::keepLayout(N);
}

const Node *regatheredInput(const Node &N) {
  const Node *G = N.numOperands() ? N.operand(0)->producer() : nullptr;
  if (N.op() == OpKind::Linear && G && G->op() == OpKind::SpGather &&
      attrInt(G->op(), G->attrs(), "regather"))
    return G;
  return nullptr;
}

} // namespace sp
