// A small recursive-descent JSON reader over a string_view: enough to pull one string field out of a
// JSON-lines record or an {string: int} object out of vocab.json, with errors that say what and where.
#include "data/json_text.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "data/unicode_class.h"

namespace gpt {

namespace {

class JsonCursor {
 public:
  explicit JsonCursor(std::string_view s) : s_(s) {}

  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool at_end() {
    skip_ws();
    return i_ >= s_.size();
  }
  char peek() {
    skip_ws();
    if (i_ >= s_.size()) fail("unexpected end of input");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  bool consume(char c) {
    if (peek() != c) return false;
    ++i_;
    return true;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw JsonError(what + " at byte " + std::to_string(i_));
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          char32_t cp = parse_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must be followed by an escaped low surrogate; a lone one becomes U+FFFD
            // (what Python's json + utf-8 "replace" produces for text files).
            if (i_ + 1 < s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
              size_t save = i_;
              i_ += 2;
              char32_t lo = parse_hex4();
              if (lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              } else {
                i_ = save;
                cp = 0xFFFD;
              }
            } else {
              cp = 0xFFFD;
            }
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            cp = 0xFFFD;
          }
          append_utf8(cp, out);
          break;
        }
        default: fail(std::string("invalid escape '\\") + e + "'");
      }
    }
  }

  int64_t parse_integer() {
    skip_ws();
    size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    if (i_ == start || (i_ == start + 1 && s_[start] == '-')) fail("expected an integer");
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) fail("expected an integer");
    return std::strtoll(std::string(s_.substr(start, i_ - start)).c_str(), nullptr, 10);
  }

  void skip_value(int depth = 0) {
    if (depth > 512) fail("nesting too deep");
    char c = peek();
    if (c == '"') {
      parse_string();
    } else if (c == '{') {
      ++i_;
      if (consume('}')) return;
      do {
        parse_string();
        expect(':');
        skip_value(depth + 1);
      } while (consume(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      if (consume(']')) return;
      do skip_value(depth + 1);
      while (consume(','));
      expect(']');
    } else if (c == 't') {
      literal("true");
    } else if (c == 'f') {
      literal("false");
    } else if (c == 'n') {
      literal("null");
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t start = i_;
      while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' || s_[i_] == '+' ||
                                s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E'))
        ++i_;
      if (i_ == start) fail("invalid number");
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
  }

 private:
  char32_t parse_hex4() {
    if (i_ + 4 > s_.size()) fail("truncated \\u escape");
    char32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char h = s_[i_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= h - '0';
      else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
      else fail("invalid \\u escape");
    }
    return v;
  }
  void literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) fail("invalid literal");
    i_ += word.size();
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

std::string json_string_field(std::string_view line, std::string_view key) {
  JsonCursor c(line);
  if (c.peek() != '{') c.fail("expected a JSON object");
  c.expect('{');
  std::string found;
  bool have = false;
  if (!c.consume('}')) {
    do {
      std::string k = c.parse_string();
      c.expect(':');
      if (!have && k == key) {
        if (c.peek() != '"') c.fail("field \"" + std::string(key) + "\" is not a string");
        found = c.parse_string();
        have = true;
      } else {
        c.skip_value();
      }
    } while (c.consume(','));
    c.expect('}');
  }
  if (!c.at_end()) c.fail("trailing characters after the JSON object");
  if (!have) throw JsonError("no \"" + std::string(key) + "\" field");
  return found;
}

std::vector<std::pair<std::string, int64_t>> json_int_object(std::string_view text) {
  JsonCursor c(text);
  std::vector<std::pair<std::string, int64_t>> out;
  c.expect('{');
  if (!c.consume('}')) {
    do {
      std::string k = c.parse_string();
      c.expect(':');
      out.emplace_back(std::move(k), c.parse_integer());
    } while (c.consume(','));
    c.expect('}');
  }
  if (!c.at_end()) c.fail("trailing characters after the JSON object");
  return out;
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

}  // namespace gpt
