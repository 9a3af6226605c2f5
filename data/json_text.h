// The little JSON that data preparation needs, parsed by hand: the string field of a JSON-lines record
// ({"text": "...", ...}) and the flat {"piece": id, ...} object of a GPT-2 vocab.json. Full JSON syntax is
// accepted (nested values are skipped); \uXXXX escapes, surrogate pairs included, decode to UTF-8.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpt {

struct JsonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The string value of top-level key `key` in the JSON object `line`. Throws JsonError when `line` is not
// one JSON object, the key is absent, or its value is not a string.
std::string json_string_field(std::string_view line, std::string_view key);

// All members of a JSON object whose values are integers, in file order. Throws JsonError otherwise.
std::vector<std::pair<std::string, int64_t>> json_int_object(std::string_view text);

// `s` as a JSON string literal, quotes included (for writing index files).
std::string json_quote(std::string_view s);

}  // namespace gpt
