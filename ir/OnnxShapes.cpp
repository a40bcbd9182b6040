//===- OnnxShapes.cpp - Result types of the onnx.* ops --------------------===//
//
// Type rules of the ONNX operators the importer maps, following the operator
// specs of opsets 13 to 17. Every rule reads the node the way the importer
// writes it:
//
// Operands. The IR has no null operands, so optional inputs are passed as a
// present prefix (an ONNX node whose optional input is empty in the middle is
// refused by the importer). Inputs that ONNX takes as tensors but whose values
// decide a result shape (Reshape/Expand/ConstantOfShape shapes, Slice starts,
// ends, axes and steps, Squeeze/Unsqueeze axes, Split sizes, Range bounds,
// Trilu k) must be constants known at compile time (constInts()).
//
// Attributes keep their ONNX names. INT becomes int64, FLOAT double, STRING
// std::string, INTS std::vector<int64_t>, FLOATS std::vector<double>. The only
// TENSOR attribute, ConstantOfShape's `value`, is split into two attributes:
//   dtype  int64, the ONNX TensorProto data type of the value (default 1,
//          FLOAT), as for Cast's `to`;
//   value  the element: int64 for integer and bool data types, double for
//          floating-point ones (default 0).
// Split without a `split` operand needs `num_outputs` (the attribute opset 18
// introduces), which the importer sets to the node's number of outputs.
// ReduceMean takes `axes` as an attribute (until opset 18).
//
// Results. Multi-result ops return all of their results (Dropout: output and
// bool mask; LayerNormalization: Y, Mean, InvStdDev; Split: one per piece); a
// node may keep only a prefix of them.
//
//===----------------------------------------------------------------------===//
#include "ir/ShapeInference.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>
#include <limits>

using namespace llvm;

namespace sp {

namespace {

/// The most results a Split may have (its `num_outputs`).
constexpr int64_t MaxSplitOutputs = 1 << 16;

std::string shapeStr(ArrayRef<int64_t> S) {
  std::string R = "[";
  for (size_t I = 0; I < S.size(); ++I)
    R += (I ? ", " : "") + std::to_string(S[I]);
  return R + "]";
}

/// Fails if a tensor of shape S (no negative dimensions) would have more
/// elements than any machine could hold, so that sizes never overflow.
Error expectSaneSize(ArrayRef<int64_t> S) {
  int64_t N = 1;
  for (int64_t D : S)
    if (__builtin_mul_overflow(N, D, &N) || N > (int64_t(1) << 48))
      return makeError(formatv("shape {0} is too large", shapeStr(S)));
  return Error::success();
}

/// DType of an ONNX TensorProto data type (the numbers of onnx.proto).
std::optional<DType> dtypeFromOnnx(int64_t T) {
  switch (T) {
  case 1:
    return DType::F32;
  case 2:
    return DType::U8;
  case 3:
    return DType::I8;
  case 6:
    return DType::I32;
  case 7:
    return DType::I64;
  case 9:
    return DType::Bool;
  case 10:
    return DType::F16;
  case 11:
    return DType::F64;
  case 16:
    return DType::BF16;
  default:
    return std::nullopt;
  }
}

Error expectOperands(ArrayRef<Value *> Ops, unsigned Min, unsigned Max) {
  if (Ops.size() < Min || Ops.size() > Max) {
    if (Min == Max)
      return makeError(
          formatv("expected {0} operands, got {1}", Min, Ops.size()));
    if (Max == ~0u)
      return makeError(
          formatv("expected at least {0} operands, got {1}", Min, Ops.size()));
    return makeError(
        formatv("expected {0} to {1} operands, got {2}", Min, Max, Ops.size()));
  }
  for (unsigned I = 0; I < Ops.size(); ++I)
    if (!Ops[I])
      return makeError(formatv("operand {0} is missing", I));
  return Error::success();
}

/// Reads operand I (named What in messages) as constant integers.
Expected<std::vector<int64_t>> constOperand(ArrayRef<Value *> Ops, unsigned I,
                                            StringRef What) {
  auto V = constInts(Ops[I]);
  if (!V) {
    consumeError(V.takeError());
    return makeError(formatv("operand {0} ({1}) must be a constant known at "
                             "compile time",
                             I, What));
  }
  return V;
}

/// Reads operand I as one constant integer (a scalar or a 1-element tensor).
Expected<int64_t> constScalar(ArrayRef<Value *> Ops, unsigned I,
                              StringRef What) {
  auto V = constOperand(Ops, I, What);
  if (!V)
    return V.takeError();
  if (V->size() != 1)
    return makeError(formatv("operand {0} ({1}) must have one element, it "
                             "has {2}",
                             I, What, V->size()));
  return (*V)[0];
}

/// Maps a possibly negative axis into [0, Rank).
Expected<unsigned> normAxis(int64_t Axis, int64_t Rank) {
  if (Axis < -Rank || Axis >= Rank)
    return makeError(
        formatv("axis {0} is out of range for rank {1}", Axis, Rank));
  return unsigned(Axis < 0 ? Axis + Rank : Axis);
}

Error expectFloat(const Value *V, unsigned I) {
  if (!isFloat(V->type().Dtype))
    return makeError(formatv("operand {0} must be floating point, it is {1}", I,
                             V->type().str()));
  return Error::success();
}

Error expectDtype(const Value *V, unsigned I, DType D) {
  if (V->type().Dtype != D)
    return makeError(formatv("operand {0} must be {1}, it is {2}", I,
                             dtypeName(D), V->type().str()));
  return Error::success();
}

Error expectSameDtype(ArrayRef<Value *> Ops, unsigned A, unsigned B) {
  if (Ops[A]->type().Dtype != Ops[B]->type().Dtype)
    return makeError(formatv("operands {0} and {1} have different element "
                             "types: {2} and {3}",
                             A, B, Ops[A]->type().str(), Ops[B]->type().str()));
  return Error::success();
}

Error expectInteger(const Value *V, unsigned I) {
  DType D = V->type().Dtype;
  if (D != DType::I64 && D != DType::I32)
    return makeError(formatv("operand {0} must be i64 or i32, it is {1}", I,
                             V->type().str()));
  return Error::success();
}

//===----------------------------------------------------------------------===//
// Elementwise ops
//===----------------------------------------------------------------------===//

/// The binary ops (isOnnxBinary): numpy broadcasting.
Expected<TypeList> inferBinary(OpKind Op, ArrayRef<Value *> Ops) {
  if (auto E = expectOperands(Ops, 2, 2))
    return E;
  // Pow's exponent may have another numeric type than its base.
  if (Op != OpKind::OnnxPow)
    if (auto E = expectSameDtype(Ops, 0, 1))
      return E;
  if (Op == OpKind::OnnxAnd)
    if (auto E = expectDtype(Ops[0], 0, DType::Bool))
      return E;
  if (Op == OpKind::OnnxPow)
    for (unsigned I : {0u, 1u})
      if (Ops[I]->type().Dtype == DType::Bool)
        return makeError(formatv("operand {0} of pow must be numeric", I));
  auto S = broadcastShapes(Ops[0]->type().Shape, Ops[1]->type().Shape);
  if (!S)
    return S.takeError();
  DType D = (Op == OpKind::OnnxEqual || Op == OpKind::OnnxAnd ||
              Op == OpKind::OnnxLess || Op == OpKind::OnnxGreater)
                ? DType::Bool
                : Ops[0]->type().Dtype;
  return TypeList{TensorType(D, *S)};
}

/// The unary ops (isOnnxUnary).
Expected<TypeList> inferUnary(OpKind Op, ArrayRef<Value *> Ops) {
  if (auto E = expectOperands(Ops, 1, 1))
    return E;
  switch (Op) {
  case OpKind::OnnxNot:
    if (auto E = expectDtype(Ops[0], 0, DType::Bool))
      return E;
    break;
  case OpKind::OnnxSqrt:
  case OpKind::OnnxErf:
  case OpKind::OnnxTanh:
  case OpKind::OnnxSigmoid:
  case OpKind::OnnxReciprocal:
    if (auto E = expectFloat(Ops[0], 0))
      return E;
    break;
  case OpKind::OnnxNeg:
    if (Ops[0]->type().Dtype == DType::Bool ||
        Ops[0]->type().Dtype == DType::U8)
      return makeError("neg needs a signed operand");
    break;
  default:
    break;
  }
  return TypeList{Ops[0]->type()};
}

Expected<TypeList> inferWhere(ArrayRef<Value *> Ops) {
  if (auto E = expectOperands(Ops, 3, 3))
    return E;
  if (auto E = expectDtype(Ops[0], 0, DType::Bool))
    return E;
  if (auto E = expectSameDtype(Ops, 1, 2))
    return E;
  auto S = broadcastShapes(Ops[0]->type().Shape, Ops[1]->type().Shape);
  if (!S)
    return S.takeError();
  auto S2 = broadcastShapes(*S, Ops[2]->type().Shape);
  if (!S2)
    return S2.takeError();
  return TypeList{TensorType(Ops[1]->type().Dtype, *S2)};
}

Expected<TypeList> inferCast(ArrayRef<Value *> Ops, const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 1, 1))
    return E;
  if (!Attrs.has("to"))
    return makeError("cast needs the attribute 'to'");
  int64_t To = Attrs.getInt("to", 0);
  auto D = dtypeFromOnnx(To);
  if (!D)
    return makeError(
        formatv("cast to ONNX data type {0} is not supported", To));
  return TypeList{TensorType(*D, Ops[0]->type().Shape)};
}

//===----------------------------------------------------------------------===//
// Linear algebra and normalization
//===----------------------------------------------------------------------===//

/// numpy.matmul: 1-D operands are promoted to matrices and the added
/// dimension is removed from the result; leading dimensions broadcast.
Expected<TypeList> inferMatMul(ArrayRef<Value *> Ops) {
  if (auto E = expectOperands(Ops, 2, 2))
    return E;
  if (auto E = expectSameDtype(Ops, 0, 1))
    return E;
  SmallVector<int64_t, 4> A(Ops[0]->type().Shape), B(Ops[1]->type().Shape);
  if (A.empty() || B.empty())
    return makeError("matmul operands must have rank >= 1");
  bool VecA = A.size() == 1, VecB = B.size() == 1;
  if (VecA)
    A.insert(A.begin(), 1);
  if (VecB)
    B.push_back(1);
  if (A.back() != B[B.size() - 2])
    return makeError(formatv("contraction sizes differ: {0} and {1}",
                             Ops[0]->type().str(), Ops[1]->type().str()));
  auto Batch = broadcastShapes(ArrayRef<int64_t>(A).drop_back(2),
                               ArrayRef<int64_t>(B).drop_back(2));
  if (!Batch)
    return Batch.takeError();
  SmallVector<int64_t, 4> Out(*Batch);
  if (!VecA)
    Out.push_back(A[A.size() - 2]);
  if (!VecB)
    Out.push_back(B.back());
  return TypeList{TensorType(Ops[0]->type().Dtype, Out)};
}

/// Y = alpha * A' B' + beta * C, with A' = transA ? A^T : A (rank 2).
Expected<TypeList> inferGemm(ArrayRef<Value *> Ops, const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 2, 3))
    return E;
  for (unsigned I = 1; I < Ops.size(); ++I)
    if (auto E = expectSameDtype(Ops, 0, I))
      return E;
  const TensorType &A = Ops[0]->type(), &B = Ops[1]->type();
  if (A.rank() != 2 || B.rank() != 2)
    return makeError(formatv("gemm operands must have rank 2: {0} and {1}",
                             A.str(), B.str()));
  bool TA = Attrs.getInt("transA", 0), TB = Attrs.getInt("transB", 0);
  int64_t M = TA ? A.Shape[1] : A.Shape[0], K = TA ? A.Shape[0] : A.Shape[1];
  int64_t KB = TB ? B.Shape[1] : B.Shape[0], N = TB ? B.Shape[0] : B.Shape[1];
  if (K != KB)
    return makeError(formatv("contraction sizes differ: {0} (transA = {1}) "
                             "and {2} (transB = {3})",
                             A.str(), int(TA), B.str(), int(TB)));
  SmallVector<int64_t, 2> Out{M, N};
  if (Ops.size() == 3) {
    // C broadcasts to [M, N] (unidirectionally).
    auto S = broadcastShapes(Ops[2]->type().Shape, Out);
    if (!S || ArrayRef<int64_t>(*S) != ArrayRef<int64_t>(Out)) {
      if (!S)
        consumeError(S.takeError());
      return makeError(formatv("operand 2 {0} does not broadcast to [{1}, "
                               "{2}]",
                               Ops[2]->type().str(), M, N));
    }
  }
  return TypeList{TensorType(A.Dtype, Out)};
}

/// LayerNormalization (opset 17): (X, Scale, B?) normalized over the
/// dimensions from `axis` on. Results: Y, Mean and InvStdDev; the last two
/// have X's shape with the normalized dimensions set to 1 and the element
/// type `stash_type` (default float).
Expected<TypeList> inferLayerNorm(ArrayRef<Value *> Ops,
                                  const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 2, 3))
    return E;
  if (auto E = expectFloat(Ops[0], 0))
    return E;
  const TensorType &X = Ops[0]->type();
  auto Axis = normAxis(Attrs.getInt("axis", -1), X.rank());
  if (!Axis)
    return Axis.takeError();
  ArrayRef<int64_t> Normalized = ArrayRef<int64_t>(X.Shape).drop_front(*Axis);
  for (unsigned I = 1; I < Ops.size(); ++I) {
    if (auto E = expectSameDtype(Ops, 0, I))
      return E;
    auto S = broadcastShapes(Ops[I]->type().Shape, Normalized);
    if (!S || ArrayRef<int64_t>(*S) != Normalized) {
      if (!S)
        consumeError(S.takeError());
      return makeError(formatv("operand {0} {1} does not broadcast to the "
                               "normalized shape {2}",
                               I, Ops[I]->type().str(), shapeStr(Normalized)));
    }
  }
  int64_t Stash = Attrs.getInt("stash_type", 1);
  auto StashType = dtypeFromOnnx(Stash);
  if (!StashType || !isFloat(*StashType))
    return makeError(formatv("stash_type {0} is not a supported floating "
                             "point type",
                             Stash));
  TensorType Stat(*StashType, X.Shape);
  for (unsigned I = *Axis; I < X.rank(); ++I)
    Stat.Shape[I] = 1;
  return TypeList{X, Stat, Stat};
}

Expected<TypeList> inferSoftmax(ArrayRef<Value *> Ops, const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 1, 1))
    return E;
  if (auto E = expectFloat(Ops[0], 0))
    return E;
  if (auto Axis = normAxis(Attrs.getInt("axis", -1), Ops[0]->type().rank());
      !Axis)
    return Axis.takeError();
  return TypeList{Ops[0]->type()};
}

/// ReduceMean (opsets 13 to 17): `axes` attribute (default: all axes),
/// `keepdims` (default 1).
Expected<TypeList> inferReduceMean(ArrayRef<Value *> Ops,
                                   const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 1, 1))
    return E;
  const TensorType &X = Ops[0]->type();
  SmallVector<bool, 4> Reduced(X.rank(), !Attrs.has("axes"));
  for (int64_t A : Attrs.getInts("axes")) {
    auto Axis = normAxis(A, X.rank());
    if (!Axis)
      return Axis.takeError();
    if (Reduced[*Axis])
      return makeError(formatv("axis {0} is reduced twice", A));
    Reduced[*Axis] = true;
  }
  bool KeepDims = Attrs.getInt("keepdims", 1);
  TensorType T(X.Dtype, {});
  for (unsigned I = 0; I < X.rank(); ++I)
    if (!Reduced[I])
      T.Shape.push_back(X.Shape[I]);
    else if (KeepDims)
      T.Shape.push_back(1);
  return TypeList{T};
}

Expected<TypeList> inferDropout(ArrayRef<Value *> Ops) {
  if (auto E = expectOperands(Ops, 1, 3))
    return E;
  if (auto E = expectFloat(Ops[0], 0))
    return E;
  if (Ops.size() > 1) {
    if (auto E = expectFloat(Ops[1], 1))
      return E;
    if (Ops[1]->type().numElements() != 1)
      return makeError("the dropout ratio must be a scalar");
  }
  if (Ops.size() > 2) {
    if (auto E = expectDtype(Ops[2], 2, DType::Bool))
      return E;
    if (Ops[2]->type().numElements() != 1)
      return makeError("training_mode must be a scalar");
  }
  const TensorType &X = Ops[0]->type();
  return TypeList{X, TensorType(DType::Bool, X.Shape)};
}

//===----------------------------------------------------------------------===//
// Shape manipulation
//===----------------------------------------------------------------------===//

/// Shape (with opset 15's optional `start` and `end`, clamped to the rank).
Expected<TypeList> inferShape(ArrayRef<Value *> Ops, const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 1, 1))
    return E;
  int64_t R = Ops[0]->type().rank();
  auto Clamp = [R](int64_t V) {
    if (V < 0)
      V += R;
    return std::clamp<int64_t>(V, 0, R);
  };
  int64_t Start = Clamp(Attrs.getInt("start", 0));
  int64_t End = Attrs.has("end") ? Clamp(Attrs.getInt("end", R)) : R;
  return TypeList{TensorType(DType::I64, {std::max<int64_t>(End - Start, 0)})};
}

Expected<TypeList> inferReshape(ArrayRef<Value *> Ops, const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 2, 2))
    return E;
  if (auto E = expectDtype(Ops[1], 1, DType::I64))
    return E;
  if (Ops[1]->type().rank() != 1)
    return makeError("operand 1 (shape) must have rank 1");
  auto Shape = constOperand(Ops, 1, "shape");
  if (!Shape)
    return Shape.takeError();
  const TensorType &X = Ops[0]->type();
  bool AllowZero = Attrs.getInt("allowzero", 0);
  SmallVector<int64_t, 4> Out;
  int Inferred = -1;
  int64_t Known = 1;
  for (unsigned I = 0; I < Shape->size(); ++I) {
    int64_t D = (*Shape)[I];
    if (D == -1) {
      if (Inferred >= 0)
        return makeError(
            formatv("shape {0} has more than one -1", shapeStr(*Shape)));
      Inferred = I;
    } else if (D == 0 && !AllowZero) {
      if (I >= X.rank())
        return makeError(formatv("shape {0} copies dimension {1} (0) of a "
                                 "rank {2} operand",
                                 shapeStr(*Shape), I, X.rank()));
      D = X.Shape[I];
    } else if (D < 0) {
      return makeError(
          formatv("shape {0} has a negative dimension", shapeStr(*Shape)));
    }
    Out.push_back(D);
    if (D != -1 && __builtin_mul_overflow(Known, D, &Known))
      return makeError(formatv("shape {0} is too large", shapeStr(*Shape)));
  }
  int64_t Total = X.numElements();
  if (Inferred >= 0) {
    if (AllowZero && is_contained(*Shape, 0))
      return makeError("with allowzero = 1 the shape cannot have both 0 and "
                       "-1");
    if (Known == 0 || Total % Known)
      return makeError(
          formatv("cannot reshape {0} to {1}", X.str(), shapeStr(*Shape)));
    Out[Inferred] = Total / Known;
  } else if (Known != Total) {
    return makeError(
        formatv("cannot reshape {0} to {1}", X.str(), shapeStr(*Shape)));
  }
  return TypeList{TensorType(X.Dtype, Out)};
}

Expected<TypeList> inferExpand(ArrayRef<Value *> Ops) {
  if (auto E = expectOperands(Ops, 2, 2))
    return E;
  if (auto E = expectDtype(Ops[1], 1, DType::I64))
    return E;
  auto Shape = constOperand(Ops, 1, "shape");
  if (!Shape)
    return Shape.takeError();
  if (any_of(*Shape, [](int64_t D) { return D < 0; }))
    return makeError(
        formatv("shape {0} has a negative dimension", shapeStr(*Shape)));
  auto S = broadcastShapes(Ops[0]->type().Shape, *Shape);
  if (!S)
    return S.takeError();
  if (auto E = expectSaneSize(*S))
    return E;
  return TypeList{TensorType(Ops[0]->type().Dtype, *S)};
}

Expected<TypeList> inferConstantOfShape(ArrayRef<Value *> Ops,
                                        const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 1, 1))
    return E;
  if (auto E = expectDtype(Ops[0], 0, DType::I64))
    return E;
  auto Shape = constOperand(Ops, 0, "shape");
  if (!Shape)
    return Shape.takeError();
  if (any_of(*Shape, [](int64_t D) { return D < 0; }))
    return makeError(
        formatv("shape {0} has a negative dimension", shapeStr(*Shape)));
  if (auto E = expectSaneSize(*Shape))
    return E;
  int64_t Code = Attrs.getInt("dtype", 1);
  auto D = dtypeFromOnnx(Code);
  if (!D)
    return makeError(formatv("ONNX data type {0} is not supported", Code));
  return TypeList{TensorType(*D, *Shape)};
}

Expected<TypeList> inferUnsqueeze(ArrayRef<Value *> Ops) {
  if (auto E = expectOperands(Ops, 2, 2))
    return E;
  auto Axes = constOperand(Ops, 1, "axes");
  if (!Axes)
    return Axes.takeError();
  const TensorType &X = Ops[0]->type();
  int64_t OutRank = X.rank() + Axes->size();
  SmallVector<bool, 6> Inserted(OutRank, false);
  for (int64_t A : *Axes) {
    auto Axis = normAxis(A, OutRank);
    if (!Axis)
      return Axis.takeError();
    if (Inserted[*Axis])
      return makeError(formatv("axis {0} appears twice", A));
    Inserted[*Axis] = true;
  }
  TensorType T(X.Dtype, {});
  unsigned Next = 0;
  for (int64_t I = 0; I < OutRank; ++I)
    T.Shape.push_back(Inserted[I] ? 1 : X.Shape[Next++]);
  return TypeList{T};
}

Expected<TypeList> inferSqueeze(ArrayRef<Value *> Ops) {
  if (auto E = expectOperands(Ops, 1, 2))
    return E;
  const TensorType &X = Ops[0]->type();
  SmallVector<bool, 6> Removed(X.rank(), false);
  if (Ops.size() == 2) {
    auto Axes = constOperand(Ops, 1, "axes");
    if (!Axes)
      return Axes.takeError();
    for (int64_t A : *Axes) {
      auto Axis = normAxis(A, X.rank());
      if (!Axis)
        return Axis.takeError();
      if (X.Shape[*Axis] != 1)
        return makeError(
            formatv("cannot squeeze axis {0} of size {1}", A, X.Shape[*Axis]));
      Removed[*Axis] = true;
    }
  } else {
    for (unsigned I = 0; I < X.rank(); ++I)
      Removed[I] = X.Shape[I] == 1;
  }
  TensorType T(X.Dtype, {});
  for (unsigned I = 0; I < X.rank(); ++I)
    if (!Removed[I])
      T.Shape.push_back(X.Shape[I]);
  return TypeList{T};
}

Expected<TypeList> inferTranspose(ArrayRef<Value *> Ops,
                                  const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 1, 1))
    return E;
  const TensorType &X = Ops[0]->type();
  std::vector<int64_t> Perm = Attrs.getInts("perm");
  if (!Attrs.has("perm"))
    for (int64_t I = X.rank() - 1; I >= 0; --I)
      Perm.push_back(I);
  if (Perm.size() != X.rank())
    return makeError(
        formatv("perm {0} does not match rank {1}", shapeStr(Perm), X.rank()));
  SmallVector<bool, 6> Seen(X.rank(), false);
  TensorType T(X.Dtype, {});
  for (int64_t P : Perm) {
    if (P < 0 || P >= int64_t(X.rank()) || Seen[P])
      return makeError(
          formatv("perm {0} is not a permutation", shapeStr(Perm)));
    Seen[P] = true;
    T.Shape.push_back(X.Shape[P]);
  }
  return TypeList{T};
}

Expected<TypeList> inferConcat(ArrayRef<Value *> Ops, const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 1, ~0u))
    return E;
  if (!Attrs.has("axis"))
    return makeError("concat needs the attribute 'axis'");
  TensorType T = Ops[0]->type();
  if (T.rank() == 0)
    return makeError("cannot concatenate scalars");
  auto Axis = normAxis(Attrs.getInt("axis", 0), T.rank());
  if (!Axis)
    return Axis.takeError();
  for (unsigned I = 1; I < Ops.size(); ++I) {
    const TensorType &O = Ops[I]->type();
    if (auto E = expectSameDtype(Ops, 0, I))
      return E;
    bool Fits = O.rank() == T.rank();
    for (unsigned D = 0; Fits && D < T.rank(); ++D)
      Fits = D == *Axis || O.Shape[D] == T.Shape[D];
    if (!Fits)
      return makeError(formatv("operand {0} {1} does not fit operand 0 {2} "
                               "along axis {3}",
                               I, O.str(), Ops[0]->type().str(), *Axis));
    // Dimensions are bounded only by the element count, which a 0 dimension
    // makes 0: the sum can overflow.
    if (__builtin_add_overflow(T.Shape[*Axis], O.Shape[*Axis],
                               &T.Shape[*Axis]))
      return makeError(formatv("the concatenation along axis {0} is too "
                               "large",
                               *Axis));
  }
  return TypeList{T};
}

/// Split (opsets 13 to 17): sizes from the optional `split` operand, or
/// `num_outputs` equal pieces (the last one smaller if it does not divide).
Expected<TypeList> inferSplit(ArrayRef<Value *> Ops, const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 1, 2))
    return E;
  const TensorType &X = Ops[0]->type();
  auto Axis = normAxis(Attrs.getInt("axis", 0), X.rank());
  if (!Axis)
    return Axis.takeError();
  int64_t Dim = X.Shape[*Axis];
  std::vector<int64_t> Sizes;
  if (Ops.size() == 2) {
    auto S = constOperand(Ops, 1, "split");
    if (!S)
      return S.takeError();
    Sizes = *S;
    int64_t Sum = 0;
    for (int64_t P : Sizes) {
      if (P < 0)
        return makeError(
            formatv("split sizes {0} have a negative size", shapeStr(Sizes)));
      if (__builtin_add_overflow(Sum, P, &Sum))
        return makeError(
            formatv("split sizes {0} are too large", shapeStr(Sizes)));
    }
    if (Sum != Dim)
      return makeError(formatv("split sizes {0} do not add up to dimension "
                               "{1} of size {2}",
                               shapeStr(Sizes), *Axis, Dim));
  } else {
    int64_t N = Attrs.getInt("num_outputs", 0);
    if (N <= 0)
      return makeError("split needs a 'split' operand or 'num_outputs'");
    if (N > Dim)
      return makeError(formatv("cannot split dimension {0} of size {1} into "
                               "{2} pieces",
                               *Axis, Dim, N));
    // A tensor with a 0 dimension may have any other dimension, so Dim
    // alone does not bound the number of results.
    if (N > MaxSplitOutputs)
      return makeError(formatv("split into {0} pieces; at most {1} are "
                               "supported",
                               N, MaxSplitOutputs));
    int64_t Piece = Dim / N + (Dim % N != 0), Left = Dim;
    for (int64_t I = 0; I < N; ++I) {
      Sizes.push_back(std::min(Piece, Left));
      Left -= Sizes.back();
    }
  }
  TypeList Out;
  for (int64_t P : Sizes) {
    TensorType T = X;
    T.Shape[*Axis] = P;
    Out.push_back(T);
  }
  return Out;
}

/// Slice: (data, starts, ends, axes?, steps?), all constant. Starts and ends
/// are clamped as the spec says (INT64_MAX / INT64_MIN mean "to the end").
Expected<TypeList> inferSlice(ArrayRef<Value *> Ops) {
  if (auto E = expectOperands(Ops, 3, 5))
    return E;
  const TensorType &X = Ops[0]->type();
  static const char *const Names[] = {"data", "starts", "ends", "axes",
                                      "steps"};
  std::vector<int64_t> Args[5];
  for (unsigned I = 1; I < Ops.size(); ++I) {
    if (auto E = expectInteger(Ops[I], I))
      return E;
    auto V = constOperand(Ops, I, Names[I]);
    if (!V)
      return V.takeError();
    Args[I] = std::move(*V);
  }
  std::vector<int64_t> &Starts = Args[1], &Ends = Args[2], &Axes = Args[3],
                       &Steps = Args[4];
  size_t N = Starts.size();
  if (Ends.size() != N || (Ops.size() > 3 && Axes.size() != N) ||
      (Ops.size() > 4 && Steps.size() != N))
    return makeError("starts, ends, axes and steps must have the same length");
  if (Ops.size() <= 3)
    for (size_t I = 0; I < N; ++I)
      Axes.push_back(I);
  if (Ops.size() <= 4)
    Steps.assign(N, 1);
  TensorType T = X;
  SmallVector<bool, 6> Seen(X.rank(), false);
  for (size_t I = 0; I < N; ++I) {
    auto Axis = normAxis(Axes[I], X.rank());
    if (!Axis)
      return Axis.takeError();
    if (Seen[*Axis])
      return makeError(formatv("axis {0} is sliced twice", Axes[I]));
    Seen[*Axis] = true;
    int64_t Step = Steps[I], Dim = X.Shape[*Axis];
    if (Step == 0)
      return makeError("slice steps cannot be 0");
    if (Dim == 0) {
      T.Shape[*Axis] = 0;
      continue;
    }
    int64_t Start = Starts[I], End = Ends[I];
    if (Start < 0)
      Start += Dim;
    if (End < 0)
      End += Dim;
    int64_t Count;
    if (Step > 0) {
      Start = std::clamp<int64_t>(Start, 0, Dim);
      End = std::clamp<int64_t>(End, 0, Dim);
      Count = End <= Start ? 0 : 1 + (End - Start - 1) / Step;
    } else {
      Start = std::clamp<int64_t>(Start, 0, Dim - 1);
      End = std::clamp<int64_t>(End, -1, Dim - 1);
      // Step < 0: (Start - End - 1) / Step truncates toward zero.
      Count = Start <= End ? 0 : 1 - (Start - End - 1) / Step;
    }
    T.Shape[*Axis] = Count;
  }
  return TypeList{T};
}

/// Range: scalar constant start, limit, delta of one type; the result has
/// max(ceil((limit - start) / delta), 0) elements.
Expected<TypeList> inferRange(ArrayRef<Value *> Ops) {
  if (auto E = expectOperands(Ops, 3, 3))
    return E;
  for (unsigned I = 1; I < 3; ++I)
    if (auto E = expectSameDtype(Ops, 0, I))
      return E;
  for (unsigned I = 0; I < 3; ++I)
    if (Ops[I]->type().numElements() != 1)
      return makeError(formatv("operand {0} of range must be a scalar", I));
  DType D = Ops[0]->type().Dtype;
  static const char *const Names[] = {"start", "limit", "delta"};
  int64_t Count;
  if (isFloat(D)) {
    double V[3];
    for (unsigned I = 0; I < 3; ++I) {
      const Value *Op = Ops[I];
      if (!Op->isConst() || !Op->data() || !Op->data()->isLoaded())
        return makeError(formatv("operand {0} ({1}) must be a constant known "
                                 "at compile time",
                                 I, Names[I]));
      V[I] = Op->data()->getDouble(0);
    }
    if (V[2] == 0)
      return makeError("range delta cannot be 0");
    double C = std::ceil((V[1] - V[0]) / V[2]);
    if (!(C < 9.0e15))
      return makeError("range is too large");
    Count = std::max<int64_t>(int64_t(C), 0);
  } else {
    int64_t V[3];
    for (unsigned I = 0; I < 3; ++I) {
      auto S = constScalar(Ops, I, Names[I]);
      if (!S)
        return S.takeError();
      V[I] = *S;
    }
    if (V[2] == 0)
      return makeError("range delta cannot be 0");
    // The distance may not fit in int64 (e.g. INT64_MIN to INT64_MAX).
    __int128 Dist = __int128(V[1]) - V[0];
    __int128 C = 0;
    if (V[2] > 0 && Dist > 0)
      C = (Dist + V[2] - 1) / V[2];
    else if (V[2] < 0 && Dist < 0)
      C = (-Dist + (-__int128(V[2])) - 1) / -__int128(V[2]);
    if (C > (__int128(1) << 53))
      return makeError("range is too large");
    Count = int64_t(C);
  }
  return TypeList{TensorType(D, {Count})};
}

Expected<TypeList> inferGather(ArrayRef<Value *> Ops, const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 2, 2))
    return E;
  if (auto E = expectInteger(Ops[1], 1))
    return E;
  const TensorType &X = Ops[0]->type(), &Idx = Ops[1]->type();
  if (X.rank() == 0)
    return makeError("cannot gather from a scalar");
  auto Axis = normAxis(Attrs.getInt("axis", 0), X.rank());
  if (!Axis)
    return Axis.takeError();
  TensorType T(X.Dtype, ArrayRef<int64_t>(X.Shape).take_front(*Axis));
  T.Shape.append(Idx.Shape.begin(), Idx.Shape.end());
  T.Shape.append(X.Shape.begin() + *Axis + 1, X.Shape.end());
  return TypeList{T};
}

/// GatherElements: (data, indices) of one rank, `axis`; the result has the
/// indices' shape and the data's type. Torch exports torch.gather so (GPT-J's
/// sin/cos lookup by position ids).
Expected<TypeList> inferGatherElements(ArrayRef<Value *> Ops,
                                       const AttrList &Attrs) {
  if (auto E = expectOperands(Ops, 2, 2))
    return E;
  if (auto E = expectInteger(Ops[1], 1))
    return E;
  const TensorType &X = Ops[0]->type(), &Idx = Ops[1]->type();
  if (X.rank() == 0 || Idx.rank() != X.rank())
    return makeError(formatv("data (rank {0}) and indices (rank {1}) must have "
                             "one rank of at least 1",
                             X.rank(), Idx.rank()));
  auto Axis = normAxis(Attrs.getInt("axis", 0), X.rank());
  if (!Axis)
    return Axis.takeError();
  for (unsigned D = 0; D < X.rank(); ++D)
    if (D != *Axis && Idx.Shape[D] > X.Shape[D])
      return makeError(formatv("indices shape {0} exceeds data shape {1} off "
                               "the axis",
                               shapeStr(Idx.Shape), shapeStr(X.Shape)));
  return TypeList{TensorType(X.Dtype, Idx.Shape)};
}

/// Tile: (input, repeats) with repeats a constant int64 [rank]; each
/// dimension is multiplied by its repeat count.
Expected<TypeList> inferTile(ArrayRef<Value *> Ops) {
  if (auto E = expectOperands(Ops, 2, 2))
    return E;
  if (auto E = expectDtype(Ops[1], 1, DType::I64))
    return E;
  auto Reps = constOperand(Ops, 1, "repeats");
  if (!Reps)
    return Reps.takeError();
  TensorType T = Ops[0]->type();
  if (Reps->size() != T.rank())
    return makeError(formatv("repeats has {0} elements for an operand of rank "
                             "{1}",
                             Reps->size(), T.rank()));
  for (unsigned D = 0; D < T.rank(); ++D) {
    if ((*Reps)[D] < 0)
      return makeError("repeats must not be negative");
    T.Shape[D] *= (*Reps)[D];
  }
  if (auto E = expectSaneSize(T.Shape))
    return E;
  return TypeList{T};
}

/// Trilu: (input, k?) with `upper` (default 1); rank >= 2.
Expected<TypeList> inferTrilu(ArrayRef<Value *> Ops) {
  if (auto E = expectOperands(Ops, 1, 2))
    return E;
  if (Ops[0]->type().rank() < 2)
    return makeError("trilu needs an operand of rank >= 2");
  if (Ops.size() == 2) {
    if (auto E = expectDtype(Ops[1], 1, DType::I64))
      return E;
    if (Ops[1]->type().numElements() != 1)
      return makeError("operand 1 (k) must be a scalar");
  }
  return TypeList{Ops[0]->type()};
}

Expected<TypeList> inferOnnxTypesOf(OpKind Op, ArrayRef<Value *> Ops,
                                    const AttrList &Attrs) {
  if (isOnnxBinary(Op))
    return inferBinary(Op, Ops);
  if (isOnnxUnary(Op))
    return inferUnary(Op, Ops);
  switch (Op) {
  case OpKind::OnnxWhere:
    return inferWhere(Ops);
  case OpKind::OnnxCast:
    return inferCast(Ops, Attrs);
  case OpKind::OnnxMatMul:
    return inferMatMul(Ops);
  case OpKind::OnnxGemm:
    return inferGemm(Ops, Attrs);
  case OpKind::OnnxLayerNormalization:
    return inferLayerNorm(Ops, Attrs);
  case OpKind::OnnxSoftmax:
    return inferSoftmax(Ops, Attrs);
  case OpKind::OnnxReduceMean:
    return inferReduceMean(Ops, Attrs);
  case OpKind::OnnxDropout:
    return inferDropout(Ops);
  case OpKind::OnnxShape:
    return inferShape(Ops, Attrs);
  case OpKind::OnnxReshape:
    return inferReshape(Ops, Attrs);
  case OpKind::OnnxExpand:
    return inferExpand(Ops);
  case OpKind::OnnxConstantOfShape:
    return inferConstantOfShape(Ops, Attrs);
  case OpKind::OnnxUnsqueeze:
    return inferUnsqueeze(Ops);
  case OpKind::OnnxSqueeze:
    return inferSqueeze(Ops);
  case OpKind::OnnxTranspose:
    return inferTranspose(Ops, Attrs);
  case OpKind::OnnxConcat:
    return inferConcat(Ops, Attrs);
  case OpKind::OnnxSplit:
    return inferSplit(Ops, Attrs);
  case OpKind::OnnxSlice:
    return inferSlice(Ops);
  case OpKind::OnnxRange:
    return inferRange(Ops);
  case OpKind::OnnxGather:
    return inferGather(Ops, Attrs);
  case OpKind::OnnxTrilu:
    return inferTrilu(Ops);
  case OpKind::OnnxGatherElements:
    return inferGatherElements(Ops, Attrs);
  case OpKind::OnnxTile:
    return inferTile(Ops);
  default:
    break;
  }
  llvm_unreachable("not an onnx op");
}

} // namespace

Expected<TypeList> inferOnnxTypes(OpKind Op, ArrayRef<Value *> Ops,
                                  const AttrList &Attrs) {
  auto Types = inferOnnxTypesOf(Op, Ops, Attrs);
  if (!Types)
    return Types.takeError();
  // A dimension of a tensor with a 0 dimension is bounded by nothing, and
  // results combine them (Gather, Unsqueeze, ...): every result must have a
  // size that the rest of the compiler can count.
  for (const TensorType &T : *Types)
    if (auto E = expectSaneSize(T.Shape))
      return E;
  return Types;
}

} // namespace sp
