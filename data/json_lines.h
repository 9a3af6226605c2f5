// The text of one JSON-lines record ({"text": "...", ...}), read with nlohmann-json's SAX interface: no
// document tree is built and only the wanted string is kept, so a record costs one pass over its bytes.
// Full JSON syntax is checked (nested values are skipped); \uXXXX escapes, surrogate pairs included,
// decode to UTF-8. Records that Python's json module writes from imperfect text still read: an escaped
// surrogate without its partner and ill-formed UTF-8 bytes become U+FFFD, as Python's "replace" does.
#pragma once
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace gpt {

struct JsonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The string value of top-level key `key` in the JSON object `line` (the first, if the key repeats).
// Throws JsonError saying what is wrong when `line` is not one JSON object, the key is absent, or its
// value is not a string.
std::string json_string_field(std::string_view line, const std::string& key);

// The message of an nlohmann-json exception without its "[json.exception.parse_error.101] parse error
// at line 1, column 7: " prefix (what is wrong, and the text last read); other exceptions' what().
std::string json_error_text(const std::exception& e);

}  // namespace gpt
