//===- TensorLayout.h - A tensor seen around one axis ------------*- C++ -*-===//
#ifndef SP_RUNTIME_TENSORLAYOUT_H
#define SP_RUNTIME_TENSORLAYOUT_H

#include "ir/Types.h"

namespace sp {

/// A row-major tensor as [Outer, the axis, Inner]: the elements before and
/// after the axis.
struct AxisView {
  int64_t Outer = 1, Inner = 1;
};

inline AxisView around(const TensorType &T, int Dim) {
  AxisView A;
  for (int I = 0; I < Dim; ++I)
    A.Outer *= T.Shape[I];
  for (int I = Dim + 1; I < int(T.rank()); ++I)
    A.Inner *= T.Shape[I];
  return A;
}

} // namespace sp

#endif // SP_RUNTIME_TENSORLAYOUT_H
