// FP8 encode/decode (model/fp8.h): the value is rounded on the binade's grid with nearbyint (ties to
// even), then its code is assembled from the exponent and mantissa of the rounded value.
#include "model/fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gpt {

Fp8FormatInfo fp8_info(Fp8Format f) {
  return f == Fp8Format::E4M3 ? Fp8FormatInfo{4, 3, 7, 448.f} : Fp8FormatInfo{5, 2, 15, 57344.f};
}

const char* fp8_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

float fp8_round(float x, Fp8Format f) {
  if (std::isnan(x)) return x;
  const Fp8FormatInfo info = fp8_info(f);
  const float a = std::fabs(x);
  if (a >= info.max_finite) return std::copysign(info.max_finite, x);  // saturation (also +-inf)
  if (a == 0.f) return x;
  int e = 0;
  std::frexp(a, &e);                        // a = m * 2^e, m in [0.5, 1): the binade is 2^(e-1)
  const int min_normal_exp = 1 - info.bias;  // below it the grid spacing stays that of the subnormals
  const int binade = std::max(e - 1, min_normal_exp);
  const float quantum = std::ldexp(1.f, binade - info.mantissa_bits);
  const float r = std::nearbyint(a / quantum) * quantum;  // a / quantum is exact: quantum is a power of 2
  return std::copysign(std::min(r, info.max_finite), x);
}

uint8_t fp8_encode(float x, Fp8Format f) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const Fp8FormatInfo info = fp8_info(f);
  const float a = std::fabs(fp8_round(x, f));
  if (a == 0.f) return sign;
  int e = 0;
  const float m = std::frexp(a, &e);  // a = m * 2^e
  int biased = e - 1 + info.bias;
  int mantissa;
  if (biased <= 0) {  // subnormal: a = mantissa * 2^(1 - bias - mantissa_bits)
    biased = 0;
    mantissa = static_cast<int>(std::ldexp(a, info.bias - 1 + info.mantissa_bits));
  } else {
    mantissa = static_cast<int>(std::ldexp(m * 2.f - 1.f, info.mantissa_bits));
  }
  return sign | static_cast<uint8_t>((biased << info.mantissa_bits) | mantissa);
}

float fp8_decode(uint8_t code, Fp8Format f) {
  const Fp8FormatInfo info = fp8_info(f);
  const bool negative = code & 0x80;
  const int biased = (code & 0x7F) >> info.mantissa_bits;
  const int mantissa = code & ((1 << info.mantissa_bits) - 1);
  const int max_biased = (1 << info.exponent_bits) - 1;
  float v;
  if (f == Fp8Format::E4M3 && biased == max_biased && mantissa == (1 << info.mantissa_bits) - 1) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (f == Fp8Format::E5M2 && biased == max_biased) {
    v = mantissa == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (biased == 0) {
    v = std::ldexp(static_cast<float>(mantissa), 1 - info.bias - info.mantissa_bits);
  } else {
    v = std::ldexp(1.f + std::ldexp(static_cast<float>(mantissa), -info.mantissa_bits), biased - info.bias);
  }
  return negative ? -v : v;
}

}  // namespace gpt
