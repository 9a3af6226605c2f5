// Tokenizer: text -> token ids, as used by `gpt-train prep`. Three kinds: raw bytes, GPT-2 byte-level
// BPE from a vocab.json + merges.txt pair, and a SentencePiece BPE model (loaded, or trained on the
// corpus). Every tokenizer names itself and carries a content hash; both are written into each shard so a
// training run can refuse data made with a different tokenizer than its config expects.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gpt {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;  // "bytes", "gpt2", "spm"
  // Identifies the exact vocabulary: "bytes", or "fnv1a64:<16 hex digits>" of the files that define it.
  virtual std::string hash() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t eod_id() const = 0;  // end-of-document token, appended after every document
  // Appends the ids of `text` to `out` (no end-of-document token). Thread-safe.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;

  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> ids;
    encode(text, ids);
    return ids;
  }
};

// Raw UTF-8 bytes: ids 0..255 are the bytes, 256 is end-of-document, vocabulary 257.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// GPT-2 byte-level BPE (the encoder of OpenAI's GPT-2 and Megatron's GPT2BPETokenizer): vocab.json maps
// byte-level unicode strings to ids, merges.txt ranks the merges. End-of-document is <|endoftext|>.
// Throws std::runtime_error naming the file when either is missing or malformed.
std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& vocab_json, const std::string& merges_txt);

// SentencePiece model file (.model). End-of-document is the model's </s> (eos) piece.
std::unique_ptr<Tokenizer> make_spm_tokenizer(const std::string& model_file);

// Trains a SentencePiece BPE model with byte fallback on `sentences` (pieces of the corpus) and writes it
// to `model_file` atomically. `vocab_size` counts every piece, including the 256 byte pieces and the
// <unk>, <s>, </s> control pieces.
void train_spm_model(const std::vector<std::string>& sentences, int64_t vocab_size, int threads,
                     const std::string& model_file);

// `bytes` as valid UTF-8: every byte sequence that is not well-formed UTF-8 (a stray continuation byte,
// a truncated or overlong sequence, a surrogate, a code point past U+10FFFF) becomes U+FFFD, as Python's
// bytes.decode(errors="replace") does. Decoded model output may be any bytes.
std::string repair_utf8(std::string_view bytes);

// 64-bit FNV-1a, the hash behind Tokenizer::hash(). `h` chains several buffers.
uint64_t fnv1a64(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ull);
std::string hex64(uint64_t v);
// Whole file contents; throws std::runtime_error naming `what` and the path when it cannot be read.
std::string read_file_bytes(const std::string& path, const std::string& what);

}  // namespace gpt
