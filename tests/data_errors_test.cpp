// Bad data gets a clear error naming the file, never a crash: missing and truncated shards, wrong dtype
// or format version, token ids outside the vocabulary, a tokenizer other than the config expects, a
// model vocabulary too small, an empty split, broken prefix indexes, and a fuzz test that truncates and
// corrupts shard files and requires every read to either return valid data or throw std::runtime_error.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "data/shard_set.h"
#include "data/shard_source.h"
#include "data/token_shard.h"
#include "tests/data_test_util.h"

namespace gpt {
namespace {

using testutil::expect_runtime_error;
using testutil::TempDir;
using testutil::write_docs_shard;

// A shard written straight through the HDF5 API, so tests can break any part of the format.
struct RawShard {
  hid_t token_type = H5T_STD_U16LE;
  std::vector<uint32_t> tokens{1, 2, 256, 3, 256};
  std::vector<uint64_t> offsets{0, 3, 5};
  int64_t format_version = 1, vocab_size = 257, eod_id = 256, max_token_id = 256;
  bool with_version = true, with_offsets = true, vlen_strings = false;
};

void write_raw(const std::string& path, const RawShard& s) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t n = s.tokens.size();
  hid_t sp = H5Screate_simple(1, &n, nullptr);
  hid_t ds = H5Dcreate2(f, "tokens", s.token_type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.tokens.data());
  H5Dclose(ds);
  H5Sclose(sp);
  if (s.with_offsets) {
    hsize_t m = s.offsets.size();
    sp = H5Screate_simple(1, &m, nullptr);
    ds = H5Dcreate2(f, "doc_offsets", H5T_STD_U64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.offsets.data());
    H5Dclose(ds);
    H5Sclose(sp);
  }
  auto attr = [&](const char* name, int64_t v) {
    hid_t as = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, as, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Sclose(as);
  };
  auto str_attr = [&](const char* name, const char* v) {
    hid_t as = H5Screate(H5S_SCALAR);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, s.vlen_strings ? H5T_VARIABLE : std::strlen(v) + 1);
    if (s.vlen_strings) H5Tset_cset(t, H5T_CSET_UTF8);  // how h5py stores a str attribute
    hid_t a = H5Acreate2(f, name, t, as, H5P_DEFAULT, H5P_DEFAULT);
    if (s.vlen_strings) H5Awrite(a, t, &v);
    else H5Awrite(a, t, v);
    H5Aclose(a);
    H5Tclose(t);
    H5Sclose(as);
  };
  if (s.with_version) attr("format_version", s.format_version);
  attr("vocab_size", s.vocab_size);
  attr("eod_id", s.eod_id);
  attr("max_token_id", s.max_token_id);
  str_attr("tokenizer", "bytes");
  str_attr("tokenizer_hash", "bytes");
  H5Fclose(f);
}

TEST(DataErrors, ShardsWrittenByOtherToolsAreReadable) {
  TempDir dir;
  write_raw(dir / "ok.h5", RawShard{});
  TokenShardReader r(dir / "ok.h5");  // contiguous layout, default file format: still a valid shard
  EXPECT_EQ(r.meta().tokenizer, "bytes");
  std::vector<int32_t> t(5);
  r.read(0, 5, t.data());
  EXPECT_EQ(t, (std::vector<int32_t>{1, 2, 256, 3, 256}));
  RawShard v;
  v.vlen_strings = true;
  write_raw(dir / "vlen.h5", v);
  TokenShardReader rv(dir / "vlen.h5");
  EXPECT_EQ(rv.meta().tokenizer, "bytes");
  EXPECT_EQ(rv.meta().tokenizer_hash, "bytes");
}

TEST(DataErrors, MissingShard) {
  TempDir dir;
  expect_runtime_error([&] { TokenShardReader r(dir / "nope.h5"); }, {"nope.h5", "not found"});
  expect_runtime_error([&] { make_shard_source({dir / "nope.h5"}, "train", "1,0,0", 4, 1, "", 257); },
                       {"nope.h5", "not found"});
  // A prefix without an index.
  expect_runtime_error([&] { make_shard_source({dir / "corpus"}, "train", "1,0,0", 4, 1, "", 257); },
                       {"corpus.index.json", "gpt-train prep"});
}

TEST(DataErrors, IndexListsMissingOrChangedShard) {
  TempDir dir;
  std::string prefix = dir / "c";
  write_docs_shard(shard_file_name(prefix, 0), {{1, 2, 256}}, 257, 256);
  ShardIndex ix;
  ix.tokenizer = ix.tokenizer_hash = "bytes";
  ix.vocab_size = 257;
  ix.eod_id = 256;
  ix.shards = {{"c_00000.h5", 1, 3}, {"c_00001.h5", 1, 3}};
  write_shard_index(prefix, ix);
  expect_runtime_error([&] { resolve_shards(prefix); }, {"c_00001.h5", "missing"});
  ix.shards = {{"c_00000.h5", 1, 4}};
  write_shard_index(prefix, ix);
  expect_runtime_error([&] { resolve_shards(prefix); }, {"c_00000.h5", "inconsistent"});
  testutil::write_text(shard_index_path(prefix), "{\"format_version\": 1, \"shards\": ");
  expect_runtime_error([&] { resolve_shards(prefix); }, {"c.index.json", "malformed"});
}

TEST(DataErrors, NotHdf5AndTruncated) {
  TempDir dir;
  testutil::write_text(dir / "text.h5", "hello, I am not HDF5");
  expect_runtime_error([&] { TokenShardReader r(dir / "text.h5"); }, {"text.h5", "not an HDF5 file"});
  std::vector<std::vector<uint32_t>> docs(20, std::vector<uint32_t>(5000, 7));
  write_docs_shard(dir / "full.h5", docs, 257, 256);
  auto size = std::filesystem::file_size(dir / "full.h5");
  std::filesystem::copy_file(dir / "full.h5", dir / "cut.h5");
  std::filesystem::resize_file(dir / "cut.h5", size / 2);
  expect_runtime_error(
      [&] {
        TokenShardReader r(dir / "cut.h5");
        std::vector<int32_t> t(r.meta().num_tokens);
        r.read(0, r.meta().num_tokens, t.data());
      },
      {"cut.h5"});
}

TEST(DataErrors, WrongDtype) {
  TempDir dir;
  RawShard s;
  s.token_type = H5T_IEEE_F32LE;
  write_raw(dir / "float.h5", s);
  expect_runtime_error([&] { TokenShardReader r(dir / "float.h5"); }, {"float.h5", "float32", "uint16"});
  s.token_type = H5T_STD_I16LE;
  write_raw(dir / "signed.h5", s);
  expect_runtime_error([&] { TokenShardReader r(dir / "signed.h5"); }, {"signed.h5", "int16"});
  s.token_type = H5T_STD_U16LE;
  s.vocab_size = 70000;
  s.eod_id = 256;
  write_raw(dir / "narrow.h5", s);  // uint16 cannot hold a 70000-id vocabulary
  expect_runtime_error([&] { TokenShardReader r(dir / "narrow.h5"); }, {"narrow.h5", "uint16", "uint32"});
  s = RawShard{};
  s.token_type = H5T_STD_U32LE;  // wider than needed is fine
  write_raw(dir / "wide.h5", s);
  EXPECT_NO_THROW(TokenShardReader r(dir / "wide.h5"));
  s = RawShard{};
  s.with_offsets = false;
  write_raw(dir / "nooffsets.h5", s);
  expect_runtime_error([&] { TokenShardReader r(dir / "nooffsets.h5"); }, {"nooffsets.h5", "doc_offsets"});
  s = RawShard{};
  s.offsets = {0, 4, 3};
  write_raw(dir / "badoffsets.h5", s);
  expect_runtime_error([&] { TokenShardReader r(dir / "badoffsets.h5"); }, {"badoffsets.h5", "doc_offsets"});
}

TEST(DataErrors, WrongFormatVersion) {
  TempDir dir;
  RawShard s;
  s.format_version = 2;
  write_raw(dir / "v2.h5", s);
  expect_runtime_error([&] { TokenShardReader r(dir / "v2.h5"); }, {"v2.h5", "format_version 2", "version 1"});
  s.with_version = false;
  write_raw(dir / "nov.h5", s);
  expect_runtime_error([&] { TokenShardReader r(dir / "nov.h5"); }, {"nov.h5", "not a gpt-train token shard"});
}

TEST(DataErrors, TokenIdOutsideVocabulary) {
  TempDir dir;
  RawShard s;
  s.tokens = {1, 2, 256, 300, 256};  // 300 >= vocab_size 257, and max_token_id lies about it
  write_raw(dir / "lying.h5", s);
  TokenShardReader r(dir / "lying.h5");
  std::vector<int32_t> t(5);
  expect_runtime_error([&] { r.read(0, 5, t.data()); }, {"lying.h5", "300", "vocabulary of 257"});
  expect_runtime_error([&] {
    auto src = make_shard_source({dir / "lying.h5"}, "all", "", 4, 1, "", 257);
    src->sample(0, t.data());
  }, {"lying.h5", "300"});
  s.tokens = {1, 2, 256, 3, 256};
  s.max_token_id = 400;
  write_raw(dir / "maxattr.h5", s);
  expect_runtime_error([&] { TokenShardReader r2(dir / "maxattr.h5"); }, {"maxattr.h5", "max_token_id 400"});
  // A shard vocabulary larger than the model's.
  write_docs_shard(dir / "gpt2.h5", {{50000, 50256}, {7, 50256}}, 50257, 50256, "gpt2", "fnv1a64:1");
  expect_runtime_error([&] { make_shard_source({dir / "gpt2.h5"}, "all", "", 2, 1, "gpt2", 256); },
                       {"gpt2.h5", "50257", "model.vocab_size is 256"});
}

TEST(DataErrors, TokenizerMismatch) {
  TempDir dir;
  write_docs_shard(dir / "b.h5", {{1, 2, 3, 256}, {4, 5, 256}}, 257, 256);
  expect_runtime_error([&] { make_shard_source({dir / "b.h5"}, "all", "", 2, 1, "gpt2", 50304); },
                       {"b.h5", "'bytes@bytes'", "data.tokenizer expects 'gpt2'"});
  EXPECT_NO_THROW(make_shard_source({dir / "b.h5"}, "all", "", 2, 1, "bytes", 257));
  EXPECT_NO_THROW(make_shard_source({dir / "b.h5"}, "all", "", 2, 1, "bytes@bytes", 257));
  expect_runtime_error([&] { make_shard_source({dir / "b.h5"}, "all", "", 2, 1, "bytes@other", 257); },
                       {"b.h5", "bytes@other"});
  // Shards of one set, or parts of a blend, must agree.
  write_docs_shard(dir / "g.h5", {{1, 2, 3, 50256}}, 50257, 50256, "gpt2", "fnv1a64:1");
  expect_runtime_error([&] { make_shard_source({dir / "b.h5", dir / "g.h5"}, "all", "", 2, 1, "", 60000); },
                       {"b.h5", "g.h5", "different tokenizers"});
  expect_runtime_error([&] { make_shard_source({"0.5", dir / "b.h5", "0.5", dir / "g.h5"}, "all", "", 2, 1, "", 60000); },
                       {"mixes tokenizers"});
}

TEST(DataErrors, EmptySplit) {
  TempDir dir;
  std::vector<std::vector<uint32_t>> docs(10, std::vector<uint32_t>{1, 2, 3, 256});
  write_docs_shard(dir / "small.h5", docs, 257, 256);
  EXPECT_NO_THROW(make_shard_source({dir / "small.h5"}, "train", "969,30,1", 4, 1, "", 257));
  // 10 documents: round(0.3) = 0 documents for valid.
  expect_runtime_error([&] { make_shard_source({dir / "small.h5"}, "valid", "969,30,1", 4, 1, "", 257); },
                       {"small.h5", "valid split", "empty", "0 documents"});
  // Documents present but fewer tokens than one sample.
  expect_runtime_error([&] { make_shard_source({dir / "small.h5"}, "all", "", 40, 1, "", 257); },
                       {"small.h5", "empty", "40 tokens", "seq_length + 1 = 41"});
  expect_runtime_error([&] { make_shard_source({dir / "small.h5"}, "train", "a", 4, 1, "", 257); }, {"split"});
  EXPECT_THROW(make_shard_source({dir / "small.h5"}, "validation", "1,1,1", 4, 1, "", 257), std::invalid_argument);
}

// Truncates a valid shard at many lengths and flips random bytes; each variant must open and read back
// valid tokens or throw std::runtime_error. HDF5's checksums (metadata and Fletcher-32 chunks) catch
// most corruption; the reader's own range checks catch the rest.
TEST(DataErrors, FuzzCorruptedShards) {
  TempDir dir;
  std::vector<std::vector<uint32_t>> docs;
  std::mt19937 rng(99);
  for (int d = 0; d < 40; ++d) {
    std::vector<uint32_t> doc(20 + rng() % 300);
    for (auto& t : doc) t = rng() % 256;
    doc.push_back(256);
    docs.push_back(doc);
  }
  const std::string good = dir / "good.h5";
  write_docs_shard(good, docs, 257, 256);
  const std::string bytes = testutil::read_text(good);
  int opened = 0, rejected = 0, variants = 0;
  auto try_variant = [&](const std::string& content) {
    const std::string path = dir / ("v" + std::to_string(variants++) + ".h5");
    testutil::write_text(path, content);
    try {
      auto r = std::make_shared<TokenShardReader>(path);
      std::vector<int32_t> t(r->meta().num_tokens);
      r->read(0, r->meta().num_tokens, t.data());
      for (int32_t id : t) ASSERT_TRUE(id >= 0 && id < 257);
      auto src = make_shard_source({path}, "all", "", 16, 5, "bytes", 257);
      std::vector<int32_t> s(17);
      for (int64_t i = 0; i < std::min<int64_t>(src->size(), 50); ++i) src->sample(i, s.data());
      ++opened;
    } catch (const std::runtime_error&) {
      ++rejected;
    }
    std::filesystem::remove(path);
  };
  for (size_t cut = 0; cut < bytes.size(); cut += std::max<size_t>(1, bytes.size() / 150)) try_variant(bytes.substr(0, cut));
  const char* env = std::getenv("GPT_DATA_FUZZ_ITERS");  // a longer soak on demand
  const int iters = env ? std::atoi(env) : 300;
  for (int k = 0; k < iters; ++k) {
    std::string c = bytes;
    int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) c[rng() % c.size()] ^= char(1 + rng() % 255);
    try_variant(c);
  }
  EXPECT_GT(rejected, 150);
  EXPECT_GT(variants, 400);
  // Some flips land in unused bytes and leave a readable shard; either outcome is fine.
  std::printf("fuzz: %d variants, %d readable, %d rejected\n", variants, opened, rejected);
}

}  // namespace
}  // namespace gpt
