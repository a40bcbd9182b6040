//===- TrainingOps.cpp - The loss and the optimizer -----------------------===//
//
// Added by autodiff (the loss) and the optimizer pass; definitions as in
// ir/OpDef.h.
//
//===----------------------------------------------------------------------===//
#include "ir/ops/OpTable.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

using namespace ops;

void addTrainingOps(OpTable &T) {
  // The loss's attributes: vocabulary-parallel logits, padding columns past
  // valid_vocab (0: every column), targets that count for nothing.
  std::vector<OpAttrDecl> LossAttrs = {
      {"valid_vocab", attr::Int(0)},
      {"vocab_parallel", attr::Int(0)},
      {"ignore_index", attr::Int(IgnoreTarget)}};
  T[size_t(OpKind::CrossEntropy)] = {
      .MinOperands = 2, // (logits[.., V], targets[..]) -> f32[], the mean
      .MaxOperands = 2,
      .Attrs = LossAttrs,
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        const TensorType &L = A.type(0), &T = A.type(1);
        if (L.rank() < 1 ||
            ArrayRef<int64_t>(L.Shape).drop_back() !=
                ArrayRef<int64_t>(T.Shape) ||
            isFloat(T.Dtype))
          return makeError(formatv("targets {0} must be integers shaped like "
                                   "the logits {1} without the vocabulary "
                                   "axis",
                                   T.str(), L.str()));
        return TypeList{TensorType(DType::F32, {})};
      },
      .Saved = [](const Node &N) -> SmallVector<Value *, 4> {
        return {N.operand(0), N.operand(1)}; // logits, targets
      },
      .Grad = [](GradBuilder &B) -> Error {
        const Node &N = B.N;
        B.accumulate(N.operand(0),
                     B.emit(OpKind::CrossEntropyGrad,
                            {N.operand(0), N.operand(1), B.grad(0)}, N.attrs())
                         ->result());
        return Error::success();
      },
      .Layout = [](const Node &) { return Sharding::replicated(); },
  };
  T[size_t(OpKind::CrossEntropyGrad)] = {
      .MinOperands = 3, // (logits, targets, dloss) -> dlogits
      .MaxOperands = 3,
      .Attrs = LossAttrs,
      .Shape = sameAsOperand0,
  };

  T[size_t(OpKind::GradNorm)] = {
      .MinOperands = 1, // (g1, ..., gn) -> f32[], the global L2 norm
      .MaxOperands = OpDef::Variadic,
      .Attrs = {{"pipeline", attr::Int(0)}, // sum the squares over the stages
                {"zero", attr::Int(0)}}, // operands are data-parallel chunks
      .Shape = [](const ShapeArgs &) -> Expected<TypeList> {
        return TypeList{TensorType(DType::F32, {})};
      },
  };
  // A pipelined program's sum of a gradient (or the loss) over the
  // microbatches (lower/UnrollSchedule.h): the first microbatch's value is
  // copied, the later ones added in microbatch order, as (((g0) + g1) + g2).
  T[size_t(OpKind::Accumulate)] = {
      .MinOperands = 2,
      .MaxOperands = 2,
      .Attrs = {{"first", attr::Int(0)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        if (A.type(0) != A.type(1))
          return makeError(formatv("the sum is {0} but the value added is {1}",
                                   A.type(0).str(), A.type(1).str()));
        return TypeList();
      },
      .SideEffects = true, // writes acc
  };
  T[size_t(OpKind::AdamW)] = {
      .MinOperands = 7, // (p, g, m, v, norm, lr, step): p, m, v in place
      .MaxOperands = 7,
      .Attrs = {{"beta1", attr::Float(0.9)},
                {"beta2", attr::Float(0.999)},
                {"eps", attr::Float(1e-8)},
                {"weight_decay", attr::Float(0.0)},
                {"max_norm", attr::Float(0.0)}, // 0: no clipping
                // ZeRO: g, m and v are this data-parallel rank's flat chunk
                // of zero_parts; only that chunk of p is updated.
                {"zero_parts", attr::Int(0)}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        int64_t Parts = A.attrInt("zero_parts");
        if (Parts < 0)
          return makeError("zero_parts must be >= 0");
        TensorType Like = A.type(0);
        if (Parts)
          Like = TensorType(Like.Dtype,
                            {dataChunkElements(Like.numElements(), Parts)});
        for (unsigned I = 1; I < 4; ++I)
          if (A.type(I) != Like)
            return makeError(formatv(
                "operand {0} must have the {1}type {2}", I,
                Parts ? "parameter chunk's " : "parameter's ", Like.str()));
        for (unsigned I = 4; I < 7; ++I)
          if (A.type(I) != TensorType(DType::F32, {}))
            return makeError(formatv("operand {0} must be an f32 scalar", I));
        return TypeList{};
      },
      .SideEffects = true,
  };

  // Mixed precision: the lowering reads each parameter through a copy in the
  // plan's 16-bit type (lower/LowerGraph.cpp), rounded to nearest even.
  T[size_t(OpKind::Cast)] = {
      .MinOperands = 1,
      .MaxOperands = 1,
      .Attrs = {{"to", attr::String("f32")}},
      .Shape = [](const ShapeArgs &A) -> Expected<TypeList> {
        auto To = parseDType(attrString(A.Op, A.Attrs, "to"));
        if (!To || !isFloat(*To) || !isFloat(A.type(0).Dtype))
          return makeError("casts between float types only");
        return TypeList{TensorType(*To, A.type(0).Shape)};
      },
  };
}

} // namespace sp
