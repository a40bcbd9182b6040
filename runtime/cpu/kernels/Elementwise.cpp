//===- Elementwise.cpp - Add, mul, scale, broadcasts, activations ---------===//
//
// The elementwise kernels of Kernels.h, sections 2, 8, 15 and 16: the sum
// and product (plain and under numpy broadcasting), the reduction of a
// broadcast gradient back to its operand's shape (in double, one thread per
// output element), the scale, and the activations of ir/Ops.def, whose
// per-element math is runtime/Numerics.h's. The CUDA twin is
// runtime/cuda/kernels/Elementwise.cuh.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/kernels/Common.h"

#include "runtime/Numerics.h"

namespace sp::cpu {

using namespace detail;

//===----------------------------------------------------------------------===//
// 2. Add and its broadcast reduction
//===----------------------------------------------------------------------===//

template <typename T> void add(T *Y, const T *A, const T *B, int64_t N) {
  checkSizes({N});
  parallelFor(N, 1 << 14, [&](int64_t I0, int64_t I1) {
    for (int64_t I = I0; I < I1; ++I)
      Y[I] = A[I] + B[I];
  });
}

namespace {
/// Y[YShape] = Fn(A[AShape], B[BShape]) under numpy broadcasting: the shared
/// body of addBroadcast and mulBroadcast.
template <typename T, typename F>
Status broadcastBinary(T *Y, Shape YShape, const T *A, Shape AShape,
                       const T *B, Shape BShape, F &&Fn) {
  int64_t SA[MaxRank], SB[MaxRank], SY[MaxRank];
  if (Status S = broadcastStrides(AShape, YShape, SA); !S.ok())
    return S;
  if (Status S = broadcastStrides(BShape, YShape, SB); !S.ok())
    return S;
  int R = int(YShape.size());
  if (R == 0) {
    Y[0] = Fn(A[0], B[0]);
    return Status::success();
  }
  rowMajorStrides(R, YShape.data(), SY);
  // Rows of Y's last dimension (each operand's stride along it is 1 or 0,
  // broadcast) over the kernel threads; a row's offsets in A and B from
  // its index over the other dimensions.
  const int64_t Inner = YShape[R - 1], IA = SA[R - 1], IB = SB[R - 1];
  int64_t Rows = 1;
  for (int D = 0; D + 1 < R; ++D)
    Rows *= YShape[D];
  if (Inner == 0 || Rows == 0)
    return Status::success();
  parallelFor(Rows, std::max<int64_t>(1, (1 << 13) / Inner),
              [&](int64_t R0, int64_t R1) {
                int64_t Idx[MaxRank];
                for (int64_t Row = R0; Row < R1; ++Row) {
                  unflatten(Row, R - 1, YShape.data(), Idx);
                  int64_t OffA = dot(R - 1, Idx, SA), OffB = dot(R - 1, Idx, SB);
                  T *YR = Y + Row * Inner;
                  for (int64_t J = 0; J < Inner; ++J)
                    YR[J] = Fn(A[OffA + J * IA], B[OffB + J * IB]);
                }
              });
  return Status::success();
}
} // namespace

template <typename T>
Status addBroadcast(T *Y, Shape YShape, const T *A, Shape AShape, const T *B,
                    Shape BShape) {
  return broadcastBinary(Y, YShape, A, AShape, B, BShape,
                         [](T X0, T X1) { return X0 + X1; });
}

template <typename T>
Status reduceToShape(T *DX, Shape XShape, const T *DY, Shape YShape) {
  int64_t SX[MaxRank], SY[MaxRank];
  if (Status S = broadcastStrides(XShape, YShape, SX); !S.ok())
    return S;
  int R = int(YShape.size());
  rowMajorStrides(R, YShape.data(), SY);
  // Split Y's dimensions into the kept ones (one DX element per index) and
  // the reduced ones (summed into it), and sum each DX element in double.
  int RK = 0, RR = 0;
  int64_t KeptDims[MaxRank], KeptSX[MaxRank], KeptSY[MaxRank];
  int64_t RedDims[MaxRank], RedSY[MaxRank];
  for (int D = 0; D < R; ++D) {
    if (SX[D] == 0 && YShape[D] != 1) {
      RedDims[RR] = YShape[D];
      RedSY[RR++] = SY[D];
    } else {
      KeptDims[RK] = YShape[D];
      KeptSX[RK] = SX[D];
      KeptSY[RK++] = SY[D];
    }
  }
  int64_t NX = 1;
  for (int64_t D : XShape)
    NX *= D;
  std::fill(DX, DX + NX, T(0)); // covers a reduction over an empty dimension
  int64_t NK = 1, NR = 1;
  for (int D = 0; D < RK; ++D)
    NK *= KeptDims[D];
  for (int D = 0; D < RR; ++D)
    NR *= RedDims[D];
  if (NK == 0 || NR == 0)
    return Status::success();
  // The DX elements over the kernel threads, each summed by one thread in
  // the reduced dimensions' row-major order.
  parallelFor(NK, std::max<int64_t>(1, (1 << 13) / NR), [&](int64_t K0,
                                                           int64_t K1) {
    int64_t KIdx[MaxRank];
    for (int64_t K = K0; K < K1; ++K) {
      unflatten(K, RK, KeptDims, KIdx);
      const T *Base = DY + dot(RK, KIdx, KeptSY);
      Acc Sum = 0;
      forEachIndex(RR, RedDims, [&](const int64_t *RIdx) {
        Sum += Base[dot(RR, RIdx, RedSY)];
      });
      DX[dot(RK, KIdx, KeptSX)] = T(Sum);
    }
  });
  return Status::success();
}

//===----------------------------------------------------------------------===//
// 8. Scale
//===----------------------------------------------------------------------===//

template <typename T> void scale(T *Y, const T *X, int64_t N, double Alpha) {
  checkSizes({N});
  const T A = T(Alpha);
  parallelFor(N, 1 << 14, [&](int64_t I0, int64_t I1) {
    for (int64_t I = I0; I < I1; ++I)
      Y[I] = A * X[I];
  });
}

//===----------------------------------------------------------------------===//
// 15. Activations
//===----------------------------------------------------------------------===//
//
// One struct per SP_UNARY_OP of ir/Ops.def, named as its enumerator, in
// runtime/Numerics.h (the CUDA kernels call them too): value and grad (the
// derivative) of one element, in double. The switch below is generated
// from Ops.def; the loops, the threading and the AVX2 / AVX-512 clones are
// shared (unaryRange, kernels/Common.h).

namespace {

/// Calls Call with a value of activation F's struct: the one switch over
/// the SP_UNARY_OP lines of ir/Ops.def.
template <typename Fn> void withActivation(Activation F, Fn &&Call) {
  switch (F) {
#define SP_OP(Enum, Name)
#define SP_UNARY_OP(Enum, Name, OnnxName)                                      \
  case Activation::Enum:                                                       \
    return Call(numerics::Enum());
#include "ir/Ops.def"
  }
}

} // namespace

template <typename T>
void activation(Activation F, T *Y, const T *X, int64_t N) {
  checkSizes({N});
  parallelFor(N, 1 << 13, [&](int64_t I0, int64_t I1) {
    withActivation(F, [&](auto A) {
      unaryRange<decltype(A)>(Y + I0, X + I0, I1 - I0);
    });
  });
}

template <typename T>
void activationBackward(Activation F, T *DX, const T *X, const T *DY,
                        int64_t N) {
  checkSizes({N});
  parallelFor(N, 1 << 13, [&](int64_t I0, int64_t I1) {
    withActivation(F, [&](auto A) {
      unaryGradRange<decltype(A)>(DX + I0, X + I0, DY + I0, I1 - I0);
    });
  });
}

//===----------------------------------------------------------------------===//
// 16. Elementwise product
//===----------------------------------------------------------------------===//

template <typename T> void mul(T *Y, const T *A, const T *B, int64_t N) {
  checkSizes({N});
  parallelFor(N, 1 << 14, [&](int64_t I0, int64_t I1) {
    for (int64_t I = I0; I < I1; ++I)
      Y[I] = A[I] * B[I];
  });
}

template <typename T>
Status mulBroadcast(T *Y, Shape YShape, const T *A, Shape AShape, const T *B,
                    Shape BShape) {
  return broadcastBinary(Y, YShape, A, AShape, B, BShape,
                         [](T X0, T X1) { return X0 * X1; });
}

#define SP_INSTANTIATE(T)                                                      \
  template void add<T>(T *, const T *, const T *, int64_t);                    \
  template Status addBroadcast<T>(T *, Shape, const T *, Shape, const T *,     \
                                  Shape);                                      \
  template Status reduceToShape<T>(T *, Shape, const T *, Shape);              \
  template void scale<T>(T *, const T *, int64_t, double);                     \
  template void activation<T>(Activation, T *, const T *, int64_t);           \
  template void activationBackward<T>(Activation, T *, const T *, const T *,   \
                                      int64_t);                                \
  template void mul<T>(T *, const T *, const T *, int64_t);                    \
  template Status mulBroadcast<T>(T *, Shape, const T *, Shape, const T *,     \
                                  Shape);

SP_INSTANTIATE(float)
SP_INSTANTIATE(double)

#undef SP_INSTANTIATE

} // namespace sp::cpu
