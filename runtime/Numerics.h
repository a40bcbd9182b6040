//===- Numerics.h - Scalar math of the CPU and CUDA kernels -----*- C++ -*-===//
//
// The per-element functions whose bits both backends must agree on, written
// once: the CPU kernels (runtime/cpu/kernels/) call them inside their
// vectorised loops, the CUDA kernels (runtime/cuda/kernels/Common.cuh and
// the files including it) on the device, and tests/gpu's emulator runs the
// CUDA kernels' calls of them on the CPU. Plain C++ for the host compiler;
// under nvcc every function is __host__ __device__ (SP_HOST_DEVICE).
//
// Everything here is written for reproducible bits: exp, erf and tanh are
// computed from IEEE operations (no libm call; sqrt, correctly rounded
// everywhere, is the one library function of the elementwise math),
// branch-free selects, and every a * b + c rounded twice (the CPU library
// is compiled with -ffp-contract=off, nvcc with -fmad=false), so each
// function gives the same double or float on every CPU clone
// (runtime/cpu/Simd.h) and on the GPU. The one exception is adamScalars'
// per-step pow (each side's own library; see there). The dropout mapping's Philox-4x32-10 lives beside the CPU kernels
// (runtime/cpu/Philox.h), shared with the CUDA kernels the same way.
//
// What is here:
//  - expD: exp in double (Cody-Waite reduction, Taylor polynomial);
//  - normalCdf, onePlusTanh: Phi(x) and 1 + tanh(u) in double from expD;
//  - the GELU's erf and tanh forms and their derivatives, in double (also
//    as structs GeluErf and GeluTanh, shaped as the activations');
//  - sigmoidPair and one struct per activation of ir/Ops.def
//    (SP_UNARY_OP): value and derivative in double;
//  - widenBits and narrowBits: float32 from and to bfloat16 or half bits,
//    exact and round-to-nearest-even (ir/Float16.h's rules, branch-free);
//  - torch's gradient-clipping coefficient and the AdamW step: its scalars
//    and the update of one element.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_NUMERICS_H
#define SP_RUNTIME_NUMERICS_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

/// A function both backends call: __host__ __device__ under nvcc, nothing
/// for the host compiler (and tests/gpu's emulator).
#ifndef SP_HOST_DEVICE
#ifdef __CUDACC__
#define SP_HOST_DEVICE __host__ __device__
#else
#define SP_HOST_DEVICE
#endif
#endif

/// The functions of this header: inlined into the CPU kernels' vectorised
/// loops (a call would stop the vectoriser), inline on the device.
#ifdef __CUDACC__
#define SP_NUMERIC __host__ __device__ inline
#else
#define SP_NUMERIC inline __attribute__((always_inline))
#endif

/// Loops with a constant trip count, unrolled on the device (the host
/// compiler unrolls them by itself).
#ifdef __CUDA_ARCH__
#define SP_NUMERIC_UNROLL _Pragma("unroll")
#else
#define SP_NUMERIC_UNROLL
#endif

namespace sp::numerics {

//===----------------------------------------------------------------------===//
// Bits
//===----------------------------------------------------------------------===//

/// The bits of a value as another type of the same size: memcpy on the
/// host; on the device the reinterpreting intrinsics, between double and a
/// 64-bit integer or float and a 32-bit one (what this header casts).
template <typename To, typename From> SP_NUMERIC To bitCast(From V) {
  static_assert(sizeof(To) == sizeof(From));
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(To) == 8) {
    if constexpr (std::is_same_v<From, double>)
      return To(__double_as_longlong(V));
    else
      return __longlong_as_double((long long)V);
  } else {
    if constexpr (std::is_same_v<From, float>)
      return To(__float_as_uint(V));
    else
      return __uint_as_float(uint32_t(V));
  }
#else
  To R;
  std::memcpy(&R, &V, sizeof(R));
  return R;
#endif
}

//===----------------------------------------------------------------------===//
// exp, Phi and 1 + tanh in double
//===----------------------------------------------------------------------===//

/// exp(X) in double, branch-free: X = n ln2 + r with |r| <= ln2 / 2
/// (Cody-Waite), a Taylor polynomial of the given degree for e^r, and 2^n
/// built in the exponent bits. Degree 13 is within about 2 ulp. For X < -708
/// it returns 0 (exp is subnormal there) and X > 709 is clamped to 709; the
/// callers only need X <= 0 (softmax, cross entropy, the GELU's Gaussian).
template <int Degree = 13> SP_NUMERIC double expD(double X) {
  constexpr double Log2e = 1.4426950408889634074;
  constexpr double Ln2Hi = 6.93147180369123816490e-01; // ln2's top 32 bits
  constexpr double Ln2Lo = 1.90821492927058770002e-10; // ln2 - Ln2Hi
  constexpr double Shifter = 6755399441055744.0;       // 1.5 * 2^52
  double C = X > 709.0 ? 709.0 : X;
  C = C < -708.0 ? -708.0 : C;
  // Adding 1.5 * 2^52 rounds C * log2(e) to an integer n held in the low
  // bits of the double's mantissa.
  double Kd = C * Log2e + Shifter;
  uint64_t Ki = bitCast<uint64_t>(Kd);
  Kd -= Shifter;
  double R = (C - Kd * Ln2Hi) - Kd * Ln2Lo;
  double InvFact[Degree + 1];
  InvFact[0] = 1.0;
  SP_NUMERIC_UNROLL
  for (int K = 1; K <= Degree; ++K)
    InvFact[K] = InvFact[K - 1] / K;
  double P = InvFact[Degree];
  SP_NUMERIC_UNROLL
  for (int K = Degree - 1; K >= 0; --K)
    P = P * R + InvFact[K];
  double Scale = bitCast<double>((Ki + 1023) << 52); // 2^n
  double E = P * Scale;
  return X < -708.0 ? 0.0 : E;
}

/// The standard normal CDF Phi(x) = 0.5 erfc(-x / sqrt 2) in double, within
/// about 1e-11 relative (also in the lower tail, unlike 0.5 (1 + erf)).
/// Gauss is set to exp(-x^2 / 2), which the GELU's derivative needs too.
/// With a = |x| / sqrt 2 and t = 1 / (1 + 0.3 a): erfc(a) = t Q(t) exp(-a^2),
/// Q a degree-12 polynomial fitted (weighted least squares, relative error)
/// on a in [0, 10]; a is clamped to 10, where erfc is far below float's
/// range.
SP_NUMERIC double normalCdf(double X, double &Gauss) {
  constexpr double InvSqrt2D = 0.70710678118654752440;
  double Z = X * InvSqrt2D;
  double A = Z < 0.0 ? -Z : Z;
  A = A > 10.0 ? 10.0 : A;
  double T = 1.0 / (1.0 + 0.3 * A);
  double Q = -0.024791171375631214;
  Q = Q * T + 0.18965657743677838;
  Q = Q * T - 0.5979185471623412;
  Q = Q * T + 1.0080039024326917;
  Q = Q * T - 1.077466910704484;
  Q = Q * T + 0.8853258797015948;
  Q = Q * T - 0.39418524669208055;
  Q = Q * T + 0.2845972437538755;
  Q = Q * T + 0.07058738544308457;
  Q = Q * T + 0.15741777629678796;
  Q = Q * T + 0.16014172331997442;
  Q = Q * T + 0.16937901772487515;
  Q = Q * T + 0.16925236982847486;
  Gauss = expD(-(Z * Z));
  double HalfErfc = 0.5 * (T * Q * Gauss); // 0.5 erfc(|z|)
  return Z < 0.0 ? HalfErfc : 1.0 - HalfErfc;
}

/// 1 + tanh(U) in double from E = exp(-2 |U|), branch-free: 2 / (1 + E) for
/// U >= 0 and 2 E / (1 + E) for U < 0, so that it stays accurate relatively
/// where it is small (the tanh GELU's lower tail).
SP_NUMERIC double onePlusTanh(double U) {
  double A = U < 0.0 ? -U : U;
  double E = expD(-2.0 * A);
  double Inv = 2.0 / (1.0 + E);
  return U < 0.0 ? E * Inv : Inv;
}

//===----------------------------------------------------------------------===//
// GELU
//===----------------------------------------------------------------------===//
//
// The float GELUs of both backends compute these in double and round once.
// (The CPU's double kernels, for the finite-difference tests, use libm's erf
// and tanh with the same constants: runtime/cpu/kernels/Gelu.cpp.)

constexpr double InvSqrt2 = 0.70710678118654752440;
constexpr double InvSqrt2Pi = 0.39894228040143267794; // 1 / sqrt(2 pi)
constexpr double Sqrt2OverPi = 0.79788456080286535588;
constexpr double GeluCoef = 0.044715;

/// erf form: x Phi(x).
SP_NUMERIC double geluErf(double X) {
  double Gauss;
  return X * normalCdf(X, Gauss);
}

/// Its derivative: Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi).
SP_NUMERIC double geluErfGrad(double X) {
  double Gauss;
  double Cdf = normalCdf(X, Gauss);
  return Cdf + X * (InvSqrt2Pi * Gauss);
}

/// tanh form: 0.5 x (1 + tanh u), u = sqrt(2 / pi) (x + 0.044715 x^3).
SP_NUMERIC double geluTanh(double X) {
  double U = Sqrt2OverPi * (X + GeluCoef * X * X * X);
  return 0.5 * X * onePlusTanh(U);
}

/// Its derivative: 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx.
SP_NUMERIC double geluTanhGrad(double X) {
  double U = Sqrt2OverPi * (X + GeluCoef * X * X * X);
  double P = onePlusTanh(U);    // 1 + tanh u
  double Sech2 = P * (2.0 - P); // 1 - tanh^2 u
  double DU = Sqrt2OverPi * (1.0 + 3 * GeluCoef * X * X);
  return 0.5 * P + 0.5 * X * Sech2 * DU;
}

/// The two forms as an activation's value and grad (below).
struct GeluErf {
  SP_NUMERIC static double value(double X) { return geluErf(X); }
  SP_NUMERIC static double grad(double X) { return geluErfGrad(X); }
};
struct GeluTanh {
  SP_NUMERIC static double value(double X) { return geluTanh(X); }
  SP_NUMERIC static double grad(double X) { return geluTanhGrad(X); }
};

//===----------------------------------------------------------------------===//
// Activations
//===----------------------------------------------------------------------===//
//
// One struct per SP_UNARY_OP of ir/Ops.def, named as its enumerator: value
// and grad (the derivative) of one element, in double. The CPU kernels
// (runtime/cpu/kernels/Activations.cpp) generate their dispatch from
// Ops.def over these; the CUDA kernels (Elementwise.cuh) call them too.

/// sigmoid(X) and 1 - sigmoid(X) in double, branch-free and without
/// cancellation: with E = exp(-|X|) (never overflows), they are 1 / (1 + E)
/// and E / (1 + E), swapped for X < 0.
SP_NUMERIC void sigmoidPair(double X, double &Sig, double &OneMinusSig) {
  double E = expD(X < 0.0 ? X : -X);
  double Inv = 1.0 / (1.0 + E);
  double Big = Inv, Small = E * Inv;
  Sig = X < 0.0 ? Small : Big;
  OneMinusSig = X < 0.0 ? Big : Small;
}

/// silu(x) = x sigmoid(x); silu'(x) = s (1 + x (1 - s)).
struct Silu {
  SP_NUMERIC static double value(double X) {
    double Sig, OneMinus;
    sigmoidPair(X, Sig, OneMinus);
    return X * Sig;
  }
  SP_NUMERIC static double grad(double X) {
    double Sig, OneMinus;
    sigmoidPair(X, Sig, OneMinus);
    return Sig * (1.0 + X * OneMinus);
  }
};

/// relu(x) = max(x, 0); relu'(x) = 1 for x > 0, else 0 (torch's choice at 0).
struct Relu {
  SP_NUMERIC static double value(double X) { return X > 0.0 ? X : 0.0; }
  SP_NUMERIC static double grad(double X) { return X > 0.0 ? 1.0 : 0.0; }
};

//===----------------------------------------------------------------------===//
// 16-bit storage
//===----------------------------------------------------------------------===//

/// float32 from 16-bit bits H (bfloat16 when Bf16, else half): exact.
/// Each case is computed and selected, so that the CPU's loops vectorise.
SP_NUMERIC float widenBits(uint32_t H, bool Bf16) {
  if (Bf16)
    return bitCast<float>(H << 16);
  uint32_t Sign = (H & 0x8000u) << 16, Exp = (H >> 10) & 0x1fu,
           Man = H & 0x3ffu;
  uint32_t Normal = Sign | (Exp + 127 - 15) << 23 | Man << 13;
  uint32_t Special = Sign | 0x7f800000u | Man << 13; // inf, nan
  // A subnormal (or zero) is Man 2^-24, exactly.
  uint32_t Sub = Sign | bitCast<uint32_t>(float(int32_t(Man)) * 0x1p-24f);
  return bitCast<float>(Exp == 0 ? Sub : Exp == 31 ? Special : Normal);
}

/// X rounded to nearest even as bfloat16 (Bf16) or half bits: a bfloat16
/// NaN stays quiet, a half overflows to infinity from 65520 up and a NaN is
/// 0x7e00.
SP_NUMERIC uint16_t narrowBits(float X, bool Bf16) {
  uint32_t B = bitCast<uint32_t>(X);
  if (Bf16) {
    uint32_t Rounded = (B + 0x7fffu + ((B >> 16) & 1)) >> 16;
    return uint16_t((B & 0x7fffffffu) > 0x7f800000u ? (B >> 16) | 0x40u
                                                     : Rounded);
  }
  uint32_t Sign = (B >> 16) & 0x8000u, Abs = B & 0x7fffffffu;
  uint32_t Normal = (Abs + 0xc8000fffu + ((Abs >> 13) & 1)) >> 13;
  // Adding 0.5 aligns a subnormal half's bits with the float's mantissa
  // and rounds to nearest even (on the device __fadd_rn: never contracted
  // or flushed).
#ifdef __CUDA_ARCH__
  float Half = __fadd_rn(bitCast<float>(Abs), 0.5f);
#else
  float Half = bitCast<float>(Abs) + 0.5f;
#endif
  uint32_t Sub = bitCast<uint32_t>(Half) - 0x3f000000u;
  uint32_t R = Abs < 0x38800000u ? Sub : Normal;
  R = Abs >= 0x477ff000u ? 0x7c00u : R;
  R = Abs >= 0x7f800000u ? (Abs > 0x7f800000u ? 0x7e00u : 0x7c00u) : R;
  return uint16_t(Sign | R);
}

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

/// The correctly rounded square root of a float or double: the device's
/// sqrtf or sqrt, the C library's on the host (an instruction with
/// -fno-math-errno).
template <typename T> SP_NUMERIC T sqrtOf(T X) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same_v<T, float>)
    return sqrtf(X);
  else
    return sqrt(X);
#else
  return std::sqrt(X);
#endif
}

/// torch's clip_grad_norm_ coefficient: max_norm / (total_norm + 1e-6),
/// i.e. (total_norm + 1e-6).reciprocal() * max_norm, clamped to at most 1.
template <typename T> SP_NUMERIC T clipCoefficient(T TotalNorm, T MaxNorm) {
  T Coef = (T(1) / (TotalNorm + T(1e-6))) * MaxNorm;
  return Coef < T(1) ? Coef : T(1);
}

/// The scalars of one AdamW step, in T.
template <typename T> struct AdamScalars {
  T Decay, B1, OneMinusB1, B2, OneMinusB2, StepSize, Bc2Sqrt, E, Scale;
};

/// AdamW's scalars at step Step (from 1), computed in double as torch
/// computes them in Python and rounded once to T; Scale multiplies the
/// gradient. pow is the C library's on the host and CUDA's on the device
/// (within 2 ulp of each other in double, far below float's resolution once
/// rounded).
template <typename T>
SP_NUMERIC AdamScalars<T> adamScalars(double Lr, double Step, double Beta1,
                                      double Beta2, double Eps,
                                      double WeightDecay, T Scale) {
#ifdef __CUDA_ARCH__
  const double Bc1 = 1.0 - pow(Beta1, Step);
  const double Bc2 = 1.0 - pow(Beta2, Step);
#else
  const double Bc1 = 1.0 - std::pow(Beta1, Step);
  const double Bc2 = 1.0 - std::pow(Beta2, Step);
#endif
  return {T(1.0 - Lr * WeightDecay), T(Beta1),
          T(1.0 - Beta1),            T(Beta2),
          T(1.0 - Beta2),            T(Lr / Bc1),
          T(sqrtOf(Bc2)),            T(Eps),
          Scale};
}

/// One element's AdamW update in T (torch's decoupled weight decay first):
///   g = G * Scale; P *= 1 - lr wd; M = b1 M + (1 - b1) g;
///   V = b2 V + (1 - b2) g g; P -= StepSize * (M / (sqrt(V) / Bc2Sqrt + eps))
template <typename T>
SP_NUMERIC void adamwElement(T &P, T G, T &M, T &V, const AdamScalars<T> &C) {
  T Grad = G * C.Scale;
  T PI = P * C.Decay;
  T MI = C.B1 * M + C.OneMinusB1 * Grad;
  T VI = C.B2 * V + C.OneMinusB2 * Grad * Grad;
  T Denom = sqrtOf(VI) / C.Bc2Sqrt + C.E;
  P = PI - C.StepSize * (MI / Denom);
  M = MI;
  V = VI;
}

} // namespace sp::numerics

#endif // SP_RUNTIME_NUMERICS_H
