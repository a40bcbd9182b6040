//===- Rewriter.h - What canonicalize's patterns share ----------*- C++ -*-===//
//
// The matching helpers and the Rewriter the patterns of the canonicalize
// pass (passes/Canonicalize.cpp) are written with: a pattern is a function
// of the rewriter and one node that rewrites and returns true, or matches
// nothing and returns false. The patterns are grouped by phase, one file
// each: Composites.cpp (norms, activations), Layers.cpp (linears, heads,
// embeddings, rotary), Pointwise.cpp (scales, masks, softmax, dropout).
//
//===----------------------------------------------------------------------===//
#ifndef SP_PASSES_CANONICALIZE_REWRITER_H
#define SP_PASSES_CANONICALIZE_REWRITER_H

#include "analysis/LazyElements.h"
#include "ir/IR.h"
#include "ir/ShapeInference.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/ErrorHandling.h"
#include <any>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <vector>

namespace sp::canonicalize {

using namespace llvm;

//===----------------------------------------------------------------------===//
// Matching helpers
//===----------------------------------------------------------------------===//

inline Node *def(Value *V, OpKind K) {
  Node *N = V ? V->producer() : nullptr;
  return N && N->op() == K ? N : nullptr;
}

/// The value of a constant with one element whose data is at hand.
inline std::optional<double> scalar(const Value *V) {
  if (!V->isConst() || V->type().numElements() != 1 || !V->data())
    return std::nullopt;
  if (!V->data()->isLoaded() && !V->data()->isInline()) {
    if (auto D = V->data()->load(); !D) {
      consumeError(D.takeError());
      return std::nullopt;
    }
  }
  double D = V->data()->getDouble(0);
  if (V->type().Dtype == DType::F32 && std::isfinite(D)) {
    // Keep the decimal the exporter meant (1e-05, not 9.99999974e-06): the
    // shortest spelling of the float, read back as a double.
    char Buf[32];
    auto R = std::to_chars(Buf, Buf + sizeof(Buf), float(D));
    std::from_chars(Buf, R.ptr, D);
  }
  return D;
}

inline bool isScalar(const Value *V, double Want, double RelTol = 1e-4) {
  auto S = scalar(V);
  return S && std::abs(*S - Want) <= RelTol * std::abs(Want);
}

/// The single user of V, if it has exactly one and V is not a graph output.
inline Node *singleUser(Value *V, OpKind K) {
  if (V->users().size() != 1)
    return nullptr;
  Node *U = V->users()[0].User;
  if (U->parent()->isOutput(V)) // V may be a graph input: ask its user
    return nullptr;
  return U->op() == K ? U : nullptr;
}

/// For a commutative binary node using V, the other operand.
inline Value *other(Node *N, Value *V) {
  if (N->numOperands() != 2)
    return nullptr;
  if (N->operand(0) == V)
    return N->operand(1);
  if (N->operand(1) == V)
    return N->operand(0);
  return nullptr;
}

/// A weight: a parameter of rank R, or (for R = 1, the weight-free case) a
/// constant parameter-like leaf.
inline bool isWeight(const Value *V, unsigned Rank) {
  return V->isParam() && V->type().rank() == Rank;
}

inline bool isLastAxis(const Node *N, unsigned Rank) {
  auto Axes = N->attrs().getInts("axes");
  return Axes.size() == 1 &&
         (Axes[0] == -1 || Axes[0] == int64_t(Rank) - 1);
}

inline int64_t normAxis(int64_t A, unsigned Rank) { return A < 0 ? A + Rank : A; }

class Rewriter {
public:
  explicit Rewriter(Graph &G) : G(G) {}

  /// Builds a core op before Anchor; the result types are inferred. Ops
  /// with optional results (layer_norm statistics, the dropout mask) get
  /// only their first: autodiff adds the others when it needs them.
  Node *build(Node *Anchor, OpKind Op, ArrayRef<Value *> Operands,
              AttrList Attrs = {}) {
    unsigned MaxResults =
        Op == OpKind::LayerNorm || Op == OpKind::RmsNorm ||
                Op == OpKind::Dropout
            ? 1
            : ~0u;
    auto N = buildNode(G, Anchor->getIterator(), Op, Operands,
                       std::move(Attrs), Anchor->name(), MaxResults);
    if (!N) {
      // Patterns check shapes before building; a failure here is a bug.
      report_fatal_error(Twine("canonicalize: ") + toString(N.takeError()));
    }
    return *N;
  }

  void replace(Value *Old, Value *New) {
    assert(Old->type() == New->type() && "replacement changes the type");
    G.replaceAllUsesWith(Old, New);
  }

  /// What a pattern learned about a constant, computed once per constant
  /// and question: a [s, s] mask shared by every layer is read once, not
  /// once per layer (Kind tells the questions apart).
  template <typename F>
  auto memo(const Value *C, int Kind, F &&Compute) -> decltype(Compute()) {
    using R = decltype(Compute());
    auto Key = std::make_pair(C, Kind);
    auto It = Memo.find(Key);
    if (It != Memo.end())
      return std::any_cast<R>(It->second);
    R Result = Compute();
    Memo.try_emplace(Key, Result);
    return Result;
  }

  Value *constant(StringRef Hint, DType T, ArrayRef<int64_t> Shape,
                  double Value) {
    assert(T == DType::F32 && "only f32 fill constants are built");
    TensorType Ty(T, Shape);
    std::vector<char> Bytes(Ty.numBytes());
    float F = float(Value);
    for (int64_t I = 0; I < Ty.numElements(); ++I)
      std::memcpy(Bytes.data() + I * 4, &F, 4);
    return G.addInlineConst(Hint, Ty, std::move(Bytes));
  }

  /// Forgets what was learned about values that nodes compute (the masks
  /// LazyElements reads): each sweep erases dead nodes, and a new node may
  /// take an erased one's address. Constants stay until the phase ends.
  /// Call before the nodes are erased.
  void forgetComputed() {
    Lazy = LazyElements();
    for (auto It = Memo.begin(); It != Memo.end();) {
      auto Cur = It++;
      if (!Cur->first.first->isConst())
        Memo.erase(Cur);
    }
  }

  Graph &G;
  /// Elements of constants and of values computed from them, one at a time
  /// (masks too large to fold).
  LazyElements Lazy;

private:
  // Constants stay alive for the whole phase (unused ones are removed only
  // after it), so their addresses are stable keys; entries about computed
  // values are dropped before each sweep erases nodes (forgetComputed).
  DenseMap<std::pair<const Value *, int>, std::any> Memo;
};

using Pattern = std::function<bool(Rewriter &, Node &)>;

/// Questions patterns ask about a constant (Rewriter::memo keys).
enum ConstQuestion {
  MaskUpper,
  MaskLower,
  AdditiveCausal,
  RopeTable,
  PairsTable,
  AllZeros,
  SameRows,
  HeadsLayoutTable,
  // PairsColumns + o: the pairs table of a [P, w] table's columns from o.
  PairsColumns
};

/// The patterns of each phase, in the order they are tried.
std::vector<Pattern> compositePatterns();
std::vector<Pattern> layerPatterns();
std::vector<Pattern> pointwisePatterns();
/// Identity, no-op Casts and Reshapes disappear (the phase before the
/// composites: they look through them).
bool foldIdentity(Rewriter &R, Node &N);

} // namespace sp::canonicalize

#endif // SP_PASSES_CANONICALIZE_REWRITER_H
