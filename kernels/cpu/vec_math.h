// Branch-free f32 math the CPU kernels share (the losses in loss.cpp, the
// fused output layer in ffi_head.cpp, GELU in lm.cpp): libm's exp, log1p and
// tanh are scalar calls that stop the vectoriser, so these are polynomials,
// and edge cases are selects.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace pooch::kern {

// c ? a : b without a branch. GCC (trapping math) will not make float
// arithmetic that feeds only one arm of a ?: unconditional, so a plain ?:
// leaves a branch that blocks vectorisation; masks on the bits become vector
// and/or.
inline float select_f(bool c, float a, float b) {
  const uint32_t m = -static_cast<uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

// max(v, 0) that keeps a NaN (as torch's clamp does), as a select.
inline float max0(float v) {
  return select_f(v < 0.0f, 0.0f, v);
}

// e^x to about 2 ulp (Cephes' expf polynomial, range-reduced by ln 2).
// Below -87.3 the result would be subnormal and is flushed to 0; above 88 it
// is +inf (exactly so only from 88.72, but the kernels below never pass a
// finite argument above 0 unless the sum it feeds is already infinite). NaN
// runs through the arithmetic and comes out NaN.
inline float exp_f(float x) {
  constexpr float kLo = -87.33654f, kHi = 88.0f;
  // Clamped by masks too: with a ?: clamp GCC specialises the code below
  // for the clamped constants, and the branches it creates block vectorising.
  const float xc = select_f(x > kHi, kHi, select_f(x < kLo, kLo, x));
  // Round x/ln2 to the nearest integer k with the 1.5*2^23 trick: the sum's
  // low mantissa bits hold k, so no float-to-int conversion (undefined for
  // NaN) is needed.
  constexpr float kMagic = 12582912.0f;
  const float shifted = xc * 1.44269504088896341f + kMagic;
  const float k = shifted - kMagic;
  const int32_t ki = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kMagic);
  // r = x - k*ln2 in two parts, so r is exact enough for the polynomial.
  float r = xc - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^k as bits (unsigned, so a NaN's garbage exponent wraps rather than
  // overflows). Masks then make it 0 below the range, so p*2^k is 0, and
  // +inf above it; a NaN x fails both tests, and NaN * 0 is NaN.
  uint32_t bits = static_cast<uint32_t>(ki + 127) << 23;
  bits &= -static_cast<uint32_t>(x >= kLo);
  bits |= -static_cast<uint32_t>(x > kHi) & 0x7F800000u;
  return p * std::bit_cast<float>(bits);
}

// log(1 + y) for y in [0, 1], the only range the kernels need (y = e^-|x|):
// 2*atanh(s) with s = y/(2+y) <= 1/3, whose odd series in s converges fast;
// unlike log(1 + y) it keeps full relative precision for tiny y.
inline float log1p_unit(float y) {
  const float s = y / (2.0f + y);
  const float z = s * s;
  float p = 1.0f / 13.0f;
  p = p * z + 1.0f / 11.0f;
  p = p * z + 1.0f / 9.0f;
  p = p * z + 1.0f / 7.0f;
  p = p * z + 1.0f / 5.0f;
  p = p * z + 1.0f / 3.0f;
  p = p * z + 1.0f;
  return 2.0f * s * p;
}

// sigma(x) from e^-|x| <= 1, which cannot overflow; a select picks the side.
inline float sigmoid_f(float x) {
  const float e = exp_f(-std::fabs(x));
  const float d = 1.0f / (1.0f + e);
  return select_f(x >= 0.0f, d, e * d);
}

}  // namespace pooch::kern
