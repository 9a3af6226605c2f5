// GPT-2 byte-level BPE, as OpenAI's encoder.py and Megatron's GPT2BPETokenizer do it: the text is cut by
// the GPT-2 pre-tokenizer (implemented by hand over UTF-8, no regex engine), each piece's bytes are mapped
// to printable code points, and merges.txt pairs are applied lowest rank first, every occurrence of the
// chosen pair left to right, until no ranked pair remains. Results are cached per piece and per thread.
#include <atomic>
#include <cstring>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "data/gpt2_bpe.h"
#include "data/json_lines.h"
#include "data/tokenizer.h"
#include "data/unicode_class.h"

namespace gpt {

namespace {

struct Char {
  CharClass cls;
  int len;
};

Char char_at(std::string_view s, size_t i) {
  DecodedChar d = decode_utf8(s, i);
  return {classify(d.code_point), d.length};
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) starting at i, or 0.
size_t contraction_at(std::string_view s, size_t i) {
  if (s[i] != '\'' || i + 1 >= s.size()) return 0;
  char a = s[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 < s.size()) {
    char b = s[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

// End of the run of characters of class `cls` (or, for Other, of "not space/letter/number") from i.
size_t run_end(std::string_view s, size_t i, CharClass cls) {
  while (i < s.size()) {
    Char c = char_at(s, i);
    if (c.cls != cls) break;
    i += c.len;
  }
  return i;
}

}  // namespace

void gpt2_pretokenize(std::string_view s, const std::function<void(std::string_view)>& piece) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    if (size_t k = contraction_at(s, i)) {
      piece(s.substr(i, k));
      i += k;
      continue;
    }
    // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional single space, then a run of one class.
    size_t body = (s[i] == ' ' && i + 1 < n) ? i + 1 : i;
    Char first = char_at(s, body);
    if (first.cls != CharClass::Space) {
      size_t end = run_end(s, body, first.cls);
      piece(s.substr(i, end - i));
      i = end;
      continue;
    }
    // "\s+(?!\S)": the whitespace run minus its last character when a non-space follows (so that space
    // can lead the next word); "\s+" when that leaves nothing. Reached at whitespace, or at a space that
    // precedes whitespace.
    size_t end = run_end(s, i, CharClass::Space);
    if (end < n) {
      size_t last_start = i;
      for (size_t p = i; p < end; p += char_at(s, p).len) last_start = p;
      if (last_start > i) end = last_start;
    }
    piece(s.substr(i, end - i));
    i = end;
  }
}

const std::array<char32_t, 256>& gpt2_byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    int next = 0;
    for (int b = 0; b < 256; ++b) t[b] = printable[b] ? char32_t(b) : char32_t(256 + next++);
    return t;
  }();
  return table;
}

namespace {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  Gpt2Tokenizer(const std::string& vocab_path, const std::string& merges_path) {
    std::string vocab_text = read_file_bytes(vocab_path, "GPT-2 vocab file");
    std::string merges_text = read_file_bytes(merges_path, "GPT-2 merges file");
    hash_ = "fnv1a64:" + hex64(fnv1a64(merges_text, fnv1a64(vocab_text)));
    load_vocab(vocab_path, vocab_text);
    load_merges(merges_path, merges_text);
  }

  std::string name() const override { return "gpt2"; }
  std::string hash() const override { return hash_; }
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eod_id() const override { return eod_; }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    // Keyed by instance id, not address: a new tokenizer may be allocated where a freed one was.
    struct Cache {
      uint64_t owner = 0;
      std::unordered_map<std::string, std::vector<int32_t>> pieces;
    };
    thread_local Cache cache;
    if (cache.owner != instance_) {
      cache.pieces.clear();
      cache.owner = instance_;
    }
    gpt2_pretokenize(text, [&](std::string_view piece) {
      auto it = cache.pieces.find(std::string(piece));
      if (it == cache.pieces.end()) {
        if (cache.pieces.size() > (1u << 20)) cache.pieces.clear();
        it = cache.pieces.emplace(std::string(piece), bpe(piece)).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    });
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids)
      if (id >= 0 && id < int32_t(id_bytes_.size())) out += id_bytes_[id];
    return out;
  }

 private:
  // Symbols are ids; strings that merges build but the vocab lacks get ids past the vocabulary, and
  // reaching the output with one is an error (encoder.py raises KeyError there too).
  int32_t symbol_id(const std::string& s) {
    auto it = symbols_.find(s);
    if (it != symbols_.end()) return it->second;
    int32_t id = next_extra_++;
    symbols_.emplace(s, id);
    extra_strings_.push_back(s);
    return id;
  }

  void load_vocab(const std::string& path, const std::string& text) {
    // One object {"piece": id, ...}; a repeated piece keeps its last id, as Python's json.load does.
    nlohmann::json root;
    try {
      root = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw std::runtime_error("GPT-2 vocab file '" + path + "' is not a JSON object of token ids: " + json_error_text(e));
    }
    if (!root.is_object())
      throw std::runtime_error("GPT-2 vocab file '" + path + "' is not a JSON object of token ids");
    std::vector<std::pair<std::string, int64_t>> entries;
    entries.reserve(root.size());
    for (const auto& [piece, id] : root.items()) {
      if (!id.is_number_integer())
        throw std::runtime_error("GPT-2 vocab file '" + path + "': the id of '" + piece + "' is not an integer");
      entries.emplace_back(piece, id.get<int64_t>());
    }
    if (entries.empty()) throw std::runtime_error("GPT-2 vocab file '" + path + "' is empty");
    int64_t max_id = -1;
    for (auto& [s, id] : entries) {
      if (id < 0 || id >= (int64_t(1) << 31) - 1)
        throw std::runtime_error("GPT-2 vocab file '" + path + "': id " + std::to_string(id) + " is out of range");
      max_id = std::max(max_id, id);
    }
    vocab_size_ = max_id + 1;
    next_extra_ = int32_t(vocab_size_);
    id_bytes_.assign(vocab_size_, std::string());
    // Reverse of the byte -> code point map, to turn vocabulary strings back into bytes.
    std::unordered_map<char32_t, unsigned char> to_byte;
    for (int b = 0; b < 256; ++b) to_byte[gpt2_byte_to_unicode()[b]] = (unsigned char)b;
    for (auto& [s, id] : entries) {
      symbols_[s] = int32_t(id);
      std::string bytes;
      for (size_t p = 0; p < s.size();) {
        DecodedChar d = decode_utf8(s, p);
        auto it = to_byte.find(d.code_point);
        if (it != to_byte.end()) bytes += char(it->second);
        p += d.length;
      }
      id_bytes_[id] = s == "<|endoftext|>" ? std::string() : bytes;
    }
    auto eod = symbols_.find("<|endoftext|>");
    if (eod == symbols_.end())
      throw std::runtime_error("GPT-2 vocab file '" + path + "' has no <|endoftext|> token");
    eod_ = eod->second;
    for (int b = 0; b < 256; ++b) {
      std::string s;
      append_utf8(gpt2_byte_to_unicode()[b], s);
      auto it = symbols_.find(s);
      if (it == symbols_.end())
        throw std::runtime_error("GPT-2 vocab file '" + path + "' lacks the byte symbol for byte " + std::to_string(b) +
                                 " ('" + s + "'); is it a byte-level BPE vocabulary?");
      byte_id_[b] = it->second;
    }
  }

  void load_merges(const std::string& path, const std::string& text) {
    std::istringstream in(text);
    std::string line;
    int64_t line_no = 0;
    int32_t rank = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
      size_t sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() || line.find(' ', sp + 1) != std::string::npos)
        throw std::runtime_error("GPT-2 merges file '" + path + "' line " + std::to_string(line_no) +
                                 ": expected two space-separated symbols, got '" + line + "'");
      std::string a = line.substr(0, sp), b = line.substr(sp + 1);
      int32_t ia = symbol_id(a), ib = symbol_id(b), im = symbol_id(a + b);
      merges_[pair_key(ia, ib)] = {rank++, im};  // a repeated pair takes its later rank, as dict() does
    }
  }

  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  std::vector<int32_t> bpe(std::string_view piece) const {
    std::vector<int32_t> word;
    word.reserve(piece.size());
    for (unsigned char c : piece) word.push_back(byte_id_[c]);
    while (word.size() > 1) {
      int32_t best_rank = INT32_MAX, first = -1, second = -1, merged = -1;
      for (size_t i = 0; i + 1 < word.size(); ++i) {
        auto it = merges_.find(pair_key(word[i], word[i + 1]));
        if (it != merges_.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          first = word[i], second = word[i + 1], merged = it->second.second;
        }
      }
      if (merged < 0) break;
      size_t w = 0;
      for (size_t i = 0; i < word.size();) {
        if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
          word[w++] = merged;
          i += 2;
        } else {
          word[w++] = word[i++];
        }
      }
      word.resize(w);
    }
    for (int32_t id : word)
      if (id >= vocab_size_)
        throw std::runtime_error("GPT-2 BPE produced the symbol '" + extra_strings_[id - vocab_size_] +
                                 "', which the vocab file lacks");
    return word;
  }

  static inline std::atomic<uint64_t> next_instance_{1};
  const uint64_t instance_ = next_instance_++;
  std::string hash_;
  int64_t vocab_size_ = 0;
  int32_t eod_ = -1;
  int32_t next_extra_ = 0;
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<std::string, int32_t> symbols_;
  std::vector<std::string> extra_strings_;
  std::vector<std::string> id_bytes_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (a, b) -> (rank, merged symbol)
};

}  // namespace

std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& vocab_json, const std::string& merges_txt) {
  return std::make_unique<Gpt2Tokenizer>(vocab_json, merges_txt);
}

}  // namespace gpt
