// Writing one shard set, the output of `gpt-train prep` whatever its input: documents (token ids ending
// with the end-of-document id) go, in the order given, into shards P_00000.h5, P_00001.h5, ... of about
// `shard_tokens` ids each (a shard closes at the first document boundary past that size); finish() then
// writes the index P.index.json and removes higher-numbered shards left by earlier runs. Construction
// creates the output directory and deletes an old index first, so a run that fails leaves no index; a
// shard whose write fails leaves no temporary file behind.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/shard_set.h"
#include "data/tokenizer.h"

namespace gpt {

// Ids per shard: `shard_tokens` when positive, else `shard_mb` megabytes of stored ids (2 bytes each
// for vocabularies up to 65535 ids, else 4).
int64_t shard_tokens_for(int64_t shard_tokens, double shard_mb, int64_t vocab_size);

class ShardSetWriter {
 public:
  ShardSetWriter(const std::string& prefix, const Tokenizer& tokenizer, int64_t shard_tokens);

  // Appends one document; every id must be in [0, the tokenizer's vocabulary size).
  void add(std::span<const int32_t> doc);
  // Writes the last shard and the index, removes stale shards; returns the index written. Call it only
  // when at least one document was added.
  ShardIndex finish();

  int64_t docs() const { return docs_; }
  int64_t tokens() const { return total_tokens_; }
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  void flush();
  std::string prefix_;
  int64_t shard_tokens_;
  ShardMeta meta_;
  std::vector<uint32_t> tokens_;
  std::vector<uint64_t> offsets_;
  std::vector<uint64_t> counts_;  // of every id over the whole set, for the unigram perplexity
  int64_t docs_ = 0, total_tokens_ = 0;
  ShardIndex index_;
  std::vector<std::string> paths_;
};

}  // namespace gpt
