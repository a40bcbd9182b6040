//===- LazyElements.cpp - Elements of a constant subgraph, one at a time ---===//
#include "analysis/LazyElements.h"
#include "ir/Float16.h"
#include "ir/ShapeInference.h"
#include <climits>
#include <cmath>

using namespace llvm;

namespace sp {

namespace {

constexpr int MaxRank = 8;

/// Row-major multi-index of Flat in Shape.
void unravel(ArrayRef<int64_t> Shape, int64_t Flat, int64_t *Idx) {
  for (int D = int(Shape.size()) - 1; D >= 0; --D) {
    Idx[D] = Shape[D] ? Flat % Shape[D] : 0;
    Flat = Shape[D] ? Flat / Shape[D] : 0;
  }
}

/// The flat index in an operand of shape In of the element that numpy
/// broadcasting sends to output index Idx (rank R).
int64_t broadcastFlat(ArrayRef<int64_t> In, const int64_t *Idx, int R) {
  int Lead = R - int(In.size());
  int64_t Flat = 0;
  for (size_t D = 0; D < In.size(); ++D)
    Flat = Flat * In[D] + (In[D] == 1 ? 0 : Idx[D + Lead]);
  return Flat;
}

/// X as the value a tensor of dtype T holds.
double roundTo(DType T, double X) {
  switch (T) {
  case DType::F64:
    return X;
  case DType::F32:
    return double(float(X));
  case DType::F16:
    return halfToFloat(floatToHalf(float(X)));
  case DType::BF16:
    return bfloat16ToFloat(floatToBFloat16(float(X)));
  case DType::Bool:
    return X != 0 ? 1.0 : 0.0;
  default:
    break;
  }
  // Integers as the folder converts them: toward zero, saturating at the
  // int64 range (nan: 0), then the low bits of the narrower types.
  int64_t I = std::isnan(X)                    ? 0
              : X >= 9.2233720368547758e18     ? INT64_MAX
              : X < -9.2233720368547758e18     ? INT64_MIN
                                               : int64_t(X);
  switch (T) {
  case DType::I32:
    return double(int32_t(uint32_t(uint64_t(I))));
  case DType::I8:
    return double(int8_t(uint8_t(uint64_t(I))));
  case DType::U8:
    return double(uint8_t(uint64_t(I)));
  default:
    return double(I);
  }
}

/// The binary ops evaluated here: the onnx.* ones but pow.
bool isBinary(OpKind K) { return isOnnxBinary(K) && K != OpKind::OnnxPow; }

std::optional<double> scalarOf(const Value *V) {
  if (!V->isConst() || V->type().numElements() != 1 || !V->data())
    return std::nullopt;
  if (auto D = V->data()->load(); !D) {
    consumeError(D.takeError());
    return std::nullopt;
  }
  return V->data()->getDouble(0);
}

} // namespace

bool LazyElements::computable(Value *V) {
  if (auto It = Ok.find(V); It != Ok.end())
    return It->second;
  Ok[V] = false; // a cycle (impossible in a valid graph) stays false
  bool R = check(V);
  Ok[V] = R;
  return R;
}

bool LazyElements::check(Value *V) {
  if (V->type().rank() > MaxRank)
    return false;
  if (V->isConst()) {
    if (!V->data() || V->data()->type() != V->type())
      return false;
    if (auto D = V->data()->load(); !D) {
      consumeError(D.takeError());
      return false;
    }
    return true;
  }
  Node *N = V->producer();
  if (!N || N->numResults() != 1 || N->numOperands() == 0)
    return false;
  auto Operands = [&](unsigned Count) {
    if (N->numOperands() < Count)
      return false;
    for (unsigned I = 0; I < Count; ++I)
      if (!computable(N->operand(I)))
        return false;
    return true;
  };
  NodeInfo I;
  switch (N->op()) {
  case OpKind::OnnxIdentity:
  case OpKind::OnnxReshape:
  case OpKind::OnnxUnsqueeze:
  case OpKind::OnnxSqueeze:
  case OpKind::OnnxCast:
  case OpKind::OnnxNot:
  case OpKind::OnnxNeg:
  case OpKind::OnnxExpand:
    if (N->operand(0)->type().numElements() == 0 && V->type().numElements())
      return false;
    if (N->op() != OpKind::OnnxExpand &&
        N->operand(0)->type().numElements() != V->type().numElements())
      return false;
    return Operands(1);
  case OpKind::OnnxWhere:
    return Operands(3);
  case OpKind::OnnxConstantOfShape:
    I.A = N->attrs().getFloat("value", 0.0);
    break;
  case OpKind::OnnxRange: {
    if (N->numOperands() != 3)
      return false;
    auto Start = scalarOf(N->operand(0)), Delta = scalarOf(N->operand(2));
    if (!Start || !Delta)
      return false;
    I.A = *Start;
    I.B = *Delta;
    break;
  }
  case OpKind::OnnxTrilu: {
    if (V->type().rank() < 2 || !Operands(1))
      return false;
    I.A = 0;
    if (N->numOperands() > 1) {
      auto K = scalarOf(N->operand(1));
      if (!K)
        return false;
      I.A = *K;
    }
    break;
  }
  case OpKind::OnnxTranspose: {
    if (!Operands(1))
      return false;
    unsigned R = V->type().rank();
    I.Ints = N->attrs().getInts("perm");
    if (I.Ints.empty())
      for (unsigned D = 0; D < R; ++D)
        I.Ints.push_back(R - 1 - D);
    if (I.Ints.size() != R)
      return false;
    for (int64_t P : I.Ints)
      if (P < 0 || P >= int64_t(R))
        return false;
    break;
  }
  case OpKind::OnnxSlice: {
    if (N->numOperands() < 3 || !Operands(1))
      return false;
    const TensorType &In = N->operand(0)->type();
    unsigned R = In.rank();
    if (V->type().rank() != R)
      return false;
    auto Starts = knownConstInts(N->operand(1));
    if (!Starts)
      return false;
    std::vector<int64_t> Axes;
    if (N->numOperands() > 3) {
      auto A = knownConstInts(N->operand(3));
      if (!A)
        return false;
      Axes = *A;
    } else {
      for (size_t K = 0; K < Starts->size(); ++K)
        Axes.push_back(int64_t(K));
    }
    std::vector<int64_t> Steps(Starts->size(), 1);
    if (N->numOperands() > 4) {
      auto S = knownConstInts(N->operand(4));
      if (!S)
        return false;
      Steps = *S;
    }
    if (Axes.size() != Starts->size() || Steps.size() != Starts->size())
      return false;
    I.Ints.assign(R, 0);
    I.Steps.assign(R, 1);
    for (size_t K = 0; K < Axes.size(); ++K) {
      int64_t A = Axes[K] < 0 ? Axes[K] + R : Axes[K];
      if (A < 0 || A >= int64_t(R) || Steps[K] <= 0)
        return false;
      int64_t Dim = In.dim(A), S = (*Starts)[K];
      S = S < 0 ? S + Dim : S;
      I.Ints[A] = std::clamp<int64_t>(S, 0, Dim);
      I.Steps[A] = Steps[K];
    }
    break;
  }
  default:
    if (!isBinary(N->op()))
      return false;
    return Operands(2);
  }
  Info[N] = std::move(I);
  return true;
}

double LazyElements::at(Value *V, int64_t Flat) {
  if (V->isConst())
    return V->data()->getDouble(Flat);
  Node *N = V->producer();
  const TensorType &T = V->type();
  int R = int(T.rank());
  int64_t Idx[MaxRank];
  switch (N->op()) {
  case OpKind::OnnxIdentity:
  case OpKind::OnnxReshape:
  case OpKind::OnnxUnsqueeze:
  case OpKind::OnnxSqueeze:
    return at(N->operand(0), Flat);
  case OpKind::OnnxCast:
    return roundTo(T.Dtype, at(N->operand(0), Flat));
  case OpKind::OnnxNot:
    return at(N->operand(0), Flat) == 0 ? 1.0 : 0.0;
  case OpKind::OnnxNeg:
    return roundTo(T.Dtype, -at(N->operand(0), Flat));
  case OpKind::OnnxExpand:
    unravel(T.Shape, Flat, Idx);
    return at(N->operand(0), broadcastFlat(N->operand(0)->type().Shape, Idx, R));
  case OpKind::OnnxWhere: {
    unravel(T.Shape, Flat, Idx);
    auto Op = [&](unsigned K) {
      return at(N->operand(K),
                broadcastFlat(N->operand(K)->type().Shape, Idx, R));
    };
    return Op(0) != 0 ? Op(1) : Op(2);
  }
  case OpKind::OnnxConstantOfShape:
    return roundTo(T.Dtype, Info[N].A);
  case OpKind::OnnxRange: {
    const NodeInfo &I = Info[N];
    return roundTo(T.Dtype, I.A + double(Flat) * I.B);
  }
  case OpKind::OnnxTrilu: {
    unravel(T.Shape, Flat, Idx);
    int64_t Diag = Idx[R - 1] - Idx[R - 2];
    double K = Info[N].A;
    bool Keep = N->attrs().getInt("upper", 1) ? Diag >= K : Diag <= K;
    return Keep ? at(N->operand(0), Flat) : 0.0;
  }
  case OpKind::OnnxTranspose: {
    unravel(T.Shape, Flat, Idx);
    const NodeInfo &I = Info[N];
    const auto &In = N->operand(0)->type().Shape;
    int64_t OpIdx[MaxRank];
    for (int D = 0; D < R; ++D)
      OpIdx[I.Ints[D]] = Idx[D];
    int64_t F = 0;
    for (int D = 0; D < R; ++D)
      F = F * In[D] + OpIdx[D];
    return at(N->operand(0), F);
  }
  case OpKind::OnnxSlice: {
    unravel(T.Shape, Flat, Idx);
    const NodeInfo &I = Info[N];
    const auto &In = N->operand(0)->type().Shape;
    int64_t F = 0;
    for (int D = 0; D < R; ++D)
      F = F * In[D] + I.Ints[D] + Idx[D] * I.Steps[D];
    return at(N->operand(0), F);
  }
  default: {
    unravel(T.Shape, Flat, Idx);
    double A = at(N->operand(0),
                  broadcastFlat(N->operand(0)->type().Shape, Idx, R));
    double B = at(N->operand(1),
                  broadcastFlat(N->operand(1)->type().Shape, Idx, R));
    bool Int = !isFloat(N->operand(0)->type().Dtype);
    switch (N->op()) {
    case OpKind::OnnxAdd:
      return roundTo(T.Dtype, A + B);
    case OpKind::OnnxSub:
      return roundTo(T.Dtype, A - B);
    case OpKind::OnnxMul:
      return roundTo(T.Dtype, A * B);
    case OpKind::OnnxDiv:
      return roundTo(T.Dtype, Int ? (B == 0 ? 0.0 : std::trunc(A / B)) : A / B);
    case OpKind::OnnxLess:
      return A < B ? 1.0 : 0.0;
    case OpKind::OnnxGreater:
      return A > B ? 1.0 : 0.0;
    case OpKind::OnnxEqual:
      return A == B ? 1.0 : 0.0;
    case OpKind::OnnxAnd:
      return A != 0 && B != 0 ? 1.0 : 0.0;
    default:
      return NAN; // not reached: check() admits only the ops above
    }
  }
  }
}

} // namespace sp
