//===- ParallelOps.cpp - Collectives and pipeline messages ----------------===//
//
// The abstract pairs f / f-bar (tp_copy, tp_reduce) and g / g-bar
// (sp_gather, sp_scatter), inserted by the parallel passes, carry their
// gradient conjugates; lower-collectives turns what remains after autodiff
// into the concrete collectives (all_reduce, all_gather, reduce_scatter).
// Pipeline messages appear when the schedule is unrolled. Definitions as in
// ir/OpDef.h.
//
//===----------------------------------------------------------------------===//
#include "ir/ops/OpTable.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

using namespace ops;

namespace {

/// all_gather multiplies axis dim by parts; reduce_scatter and the splits
/// divide it.
Expected<TypeList> chunkShape(const ShapeArgs &A) {
  TensorType T = A.type(0);
  int64_t Dim = A.attrInt("dim"), Parts = A.attrInt("parts");
  if (Dim < 0 || Dim >= int64_t(T.rank()) || Parts < 1)
    return makeError(
        formatv("needs 'dim' in [0, {0}) and 'parts' >= 1", T.rank()));
  if (A.Op == OpKind::SpGather || A.Op == OpKind::AllGather ||
      A.Op == OpKind::RingConcat) {
    T.Shape[Dim] *= Parts;
  } else {
    if (T.Shape[Dim] % Parts)
      return makeError(formatv("dimension {0} of size {1} is not divisible "
                               "by {2}",
                               Dim, T.Shape[Dim], Parts));
    T.Shape[Dim] /= Parts;
  }
  return TypeList{T};
}

/// The attributes of the collective that undoes N along the same axis.
AttrList chunkAttrs(const Node &N) {
  AttrList A;
  A.set("dim", attrInt(N.op(), N.attrs(), "dim"));
  A.set("parts", attrInt(N.op(), N.attrs(), "parts"));
  return A;
}

/// The backward of N is the collective Op along N's axis.
template <OpKind Op> Error conjugateGrad(GradBuilder &B) {
  B.accumulate(B.N.operand(0),
               B.emit(Op, {B.grad(0)}, chunkAttrs(B.N))->result());
  return Error::success();
}

/// reduce_scatter: chunkShape of every operand, or with flat = 1 a flat
/// chunk of ceil(n / parts) elements.
Expected<TypeList> scatterShape(const ShapeArgs &A) {
  if (!A.attrInt("flat")) {
    if (A.Operands.size() != 1)
      return makeError("a reduce_scatter of several operands must be flat");
    return chunkShape(A);
  }
  int64_t Parts = A.attrInt("parts");
  if (Parts < 1 || A.attrInt("dim") != 0)
    return makeError("a flat reduce_scatter needs 'dim' 0 and 'parts' >= 1");
  TypeList R;
  for (unsigned I = 0; I < A.Operands.size(); ++I)
    R.push_back(TensorType(A.type(I).Dtype,
                           {dataChunkElements(A.type(I).numElements(), Parts)}));
  return R;
}

Sharding replicatedLayout(const Node &) { return Sharding::replicated(); }

Sharding splitLayout(const Node &N) {
  return Sharding::split(attrInt(N.op(), N.attrs(), "dim"),
                         attrInt(N.op(), N.attrs(), "parts"));
}

std::vector<OpAttrDecl> chunkAttrDecls() {
  return {{"dim", attr::RequiredInt}, {"parts", attr::RequiredInt}};
}

Expected<TypeList> sameAsOperands(const ShapeArgs &A) {
  TypeList R;
  for (unsigned I = 0; I < A.Operands.size(); ++I)
    R.push_back(A.type(I));
  return R;
}

/// A one-operand collective of the tensor-parallel group.
OpDef collective(ShapeRule Shape, LayoutRule Layout, GradRule Grad = nullptr,
                 std::vector<OpAttrDecl> Attrs = {}) {
  return {.MinOperands = 1,
          .MaxOperands = 1,
          .Attrs = std::move(Attrs),
          .Shape = Shape,
          .Grad = Grad,
          .Layout = Layout,
          .Group = "tp"};
}

} // namespace

void addParallelOps(OpTable &T) {
  // f: identity forward, all-reduce backward.
  T[size_t(OpKind::TpCopy)] =
      collective(sameAsOperand0, replicatedLayout, [](GradBuilder &B) -> Error {
        B.accumulate(B.N.operand(0),
                     B.emit(OpKind::AllReduce, {B.grad(0)})->result());
        return Error::success();
      });
  // f-bar: all-reduce forward, identity backward.
  T[size_t(OpKind::TpReduce)] =
      collective(sameAsOperand0, replicatedLayout, [](GradBuilder &B) -> Error {
        B.accumulate(B.N.operand(0), B.grad(0));
        return Error::success();
      });
  // g: all-gather forward, reduce-scatter backward. With regather = 1 the
  // backward of the linears reading it gathers the saved shard again.
  std::vector<OpAttrDecl> GatherAttrs = chunkAttrDecls();
  GatherAttrs.push_back({"regather", attr::Int(0)});
  T[size_t(OpKind::SpGather)] =
      collective(chunkShape, replicatedLayout,
                 conjugateGrad<OpKind::ReduceScatter>, GatherAttrs);
  // g-bar: reduce-scatter forward, all-gather backward.
  T[size_t(OpKind::SpScatter)] =
      collective(chunkShape, splitLayout, conjugateGrad<OpKind::AllGather>,
                 chunkAttrDecls());
  // This rank's chunk forward, all-gather backward.
  T[size_t(OpKind::SpSplit)] =
      collective(chunkShape, splitLayout, conjugateGrad<OpKind::AllGather>,
                 chunkAttrDecls());

  // Context parallelism (passes/ContextParallel.cpp): this cp rank's
  // positions of a full-sequence value along dim, in the layout of
  // ir/ContextLayout.h (zigzag = 1: chunks r and 2 parts - 1 - r); the
  // gradient puts them back in place, zero elsewhere: the parameters'
  // gradients are summed over the cp group anyway (data-parallel pass), so
  // no rank needs the others' part. No communication either way; the group
  // gives the rank.
  std::vector<OpAttrDecl> CpAttrs = chunkAttrDecls();
  CpAttrs.push_back({"zigzag", attr::Int(0)});
  auto CpShape = [](const ShapeArgs &A) -> Expected<TypeList> {
    if (A.Op == OpKind::CpPad) {
      TensorType T = A.type(0);
      int64_t Dim = A.attrInt("dim"), Parts = A.attrInt("parts");
      if (Dim < 0 || Dim >= int64_t(T.rank()) || Parts < 1)
        return makeError(
            formatv("needs 'dim' in [0, {0}) and 'parts' >= 1", T.rank()));
      T.Shape[Dim] *= Parts;
      return TypeList{T};
    }
    auto R = chunkShape(A);
    if (R && A.attrInt("zigzag") &&
        A.type(0).Shape[A.attrInt("dim")] % (2 * A.attrInt("parts")))
      return makeError(formatv("zigzag: dimension {0} of size {1} is not "
                               "divisible into 2 x {2} chunks",
                               A.attrInt("dim"),
                               A.type(0).Shape[A.attrInt("dim")],
                               A.attrInt("parts")));
    return R;
  };
  T[size_t(OpKind::CpSlice)] = {
      .MinOperands = 1,
      .MaxOperands = 1,
      .Attrs = CpAttrs,
      .Shape = CpShape,
      .Grad = [](GradBuilder &B) -> Error {
        B.accumulate(B.N.operand(0),
                     B.emit(OpKind::CpPad, {B.grad(0)}, B.N.attrs())->result());
        return Error::success();
      },
      .Group = "cp",
  };
  T[size_t(OpKind::CpPad)] = {
      .MinOperands = 1,
      .MaxOperands = 1,
      .Attrs = CpAttrs,
      .Shape = CpShape,
      .Group = "cp",
  };

  // The concrete collectives: sum over the group; concatenate the ranks'
  // chunks along dim; sum and keep this rank's chunk.
  // all_reduce sums each operand over the group: one operand in the graph;
  // in a lowered program, a bucket of data-parallel gradient sums
  // (lower/GradientBuckets.h) is one all_reduce of several operands, and
  // bucket_bytes (set by the data-parallel pass) bounds a bucket's size.
  T[size_t(OpKind::AllReduce)] =
      collective(sameAsOperands, replicatedLayout, nullptr,
                 {{"bucket_bytes", attr::Int(0)}});
  T[size_t(OpKind::AllReduce)].MaxOperands = OpDef::Variadic;
  T[size_t(OpKind::AllGather)] =
      collective(chunkShape, replicatedLayout, nullptr, chunkAttrDecls());
  // reduce_scatter {flat = 1} (ZeRO's gradient sums over the data-parallel
  // group) reads each operand as a flat vector zero-padded to parts equal
  // chunks and keeps this rank's chunk; like all_reduce, a bucket of them is
  // one reduce_scatter of several operands in a lowered program.
  std::vector<OpAttrDecl> ScatterAttrs = chunkAttrDecls();
  ScatterAttrs.push_back({"flat", attr::Int(0)});
  ScatterAttrs.push_back({"bucket_bytes", attr::Int(0)});
  T[size_t(OpKind::ReduceScatter)] =
      collective(scatterShape, splitLayout, nullptr, ScatterAttrs);
  T[size_t(OpKind::ReduceScatter)].MaxOperands = OpDef::Variadic;
  // collective-matmul (passes/CollectiveMatmul.cpp): an all-gather feeding
  // a linear, cut into a ring. ring_shift sends its operand to the next
  // rank of the tensor-parallel group and returns the previous rank's, so
  // after k shifts rank r holds rank (r - k) mod parts's chunk;
  // ring_concat puts the products of those chunks back in place.
  T[size_t(OpKind::RingShift)] =
      collective(sameAsOperand0, replicatedLayout, nullptr,
                 {{"parts", attr::RequiredInt}});
  T[size_t(OpKind::RingConcat)] = {
      .MinOperands = 1,
      .MaxOperands = OpDef::Variadic,
      .Attrs = chunkAttrDecls(),
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        int64_t Parts = A.attrInt("parts");
        if (Parts < 1 || int64_t(A.Operands.size()) != Parts)
          return makeError(formatv("needs 'parts' >= 1 operands, one per "
                                   "rank; has {0} for parts {1}",
                                   A.Operands.size(), Parts));
        for (unsigned I = 1; I < A.Operands.size(); ++I)
          if (A.type(I) != A.type(0))
            return makeError("its operands differ in type");
        return chunkShape(A);
      },
      .Layout = replicatedLayout,
      .Group = "tp",
  };
  // ZeRO: after each data-parallel rank has updated its flat chunk of a
  // parameter (adamw {zero_parts}), every rank gets every chunk, in place.
  // In a lowered program, consecutive ones are buckets of several
  // parameters, of at most bucket_bytes (lower/GradientBuckets.h).
  T[size_t(OpKind::GatherParam)] = {
      .MinOperands = 1,
      .MaxOperands = OpDef::Variadic,
      .Attrs = {{"parts", attr::RequiredInt}, {"bucket_bytes", attr::Int(0)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        if (A.attrInt("parts") < 1)
          return makeError("needs 'parts' >= 1");
        return TypeList{};
      },
      .Group = "dp",
      .SideEffects = true,
  };

  // Pipeline parallelism. Peers and roots are pipeline ranks (stages of the
  // same tensor-parallel rank). pipe_all_reduce sums the gradients of a
  // weight used on several stages; send, recv and pipe_broadcast exist only
  // in unrolled programs and have no shape rule.
  T[size_t(OpKind::PipeAllReduce)] = {
      .MinOperands = 1,
      .MaxOperands = 1,
      .Attrs = {{"stages", attr::RequiredInts}, // the virtual stages using it
                {"ranks", attr::Ints()},        // their pipeline ranks
                {"tag", attr::Int(0)}},
      .Shape = sameAsOperand0,
      .Group = "pp",
  };
  T[size_t(OpKind::Send)] = {
      .MinOperands = 1, // (x) to another stage
      .MaxOperands = 1,
      .Attrs = {{"peer", attr::RequiredInt}, {"tag", attr::RequiredInt}},
      .Group = "pp",
  };
  T[size_t(OpKind::Recv)] = {
      .Attrs = {{"peer", attr::RequiredInt}, {"tag", attr::RequiredInt}},
      .Group = "pp",
  };
  T[size_t(OpKind::PipeBroadcast)] = {
      .MinOperands = 1, // (x on root) -> x on every stage
      .MaxOperands = 1,
      .Attrs = {{"root", attr::RequiredInt}},
      .Group = "pp",
  };
}

} // namespace sp
