// A corpus made of token shards: shard files and/or prefixes written by `gpt-train prep` (P resolves
// through P.index.json to P_00000.h5, P_00001.h5, ...), concatenated in the order given into one list of
// documents. Shards are opened once per process and shared; all must agree on the tokenizer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/token_shard.h"

namespace gpt {

// One shard as listed in a prefix's index file.
struct ShardIndexEntry {
  std::string file;  // relative to the index file's directory
  int64_t num_docs = 0;
  int64_t num_tokens = 0;
};

struct ShardIndex {
  int64_t format_version = kShardFormatVersion;
  std::string tokenizer, tokenizer_hash;
  int64_t vocab_size = 0, eod_id = -1;
  int64_t num_docs = 0, num_tokens = 0;
  double unigram_perplexity = 0;  // exp(entropy of the corpus token frequencies): the no-context baseline
  std::vector<ShardIndexEntry> shards;
};

std::string shard_index_path(const std::string& prefix);  // P.index.json
std::string shard_file_name(const std::string& prefix, int64_t k);  // P_0000k.h5
// Written atomically (tmp + rename).
void write_shard_index(const std::string& prefix, const ShardIndex& index);
// Throws std::runtime_error naming the file when missing or malformed.
ShardIndex read_shard_index(const std::string& prefix);

// Shard paths of one entry: the file itself when it ends in .h5, else the shards of prefix `entry`.
std::vector<std::string> resolve_shards(const std::string& entry);

// Opens `path` or returns the reader already open for it in this process.
std::shared_ptr<const TokenShardReader> open_shard(const std::string& path);

class ShardCorpus {
 public:
  explicit ShardCorpus(const std::vector<std::string>& entries);

  int64_t num_docs() const { return first_doc_.back(); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t doc_length(int64_t doc) const;
  // Tokens [offset, offset + count) of document `doc`.
  void read_doc(int64_t doc, int64_t offset, int64_t count, int32_t* out) const;
  const ShardMeta& meta() const { return shards_.front()->meta(); }  // tokenizer, vocab, eod of every shard
  const std::string& name() const { return name_; }
  size_t num_shards() const { return shards_.size(); }

 private:
  std::pair<size_t, int64_t> locate(int64_t doc) const;  // (shard, document within it)
  std::string name_;
  std::vector<std::shared_ptr<const TokenShardReader>> shards_;
  std::vector<int64_t> first_doc_;  // first global document of each shard, plus the total
  int64_t num_tokens_ = 0;
};

}  // namespace gpt
