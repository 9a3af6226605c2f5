// One HDF5 token shard (format in docs/data-format.md): a 1-D "tokens" dataset (uint16 when the
// vocabulary has at most 65535 ids, else uint32; chunked and checksummed so a reader can fetch any
// hyperslab), "doc_offsets" (uint64, n_docs + 1 entries, document d is tokens[offsets[d], offsets[d+1])
// and ends with the end-of-document id), and attributes naming the tokenizer. The reader validates
// everything at open and every token it reads, throwing std::runtime_error naming the file.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace gpt {

constexpr int kShardFormatVersion = 1;

struct ShardMeta {
  int64_t format_version = kShardFormatVersion;
  int64_t vocab_size = 0;
  int64_t eod_id = -1;
  int64_t max_token_id = -1;
  std::string tokenizer;       // "bytes", "gpt2", "spm"
  std::string tokenizer_hash;  // see Tokenizer::hash()
  int64_t num_tokens = 0;
  int64_t num_docs = 0;
  int token_bits = 16;  // width of the stored ids
};

// Writes a shard atomically: to `path`.tmp, flushed to disk, then renamed over `path`. `doc_offsets`
// has n_docs + 1 entries from 0 to tokens.size(). meta.vocab_size / eod_id / tokenizer* are taken from
// `meta`; the counts, max_token_id and token_bits are computed here.
void write_token_shard(const std::string& path, std::span<const uint32_t> tokens,
                       std::span<const uint64_t> doc_offsets, const ShardMeta& meta);

class TokenShardReader {
 public:
  // Opens and validates the shard (attributes, dataset types and shapes, document offsets). Reads only
  // metadata and doc_offsets; tokens stay on disk until read().
  explicit TokenShardReader(const std::string& path);
  ~TokenShardReader();
  TokenShardReader(const TokenShardReader&) = delete;
  TokenShardReader& operator=(const TokenShardReader&) = delete;

  const std::string& path() const { return path_; }
  const ShardMeta& meta() const { return meta_; }
  const std::vector<uint64_t>& doc_offsets() const { return offsets_; }

  // Copies tokens [begin, begin + count) into `out` (one HDF5 hyperslab read). Throws when the range is
  // outside the shard, the read fails (e.g. a checksum mismatch) or an id is >= the shard's vocab_size.
  void read(int64_t begin, int64_t count, int32_t* out) const;

 private:
  struct Handles;
  void open();
  std::string path_;
  ShardMeta meta_;
  std::vector<uint64_t> offsets_;
  std::unique_ptr<Handles> h_;
};

}  // namespace gpt
