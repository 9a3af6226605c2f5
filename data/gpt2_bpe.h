// GPT-2 byte-level BPE internals, exposed for tests: the pre-tokenizer that cuts text the way GPT-2's
// regex 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ does, and the
// byte -> printable-unicode map its vocab.json is written in. The tokenizer itself is make_gpt2_tokenizer.
#pragma once
#include <array>
#include <functional>
#include <string>
#include <string_view>

namespace gpt {

// Calls `piece` for each pre-token of `text` in order; the pieces concatenate back to `text`.
void gpt2_pretokenize(std::string_view text, const std::function<void(std::string_view)>& piece);

// bytes_to_unicode() of GPT-2's encoder.py: byte b -> one code point, printable bytes map to themselves.
const std::array<char32_t, 256>& gpt2_byte_to_unicode();

}  // namespace gpt
