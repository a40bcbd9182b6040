//===- ProgramBuilder.h - Emitting a program from graph nodes ---*- C++ -*-===//
//
// What lowering needs, shared by the one-program lowering (lowerGraph) and
// the unrolling of a pipeline schedule (lowerPipeline): buffers for leaves
// and node results sized with the plan's activation dtype, instructions
// carrying the node's op, attributes and tags, and live ranges computed once
// at the end.
//
//===----------------------------------------------------------------------===//
#ifndef SP_LOWER_PROGRAMBUILDER_H
#define SP_LOWER_PROGRAMBUILDER_H

#include "plan/Program.h"
#include "llvm/ADT/DenseMap.h"

namespace sp {

class Value;
/// Which values feed the optimizer (plannedDtype's memo).
using OptimizerFeeds = llvm::DenseMap<const Value *, bool>;

class ProgramBuilder {
public:
  explicit ProgramBuilder(DType ActDtype) : ActDtype(ActDtype) {}

  /// The buffer of a leaf (input, parameter, state, constant), created on
  /// first use under Name (default: the leaf's name).
  int leaf(const Value *V, std::string Name = "");
  /// A new persistent buffer that no graph value backs (per-microbatch
  /// inputs, constants of the unrolling).
  int addBuffer(std::string Name, TensorType T, ProgramBuffer::Kind K,
                std::shared_ptr<TensorData> Data = nullptr);
  /// One instruction for N reading In; returns the buffers of its results.
  llvm::SmallVector<int, 3> emit(const Node &N, llvm::ArrayRef<int> In,
                                 const AttrList *ExtraAttrs = nullptr);
  /// An instruction the graph has no node for (send, recv, accumulation).
  llvm::SmallVector<int, 1> emitRaw(OpKind Op, llvm::ArrayRef<int> In,
                                    llvm::ArrayRef<TensorType> OutTypes,
                                    AttrList Attrs, const Tags &T,
                                    llvm::StringRef Name,
                                    llvm::ArrayRef<int64_t> OutBytes = {});
  void output(std::string Name, int Buffer) {
    P.Outputs.push_back({std::move(Name), Buffer});
  }
  const ProgramBuffer &buffer(int Id) const { return P.Buffers[Id]; }
  void setSharding(int Id, const Sharding &S) { P.Buffers[Id].Shard = S; }
  /// Marks a per-microbatch input buffer: what it is fed with, and which
  /// microbatch's rows.
  void setFeed(int Id, InputRole R, int Microbatch) {
    P.Buffers[Id].Feed = R;
    P.Buffers[Id].Microbatch = Microbatch;
  }
  void setScope(int Id, BufferScope S) { P.Buffers[Id].Scope = S; }
  int numInstructions() const { return P.Instrs.size(); }
  /// The 16-bit copy of parameter buffer Param, cast here on first use
  /// (emit reads the copies of the parameters it is given).
  int computeCopy(int Param, const Tags &User);
  DType activationDtype() const { return ActDtype; }
  /// plannedType (below) of a value of the graph being lowered, which does
  /// not change while this builder lives.
  TensorType plannedType(const Value *V);
  /// A 16-bit activation dtype: compute reads parameters through copies.
  bool mixedPrecision() const;
  /// Sets every temporary's live range and returns the program.
  Program take();

private:
  int addResult(const TensorType &T, int64_t Bytes, const Tags &Tg,
                const Sharding &S);

  DType ActDtype;
  OptimizerFeeds Feeds;
  Program P;
  llvm::DenseMap<const Value *, int> Leaves;
  llvm::DenseMap<int, int> Copies; // parameter buffer -> its 16-bit copy
};

/// The planned type of a node result: activations of a floating-point type
/// take the plan's activation dtype, except layer_norm statistics, logits
/// and the loss, which stay f32 (as the paper counts them), and the
/// parameters' gradients, which stay f32 for the optimizer (as Megatron
/// accumulates them). Memo, when given, remembers which values feed the
/// optimizer while the graph does not change.
DType plannedDtype(const Value *V, DType ActDtype,
                   OptimizerFeeds *Memo = nullptr);
TensorType plannedType(const Value *V, DType ActDtype,
                       OptimizerFeeds *Memo = nullptr);
int64_t plannedBytes(const Value *V, DType ActDtype,
                     OptimizerFeeds *Memo = nullptr);

} // namespace sp

#endif // SP_LOWER_PROGRAMBUILDER_H
