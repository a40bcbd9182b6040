//===- IR.h - Values, nodes and graphs -------------------------*- C++ -*-===//
//
// A small SSA graph. A Graph owns its inputs, parameters and constants (values
// without a producer) and a list of Nodes in topological order; each Node owns
// its result values. Every value knows its users, so rewrites are local:
// create the replacement, Graph::replaceAllUsesWith, erase the old node.
//
// Nodes carry tags that later passes rely on instead of op patterns: the
// Transformer layer and role found by detection, the phase (forward, backward,
// recompute, optimizer) and the pipeline stage.
//
//===----------------------------------------------------------------------===//
#ifndef SP_IR_IR_H
#define SP_IR_IR_H

#include "ir/Attribute.h"
#include "ir/Role.h"
#include "ir/TensorData.h"
#include "ir/Types.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/ilist.h"
#include "llvm/ADT/ilist_node.h"
#include "llvm/ADT/iterator_range.h"
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sp {

enum class OpKind : uint16_t {
#define SP_OP(Enum, Name) Enum,
#include "ir/Ops.def"
};
llvm::StringRef opName(OpKind K);
std::optional<OpKind> parseOpName(llvm::StringRef Name);
bool isOnnxOp(OpKind K);
/// The onnx.* ops elementwise on two operands, with numpy broadcasting (Add,
/// Sub, Mul, Div, Pow, Equal, And, Less, Greater: SP_ONNX_BINARY_OP in
/// ir/Ops.def), and on one (Identity, Neg, Not, Sqrt, Erf, Tanh, Sigmoid,
/// Reciprocal: SP_ONNX_UNARY_OP).
bool isOnnxBinary(OpKind K);
bool isOnnxUnary(OpKind K);
/// Ops that write to their operands (the optimizer update). They have no
/// results and are never dead.
bool hasSideEffects(OpKind K);
/// The process group a collective op communicates over when its node has no
/// "group" attribute: "tp" (the tensor-parallel group: f, f-bar, g, g-bar,
/// sp_split and the concrete collectives), "pp" (the pipeline group: send,
/// recv, pipe_all_reduce, pipe_broadcast); "" for ops that do not
/// communicate. A "group" attribute names another: "tp", "pp", "dp" (the
/// data-parallel group) or a named subgroup.
llvm::StringRef defaultGroup(OpKind K);
/// The group a collective node or instruction communicates over.
std::string collectiveGroup(OpKind K, const AttrList &Attrs);
/// The concrete collectives of a lowered program: all_reduce, all_gather,
/// reduce_scatter, gather_param, ring_shift.
bool isCollectiveOp(OpKind K);
/// The ops of a lowered program that are communication calls: the concrete
/// collectives and the pipeline messages (send, recv, pipe_broadcast,
/// pipe_all_reduce).
bool isCommunicationOp(OpKind K);
/// The GEMMs of a lowered program (a collective may run beside one):
/// linear, linear_grad_w, batch_matmul and the fused linear_gelu and
/// linear_gelu_grad.
bool isGemmOp(OpKind K);

/// A core op's attribute as its definition declares it (ir/OpDef.h).
struct AttrDecl {
  enum KindT : uint8_t { Int, Float, String, Ints } Kind;
  bool Required;
  /// The default when not Required: Number for Int and Float, String for
  /// String (Ints default to the empty list).
  struct Default {
    double Number = 0;
    const char *String = "";
    Default() = default; // Ints' {}
    Default(int N) : Number(N) {}
    Default(int64_t N) : Number(double(N)) {}
    Default(double N) : Number(N) {}
    Default(const char *S) : String(S) {}
  } Value;
};
/// The declaration of Op's attribute Name, or null if it has none.
const AttrDecl *findAttrDecl(OpKind Op, llvm::StringRef Name);
/// Why Attrs do not fit Op's declarations (an undeclared name, another kind,
/// a required one missing), or "" when they do. ONNX ops always fit.
std::string checkAttrs(OpKind Op, const AttrList &Attrs);
/// An attribute of a core op, or its declared default. Asking for an
/// attribute the op does not declare is a programming error (asserts).
int64_t attrInt(OpKind Op, const AttrList &Attrs, llvm::StringRef Name);
double attrFloat(OpKind Op, const AttrList &Attrs, llvm::StringRef Name);
std::string attrString(OpKind Op, const AttrList &Attrs, llvm::StringRef Name);
std::vector<int64_t> attrInts(OpKind Op, const AttrList &Attrs,
                              llvm::StringRef Name);

enum class Phase : uint8_t { Forward, Backward, Recompute, Optimizer };
llvm::StringRef phaseName(Phase P);
std::optional<Phase> parsePhase(llvm::StringRef Name);

/// What the runtime feeds a graph input with at every step. The role is found
/// from the graph's structure (the ids of the token embedding are the
/// tokens, ...), never from the input's name; an input without a role cannot
/// be fed, and the runtime refuses to run it.
enum class InputRole : uint8_t {
  None,
  Tokens,     // token ids [batch, seq]
  Targets,    // the loss's target ids [batch, seq] (added by autodiff)
  Positions,  // position ids [batch or 1, seq]: 0, 1, ..., seq - 1
  Mask,       // attention (padding) mask [batch, seq]: 1 = attend
  TokenTypes, // segment ids [batch, seq]: 0
  LearningRate, // f32 scalar (added by the optimizer pass)
  Step,         // f32 scalar, 1-based (added by the optimizer pass)
  LossWeight,   // f32 scalar per microbatch: its share of the step's counted
                // targets (added by autodiff)
};
/// A target id that counts for nothing in the loss (torch's ignore_index
/// default): padding, or a position masked-LM does not predict.
constexpr int64_t IgnoreTarget = -100;
llvm::StringRef inputRoleName(InputRole R);
std::optional<InputRole> parseInputRole(llvm::StringRef Name);
/// Roles fed once per microbatch: a tensor whose first axis is the batch (a
/// microbatch gets its rows), or the microbatch's loss weight.
bool isPerMicrobatchRole(InputRole R);
/// Roles of the exported model's own inputs (bind-inputs finds them, --input
/// names them): tokens, positions, mask, token_types.
bool isModelInputRole(InputRole R);
/// What the runtime feeds a role with, for bind-inputs and the executor:
/// ids (tokens, targets, positions, token types) are i64; a mask f32, i64,
/// i32 or bool; lr, step and the loss weight f32 scalars.
bool roleDtypeOk(InputRole R, DType T);
/// A per-row role is [Batch, Seq] (positions may be [1, Seq]).
bool roleShapeOk(InputRole R, const TensorType &T, int64_t Batch,
                 int64_t Seq);

class Node;
class Graph;

struct Use {
  Node *User;
  unsigned OperandNo;
  bool operator==(const Use &O) const {
    return User == O.User && OperandNo == O.OperandNo;
  }
};

class Value {
public:
  /// Input: fed every step. Param: trainable weight. Const: immutable data.
  /// State: persistent, zero-initialised, updated in place (optimizer
  /// moments). Result: produced by a node.
  enum class Kind : uint8_t { Input, Param, Const, State, Result };

  Kind kind() const { return K; }
  bool isInput() const { return K == Kind::Input; }
  bool isParam() const { return K == Kind::Param; }
  bool isConst() const { return K == Kind::Const; }
  bool isState() const { return K == Kind::State; }
  bool isResult() const { return K == Kind::Result; }

  const TensorType &type() const { return Type; }
  void setType(TensorType T) { Type = std::move(T); }
  const Sharding &sharding() const { return Shard; }
  void setSharding(Sharding S) { Shard = S; }
  /// What the runtime feeds an input with (None for other values).
  InputRole inputRole() const { return Role; }
  void setInputRole(InputRole R) { Role = R; }

  /// Name of an input, parameter or constant (the ONNX name); empty for
  /// node results, which print as %0, %1, ... in program order.
  const std::string &name() const { return Name; }

  /// Producer of a result value; null otherwise.
  Node *producer() const { return Producer; }
  unsigned resultIndex() const { return ResultNo; }

  /// Payload of a parameter or constant.
  const std::shared_ptr<TensorData> &data() const { return Data; }
  void setData(std::shared_ptr<TensorData> D) { Data = std::move(D); }

  llvm::ArrayRef<Use> users() const { return Users; }
  bool hasUsers() const { return !Users.empty(); }

private:
  friend class Node;
  friend class Graph;
  Value(Kind K, TensorType T, std::string Name)
      : K(K), Type(std::move(T)), Name(std::move(Name)) {}
  void removeUse(Use U);

  Kind K;
  TensorType Type;
  Sharding Shard;
  InputRole Role = InputRole::None;
  std::string Name;
  Node *Producer = nullptr;
  unsigned ResultNo = 0;
  std::shared_ptr<TensorData> Data;
  llvm::SmallVector<Use, 2> Users;
};

/// Tags set by passes. Layer -1 means "not inside a Transformer layer";
/// Stage -1 means "not assigned to a pipeline stage".
struct Tags {
  int Layer = -1;
  sp::Role Role = sp::Role::None;
  Phase Ph = Phase::Forward;
  int Stage = -1;
};

class Node : public llvm::ilist_node<Node> {
public:
  OpKind op() const { return Op; }
  llvm::StringRef opName() const { return sp::opName(Op); }

  unsigned numOperands() const { return Operands.size(); }
  Value *operand(unsigned I) const { return Operands[I]; }
  llvm::ArrayRef<Value *> operands() const { return Operands; }
  void setOperand(unsigned I, Value *V);
  void addOperand(Value *V);
  void dropAllOperands();

  unsigned numResults() const { return Results.size(); }
  Value *result(unsigned I = 0) const { return Results[I].get(); }
  llvm::SmallVector<Value *, 2> results() const;

  AttrList &attrs() { return Attrs; }
  const AttrList &attrs() const { return Attrs; }

  /// Source name (the ONNX node name), kept for diagnostics.
  const std::string &name() const { return Name; }
  void setName(std::string N) { Name = std::move(N); }
  Tags &tags() { return T; }
  const Tags &tags() const { return T; }

  Graph *parent() const { return Parent; }
  /// No result is used or is a graph output, and the op has no side effects.
  bool isDead() const;
  /// "node 'Name' (onnx.MatMul)" for diagnostics.
  std::string describe() const;

  ~Node();

private:
  friend class Graph;
  Node(OpKind Op, std::string Name) : Op(Op), Name(std::move(Name)) {}

  OpKind Op;
  llvm::SmallVector<Value *, 3> Operands;
  llvm::SmallVector<std::unique_ptr<Value>, 1> Results;
  AttrList Attrs;
  std::string Name;
  Tags T;
  Graph *Parent = nullptr;
};

class Graph {
public:
  using NodeList = llvm::iplist<Node>;
  using iterator = NodeList::iterator;

  explicit Graph(std::string Name = "main") : Name(std::move(Name)) {}
  Graph(const Graph &) = delete;
  Graph &operator=(const Graph &) = delete;
  ~Graph();

  const std::string &name() const { return Name; }
  void setName(std::string N) { Name = std::move(N); }

  // Values without producers.
  Value *addInput(std::string Name, TensorType T,
                  InputRole Role = InputRole::None);
  Value *addParam(std::string Name, TensorType T,
                  std::shared_ptr<TensorData> Data);
  Value *addConst(std::string Name, TensorType T,
                  std::shared_ptr<TensorData> Data);
  Value *addState(std::string Name, TensorType T);
  /// Adds an inline constant with a fresh unique name built from Hint.
  Value *addInlineConst(llvm::StringRef Hint, TensorType T,
                        std::vector<char> Bytes);
  llvm::ArrayRef<std::unique_ptr<Value>> inputs() const { return Inputs; }
  llvm::ArrayRef<std::unique_ptr<Value>> params() const { return Params; }
  llvm::ArrayRef<std::unique_ptr<Value>> consts() const { return Consts; }
  llvm::ArrayRef<std::unique_ptr<Value>> states() const { return States; }
  /// Finds an input, parameter or constant by name.
  Value *lookup(llvm::StringRef Name) const;
  /// The first input with this role, or null.
  Value *inputWithRole(InputRole R) const;
  /// Removes parameters and constants that have no users.
  unsigned removeUnusedConstants();
  /// Erases a parameter or constant with no users.
  void eraseLeaf(Value *V);

  // Outputs are named (the ONNX output name).
  struct Output {
    std::string Name;
    Value *V;
  };
  void addOutput(std::string Name, Value *V) { Outputs.push_back({Name, V}); }
  llvm::ArrayRef<Output> outputs() const { return Outputs; }
  /// Rewires every use of Old, and every graph output that is Old, to New.
  /// Uses by Except stay (a node inserted after Old that consumes it).
  void replaceAllUsesWith(Value *Old, Value *New,
                          const Node *Except = nullptr);
  void clearOutputs() { Outputs.clear(); }
  bool isOutput(const Value *V) const;

  // Nodes, in topological order.
  NodeList &nodes() { return Nodes; }
  const NodeList &nodes() const { return Nodes; }
  size_t numNodes() const { return Nodes.size(); }

  /// Creates a node before InsertPt with the given operands and result types.
  Node *create(iterator InsertPt, OpKind Op, llvm::ArrayRef<Value *> Operands,
               llvm::ArrayRef<TensorType> ResultTypes, std::string Name = "");
  /// Appends a node at the end.
  Node *append(OpKind Op, llvm::ArrayRef<Value *> Operands,
               llvm::ArrayRef<TensorType> ResultTypes, std::string Name = "") {
    return create(Nodes.end(), Op, Operands, ResultTypes, std::move(Name));
  }
  /// Erases a node whose results have no users.
  void erase(Node *N);
  /// Erases every dead node (Node::isDead), sweeping backwards so that chains
  /// go in one call. Returns how many.
  unsigned eraseDeadNodes();

  /// A name not used by any input, parameter or constant.
  std::string uniqueLeafName(llvm::StringRef Hint);

  /// A deep copy: the same leaves (sharing their data), nodes, tags,
  /// shardings and outputs. Passes that try alternatives (recompute auto)
  /// transform copies.
  std::unique_ptr<Graph> clone() const;

private:
  std::string Name;
  Value *addLeaf(std::vector<std::unique_ptr<Value>> &List, Value::Kind K,
                 std::string Name, TensorType T,
                 std::shared_ptr<TensorData> Data);

  std::vector<std::unique_ptr<Value>> Inputs, Params, Consts, States;
  llvm::StringMap<Value *> LeafNames; // index over the four lists above
  std::vector<Output> Outputs;
  NodeList Nodes;
  unsigned NextConstId = 0;
};

} // namespace sp

#endif // SP_IR_IR_H
