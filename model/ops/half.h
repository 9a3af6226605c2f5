// Scalar conversions between fp32 and the two 16-bit float formats the backends store (bf16 and IEEE fp16,
// both held as raw uint16 bits). Rounding is round-to-nearest-even, like the hardware converters and
// PyTorch; NaN stays NaN (quietened, sign kept), infinities stay infinite, fp32 values too large for fp16
// become +-inf and values too small become fp16 subnormals or signed zero. Header-only so kernels inline them.
#pragma once
#include <bit>
#include <cstdint>

namespace gpt {

inline float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t fp32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  // NaN: truncating could clear every mantissa bit and turn it into Inf, so force the quiet bit.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds half-way cases to the even neighbour; a carry into the
  // exponent is the correct result (including rounding up to Inf past the largest finite bf16).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  if (exp == 0) {
    // Zero or subnormal: value = mant * 2^-24, exact in fp32.
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((ax >> 13) & 0x3ffu);  // quiet NaN
  // 65520 is half-way between 65504 (largest fp16, odd mantissa) and 65536, so it and everything above
  // rounds to Inf.
  if (ax >= 0x477ff000u) return sign | 0x7c00u;
  if (ax < 0x38800000u) {
    // Below the smallest normal fp16 (2^-14): result is mant * 2^-24 with the rounding done by hand.
    const int biased = static_cast<int>(ax >> 23);
    const int shift = 126 - biased;  // >= 14
    if (shift > 24) return sign;     // below 2^-25: rounds to zero
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // q == 0x400 is the smallest normal: correct
    return sign | static_cast<uint16_t>(q);
  }
  // Normal range: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  ax += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + ((ax >> 13) & 1u);
  return sign | static_cast<uint16_t>(ax >> 13);
}

}  // namespace gpt
