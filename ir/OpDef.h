//===- OpDef.h - What each core op is, declared in one place ----*- C++ -*-===//
//
// Every core op is one OpDef, written in ir/ops/ beside its kin:
//  - its operand count and its attributes, with their kinds and defaults;
//  - its shape rule (the result types);
//  - the forward values its gradient reads, and its gradient rule;
//  - its layout rule (how results are sharded given the operands' layouts);
//  - for the ops that communicate, the process group they default to.
// Passes ask the definition instead of switching on the op: inferTypes (so
// buildNode and the verifier), autodiff, the parallel passes' layout
// propagation, the attribute readers (attrInt, ...). Kernels belong to each
// backend (runtime/cpu/CpuBackend.cpp). The ONNX ops (onnx.*) are the
// importer's and have no OpDef: ir/OnnxShapes.cpp and ir/Fold.cpp know them.
//
// An elementwise activation without attributes is one line of ir/Ops.def,
// SP_UNARY_OP: it defines the op and its gradient op with the generic rules
// of unaryOp (same shape, layout kept, dx = op_grad(x, dy), x saved), and the
// CPU backend finds its kernel by name (runtime/cpu/kernels/).
//
// The models are MLIR's op definitions and ONNX Runtime's gradient builders.
//
//===----------------------------------------------------------------------===//
#ifndef SP_IR_OPDEF_H
#define SP_IR_OPDEF_H

#include "ir/IR.h"
#include "ir/ShapeInference.h"
#include "llvm/Support/Error.h"
#include <vector>

namespace sp {

/// What a shape rule sees: the op, its operands (present and counted per the
/// definition) and its attributes.
struct ShapeArgs {
  OpKind Op;
  llvm::ArrayRef<Value *> Operands;
  const AttrList &Attrs;

  const TensorType &type(unsigned I) const { return Operands[I]->type(); }
  /// Attributes with their declared defaults.
  int64_t attrInt(llvm::StringRef Name) const {
    return sp::attrInt(Op, Attrs, Name);
  }
  std::vector<int64_t> attrInts(llvm::StringRef Name) const {
    return sp::attrInts(Op, Attrs, Name);
  }
};

/// What a gradient rule builds with: autodiff implements it
/// (passes/Autodiff.cpp) for one forward node at a time.
class GradBuilder {
public:
  explicit GradBuilder(const Node &N) : N(N) {}
  virtual ~GradBuilder();

  /// The forward node being differentiated.
  const Node &N;
  /// The gradient reaching result I of N; null if none does.
  virtual Value *grad(unsigned I) const = 0;
  /// True if V (an operand of N) depends on a parameter.
  virtual bool requiresGrad(const Value *V) const = 0;
  /// Appends a backward node with N's layer and role.
  virtual Node *emit(OpKind Op, llvm::ArrayRef<Value *> Operands,
                     AttrList Attrs = {}) = 0;
  /// Adds D to the gradient of V, summing over broadcast axes first; nothing
  /// if V does not require a gradient.
  virtual void accumulate(Value *V, Value *D) = 0;
  /// The all-gather, in the backward, of the input of the sequence-parallel
  /// gather G (see regatheredInput), built once for every linear reading G.
  virtual Value *regathered(const Node &G) = 0;

  /// An error naming N.
  llvm::Error error(const llvm::Twine &Msg) const;
};

/// A core op's attribute declaration.
struct OpAttrDecl {
  const char *Name;
  AttrDecl Decl;
};

/// Attribute declarations, as written in the op files:
/// {"epsilon", attr::Float(1e-5)}, {"heads", attr::RequiredInt}.
namespace attr {
inline AttrDecl Int(int64_t D) { return {AttrDecl::Int, false, D}; }
inline AttrDecl Float(double D) { return {AttrDecl::Float, false, D}; }
inline AttrDecl String(const char *D) { return {AttrDecl::String, false, D}; }
inline AttrDecl Ints() { return {AttrDecl::Ints, false, {}}; }
inline const AttrDecl RequiredInt{AttrDecl::Int, true, {}};
inline const AttrDecl RequiredInts{AttrDecl::Ints, true, {}};
} // namespace attr

using ShapeRule = llvm::Expected<TypeList> (*)(const ShapeArgs &);
using SavedRule = llvm::SmallVector<Value *, 4> (*)(const Node &);
using GradRule = llvm::Error (*)(GradBuilder &);
using LayoutRule = Sharding (*)(const Node &);

struct OpDef {
  /// Operand count bounds (Variadic: no upper bound).
  static constexpr unsigned Variadic = ~0u;
  unsigned MinOperands = 0, MaxOperands = 0;
  /// Its attributes. The verifier refuses undeclared ones and wrong kinds;
  /// attrInt/attrFloat/... read them with these defaults.
  std::vector<OpAttrDecl> Attrs = {};
  /// The result types. Operand counts are checked before it runs.
  ShapeRule Shape = nullptr;
  /// The forward values (operands or results of the node) its gradient rule
  /// reads; autodiff checks the rule reads no other. Null: none.
  SavedRule Saved = nullptr;
  /// Emits the gradient of the operands. Null: the op is not differentiable
  /// (gradient, optimizer and lowered collective ops).
  GradRule Grad = nullptr;
  /// The layout of every result given the operands'. Null: elementwise and
  /// row-wise ops, which keep operand 0's layout.
  LayoutRule Layout = nullptr;
  /// The group a communicating op uses without a "group" attribute: "tp"
  /// or "pp"; empty for ops that do not communicate.
  llvm::StringRef Group = {};
  /// Writes to its operands (the optimizer update); has no results and is
  /// never dead.
  bool SideEffects = false;
};

/// The definition of a core op (not an onnx.* op).
const OpDef &opDef(OpKind Op);

/// An elementwise activation: gelu, or an SP_UNARY_OP of ir/Ops.def (silu,
/// relu). Detection accepts any of them where a Transformer has its MLP
/// activation.
bool isActivation(OpKind Op);
/// Those ops, gelu first.
llvm::SmallVector<OpKind, 4> activationOps();

/// How many operands an attention or attention_grad reads q, k and v from
/// (after attention_grad's do): 3, or 1 with packed = 1 (the QKV
/// projection's output). Its padding mask, if any, comes next.
inline unsigned attentionInputs(OpKind Op, const AttrList &Attrs) {
  return attrInt(Op, Attrs, "packed") ? 1 : 3;
}
inline unsigned attentionInputs(const Node &N) {
  return attentionInputs(N.op(), N.attrs());
}
/// Where an attention's padding mask (keep) would be among its operands:
/// after q, k, v (or qkv), and for attention_grad after do before them and
/// o, lse after them.
inline unsigned attentionKeepOperand(OpKind Op, const AttrList &Attrs) {
  bool Grad = Op == OpKind::AttentionGrad;
  return attentionInputs(Op, Attrs) + (Grad ? 3 : 0);
}

/// The forward values N's gradient rule reads.
llvm::SmallVector<Value *, 4> savedForBackward(const Node &N);

/// The result layout of N from its operands' layouts.
Sharding resultLayout(const Node &N);

/// The sequence-parallel gather feeding N, if N is a column-parallel linear
/// whose backward gathers its input again from the saved shard
/// (sp_gather {regather = 1}); null otherwise.
const Node *regatheredInput(const Node &N);

} // namespace sp

#endif // SP_IR_OPDEF_H
