//===- Float16.h - IEEE half and bfloat16 conversions ----------*- C++ -*-===//
//
// The 16-bit float formats as bits: to float (exact) and from float (rounded
// to nearest even, NaN kept quiet, overflow to infinity). Header-only, for
// the constant evaluator, tensor data and the communicators alike.
//
//===----------------------------------------------------------------------===//
#ifndef SP_IR_FLOAT16_H
#define SP_IR_FLOAT16_H

#include <cstdint>
#include <cstring>

namespace sp {

/// IEEE half-precision bits of F, rounded to nearest even.
inline uint16_t floatToHalf(float F) {
  uint32_t X;
  std::memcpy(&X, &F, 4);
  uint32_t Sign = (X >> 16) & 0x8000u;
  uint32_t Abs = X & 0x7fffffffu;
  if (Abs >= 0x7f800000u) // inf or nan
    return uint16_t(Sign | 0x7c00u | (Abs > 0x7f800000u ? 0x200u : 0u));
  if (Abs >= 0x477ff000u) // rounds to a value beyond the largest half
    return uint16_t(Sign | 0x7c00u);
  if (Abs < 0x38800000u) { // subnormal half (or zero)
    float A;
    std::memcpy(&A, &Abs, 4);
    // Adding 0.5 aligns the subnormal half's bits with the float's mantissa
    // and rounds to nearest even in the process.
    float Sum = A + 0.5f;
    uint32_t B;
    std::memcpy(&B, &Sum, 4);
    return uint16_t(Sign | (B - 0x3f000000u));
  }
  uint32_t Odd = (Abs >> 13) & 1;
  Abs += 0xc8000fffu + Odd; // rebias the exponent and round
  return uint16_t(Sign | (Abs >> 13));
}

/// The float value of IEEE half-precision bits H (exact).
inline float halfToFloat(uint16_t H) {
  uint32_t Sign = (H & 0x8000u) << 16, Exp = (H >> 10) & 0x1f, Man = H & 0x3ff;
  uint32_t Bits;
  if (Exp == 0 && Man == 0) {
    Bits = Sign;
  } else if (Exp == 0) { // subnormal: normalize the mantissa
    int E = -1;
    do {
      ++E;
      Man <<= 1;
    } while (!(Man & 0x400));
    Bits = Sign | uint32_t(127 - 15 - E) << 23 | (Man & 0x3ff) << 13;
  } else if (Exp == 31) {
    Bits = Sign | 0x7f800000u | Man << 13;
  } else {
    Bits = Sign | (Exp + 127 - 15) << 23 | Man << 13;
  }
  float F;
  std::memcpy(&F, &Bits, 4);
  return F;
}

/// bfloat16 bits of F, rounded to nearest even.
inline uint16_t floatToBFloat16(float F) {
  uint32_t X;
  std::memcpy(&X, &F, 4);
  if ((X & 0x7fffffffu) > 0x7f800000u)
    return uint16_t((X >> 16) | 0x40u); // quiet nan
  X += 0x7fffu + ((X >> 16) & 1);
  return uint16_t(X >> 16);
}

/// The float value of bfloat16 bits B (exact).
inline float bfloat16ToFloat(uint16_t B) {
  uint32_t Bits = uint32_t(B) << 16;
  float F;
  std::memcpy(&F, &Bits, 4);
  return F;
}

} // namespace sp

#endif // SP_IR_FLOAT16_H
