// Shard index files (P.index.json), prefix resolution, the per-process cache of open shards, and the
// document table of a corpus spread over many shards. The index records each shard's counts so a shard
// replaced or lost after `prep` is reported instead of silently changing the data.
#include "data/shard_set.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "data/json_lines.h"

namespace gpt {

namespace fs = std::filesystem;

std::string shard_index_path(const std::string& prefix) { return prefix + ".index.json"; }

std::string shard_file_name(const std::string& prefix, int64_t k) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "_%05lld.h5", static_cast<long long>(k));
  return prefix + buf;
}

void write_shard_index(const std::string& prefix, const ShardIndex& ix) {
  nlohmann::ordered_json o;
  o["format_version"] = ix.format_version;
  o["tokenizer"] = ix.tokenizer;
  o["tokenizer_hash"] = ix.tokenizer_hash;
  o["vocab_size"] = ix.vocab_size;
  o["eod_id"] = ix.eod_id;
  o["num_docs"] = ix.num_docs;
  o["num_tokens"] = ix.num_tokens;
  o["unigram_perplexity"] = ix.unigram_perplexity;
  o["shards"] = nlohmann::ordered_json::array();
  for (const ShardIndexEntry& s : ix.shards)
    o["shards"].push_back({{"file", s.file}, {"num_docs", s.num_docs}, {"num_tokens", s.num_tokens}});
  // A file name that is not UTF-8 is written with U+FFFD in place of its bad bytes rather than refused.
  const std::string text = o.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const std::string path = shard_index_path(prefix), tmp = path + ".tmp";
  {
    errno = 0;
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      const std::string reason = errno ? std::strerror(errno) : "write failed";
      out.close();
      std::error_code ignored;
      fs::remove(tmp, ignored);
      throw std::runtime_error("cannot write shard index '" + tmp + "': " + reason);
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + ec.message());
}

ShardIndex read_shard_index(const std::string& prefix) {
  const std::string path = shard_index_path(prefix);
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw std::runtime_error("no data shards for '" + prefix + "': neither a .h5 file nor a prefix with an index '" +
                             path + "' (written by gpt-train prep --output-prefix " + prefix + ")");
  ShardIndex ix;
  try {
    std::ifstream in(path);
    const nlohmann::json n = nlohmann::json::parse(in);
    if (!n.is_object()) throw std::runtime_error("not a JSON object");
    // Each key named in the message when it is missing or of the wrong type.
    auto field = [](const nlohmann::json& object, const char* key, auto& out) {
      try {
        object.at(key).get_to(out);
      } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error(std::string("\"") + key + "\": " + json_error_text(e));
      }
    };
    field(n, "format_version", ix.format_version);
    field(n, "tokenizer", ix.tokenizer);
    field(n, "tokenizer_hash", ix.tokenizer_hash);
    field(n, "vocab_size", ix.vocab_size);
    field(n, "eod_id", ix.eod_id);
    field(n, "num_docs", ix.num_docs);
    field(n, "num_tokens", ix.num_tokens);
    if (n.contains("unigram_perplexity") && n.at("unigram_perplexity").is_number())
      ix.unigram_perplexity = n.at("unigram_perplexity").get<double>();
    if (!n.contains("shards") || !n.at("shards").is_array()) throw std::runtime_error("\"shards\" is not a list");
    for (const auto& s : n.at("shards")) {
      ShardIndexEntry e;
      field(s, "file", e.file);
      field(s, "num_docs", e.num_docs);
      field(s, "num_tokens", e.num_tokens);
      ix.shards.push_back(std::move(e));
    }
  } catch (const std::exception& e) {
    throw std::runtime_error("shard index '" + path + "' is malformed: " + json_error_text(e));
  }
  if (ix.format_version != kShardFormatVersion)
    throw std::runtime_error("shard index '" + path + "' has format_version " + std::to_string(ix.format_version) +
                             "; this build reads version " + std::to_string(kShardFormatVersion));
  if (ix.shards.empty()) throw std::runtime_error("shard index '" + path + "' lists no shards");
  return ix;
}

std::vector<std::string> resolve_shards(const std::string& entry) {
  if (entry.size() > 3 && entry.compare(entry.size() - 3, 3, ".h5") == 0) return {entry};
  std::string prefix = entry;
  const std::string suffix = ".index.json";
  if (prefix.size() > suffix.size() && prefix.compare(prefix.size() - suffix.size(), suffix.size(), suffix) == 0)
    prefix.resize(prefix.size() - suffix.size());
  ShardIndex ix = read_shard_index(prefix);
  fs::path dir = fs::path(shard_index_path(prefix)).parent_path();
  std::vector<std::string> paths;
  for (const auto& s : ix.shards) {
    std::string p = (dir / s.file).string();
    std::error_code ec;
    if (!fs::exists(p, ec))
      throw std::runtime_error("data shard '" + p + "' listed in '" + shard_index_path(prefix) + "' is missing");
    auto reader = open_shard(p);
    if (reader->meta().num_docs != s.num_docs || reader->meta().num_tokens != s.num_tokens)
      throw std::runtime_error("data shard '" + p + "' holds " + std::to_string(reader->meta().num_docs) +
                               " documents / " + std::to_string(reader->meta().num_tokens) + " tokens but '" +
                               shard_index_path(prefix) + "' says " + std::to_string(s.num_docs) + " / " +
                               std::to_string(s.num_tokens) + ": the shard set is inconsistent, re-run prep");
    paths.push_back(p);
  }
  return paths;
}

std::shared_ptr<const TokenShardReader> open_shard(const std::string& path) {
  static std::mutex m;
  static std::map<std::string, std::weak_ptr<const TokenShardReader>> open;
  std::error_code ec;
  std::string key = fs::weakly_canonical(path, ec).string();
  if (ec) key = path;
  std::lock_guard<std::mutex> lock(m);
  if (auto it = open.find(key); it != open.end())
    if (auto r = it->second.lock()) return r;
  auto r = std::make_shared<const TokenShardReader>(path);
  open[key] = r;
  return r;
}

ShardCorpus::ShardCorpus(const std::vector<std::string>& entries) {
  if (entries.empty()) throw std::runtime_error("no data shards given");
  for (size_t k = 0; k < entries.size(); ++k) name_ += (k ? " " : "") + entries[k];
  first_doc_.push_back(0);
  for (const auto& e : entries)
    for (const auto& p : resolve_shards(e)) {
      auto r = open_shard(p);
      if (!shards_.empty()) {
        const ShardMeta &a = shards_.front()->meta(), &b = r->meta();
        if (a.tokenizer != b.tokenizer || a.tokenizer_hash != b.tokenizer_hash || a.vocab_size != b.vocab_size ||
            a.eod_id != b.eod_id)
          throw std::runtime_error("data shards '" + shards_.front()->path() + "' (" + a.tokenizer + " " +
                                   a.tokenizer_hash + ") and '" + p + "' (" + b.tokenizer + " " + b.tokenizer_hash +
                                   ") were made with different tokenizers and cannot be mixed");
      }
      first_doc_.push_back(first_doc_.back() + r->meta().num_docs);
      num_tokens_ += r->meta().num_tokens;
      shards_.push_back(std::move(r));
    }
}

std::pair<size_t, int64_t> ShardCorpus::locate(int64_t doc) const {
  if (doc < 0 || doc >= num_docs())
    throw std::out_of_range("document " + std::to_string(doc) + " outside corpus '" + name_ + "'");
  size_t s = size_t(std::upper_bound(first_doc_.begin(), first_doc_.end(), doc) - first_doc_.begin()) - 1;
  return {s, doc - first_doc_[s]};
}

int64_t ShardCorpus::doc_length(int64_t doc) const {
  auto [s, d] = locate(doc);
  const auto& off = shards_[s]->doc_offsets();
  return int64_t(off[d + 1] - off[d]);
}

void ShardCorpus::read_doc(int64_t doc, int64_t offset, int64_t count, int32_t* out) const {
  auto [s, d] = locate(doc);
  const auto& off = shards_[s]->doc_offsets();
  shards_[s]->read(int64_t(off[d]) + offset, count, out);
}

}  // namespace gpt
