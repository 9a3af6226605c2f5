// UTF-8 decoding and the three Unicode character classes the GPT-2 pre-tokenizer needs (letters \p{L},
// numbers \p{N}, whitespace \s). Invalid UTF-8 never throws: each bad byte decodes as one code point of
// class Other, so byte-level tokenizers still see (and round-trip) every input byte.
#pragma once
#include <cstdint>
#include <string_view>

namespace gpt {

enum class CharClass : uint8_t { Letter, Number, Space, Other };

struct DecodedChar {
  char32_t code_point;  // 0xFFFD for an invalid byte
  int length;           // bytes consumed, 1..4
};

// Decodes the character starting at text[pos] (pos < text.size()). Rejects overlong forms, surrogates
// and code points above U+10FFFF by consuming a single byte.
DecodedChar decode_utf8(std::string_view text, size_t pos);

CharClass classify(char32_t code_point);

// Appends the UTF-8 encoding of `code_point` (<= U+10FFFF) to `out`.
void append_utf8(char32_t code_point, std::string& out);

}  // namespace gpt
