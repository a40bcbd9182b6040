//===- Fold.cpp - Constant evaluation of ops ------------------------------===//
//
// A reference evaluator for the onnx.* ops that exporters use in shape
// computations and scalar math. It is written for clarity, not speed: the
// operands are read into a Dense tensor (integer and bool elements as int64,
// so that values such as INT64_MAX stay exact; floating-point elements as
// double), each op family computes its result element by element, and the
// result is written back in the result type's dtype (floating-point results
// are rounded once, from double).
//
// foldOp never loads more than MaxFoldElements elements of an operand, treats
// an operand whose data cannot be loaded as "cannot fold", and needs no data
// at all for Shape, whose value depends only on the operand's static type.
//
//===----------------------------------------------------------------------===//
#include "ir/Fold.h"
#include "ir/Float16.h"
#include "ir/ShapeInference.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

using namespace llvm;

namespace sp {

namespace {

using FoldResult = std::optional<std::vector<std::shared_ptr<TensorData>>>;

//===----------------------------------------------------------------------===//
// Dense tensors
//===----------------------------------------------------------------------===//

/// A tensor being evaluated. Exactly one of Ints and Floats holds the
/// elements, chosen by the dtype class.
struct Dense {
  TensorType Type;
  std::vector<int64_t> Ints;  // integer and bool dtypes
  std::vector<double> Floats; // floating-point dtypes

  explicit Dense(TensorType T) : Type(std::move(T)) {
    if (isFloating())
      Floats.assign(Type.numElements(), 0.0);
    else
      Ints.assign(Type.numElements(), 0);
  }
  bool isFloating() const { return isFloat(Type.Dtype); }
  int64_t size() const { return Type.numElements(); }
  ArrayRef<int64_t> shape() const { return Type.Shape; }
  double getF(int64_t I) const {
    return isFloating() ? Floats[I] : double(Ints[I]);
  }
  /// Copies element From of Src into element To (same dtype class).
  void copyFrom(int64_t To, const Dense &Src, int64_t From) {
    if (isFloating())
      Floats[To] = Src.getF(From);
    else
      Ints[To] = Src.Ints[From];
  }
};

/// Converts a double to int64 the way a C cast does, saturating where the
/// cast would be undefined.
int64_t toInt(double D) {
  if (std::isnan(D))
    return 0;
  if (D >= 9.2233720368547758e18)
    return std::numeric_limits<int64_t>::max();
  if (D < -9.2233720368547758e18)
    return std::numeric_limits<int64_t>::min();
  return int64_t(D);
}

/// Reads a constant operand, or std::nullopt if its data is not at hand.
std::optional<Dense> readConst(const Value *V) {
  if (!V || !V->isConst() || !V->data() ||
      V->type().numElements() > MaxFoldElements ||
      V->data()->type() != V->type())
    return std::nullopt;
  const TensorData &D = *V->data();
  if (auto Bytes = D.load(); !Bytes) {
    consumeError(Bytes.takeError());
    return std::nullopt;
  }
  Dense T(V->type());
  for (int64_t I = 0, N = T.size(); I < N; ++I) {
    if (T.isFloating())
      T.Floats[I] = D.getDouble(I);
    else
      T.Ints[I] = D.getInt(I);
  }
  return T;
}

template <typename T> void put(std::vector<char> &B, int64_t I, T V) {
  std::memcpy(B.data() + I * sizeof(T), &V, sizeof(T));
}

/// Writes D as inline data of its type.
std::shared_ptr<TensorData> toData(const Dense &D) {
  std::vector<char> B(D.Type.numBytes());
  for (int64_t I = 0, N = D.size(); I < N; ++I) {
    switch (D.Type.Dtype) {
    case DType::F32:
      put<float>(B, I, float(D.Floats[I]));
      break;
    case DType::F64:
      put<double>(B, I, D.Floats[I]);
      break;
    case DType::F16:
      put<uint16_t>(B, I, floatToHalf(float(D.Floats[I])));
      break;
    case DType::BF16:
      put<uint16_t>(B, I, floatToBFloat16(float(D.Floats[I])));
      break;
    case DType::I64:
      put<int64_t>(B, I, D.Ints[I]);
      break;
    case DType::I32:
      put<int32_t>(B, I, int32_t(uint32_t(uint64_t(D.Ints[I]))));
      break;
    case DType::I8:
      put<int8_t>(B, I, int8_t(uint8_t(uint64_t(D.Ints[I]))));
      break;
    case DType::U8:
      put<uint8_t>(B, I, uint8_t(uint64_t(D.Ints[I])));
      break;
    case DType::Bool:
      put<uint8_t>(B, I, D.Ints[I] != 0);
      break;
    }
  }
  return TensorData::makeInline(D.Type, std::move(B));
}

/// Row-major strides of Shape.
SmallVector<int64_t, 6> stridesOf(ArrayRef<int64_t> Shape) {
  SmallVector<int64_t, 6> S(Shape.size(), 1);
  for (int I = int(Shape.size()) - 2; I >= 0; --I)
    S[I] = S[I + 1] * Shape[I + 1];
  return S;
}

/// Calls F(OutIndex, InIndex) for every element of Out, where InIndex is
/// Base + sum(i_d * InStrides[d]) for the multi-index (i_d) of the element.
template <typename Fn>
void forEachStrided(ArrayRef<int64_t> Out, int64_t Base,
                    ArrayRef<int64_t> InStrides, Fn F) {
  int64_t N = 1;
  for (int64_t D : Out)
    N *= D;
  SmallVector<int64_t, 6> Idx(Out.size(), 0);
  int64_t In = Base;
  for (int64_t I = 0; I < N; ++I) {
    F(I, In);
    if (I + 1 == N) // never step past the last element
      break;
    for (int D = int(Out.size()) - 1; D >= 0; --D) {
      In += InStrides[D];
      if (++Idx[D] < Out[D])
        break;
      In -= InStrides[D] * Out[D];
      Idx[D] = 0;
    }
  }
}

/// For each element of a tensor of shape Out, the index of the element of a
/// tensor of shape In that numpy broadcasting reads.
std::vector<int64_t> broadcastIndex(ArrayRef<int64_t> In,
                                    ArrayRef<int64_t> Out) {
  SmallVector<int64_t, 6> InStrides = stridesOf(In);
  SmallVector<int64_t, 6> Strides(Out.size(), 0);
  size_t Off = Out.size() - In.size();
  for (size_t D = 0; D < In.size(); ++D)
    Strides[Off + D] = In[D] == 1 ? 0 : InStrides[D];
  std::vector<int64_t> Map(TensorType(DType::I64, Out).numElements());
  forEachStrided(Out, 0, Strides, [&](int64_t O, int64_t I) { Map[O] = I; });
  return Map;
}

//===----------------------------------------------------------------------===//
// Elementwise ops
//===----------------------------------------------------------------------===//

int64_t wrapAdd(int64_t A, int64_t B) { return int64_t(uint64_t(A) + B); }
int64_t wrapSub(int64_t A, int64_t B) { return int64_t(uint64_t(A) - B); }
int64_t wrapMul(int64_t A, int64_t B) {
  return int64_t(uint64_t(A) * uint64_t(B));
}

int64_t intPow(int64_t Base, int64_t Exp) {
  if (Exp < 0) // 1 / Base^|Exp| truncated
    return Base == 1 ? 1 : Base == -1 ? (Exp % 2 ? -1 : 1) : 0;
  int64_t R = 1;
  while (Exp) {
    if (Exp & 1)
      R = wrapMul(R, Base);
    Base = wrapMul(Base, Base);
    Exp >>= 1;
  }
  return R;
}

/// Add, Sub, Mul, Div, Pow, Equal, Less, Greater, And with broadcasting. Integer math
/// stays in int64 (wrapping; Div truncates toward zero); anything involving
/// a floating-point operand or result is computed in double.
Expected<Dense> foldBinary(OpKind Op, const Dense &A, const Dense &B,
                           const TensorType &ResultType) {
  Dense R(ResultType);
  std::vector<int64_t> IA = broadcastIndex(A.shape(), R.shape());
  std::vector<int64_t> IB = broadcastIndex(B.shape(), R.shape());
  bool IntMath = !A.isFloating() && !B.isFloating();
  for (int64_t I = 0, N = R.size(); I < N; ++I) {
    if (Op == OpKind::OnnxEqual) {
      R.Ints[I] = IntMath ? A.Ints[IA[I]] == B.Ints[IB[I]]
                          : A.getF(IA[I]) == B.getF(IB[I]);
      continue;
    }
    if (Op == OpKind::OnnxLess || Op == OpKind::OnnxGreater) {
      bool Less = Op == OpKind::OnnxLess;
      R.Ints[I] = IntMath ? (Less ? A.Ints[IA[I]] < B.Ints[IB[I]]
                                  : A.Ints[IA[I]] > B.Ints[IB[I]])
                          : (Less ? A.getF(IA[I]) < B.getF(IB[I])
                                  : A.getF(IA[I]) > B.getF(IB[I]));
      continue;
    }
    if (IntMath) {
      int64_t X = A.Ints[IA[I]], Y = B.Ints[IB[I]], Z = 0;
      switch (Op) {
      case OpKind::OnnxAdd:
        Z = wrapAdd(X, Y);
        break;
      case OpKind::OnnxSub:
        Z = wrapSub(X, Y);
        break;
      case OpKind::OnnxMul:
        Z = wrapMul(X, Y);
        break;
      case OpKind::OnnxDiv:
        if (Y == 0)
          return makeError("integer division by zero");
        Z = (Y == -1) ? wrapSub(0, X) : X / Y;
        break;
      case OpKind::OnnxPow:
        Z = intPow(X, Y);
        break;
      case OpKind::OnnxAnd:
        Z = X && Y;
        break;
      default:
        llvm_unreachable("not a binary op");
      }
      if (R.isFloating())
        R.Floats[I] = double(Z);
      else
        R.Ints[I] = Z;
      continue;
    }
    double X = A.getF(IA[I]), Y = B.getF(IB[I]), Z = 0;
    switch (Op) {
    case OpKind::OnnxAdd:
      Z = X + Y;
      break;
    case OpKind::OnnxSub:
      Z = X - Y;
      break;
    case OpKind::OnnxMul:
      Z = X * Y;
      break;
    case OpKind::OnnxDiv:
      Z = X / Y;
      break;
    case OpKind::OnnxPow:
      Z = std::pow(X, Y);
      break;
    default:
      llvm_unreachable("not a floating-point binary op");
    }
    if (R.isFloating())
      R.Floats[I] = Z;
    else
      R.Ints[I] = toInt(Z);
  }
  return R;
}

Dense foldUnary(OpKind Op, const Dense &X, const TensorType &ResultType) {
  Dense R(ResultType);
  for (int64_t I = 0, N = R.size(); I < N; ++I) {
    if (!R.isFloating()) {
      int64_t V = X.Ints[I];
      R.Ints[I] = Op == OpKind::OnnxNot   ? !V
                  : Op == OpKind::OnnxNeg ? wrapSub(0, V)
                                          : V;
      continue;
    }
    double V = X.Floats[I];
    switch (Op) {
    case OpKind::OnnxNeg:
      V = -V;
      break;
    case OpKind::OnnxSqrt:
      V = std::sqrt(V);
      break;
    case OpKind::OnnxErf:
      V = std::erf(V);
      break;
    case OpKind::OnnxTanh:
      V = std::tanh(V);
      break;
    case OpKind::OnnxSigmoid:
      V = 1 / (1 + std::exp(-V));
      break;
    case OpKind::OnnxReciprocal:
      V = 1 / V;
      break;
    default: // Identity
      break;
    }
    R.Floats[I] = V;
  }
  return R;
}

Dense foldWhere(const Dense &C, const Dense &X, const Dense &Y,
                const TensorType &ResultType) {
  Dense R(ResultType);
  std::vector<int64_t> IC = broadcastIndex(C.shape(), R.shape());
  std::vector<int64_t> IX = broadcastIndex(X.shape(), R.shape());
  std::vector<int64_t> IY = broadcastIndex(Y.shape(), R.shape());
  for (int64_t I = 0, N = R.size(); I < N; ++I) {
    if (C.Ints[IC[I]])
      R.copyFrom(I, X, IX[I]);
    else
      R.copyFrom(I, Y, IY[I]);
  }
  return R;
}

/// Cast: float to integer truncates toward zero, anything to bool tests for
/// nonzero, integer to narrower integer wraps (when the result is written).
Dense foldCast(const Dense &X, const TensorType &ResultType) {
  Dense R(ResultType);
  for (int64_t I = 0, N = R.size(); I < N; ++I) {
    if (R.isFloating())
      R.Floats[I] = X.getF(I);
    else if (ResultType.Dtype == DType::Bool)
      R.Ints[I] = X.isFloating() ? X.Floats[I] != 0 : X.Ints[I] != 0;
    else
      R.Ints[I] = X.isFloating() ? toInt(X.Floats[I]) : X.Ints[I];
  }
  return R;
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

/// Reshape, Squeeze, Unsqueeze, Identity: same elements, new type.
Dense foldRetype(const Dense &X, const TensorType &ResultType) {
  Dense R = X;
  R.Type = ResultType;
  return R;
}

Dense foldExpand(const Dense &X, const TensorType &ResultType) {
  Dense R(ResultType);
  std::vector<int64_t> IX = broadcastIndex(X.shape(), R.shape());
  for (int64_t I = 0, N = R.size(); I < N; ++I)
    R.copyFrom(I, X, IX[I]);
  return R;
}

Dense foldTranspose(const Dense &X, const AttrList &Attrs,
                    const TensorType &ResultType) {
  std::vector<int64_t> Perm = Attrs.getInts("perm");
  if (!Attrs.has("perm"))
    for (int64_t I = X.Type.rank() - 1; I >= 0; --I)
      Perm.push_back(I);
  SmallVector<int64_t, 6> InStrides = stridesOf(X.shape()), Strides;
  for (int64_t P : Perm)
    Strides.push_back(InStrides[P]);
  Dense R(ResultType);
  forEachStrided(R.shape(), 0, Strides,
                 [&](int64_t O, int64_t I) { R.copyFrom(O, X, I); });
  return R;
}

/// Gather along `axis`; negative indices count from the end.
Expected<Dense> foldGather(const Dense &X, const Dense &Idx,
                           const AttrList &Attrs,
                           const TensorType &ResultType) {
  int64_t Rank = X.Type.rank();
  int64_t Axis = Attrs.getInt("axis", 0);
  if (Axis < 0)
    Axis += Rank;
  int64_t Outer = 1, Inner = 1, Dim = X.shape()[Axis];
  for (int64_t D = 0; D < Axis; ++D)
    Outer *= X.shape()[D];
  for (int64_t D = Axis + 1; D < Rank; ++D)
    Inner *= X.shape()[D];
  Dense R(ResultType);
  int64_t NIdx = Idx.size(), O = 0;
  for (int64_t A = 0; A < Outer; ++A)
    for (int64_t J = 0; J < NIdx; ++J) {
      int64_t K = Idx.Ints[J];
      if (K < -Dim || K >= Dim)
        return makeError(formatv("index {0} is out of range for axis {1} of "
                                 "size {2}",
                                 K, Axis, Dim));
      if (K < 0)
        K += Dim;
      for (int64_t B = 0; B < Inner; ++B)
        R.copyFrom(O++, X, (A * Dim + K) * Inner + B);
    }
  return R;
}

/// GatherElements along `axis`: R[i] = X[i with i[axis] = Idx[i]].
Expected<Dense> foldGatherElements(const Dense &X, const Dense &Idx,
                                   const AttrList &Attrs,
                                   const TensorType &ResultType) {
  int64_t Rank = X.Type.rank();
  int64_t Axis = Attrs.getInt("axis", 0);
  if (Axis < 0)
    Axis += Rank;
  int64_t Dim = X.shape()[Axis];
  SmallVector<int64_t, 6> XStrides = stridesOf(X.shape());
  ArrayRef<int64_t> Shape = ResultType.Shape;
  Dense R(ResultType);
  for (int64_t I = 0, N = R.size(); I < N; ++I) {
    int64_t Rest = I, Src = 0;
    for (int64_t D = Rank - 1; D >= 0; --D) {
      int64_t C = Rest % Shape[D];
      Rest /= Shape[D];
      if (D == Axis) {
        C = Idx.Ints[I];
        if (C < -Dim || C >= Dim)
          return makeError(formatv("index {0} is out of range for axis {1} of "
                                   "size {2}",
                                   C, Axis, Dim));
        if (C < 0)
          C += Dim;
      }
      Src += C * XStrides[D];
    }
    R.copyFrom(I, X, Src);
  }
  return R;
}

/// Tile: R[i] = X[i mod X's shape].
Dense foldTile(const Dense &X, const TensorType &ResultType) {
  int64_t Rank = X.Type.rank();
  SmallVector<int64_t, 6> XStrides = stridesOf(X.shape());
  ArrayRef<int64_t> Shape = ResultType.Shape;
  Dense R(ResultType);
  for (int64_t I = 0, N = R.size(); I < N; ++I) {
    int64_t Rest = I, Src = 0;
    for (int64_t D = Rank - 1; D >= 0; --D) {
      Src += (Rest % Shape[D]) % X.shape()[D] * XStrides[D];
      Rest /= Shape[D];
    }
    R.copyFrom(I, X, Src);
  }
  return R;
}

/// Concat along `axis`: for each outer index, the inputs' slabs in order.
Dense foldConcat(ArrayRef<Dense> Xs, const AttrList &Attrs,
                 const TensorType &ResultType) {
  int64_t Rank = ResultType.rank();
  int64_t Axis = Attrs.getInt("axis", 0);
  if (Axis < 0)
    Axis += Rank;
  int64_t Outer = 1;
  for (int64_t D = 0; D < Axis; ++D)
    Outer *= ResultType.Shape[D];
  Dense R(ResultType);
  int64_t O = 0;
  for (int64_t A = 0; A < Outer; ++A)
    for (const Dense &X : Xs) {
      int64_t Slab = Outer ? X.size() / Outer : 0;
      for (int64_t I = 0; I < Slab; ++I)
        R.copyFrom(O++, X, A * Slab + I);
    }
  return R;
}

/// Split along `axis` into the result types' sizes.
std::vector<Dense> foldSplit(const Dense &X, const AttrList &Attrs,
                             ArrayRef<TensorType> ResultTypes) {
  int64_t Rank = X.Type.rank();
  int64_t Axis = Attrs.getInt("axis", 0);
  if (Axis < 0)
    Axis += Rank;
  SmallVector<int64_t, 6> Strides = stridesOf(X.shape());
  std::vector<Dense> Out;
  int64_t Offset = 0;
  for (const TensorType &T : ResultTypes) {
    Dense R(T);
    forEachStrided(T.Shape, Offset * Strides[Axis], Strides,
                   [&](int64_t O, int64_t I) { R.copyFrom(O, X, I); });
    Offset += T.Shape[Axis];
    Out.push_back(std::move(R));
  }
  return Out;
}

/// Slice of X by the constant operands starts, axes (or empty) and steps (or
/// empty). The start of each axis is clamped as the spec says (and as shape
/// inference does); the ends only decide the counts, which ResultType holds.
Dense foldSlice(const Dense &X, ArrayRef<int64_t> Starts,
                ArrayRef<int64_t> Axes, ArrayRef<int64_t> Steps,
                const TensorType &ResultType) {
  int64_t Rank = X.Type.rank();
  SmallVector<int64_t, 6> Start(Rank, 0), Step(Rank, 1);
  for (size_t I = 0; I < Starts.size(); ++I) {
    int64_t Axis = Axes.empty() ? int64_t(I) : Axes[I];
    if (Axis < 0)
      Axis += Rank;
    int64_t S = Starts[I], Dim = X.shape()[Axis];
    int64_t St = Steps.empty() ? 1 : Steps[I];
    if (S < 0)
      S += Dim;
    S = St > 0 ? std::clamp<int64_t>(S, 0, Dim)
               : std::clamp<int64_t>(S, 0, std::max<int64_t>(Dim - 1, 0));
    Start[Axis] = S;
    Step[Axis] = St;
  }
  SmallVector<int64_t, 6> InStrides = stridesOf(X.shape()), Strides(Rank);
  int64_t Base = 0;
  for (int64_t D = 0; D < Rank; ++D) {
    Base += Start[D] * InStrides[D];
    // A step is only taken along axes with more than one element; there it
    // is smaller than the dimension, so the stride cannot overflow.
    Strides[D] = ResultType.Shape[D] > 1 ? Step[D] * InStrides[D] : 0;
  }
  Dense R(ResultType);
  if (R.size() == 0)
    return R;
  forEachStrided(R.shape(), Base, Strides,
                 [&](int64_t O, int64_t I) { R.copyFrom(O, X, I); });
  return R;
}

//===----------------------------------------------------------------------===//
// Generators
//===----------------------------------------------------------------------===//

Dense foldShape(const TensorType &Operand, const TensorType &ResultType,
                const AttrList &Attrs) {
  int64_t R = Operand.rank();
  int64_t Start = Attrs.getInt("start", 0);
  if (Start < 0)
    Start += R;
  Start = std::clamp<int64_t>(Start, 0, R);
  Dense Out(ResultType);
  for (int64_t I = 0; I < Out.size(); ++I)
    Out.Ints[I] = Operand.Shape[Start + I];
  return Out;
}

Dense foldConstantOfShape(const AttrList &Attrs, const TensorType &ResultType) {
  Dense R(ResultType);
  const Attribute *V = Attrs.find("value");
  if (R.isFloating())
    std::fill(R.Floats.begin(), R.Floats.end(), Attrs.getFloat("value", 0.0));
  else if (V && std::holds_alternative<int64_t>(*V))
    std::fill(R.Ints.begin(), R.Ints.end(), std::get<int64_t>(*V));
  else
    std::fill(R.Ints.begin(), R.Ints.end(),
              toInt(Attrs.getFloat("value", 0.0)));
  return R;
}

Dense foldRange(const Dense &Start, const Dense &Delta,
                const TensorType &ResultType) {
  Dense R(ResultType);
  for (int64_t I = 0; I < R.size(); ++I) {
    if (R.isFloating())
      R.Floats[I] = Start.Floats[0] + double(I) * Delta.Floats[0];
    else
      R.Ints[I] = wrapAdd(Start.Ints[0], wrapMul(I, Delta.Ints[0]));
  }
  return R;
}

/// Trilu: keeps the upper (j - i >= k) or lower (j - i <= k) triangle of
/// each matrix in the last two dimensions and zeroes the rest.
Dense foldTrilu(const Dense &X, int64_t K, bool Upper) {
  Dense R = X;
  int64_t Rows = X.shape()[X.Type.rank() - 2];
  int64_t Cols = X.shape()[X.Type.rank() - 1];
  for (int64_t I = 0; I < R.size(); ++I) {
    int64_t Col = I % Cols, Row = (I / Cols) % Rows;
    bool Keep = Upper ? Col - Row >= K : Col - Row <= K;
    if (Keep)
      continue;
    if (R.isFloating())
      R.Floats[I] = 0;
    else
      R.Ints[I] = 0;
  }
  return R;
}

} // namespace

bool isFoldable(OpKind Op) {
  if (isOnnxBinary(Op) || isOnnxUnary(Op))
    return true;
  switch (Op) {
  case OpKind::OnnxShape:
  case OpKind::OnnxGather:
  case OpKind::OnnxUnsqueeze:
  case OpKind::OnnxSqueeze:
  case OpKind::OnnxConcat:
  case OpKind::OnnxConstantOfShape:
  case OpKind::OnnxCast:
  case OpKind::OnnxRange:
  case OpKind::OnnxExpand:
  case OpKind::OnnxSlice:
  case OpKind::OnnxReshape:
  case OpKind::OnnxTranspose:
  case OpKind::OnnxWhere:
  case OpKind::OnnxTrilu:
  case OpKind::OnnxSplit:
  case OpKind::OnnxGatherElements:
  case OpKind::OnnxTile:
    return true;
  default:
    return false;
  }
}

Expected<FoldResult> foldOp(OpKind Op, ArrayRef<Value *> Operands,
                            const AttrList &Attrs,
                            ArrayRef<TensorType> ResultTypes) {
  if (!isFoldable(Op) || ResultTypes.empty())
    return std::nullopt;
  for (const TensorType &T : ResultTypes)
    if (T.numElements() > MaxFoldElements)
      return std::nullopt;
  // The evaluators below rely on well-typed operands and attributes: check
  // them (and the result types, which may be a prefix) with the type rules.
  auto Types = inferOnnxTypes(Op, Operands, Attrs);
  if (!Types) {
    // Value-dependent rules fail when an operand is not a loaded constant;
    // that only means "cannot fold (yet)".
    consumeError(Types.takeError());
    return std::nullopt;
  }
  if (Types->size() < ResultTypes.size() ||
      !std::equal(ResultTypes.begin(), ResultTypes.end(), Types->begin()))
    return makeError("the result types do not match the operands");
  const TensorType &RT = ResultTypes[0];
  auto Single = [](Dense D) -> FoldResult {
    return std::vector<std::shared_ptr<TensorData>>{toData(D)};
  };

  // Shape needs only the static type of its operand.
  if (Op == OpKind::OnnxShape) {
    if (Operands.size() != 1 || !Operands[0])
      return std::nullopt;
    return Single(foldShape(Operands[0]->type(), RT, Attrs));
  }

  std::vector<Dense> X;
  for (const Value *V : Operands) {
    std::optional<Dense> D = readConst(V);
    if (!D)
      return std::nullopt;
    X.push_back(std::move(*D));
  }

  // Results without elements need no evaluation, and the evaluators' stride
  // arithmetic would overflow on the unbounded dimensions that a tensor
  // with a 0 dimension may have.
  if (all_of(ResultTypes,
             [](const TensorType &T) { return T.numElements() == 0; })) {
    std::vector<std::shared_ptr<TensorData>> Out;
    for (const TensorType &T : ResultTypes)
      Out.push_back(toData(Dense(T)));
    return FoldResult(std::move(Out));
  }

  if (isOnnxBinary(Op)) {
    auto R = foldBinary(Op, X[0], X[1], RT);
    if (!R)
      return R.takeError();
    return Single(std::move(*R));
  }
  if (isOnnxUnary(Op))
    return Single(foldUnary(Op, X[0], RT));
  switch (Op) {
  case OpKind::OnnxWhere:
    return Single(foldWhere(X[0], X[1], X[2], RT));
  case OpKind::OnnxCast:
    return Single(foldCast(X[0], RT));
  case OpKind::OnnxReshape:
  case OpKind::OnnxSqueeze:
  case OpKind::OnnxUnsqueeze:
    return Single(foldRetype(X[0], RT));
  case OpKind::OnnxExpand:
    return Single(foldExpand(X[0], RT));
  case OpKind::OnnxTranspose:
    return Single(foldTranspose(X[0], Attrs, RT));
  case OpKind::OnnxGather: {
    auto R = foldGather(X[0], X[1], Attrs, RT);
    if (!R)
      return R.takeError();
    return Single(std::move(*R));
  }
  case OpKind::OnnxGatherElements: {
    auto R = foldGatherElements(X[0], X[1], Attrs, RT);
    if (!R)
      return R.takeError();
    return Single(std::move(*R));
  }
  case OpKind::OnnxTile:
    return Single(foldTile(X[0], RT));
  case OpKind::OnnxConcat:
    return Single(foldConcat(X, Attrs, RT));
  case OpKind::OnnxSplit: {
    std::vector<std::shared_ptr<TensorData>> Out;
    for (const Dense &D : foldSplit(X[0], Attrs, ResultTypes))
      Out.push_back(toData(D));
    return FoldResult(std::move(Out));
  }
  case OpKind::OnnxSlice:
    return Single(foldSlice(
        X[0], X[1].Ints, X.size() > 3 ? ArrayRef<int64_t>(X[3].Ints) : None,
        X.size() > 4 ? ArrayRef<int64_t>(X[4].Ints) : None, RT));
  case OpKind::OnnxConstantOfShape:
    return Single(foldConstantOfShape(Attrs, RT));
  case OpKind::OnnxRange:
    return Single(foldRange(X[0], X[2], RT));
  case OpKind::OnnxTrilu: {
    int64_t K = X.size() > 1 ? X[1].Ints[0] : 0;
    return Single(foldTrilu(X[0], K, Attrs.getInt("upper", 1)));
  }
  default:
    break;
  }
  llvm_unreachable("isFoldable and foldOp disagree");
}

} // namespace sp
