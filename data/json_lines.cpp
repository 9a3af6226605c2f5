// One string field out of a JSON-lines record through nlohmann-json's SAX parser (see json_lines.h). A
// record that the strict parser refuses only for a lone surrogate escape or ill-formed UTF-8 is read a
// second time with those replaced by U+FFFD (ill-formed bytes as data/utf8_repair does it); every other
// error is reported as the parser found it.
#include "data/json_lines.h"

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"

namespace gpt {

namespace {

using nlohmann::json;

// Keeps the value of one top-level key and checks that the record is an object and the value a string.
// Returning false stops the parse; `error` then says why.
class FieldPicker {
 public:
  FieldPicker(const std::string& key, std::string& out) : key_(key), out_(out) {}

  bool null() { return value("null"); }
  bool boolean(bool) { return value("a boolean"); }
  bool number_integer(json::number_integer_t) { return value("a number"); }
  bool number_unsigned(json::number_unsigned_t) { return value("a number"); }
  bool number_float(json::number_float_t, const json::string_t&) { return value("a number"); }
  bool binary(json::binary_t&) { return value("binary data"); }
  bool string(json::string_t& text) {
    if (!value("")) return false;
    if (picking_) {
      out_ = std::move(text);
      found_ = true;
      picking_ = false;
    }
    return true;
  }
  bool start_object(std::size_t) {
    if (depth_ > 0 && !value("an object")) return false;
    ++depth_;
    return true;
  }
  bool key(json::string_t& name) {
    picking_ = depth_ == 1 && !found_ && name == key_;
    return true;
  }
  bool end_object() {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) {
    if (!value("an array")) return false;
    ++depth_;
    return true;
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t byte, const std::string&, const nlohmann::detail::exception& e) {
    error = json_error_text(e) + " (at byte " + std::to_string(byte) + ")";
    syntax_error = true;
    return false;
  }

  bool found() const { return found_; }
  std::string error;
  bool syntax_error = false;

 private:
  // A value of kind `what` ("" for a string) starts: refused at the top level, or where the key's value
  // must be a string.
  bool value(const char* what) {
    if (depth_ == 0) {
      error = "expected a JSON object";
      return false;
    }
    if (picking_ && *what) {
      error = "field \"" + key_ + "\" is not a string but " + what;
      return false;
    }
    return true;
  }

  const std::string& key_;
  std::string& out_;
  int depth_ = 0;
  bool picking_ = false, found_ = false;
};

// `line` with each \uXXXX escape of an unpaired surrogate replaced by \ufffd and each ill-formed UTF-8
// sequence by U+FFFD (repair_utf8); valid text is copied unchanged.
std::string replace_unreadable(std::string_view line) {
  auto hex4 = [&](size_t pos, char32_t& v) {
    if (pos + 4 > line.size()) return false;
    v = 0;
    for (size_t k = pos; k < pos + 4; ++k) {
      const char h = line[k];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= char32_t(h - '0');
      else if (h >= 'a' && h <= 'f') v |= char32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= char32_t(h - 'A' + 10);
      else return false;
    }
    return true;
  };
  std::string out;
  out.reserve(line.size());
  for (size_t i = 0; i < line.size();) {
    char32_t v = 0, low = 0;
    if (line[i] != '\\' || i + 1 == line.size()) {
      out += line[i++];
    } else if (line[i + 1] != 'u' || !hex4(i + 2, v)) {  // another escape, or one the parser will refuse
      out.append(line.substr(i, 2));
      i += 2;
    } else if (v >= 0xD800 && v <= 0xDBFF && i + 7 < line.size() && line[i + 6] == '\\' && line[i + 7] == 'u' &&
               hex4(i + 8, low) && low >= 0xDC00 && low <= 0xDFFF) {
      out.append(line.substr(i, 12));  // a surrogate pair
      i += 12;
    } else {
      out.append(v >= 0xD800 && v <= 0xDFFF ? std::string_view("\\ufffd") : line.substr(i, 6));
      i += 6;
    }
  }
  return repair_utf8(out);
}

// One strict parse; false with `picker.error` set when the record is refused.
bool pick(std::string_view line, FieldPicker& picker) {
  return json::sax_parse(line.begin(), line.end(), &picker, json::input_format_t::json, true);
}

}  // namespace

std::string json_error_text(const std::exception& e) {
  std::string text = e.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    const size_t tag_end = text.find("] ");
    if (tag_end != std::string::npos) text.erase(0, tag_end + 2);
  }
  // "parse error at line 1, column 7: syntax error ..." -> "syntax error ..."
  if (text.rfind("parse error at line ", 0) == 0) {
    const size_t colon = text.find(": ");
    if (colon != std::string::npos) text.erase(0, colon + 2);
  }
  return text;
}

std::string json_string_field(std::string_view line, const std::string& key) {
  std::string text;
  FieldPicker picker(key, text);
  if (!pick(line, picker)) {
    if (!picker.syntax_error) throw JsonError(picker.error);
    // Refused by the strict parser: read again with the text Python would have given, if that differs.
    const std::string repaired = replace_unreadable(line);
    if (repaired == line) throw JsonError(picker.error);
    FieldPicker again(key, text);
    if (!pick(repaired, again)) throw JsonError(again.syntax_error ? picker.error : again.error);
    if (!again.found()) throw JsonError("no \"" + key + "\" field");
    return text;
  }
  if (!picker.found()) throw JsonError("no \"" + key + "\" field");
  return text;
}

}  // namespace gpt
