// repair_utf8 (data/tokenizer.h): replaces ill-formed UTF-8 with U+FFFD, one replacement per maximal
// ill-formed subpart (the Unicode standard's "substitution of maximal subparts", which Python follows).
#include <cstdint>
#include <string>
#include <string_view>

#include "data/tokenizer.h"

namespace gpt {

std::string repair_utf8(std::string_view in) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(in.size());
  size_t i = 0;
  while (i < in.size()) {
    const auto b = static_cast<uint8_t>(in[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    // Length and the allowed range of the second byte (which rules out overlongs, surrogates and
    // code points past U+10FFFF).
    int len = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b == 0xE0) len = 3, lo = 0xA0;
    else if (b >= 0xE1 && b <= 0xEC) len = 3;
    else if (b == 0xED) len = 3, hi = 0x9F;
    else if (b >= 0xEE && b <= 0xEF) len = 3;
    else if (b == 0xF0) len = 4, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) len = 4;
    else if (b == 0xF4) len = 4, hi = 0x8F;
    if (len == 0) {  // a continuation byte or an invalid lead byte
      out += kReplacement;
      ++i;
      continue;
    }
    size_t n = 1;  // bytes of a well-formed prefix
    for (; n < static_cast<size_t>(len) && i + n < in.size(); ++n) {
      const auto c = static_cast<uint8_t>(in[i + n]);
      const uint8_t l = n == 1 ? lo : 0x80, h = n == 1 ? hi : 0xBF;
      if (c < l || c > h) break;
    }
    if (n == static_cast<size_t>(len)) out.append(in.substr(i, n));
    else out += kReplacement;
    i += n;
  }
  return out;
}

}  // namespace gpt
