// The two 8-bit float formats of FP8 training (OCP FP8, as on Hopper and in Transformer Engine) and the
// conversion to them. E4M3 ("e4m3fn"): exponent bias 7, 3 mantissa bits, no infinities, 0x7F/0xFF NaN,
// largest finite 448, smallest subnormal 2^-9. E5M2: bias 15, 2 mantissa bits, IEEE-style infinities
// and NaNs, largest finite 57344, smallest subnormal 2^-16. Conversion from fp32 rounds to nearest with
// ties to the even code and saturates (cuda's __NV_SATFINITE, Transformer Engine's cast): finite values
// and infinities beyond the largest finite value become it, NaN stays NaN, -0 stays -0. Pure functions,
// the one definition of the formats for every backend.
#pragma once
#include <cstdint>
#include <string>

namespace gpt {

enum class Fp8Format { E4M3, E5M2 };

struct Fp8FormatInfo {
  int exponent_bits, mantissa_bits, bias;
  float max_finite;  // 448 (E4M3), 57344 (E5M2)
};
Fp8FormatInfo fp8_info(Fp8Format f);
const char* fp8_name(Fp8Format f);  // "e4m3" | "e5m2"

// The code of x: round to nearest even, saturating to +-max_finite; NaN -> 0x7F (sign kept).
uint8_t fp8_encode(float x, Fp8Format f);
// The value of a code (E5M2's 0x7C/0xFC are +-inf; NaN codes give NaN).
float fp8_decode(uint8_t code, Fp8Format f);
// fp8_decode(fp8_encode(x)): x rounded onto the format's grid, as an fp32 value (exact: every FP8 value is).
float fp8_round(float x, Fp8Format f);

}  // namespace gpt
