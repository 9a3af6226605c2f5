// Branch-free exp and tanh for the CPU kernels. std::exp / std::tanh do not vectorise without -ffast-math,
// and softmax, cross-entropy and GELU spend most of their time in them, so these use the Cephes expf
// reduction and polynomial (about 1 ulp over the normal range) written so loops calling them vectorise.
// fast_exp flushes results below ~2^-125 to zero, returns +inf above the fp32 range and passes NaN through.
// max_of is the row maximum of softmax and cross-entropy, written so that it vectorises too.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace gpt::cpu {

inline float fast_exp(float x) {
  constexpr float kLo = -86.6f;  // below this, 2^n would need a subnormal exponent
  constexpr float kHi = 88.72283935546875f;
  // Clamp with plain compares (they vectorise); NaN is replaced by 0 here and passed through at the end.
  float xc = x < kLo ? kLo : x;
  xc = xc > kHi ? kHi : xc;
  xc = x != x ? 0.0f : xc;
  // exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 split in two constants (Cody-Waite).
  // Round to nearest by adding and removing 1.5 * 2^23 (std::floor does not vectorise here).
  constexpr float kRound = 12582912.0f;
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n built as 2^(n-1) * 2 so n = 128 (x just below the overflow limit) stays representable.
  const int32_t bits = (static_cast<int32_t>(n) + 126) << 23;
  const float result = p * std::bit_cast<float>(bits) * 2.0f;
  const float high = x > kHi ? std::numeric_limits<float>::infinity() : result;
  const float low = x < kLo ? 0.0f : high;
  return x != x ? x : low;
}

// tanh(u) = 1 - 2 / (exp(2u) + 1); absolute error about 1e-7, saturates cleanly to +-1.
// The largest of init and x[0..n), skipping NaNs (as std::max(mx, x) does). A compare-select reduction:
// GCC keeps `std::max` in a max reduction scalar without -ffast-math (one 4-cycle vmaxss per element),
// but vectorises this form.
inline float max_of(const float* x, int64_t n, float init) {
  float mx = init;
#pragma omp simd reduction(max : mx)
  for (int64_t c = 0; c < n; ++c) mx = x[c] > mx ? x[c] : mx;
  return mx;
}

inline float fast_tanh(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }

}  // namespace gpt::cpu
