//===- IR.cpp - Values, nodes and graphs ----------------------------------===//
#include "ir/IR.h"
#include "ir/OpDef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/ErrorHandling.h"
#include <algorithm>

using namespace llvm;

namespace sp {

//===----------------------------------------------------------------------===//
// Op and phase names
//===----------------------------------------------------------------------===//

static const char *const OpNames[] = {
#define SP_OP(Enum, Name) Name,
#include "ir/Ops.def"
};

StringRef opName(OpKind K) { return OpNames[unsigned(K)]; }

std::optional<OpKind> parseOpName(StringRef Name) {
  static const StringMap<OpKind> Map = [] {
    StringMap<OpKind> M;
    for (unsigned I = 0; I < std::size(OpNames); ++I)
      M[OpNames[I]] = OpKind(I);
    return M;
  }();
  auto It = Map.find(Name);
  if (It == Map.end())
    return std::nullopt;
  return It->second;
}

bool isOnnxOp(OpKind K) { return opName(K).startswith("onnx."); }

namespace {
/// How many operands each op is elementwise on, if it is an onnx.* op of
/// SP_ONNX_BINARY_OP or SP_ONNX_UNARY_OP; 0 otherwise.
const uint8_t OnnxElementwiseArity[] = {
#define SP_OP(Enum, Name) 0,
#define SP_ONNX_BINARY_OP(Enum, Name) 2,
#define SP_ONNX_UNARY_OP(Enum, Name) 1,
#include "ir/Ops.def"
};
} // namespace

bool isOnnxBinary(OpKind K) { return OnnxElementwiseArity[unsigned(K)] == 2; }
bool isOnnxUnary(OpKind K) { return OnnxElementwiseArity[unsigned(K)] == 1; }

bool hasSideEffects(OpKind K) { return opDef(K).SideEffects; }

StringRef defaultGroup(OpKind K) { return opDef(K).Group; }

std::string collectiveGroup(OpKind K, const AttrList &Attrs) {
  return Attrs.getString("group", defaultGroup(K));
}

bool isCollectiveOp(OpKind K) {
  return K == OpKind::AllReduce || K == OpKind::AllGather ||
         K == OpKind::ReduceScatter || K == OpKind::GatherParam ||
         K == OpKind::RingShift;
}

bool isGemmOp(OpKind K) {
  return K == OpKind::Linear || K == OpKind::LinearGradW ||
         K == OpKind::LinearGelu || K == OpKind::LinearGeluGrad ||
         K == OpKind::BatchMatMul;
}

bool isCommunicationOp(OpKind K) {
  if (isCollectiveOp(K))
    return true;
  switch (K) {
  case OpKind::Send:
  case OpKind::Recv:
  case OpKind::PipeBroadcast:
  case OpKind::PipeAllReduce:
    return true;
  default:
    return false;
  }
}

namespace {
bool fits(AttrDecl::KindT K, const Attribute &V) {
  switch (K) {
  case AttrDecl::Int:
    return std::holds_alternative<int64_t>(V);
  case AttrDecl::Float: // an integer literal is a float too
    return std::holds_alternative<double>(V) ||
           std::holds_alternative<int64_t>(V);
  case AttrDecl::String:
    return std::holds_alternative<std::string>(V);
  case AttrDecl::Ints:
    return std::holds_alternative<std::vector<int64_t>>(V);
  }
  return false;
}
} // namespace

const AttrDecl *findAttrDecl(OpKind Op, StringRef Name) {
  for (const OpAttrDecl &A : opDef(Op).Attrs)
    if (Name == A.Name)
      return &A.Decl;
  return nullptr;
}

std::string checkAttrs(OpKind Op, const AttrList &Attrs) {
  if (const Attribute *G = Attrs.find("group")) {
    if (defaultGroup(Op).empty())
      return "has a group but does not communicate";
    auto *Name = std::get_if<std::string>(G);
    if (!Name || Name->empty())
      return "its group must be a name (tp, pp, dp or a named subgroup)";
  }
  if (isOnnxOp(Op))
    return "";
  for (const auto &[Name, V] : Attrs.entries()) {
    if (Name == "group")
      continue; // checked above
    const AttrDecl *D = findAttrDecl(Op, Name);
    if (!D)
      return "has no attribute '" + Name + "' (ir/ops/)";
    if (!fits(D->Kind, V))
      return "attribute '" + Name + "' has the wrong kind (ir/ops/)";
  }
  for (const OpAttrDecl &A : opDef(Op).Attrs)
    if (A.Decl.Required && !Attrs.has(A.Name))
      return std::string("needs attribute '") + A.Name + "'";
  return "";
}

/// The declaration of an attribute a caller reads as Kind; reading one the op
/// does not declare, or as another kind, is a programming error.
static const AttrDecl &declOf(OpKind Op, StringRef Name, AttrDecl::KindT Kind) {
  const AttrDecl *D = findAttrDecl(Op, Name);
  if (!D || D->Kind != Kind)
    report_fatal_error(Twine(opName(Op)) + " declares no attribute '" + Name +
                       "' of that kind (ir/ops/)");
  return *D;
}

int64_t attrInt(OpKind Op, const AttrList &Attrs, StringRef Name) {
  return Attrs.getInt(Name, int64_t(declOf(Op, Name, AttrDecl::Int).Value.Number));
}

double attrFloat(OpKind Op, const AttrList &Attrs, StringRef Name) {
  return Attrs.getFloat(Name, declOf(Op, Name, AttrDecl::Float).Value.Number);
}

std::string attrString(OpKind Op, const AttrList &Attrs, StringRef Name) {
  return Attrs.getString(Name, declOf(Op, Name, AttrDecl::String).Value.String);
}

std::vector<int64_t> attrInts(OpKind Op, const AttrList &Attrs,
                              StringRef Name) {
  declOf(Op, Name, AttrDecl::Ints);
  return Attrs.getInts(Name);
}

/// The enumerator whose name (its index in Names) is Name.
template <typename E, size_t N>
static std::optional<E> parseEnumName(const char *const (&Names)[N],
                                      StringRef Name) {
  for (unsigned I = 0; I < N; ++I)
    if (Name == Names[I])
      return E(I);
  return std::nullopt;
}

static const char *const PhaseNames[] = {"fwd", "bwd", "recompute", "opt"};

StringRef phaseName(Phase P) { return PhaseNames[unsigned(P)]; }

std::optional<Phase> parsePhase(StringRef Name) {
  return parseEnumName<Phase>(PhaseNames, Name);
}

static const char *const InputRoleNames[] = {
    "none", "tokens", "targets", "positions", "mask", "token_types", "lr",
    "step", "loss_weight"};

StringRef inputRoleName(InputRole R) { return InputRoleNames[unsigned(R)]; }

std::optional<InputRole> parseInputRole(StringRef Name) {
  return parseEnumName<InputRole>(InputRoleNames, Name);
}

bool isPerMicrobatchRole(InputRole R) {
  return R == InputRole::Tokens || R == InputRole::Targets ||
         R == InputRole::Positions || R == InputRole::Mask ||
         R == InputRole::TokenTypes || R == InputRole::LossWeight;
}

bool roleDtypeOk(InputRole R, DType T) {
  switch (R) {
  case InputRole::Mask:
    return T == DType::F32 || T == DType::I64 || T == DType::I32 ||
           T == DType::Bool;
  case InputRole::LearningRate:
  case InputRole::Step:
  case InputRole::LossWeight:
    return T == DType::F32;
  default:
    return T == DType::I64;
  }
}

bool roleShapeOk(InputRole R, const TensorType &T, int64_t Batch,
                 int64_t Seq) {
  return T.rank() == 2 && T.Shape[1] == Seq &&
         (T.Shape[0] == Batch || (R == InputRole::Positions && T.Shape[0] == 1));
}

bool isModelInputRole(InputRole R) {
  return R == InputRole::Tokens || R == InputRole::Positions ||
         R == InputRole::Mask || R == InputRole::TokenTypes;
}

//===----------------------------------------------------------------------===//
// Value
//===----------------------------------------------------------------------===//

void Value::removeUse(Use U) {
  auto It = std::find(Users.begin(), Users.end(), U);
  assert(It != Users.end() && "use not found");
  Users.erase(It);
}

//===----------------------------------------------------------------------===//
// Node
//===----------------------------------------------------------------------===//

Node::~Node() {
  assert(Operands.empty() && "destroying a node that still uses values");
}

void Node::setOperand(unsigned I, Value *V) {
  if (Operands[I])
    Operands[I]->removeUse({this, I});
  Operands[I] = V;
  if (V)
    V->Users.push_back({this, I});
}

void Node::addOperand(Value *V) {
  Operands.push_back(nullptr);
  setOperand(Operands.size() - 1, V);
}

void Node::dropAllOperands() {
  for (unsigned I = 0; I < Operands.size(); ++I)
    if (Operands[I])
      Operands[I]->removeUse({this, I});
  Operands.clear();
}

SmallVector<Value *, 2> Node::results() const {
  SmallVector<Value *, 2> R;
  for (const auto &V : Results)
    R.push_back(V.get());
  return R;
}

bool Node::isDead() const {
  if (hasSideEffects(Op))
    return false;
  return none_of(Results, [&](const std::unique_ptr<Value> &V) {
    return V->hasUsers() || Parent->isOutput(V.get());
  });
}

std::string Node::describe() const {
  std::string S = "node ";
  S += Name.empty() ? std::string("<unnamed>") : "'" + Name + "'";
  return S + " (" + opName().str() + ")";
}

//===----------------------------------------------------------------------===//
// Graph
//===----------------------------------------------------------------------===//

Graph::~Graph() {
  // Drop all uses first so that node destruction order does not matter.
  for (Node &N : Nodes)
    N.dropAllOperands();
  Nodes.clear();
}

Value *Graph::addLeaf(std::vector<std::unique_ptr<Value>> &List,
                      Value::Kind K, std::string N, TensorType T,
                      std::shared_ptr<TensorData> Data) {
  List.push_back(
      std::unique_ptr<Value>(new Value(K, std::move(T), std::move(N))));
  Value *V = List.back().get();
  V->Data = std::move(Data);
  // The verifier reports duplicate names; the index keeps the first.
  LeafNames.try_emplace(V->name(), V);
  return V;
}

Value *Graph::addInput(std::string N, TensorType T, InputRole Role) {
  Value *V = addLeaf(Inputs, Value::Kind::Input, std::move(N), std::move(T),
                     nullptr);
  V->setInputRole(Role);
  return V;
}

Value *Graph::inputWithRole(InputRole R) const {
  for (const auto &V : Inputs)
    if (V->inputRole() == R)
      return V.get();
  return nullptr;
}

Value *Graph::addParam(std::string N, TensorType T,
                       std::shared_ptr<TensorData> Data) {
  return addLeaf(Params, Value::Kind::Param, std::move(N), std::move(T),
                 std::move(Data));
}

Value *Graph::addConst(std::string N, TensorType T,
                       std::shared_ptr<TensorData> Data) {
  return addLeaf(Consts, Value::Kind::Const, std::move(N), std::move(T),
                 std::move(Data));
}

Value *Graph::addState(std::string N, TensorType T) {
  return addLeaf(States, Value::Kind::State, std::move(N), std::move(T),
                 nullptr);
}

Value *Graph::addInlineConst(StringRef Hint, TensorType T,
                             std::vector<char> Bytes) {
  auto Data = TensorData::makeInline(T, std::move(Bytes));
  return addConst(uniqueLeafName(Hint), std::move(T), std::move(Data));
}

std::string Graph::uniqueLeafName(StringRef Hint) {
  std::string Base = Hint.empty() ? std::string("c") : Hint.str();
  if (!lookup(Base))
    return Base;
  while (true) {
    std::string N = Base + "_" + std::to_string(NextConstId++);
    if (!lookup(N))
      return N;
  }
}

Value *Graph::lookup(StringRef N) const {
  auto It = LeafNames.find(N);
  return It == LeafNames.end() ? nullptr : It->second;
}

bool Graph::isOutput(const Value *V) const {
  return llvm::any_of(Outputs, [&](const Output &O) { return O.V == V; });
}

void Graph::eraseLeaf(Value *V) {
  assert(!V->hasUsers() && !isOutput(V) && "erasing a used leaf value");
  auto &List = V->isParam()   ? Params
               : V->isConst() ? Consts
               : V->isState() ? States
                              : Inputs;
  if (lookup(V->name()) == V)
    LeafNames.erase(V->name());
  List.erase(std::find_if(List.begin(), List.end(),
                          [&](const auto &P) { return P.get() == V; }));
}

unsigned Graph::removeUnusedConstants() {
  unsigned N = 0;
  for (auto *List : {&Params, &Consts, &States}) {
    auto Dead = [&](const std::unique_ptr<Value> &V) {
      return !V->hasUsers() && !isOutput(V.get());
    };
    for (const auto &V : *List)
      if (Dead(V) && lookup(V->name()) == V.get())
        LeafNames.erase(V->name());
    N += std::count_if(List->begin(), List->end(), Dead);
    List->erase(std::remove_if(List->begin(), List->end(), Dead), List->end());
  }
  return N;
}

Node *Graph::create(iterator InsertPt, OpKind Op, ArrayRef<Value *> Operands,
                    ArrayRef<TensorType> ResultTypes, std::string Name) {
  Node *N = new Node(Op, std::move(Name));
  N->Parent = this;
  for (Value *V : Operands)
    N->addOperand(V);
  for (unsigned I = 0; I < ResultTypes.size(); ++I) {
    auto V = std::unique_ptr<Value>(
        new Value(Value::Kind::Result, ResultTypes[I], ""));
    V->Producer = N;
    V->ResultNo = I;
    N->Results.push_back(std::move(V));
  }
  Nodes.insert(InsertPt, N);
  return N;
}

void Graph::replaceAllUsesWith(Value *Old, Value *New, const Node *Except) {
  assert(Old != New && "replacing a value with itself");
  SmallVector<Use, 4> Uses(Old->users().begin(), Old->users().end());
  for (const Use &U : Uses)
    if (U.User != Except)
      U.User->setOperand(U.OperandNo, New);
  for (Output &O : Outputs)
    if (O.V == Old)
      O.V = New;
}

unsigned Graph::eraseDeadNodes() {
  unsigned N = 0;
  for (auto It = Nodes.rbegin(); It != Nodes.rend();) {
    Node &Nd = *It++;
    if (Nd.isDead()) {
      erase(&Nd);
      ++N;
    }
  }
  return N;
}

std::unique_ptr<Graph> Graph::clone() const {
  auto C = std::make_unique<Graph>(Name);
  DenseMap<const Value *, Value *> Map;
  auto CopyLeaves = [&](const std::vector<std::unique_ptr<Value>> &From,
                        std::vector<std::unique_ptr<Value>> &To) {
    for (const auto &V : From) {
      Value *N = C->addLeaf(To, V->kind(), V->name(), V->type(), V->data());
      N->setSharding(V->sharding());
      N->setInputRole(V->inputRole());
      Map[V.get()] = N;
    }
  };
  CopyLeaves(Inputs, C->Inputs);
  CopyLeaves(Params, C->Params);
  CopyLeaves(Consts, C->Consts);
  CopyLeaves(States, C->States);
  C->NextConstId = NextConstId;
  SmallVector<Value *, 4> Ops;
  SmallVector<TensorType, 3> Types;
  for (const Node &N : Nodes) {
    Ops.clear();
    Types.clear();
    for (Value *V : N.operands())
      Ops.push_back(Map.lookup(V));
    for (Value *R : N.results())
      Types.push_back(R->type());
    Node *New = C->append(N.op(), Ops, Types, N.name());
    New->attrs() = N.attrs();
    New->tags() = N.tags();
    for (unsigned I = 0; I < N.numResults(); ++I) {
      New->result(I)->setSharding(N.result(I)->sharding());
      Map[N.result(I)] = New->result(I);
    }
  }
  for (const Output &O : Outputs)
    C->addOutput(O.Name, Map.lookup(O.V));
  return C;
}

void Graph::erase(Node *N) {
  for (const auto &R : N->Results) {
    (void)R;
    assert(!R->hasUsers() && "erasing a node whose results are still used");
    assert(!isOutput(R.get()) && "erasing a node that produces an output");
  }
  N->dropAllOperands();
  Nodes.erase(N);
}

} // namespace sp
