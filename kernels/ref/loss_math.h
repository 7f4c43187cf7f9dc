// The per-logit loss formulas the reference kernels share (loss.cpp and the
// fused output layer, ffi_head.cpp), in double.
#pragma once
#include <algorithm>
#include <cmath>

namespace pooch::kern::refmath {

// Only e^-|x| <= 1 is ever formed, and the part that grows with |x|,
// max(x,0) - x*t, needs no exponential: accurate for logits of any magnitude.
inline double bce_term(double x, double t) {
  return std::max(x, 0.0) - x * t + std::log1p(std::exp(-std::fabs(x)));
}

// sigma(x) from the side where the exponential cannot overflow.
inline double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  double e = std::exp(x);
  return e / (1.0 + e);
}

// max(1 - s*x, 0) with the operands in the order that keeps a NaN, as
// torch's clamp does.
inline double hinge_margin(double x, double t) {
  double s = 2.0 * t - 1.0;
  return std::max(1.0 - s * x, 0.0);
}

}  // namespace pooch::kern::refmath
