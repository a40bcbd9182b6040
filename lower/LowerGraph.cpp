//===- LowerGraph.cpp - A training graph to one program -------------------===//
#include "lower/LowerGraph.h"
#include "lower/ProgramBuilder.h"
#include "llvm/ADT/DenseMap.h"

using namespace llvm;

namespace sp {

/// Whether V is a parameter's gradient, or summed into one: the optimizer
/// (adamw's gradient, grad_norm) reads it, directly or through the sums that
/// build it (the data- and tensor-parallel reductions, the sum of a weight's
/// uses). Mixed precision keeps these in f32, as Megatron accumulates its
/// main_grad: the weight-gradient GEMMs write f32.
static bool feedsOptimizer(const Value *V, OptimizerFeeds *Memo) {
  // Memo: the backward's residual-gradient sums chain through every layer,
  // and walking that chain from each of its values would be quadratic.
  if (Memo)
    if (auto It = Memo->find(V); It != Memo->end())
      return It->second;
  bool Feeds = false;
  for (const Use &U : V->users()) {
    switch (U.User->op()) {
    case OpKind::AdamW:
      Feeds |= U.OperandNo == 1;
      break;
    case OpKind::GradNorm:
      Feeds = true;
      break;
    case OpKind::Add:
    case OpKind::AllReduce:
    case OpKind::ReduceScatter:
    case OpKind::PipeAllReduce:
      Feeds |= U.User->tags().Ph != Phase::Forward &&
               feedsOptimizer(U.User->result(), Memo);
      break;
    default:
      break;
    }
    if (Feeds)
      break;
  }
  if (Memo)
    (*Memo)[V] = Feeds;
  return Feeds;
}

/// Values that keep f32 whatever the activation dtype (a ring_concat's
/// operands as its result): norm statistics, the
/// fused attention's log-sum-exp (its backward rebuilds the probabilities as
/// exp(score - lse): a 16-bit lse would put its rounding, up to 2^-8
/// relative in bf16, into every probability), everything the loss computes
/// on (the logits and the loss) and the parameters' gradients.
static bool keepsF32(const Value *V, OptimizerFeeds *Memo) {
  const Node *P = V->producer();
  if (!P)
    return false;
  if ((P->op() == OpKind::LayerNorm || P->op() == OpKind::RmsNorm ||
       P->op() == OpKind::Attention) &&
      V->resultIndex() > 0)
    return true;
  if (P->op() == OpKind::CrossEntropy || P->op() == OpKind::CrossEntropyGrad ||
      P->tags().Role == Role::Loss || P->tags().Ph == Phase::Optimizer)
    return true;
  if (any_of(V->users(), [](const Use &U) {
        return U.User->op() == OpKind::CrossEntropy;
      }))
    return true;
  // A chunk of collective-matmul's ring keeps the type of the whole it is
  // put into (ring_concat copies bytes): the head's chunks of the logits.
  if (any_of(V->users(), [&](const Use &U) {
        return U.User->op() == OpKind::RingConcat &&
               keepsF32(U.User->result(), Memo);
      }))
    return true;
  return P->tags().Ph != Phase::Forward && feedsOptimizer(V, Memo);
}

DType plannedDtype(const Value *V, DType ActDtype, OptimizerFeeds *Memo) {
  DType Own = V->type().Dtype;
  return Own != ActDtype && isFloat(Own) && !keepsF32(V, Memo) ? ActDtype : Own;
}

int64_t plannedBytes(const Value *V, DType ActDtype, OptimizerFeeds *Memo) {
  return V->type().numElements() * dtypeSize(plannedDtype(V, ActDtype, Memo));
}

TensorType plannedType(const Value *V, DType ActDtype, OptimizerFeeds *Memo) {
  TensorType T = V->type();
  T.Dtype = plannedDtype(V, ActDtype, Memo);
  return T;
}

TensorType ProgramBuilder::plannedType(const Value *V) {
  return sp::plannedType(V, ActDtype, &Feeds);
}

int ProgramBuilder::addBuffer(std::string Name, TensorType T,
                              ProgramBuffer::Kind K,
                              std::shared_ptr<TensorData> Data) {
  ProgramBuffer B;
  B.Name = std::move(Name);
  B.Bytes = T.numBytes();
  B.Type = std::move(T);
  B.K = K;
  B.Data = std::move(Data);
  P.Buffers.push_back(std::move(B));
  return P.Buffers.size() - 1;
}

int ProgramBuilder::leaf(const Value *V, std::string Name) {
  auto It = Leaves.find(V);
  if (It != Leaves.end())
    return It->second;
  ProgramBuffer::Kind K = V->isInput()   ? ProgramBuffer::Input
                          : V->isParam() ? ProgramBuffer::Param
                          : V->isState() ? ProgramBuffer::State
                                         : ProgramBuffer::Const;
  int Id = addBuffer(Name.empty() ? V->name() : std::move(Name), V->type(), K,
                     V->data());
  P.Buffers[Id].Shard = V->sharding();
  P.Buffers[Id].Feed = V->inputRole();
  Leaves[V] = Id;
  return Id;
}

int ProgramBuilder::addResult(const TensorType &T, int64_t Bytes,
                              const Tags &Tg, const Sharding &S) {
  ProgramBuffer B;
  B.Name = "%" + std::to_string(P.Buffers.size());
  B.Type = T;
  B.Bytes = Bytes;
  B.Def = B.LastUse = P.Instrs.size();
  B.Shard = S;
  B.Layer = Tg.Layer;
  B.Role = Tg.Role;
  P.Buffers.push_back(std::move(B));
  return P.Buffers.size() - 1;
}

bool ProgramBuilder::mixedPrecision() const {
  return ActDtype != DType::F32 && ActDtype != DType::F64;
}

int ProgramBuilder::computeCopy(int Param, const Tags &User) {
  auto It = Copies.find(Param);
  if (It != Copies.end())
    return It->second;
  const ProgramBuffer &PB = P.Buffers[Param];
  TensorType T = PB.Type;
  T.Dtype = ActDtype;
  AttrList A;
  A.set("to", dtypeName(ActDtype).str());
  Tags Tg;
  Tg.Layer = User.Layer;
  Tg.Stage = User.Stage;
  Tg.Role = Role::Cast;
  Tg.Ph = Phase::Forward; // also run when evaluating
  int Id = emitRaw(OpKind::Cast, {Param}, {T}, std::move(A), Tg,
                   "cast." + PB.Name, {T.numBytes()})[0];
  P.Buffers[Id].Type = T; // not its operand's f32
  P.Buffers[Id].Shard = P.Buffers[Param].Shard;
  Copies[Param] = Id;
  return Id;
}

SmallVector<int, 3> ProgramBuilder::emit(const Node &N, ArrayRef<int> In,
                                         const AttrList *ExtraAttrs) {
  Instruction I;
  I.Op = N.op();
  I.Attrs = N.attrs();
  if (ExtraAttrs)
    for (const auto &[Name, V] : ExtraAttrs->entries())
      I.Attrs.set(Name, V);
  I.Layer = N.tags().Layer;
  I.Role = N.tags().Role;
  I.Ph = N.tags().Ph;
  I.Name = N.name();
  I.In.assign(In.begin(), In.end());
  // Mixed precision: the forward and backward read the 16-bit copies of the
  // parameters; the optimizer updates the f32 masters.
  if (mixedPrecision() && N.tags().Ph != Phase::Optimizer)
    for (int &B : I.In)
      if (P.Buffers[B].K == ProgramBuffer::Param &&
          isFloat(P.Buffers[B].Type.Dtype))
        B = computeCopy(B, N.tags());
  SmallVector<int, 3> Out;
  for (Value *R : N.results()) {
    TensorType T = plannedType(R);
    Out.push_back(addResult(T, T.numElements() * dtypeSize(T.Dtype), N.tags(),
                            R->sharding()));
  }
  I.Out.assign(Out.begin(), Out.end());
  P.Instrs.push_back(std::move(I));
  return Out;
}

SmallVector<int, 1> ProgramBuilder::emitRaw(OpKind Op, ArrayRef<int> In,
                                            ArrayRef<TensorType> OutTypes,
                                            AttrList Attrs, const Tags &T,
                                            StringRef Name,
                                            ArrayRef<int64_t> OutBytes) {
  Instruction I;
  I.Op = Op;
  I.Attrs = std::move(Attrs);
  I.Layer = T.Layer;
  I.Role = T.Role;
  I.Ph = T.Ph;
  I.Name = Name.str();
  I.In.assign(In.begin(), In.end());
  SmallVector<int, 1> Out;
  for (size_t K = 0; K < OutTypes.size(); ++K) {
    // A result like an operand keeps its planned type, size and layout.
    const ProgramBuffer *Like =
        K < In.size() && P.Buffers[In[K]].Type.Shape == OutTypes[K].Shape &&
                isFloat(P.Buffers[In[K]].Type.Dtype) ==
                    isFloat(OutTypes[K].Dtype)
            ? &P.Buffers[In[K]]
            : nullptr;
    int64_t Bytes = K < OutBytes.size() ? OutBytes[K]
                    : Like               ? Like->Bytes
                                         : OutTypes[K].numBytes();
    Out.push_back(addResult(Like ? Like->Type : OutTypes[K], Bytes, T,
                            Like ? Like->Shard : Sharding()));
  }
  I.Out.assign(Out.begin(), Out.end());
  P.Instrs.push_back(std::move(I));
  return Out;
}

Program ProgramBuilder::take() {
  int End = P.Instrs.size();
  for (int I = 0; I < End; ++I)
    for (int B : P.Instrs[I].In)
      if (P.Buffers[B].K == ProgramBuffer::Temp)
        P.Buffers[B].LastUse = std::max(P.Buffers[B].LastUse, I);
  for (auto &[Name, Id] : P.Outputs)
    if (P.Buffers[Id].K == ProgramBuffer::Temp)
      P.Buffers[Id].LastUse = End; // read after the last instruction
  return std::move(P);
}

Expected<Program> lowerGraph(const Graph &G, DType ActDtype) {
  ProgramBuilder B(ActDtype);
  for (auto List : {G.inputs(), G.params(), G.states(), G.consts()})
    for (const auto &V : List)
      B.leaf(V.get());
  DenseMap<const Value *, int> Ids;
  SmallVector<int, 4> In;
  for (const Node &N : G.nodes()) {
    if (isOnnxOp(N.op()))
      return createStringError(inconvertibleErrorCode(),
                               "%s: cannot lower an ONNX op; run canonicalize",
                               N.describe().c_str());
    In.clear();
    for (Value *V : N.operands())
      In.push_back(V->isResult() ? Ids.lookup(V) : B.leaf(V));
    auto Out = B.emit(N, In);
    for (unsigned K = 0; K < Out.size(); ++K)
      Ids[N.result(K)] = Out[K];
  }
  for (const Graph::Output &O : G.outputs())
    B.output(O.Name, O.V->isResult() ? Ids.lookup(O.V) : B.leaf(O.V));
  return B.take();
}

} // namespace sp
