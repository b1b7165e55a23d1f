// The scalar functions of the generic elementwise kernels (Kernels::unary_forward, binary_forward),
// one definition for the reference (in double) and the CUDA kernels (in float).
#pragma once

#include <math.h>  // the unqualified overloads: ::exp(double) on the host, exp(float) on the device

#include "nn/broadcast.h"  // AB_HOST_DEVICE
#include "nn/kernels.h"

namespace ab::nn {

template <typename T>
AB_HOST_DEVICE inline T clamp01(T v) {
  return v < T(0) ? T(0) : (v > T(1) ? T(1) : v);
}

template <typename T>
AB_HOST_DEVICE inline T unary_apply(UnaryKind kind, T alpha, T beta, T x) {
  constexpr T kInvSqrt2 = T(0.70710678118654752440), kSqrt2OverPi = T(0.79788456080286535588);
  switch (kind) {
    case UnaryKind::sigmoid: return T(1) / (T(1) + exp(-x));
    case UnaryKind::hard_sigmoid: return clamp01(alpha * x + beta);
    case UnaryKind::hard_swish: return x * clamp01(x / T(6) + T(0.5));
    case UnaryKind::silu: return x / (T(1) + exp(-x));
    case UnaryKind::leaky_relu: return x < T(0) ? alpha * x : x;
    case UnaryKind::clip: return x < alpha ? alpha : (x > beta ? beta : x);
    case UnaryKind::erf: return erf(x);
    case UnaryKind::gelu_erf: return T(0.5) * x * (T(1) + erf(x * kInvSqrt2));
    case UnaryKind::gelu_tanh: return T(0.5) * x * (T(1) + tanh(kSqrt2OverPi * (x + T(0.044715) * x * x * x)));
    case UnaryKind::sqrt: return sqrt(x);
    case UnaryKind::exp: return exp(x);
    case UnaryKind::tanh: return tanh(x);
    case UnaryKind::neg: return -x;
    case UnaryKind::abs: return fabs(x);
    case UnaryKind::reciprocal: return T(1) / x;
  }
  return x;
}

template <typename T>
AB_HOST_DEVICE inline T binary_apply(BinaryKind kind, T a, T b) {
  switch (kind) {
    case BinaryKind::add: return a + b;
    case BinaryKind::sub: return a - b;
    case BinaryKind::mul: return a * b;
    case BinaryKind::div: return a / b;
    case BinaryKind::pow: return pow(a, b);
    case BinaryKind::max: return (a != a || b != b) ? a + b : (a > b ? a : b);  // NaN from either operand
    case BinaryKind::min: return (a != a || b != b) ? a + b : (a < b ? a : b);
  }
  return a;
}

// Arithmetic operations per element, for the ops' FLOP counts (docs/ENGINE.md): a transcendental
// (exp, erf, tanh, sqrt, pow) counts as one.
inline std::int64_t unary_flops_per_element(UnaryKind kind) {
  switch (kind) {
    case UnaryKind::sigmoid: return 3;       // exp, add, divide (the negation folds)
    case UnaryKind::hard_sigmoid: return 4;  // multiply, add, two clamps
    case UnaryKind::hard_swish: return 5;    // divide, add, two clamps, multiply
    case UnaryKind::silu: return 3;          // exp, add, divide
    case UnaryKind::leaky_relu: return 2;    // compare, multiply
    case UnaryKind::clip: return 2;          // two compares
    case UnaryKind::gelu_erf: return 5;      // multiply, erf, add, two multiplies
    case UnaryKind::gelu_tanh: return 8;     // as the gelu op counts it
    default: return 1;
  }
}

}  // namespace ab::nn
