// The raw-byte tokenizer (ids 0..255 = bytes, 256 = end of document) and the small helpers every
// tokenizer shares: FNV-1a content hashes and whole-file reads with errors that name the file.
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "data/tokenizer.h"

namespace gpt {

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "bytes"; }
  std::string hash() const override { return "bytes"; }
  int64_t vocab_size() const override { return 257; }
  int64_t eod_id() const override { return 256; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    out.reserve(out.size() + text.size());
    for (unsigned char c : text) out.push_back(c);
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t id : ids)
      if (id >= 0 && id < 256) s += char(id);
    return s;
  }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = digits[v & 15];
  return s;
}

std::string read_file_bytes(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(what + " '" + path + "' cannot be opened");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw std::runtime_error(what + " '" + path + "' could not be read");
  return ss.str();
}

}  // namespace gpt
