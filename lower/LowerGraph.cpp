//===- LowerGraph.cpp - A training graph to one program -------------------===//
#include "lower/LowerGraph.h"
#include "lower/ProgramBuilder.h"
#include "llvm/ADT/DenseMap.h"

using namespace llvm;

namespace sp {

/// Values that keep f32 whatever the activation dtype: norm statistics
/// and everything the loss computes on (the logits and the loss).
static bool keepsF32(const Value *V) {
  const Node *P = V->producer();
  if (!P)
    return false;
  if ((P->op() == OpKind::LayerNorm || P->op() == OpKind::RmsNorm) &&
      V->resultIndex() > 0)
    return true;
  if (P->op() == OpKind::CrossEntropy || P->op() == OpKind::CrossEntropyGrad ||
      P->tags().Role == "loss")
    return true;
  return any_of(V->users(), [](const Use &U) {
    return U.User->op() == OpKind::CrossEntropy;
  });
}

int64_t plannedBytes(const Value *V, DType ActDtype) {
  DType Planned = isFloat(V->type().Dtype) && !keepsF32(V) ? ActDtype
                                                           : V->type().Dtype;
  return V->type().numElements() * dtypeSize(Planned);
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
  SmallVector<int, 3> Out;
  for (Value *R : N.results())
    Out.push_back(addResult(R->type(), plannedBytes(R, ActDtype), N.tags(),
                            R->sharding()));
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
    // A result like an operand keeps its planned size and layout.
    const ProgramBuffer *Like =
        K < In.size() && P.Buffers[In[K]].Type == OutTypes[K]
            ? &P.Buffers[In[K]]
            : nullptr;
    int64_t Bytes = K < OutBytes.size() ? OutBytes[K]
                    : Like               ? Like->Bytes
                                         : OutTypes[K].numBytes();
    Out.push_back(addResult(OutTypes[K], Bytes, T,
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
