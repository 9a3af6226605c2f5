// Shard set output (see shard_set_writer.h): documents buffered until a shard is full, each shard written
// atomically by write_token_shard, the index written last.
#include "data/shard_set_writer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include "data/token_shard.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

// Shards P_NNNNN.h5 left from an earlier run beyond the ones this run wrote.
void remove_stale_shards(const std::string& prefix, size_t written) {
  fs::path p(prefix);
  fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string base = p.filename().string();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.size() != base.size() + 9 || name.compare(0, base.size(), base) != 0 || name[base.size()] != '_' ||
        name.compare(name.size() - 3, 3, ".h5") != 0)
      continue;
    std::string digits = name.substr(base.size() + 1, 5);
    if (!std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    if (size_t(std::stoll(digits)) >= written) fs::remove(e.path(), ec);
  }
}

}  // namespace

int64_t shard_tokens_for(int64_t shard_tokens, double shard_mb, int64_t vocab_size) {
  if (shard_tokens > 0) return shard_tokens;
  const int64_t token_bytes = vocab_size <= 65535 ? 2 : 4;
  return std::max<int64_t>(1, int64_t(shard_mb * 1048576.0) / token_bytes);
}

ShardSetWriter::ShardSetWriter(const std::string& prefix, const Tokenizer& tok, int64_t shard_tokens)
    : prefix_(prefix), shard_tokens_(shard_tokens), counts_(size_t(tok.vocab_size()), 0) {
  meta_.vocab_size = tok.vocab_size();
  meta_.eod_id = tok.eod_id();
  meta_.tokenizer = tok.name();
  meta_.tokenizer_hash = tok.hash();
  // Address space only until written; saves the copies of growing a vector to a shard's size.
  tokens_.reserve(size_t(std::min<int64_t>(shard_tokens, int64_t(1) << 30)));
  offsets_.push_back(0);
  fs::path out_dir = fs::path(prefix).parent_path();
  std::error_code ec;
  if (!out_dir.empty()) fs::create_directories(out_dir, ec);
  fs::remove(shard_index_path(prefix), ec);  // the old index would describe shards we overwrite
}

void ShardSetWriter::add(std::span<const int32_t> doc) {
  for (int32_t id : doc) {
    tokens_.push_back(uint32_t(id));
    ++counts_[size_t(id)];
  }
  offsets_.push_back(tokens_.size());
  ++docs_;
  total_tokens_ += int64_t(doc.size());
  if (int64_t(tokens_.size()) >= shard_tokens_) flush();
}

void ShardSetWriter::flush() {
  if (tokens_.empty()) return;
  std::string path = shard_file_name(prefix_, int64_t(index_.shards.size()));
  try {
    write_token_shard(path, tokens_, offsets_, meta_);
  } catch (...) {
    std::error_code ec;
    fs::remove(path + ".tmp", ec);
    throw;
  }
  index_.shards.push_back({fs::path(path).filename().string(), int64_t(offsets_.size() - 1), int64_t(tokens_.size())});
  paths_.push_back(path);
  tokens_.clear();
  offsets_.assign(1, 0);
}

ShardIndex ShardSetWriter::finish() {
  flush();
  index_.tokenizer = meta_.tokenizer;
  index_.tokenizer_hash = meta_.tokenizer_hash;
  index_.vocab_size = meta_.vocab_size;
  index_.eod_id = meta_.eod_id;
  index_.num_docs = docs_;
  index_.num_tokens = total_tokens_;
  double h = 0;
  for (uint64_t c : counts_)
    if (c) {
      double p = double(c) / double(total_tokens_);
      h -= p * std::log(p);
    }
  index_.unigram_perplexity = std::exp(h);
  write_shard_index(prefix_, index_);
  remove_stale_shards(prefix_, paths_.size());
  return index_;
}

}  // namespace gpt
