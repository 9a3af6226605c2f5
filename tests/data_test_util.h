// Helpers shared by the data tests: a self-deleting temporary directory, shards with chosen documents,
// and a check that a call throws std::runtime_error whose message contains given parts.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "data/token_shard.h"

namespace gpt::testutil {

class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "gpt-data-test-XXXXXX").string();
    if (!mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Writes a shard holding `docs` (each gets no extra EOD: callers include it when they want one).
inline void write_docs_shard(const std::string& path, const std::vector<std::vector<uint32_t>>& docs,
                             int64_t vocab_size, int64_t eod_id, const std::string& tokenizer = "bytes",
                             const std::string& hash = "bytes") {
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> offsets{0};
  for (const auto& d : docs) {
    tokens.insert(tokens.end(), d.begin(), d.end());
    offsets.push_back(tokens.size());
  }
  ShardMeta meta;
  meta.vocab_size = vocab_size;
  meta.eod_id = eod_id;
  meta.tokenizer = tokenizer;
  meta.tokenizer_hash = hash;
  write_token_shard(path, tokens, offsets, meta);
}

// Expects `body` to throw std::runtime_error (or a subclass) mentioning every one of `parts`.
inline void expect_runtime_error(const std::function<void()>& body, const std::vector<std::string>& parts) {
  try {
    body();
  } catch (const std::runtime_error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-runtime_error: " << e.what();
    return;
  }
  ADD_FAILURE() << "no exception; expected one mentioning " << (parts.empty() ? "" : parts[0]);
}

}  // namespace gpt::testutil
