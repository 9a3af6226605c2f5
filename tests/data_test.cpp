// Data tests: shard write / read round trips (both id widths, hyperslab reads, h5dump-visible layout),
// prefix index files, and the dataset: Megatron split boundaries, keyed permutations, samples that
// concatenate shuffled documents exactly (checked with tokens that encode their own document and
// position), per-epoch reshuffling, determinism, and weighted blending against a direct replay of
// Megatron's greedy loop.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "data/sample_order.h"
#include "data/shard_set.h"
#include "data/shard_source.h"
#include "data/token_shard.h"
#include "tests/data_test_util.h"

namespace gpt {
namespace {

using testutil::expect_runtime_error;
using testutil::TempDir;
using testutil::write_docs_shard;

TEST(TokenShard, RoundTripUint16WithHyperslabReads) {
  TempDir dir;
  std::vector<std::vector<uint32_t>> docs;
  for (int d = 0; d < 50; ++d) {
    std::vector<uint32_t> doc;
    for (int t = 0; t < 1000 + d * 37; ++t) doc.push_back(uint32_t((d * 7919 + t * 31) % 256));
    doc.push_back(256);
    docs.push_back(doc);
  }
  write_docs_shard(dir / "s.h5", docs, 257, 256);
  EXPECT_FALSE(std::filesystem::exists(dir / "s.h5.tmp"));
  TokenShardReader r(dir / "s.h5");
  EXPECT_EQ(r.meta().token_bits, 16);
  EXPECT_EQ(r.meta().num_docs, 50);
  EXPECT_EQ(r.meta().vocab_size, 257);
  EXPECT_EQ(r.meta().eod_id, 256);
  EXPECT_EQ(r.meta().max_token_id, 256);
  EXPECT_EQ(r.meta().tokenizer, "bytes");
  std::vector<uint32_t> all;
  for (auto& d : docs) all.insert(all.end(), d.begin(), d.end());
  EXPECT_EQ(r.meta().num_tokens, int64_t(all.size()));
  // Reads crossing chunk boundaries (32768 ids per chunk) and single ids.
  for (auto [begin, count] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 10}, {32760, 20}, {int64_t(all.size()) - 5, 5}, {1234, 40000}, {77, 1}}) {
    std::vector<int32_t> got(count);
    r.read(begin, count, got.data());
    for (int64_t k = 0; k < count; ++k) ASSERT_EQ(uint32_t(got[k]), all[begin + k]) << begin << "+" << k;
  }
  for (int d = 0; d < 50; ++d) EXPECT_EQ(r.doc_offsets()[d + 1] - r.doc_offsets()[d], docs[d].size());
  std::vector<int32_t> buf(4);
  expect_runtime_error([&] { r.read(int64_t(all.size()) - 2, 4, buf.data()); }, {"s.h5", "outside"});
}

TEST(TokenShard, Uint32ForLargeVocabularies) {
  TempDir dir;
  write_docs_shard(dir / "big.h5", {{70000, 5, 99999}, {65535, 99999}}, 100000, 99999, "gpt2", "fnv1a64:00");
  TokenShardReader r(dir / "big.h5");
  EXPECT_EQ(r.meta().token_bits, 32);
  std::vector<int32_t> got(5);
  r.read(0, 5, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{70000, 5, 99999, 65535, 99999}));
}

TEST(TokenShard, WriterRejectsIdsOutsideVocab) {
  TempDir dir;
  expect_runtime_error([&] { write_docs_shard(dir / "x.h5", {{1, 300}}, 257, 256); }, {"x.h5", "300"});
  EXPECT_FALSE(std::filesystem::exists(dir / "x.h5"));
}

TEST(TokenShard, LayoutVisibleToH5dump) {
  if (std::system("command -v h5dump > /dev/null 2>&1") != 0) GTEST_SKIP() << "h5dump not installed";
  TempDir dir;
  write_docs_shard(dir / "s.h5", {{1, 2, 256}, {3, 256}}, 257, 256);
  std::string cmd = "h5dump -H " + (dir / "s.h5") + " > " + (dir / "dump.txt");
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string dump = testutil::read_text(dir / "dump.txt");
  for (const char* part : {"DATASET \"tokens\"", "H5T_STD_U16LE", "DATASPACE  SIMPLE { ( 5 ) / ( 5 ) }",
                           "DATASET \"doc_offsets\"", "H5T_STD_U64LE", "ATTRIBUTE \"format_version\"",
                           "ATTRIBUTE \"tokenizer\"", "ATTRIBUTE \"eod_id\"", "ATTRIBUTE \"vocab_size\""})
    EXPECT_NE(dump.find(part), std::string::npos) << part << "\n" << dump;
}

TEST(ShardIndex, PrefixResolvesThroughIndexFile) {
  TempDir dir;
  std::string prefix = dir / "corpus";
  write_docs_shard(shard_file_name(prefix, 0), {{1, 256}, {2, 3, 256}}, 257, 256);
  write_docs_shard(shard_file_name(prefix, 1), {{4, 5, 6, 256}}, 257, 256);
  ShardIndex ix;
  ix.tokenizer = "bytes";
  ix.tokenizer_hash = "bytes";
  ix.vocab_size = 257;
  ix.eod_id = 256;
  ix.num_docs = 3;
  ix.num_tokens = 9;
  ix.unigram_perplexity = 5.5;
  ix.shards = {{"corpus_00000.h5", 2, 5}, {"corpus_00001.h5", 1, 4}};
  write_shard_index(prefix, ix);
  auto back = read_shard_index(prefix);
  EXPECT_EQ(back.shards.size(), 2u);
  EXPECT_EQ(back.shards[1].file, "corpus_00001.h5");
  EXPECT_DOUBLE_EQ(back.unigram_perplexity, 5.5);
  auto paths = resolve_shards(prefix);
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[1], shard_file_name(prefix, 1));
  EXPECT_EQ(resolve_shards(prefix + ".index.json"), paths);
  ShardCorpus c({prefix});
  EXPECT_EQ(c.num_docs(), 3);
  EXPECT_EQ(c.num_tokens(), 9);
  EXPECT_EQ(c.doc_length(2), 4);
  std::vector<int32_t> got(3);
  c.read_doc(2, 1, 3, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{5, 6, 256}));
  auto info = read_shard_data_info({prefix});
  EXPECT_EQ(info.num_shards, 2);
  EXPECT_EQ(info.num_docs, 3);
  EXPECT_EQ(info.tokenizer, "bytes");
}

TEST(SampleOrder, SplitBoundariesLikeMegatron) {
  auto w = parse_split("969,30,1");
  EXPECT_NEAR(w[0], 0.969, 1e-12);
  EXPECT_EQ(split_boundaries(w, 1000), (std::array<int64_t, 4>{0, 969, 999, 1000}));
  // round(9.69) = 10, round(0.3) = 0, round(0.01) = 0 -> valid and test empty.
  EXPECT_EQ(split_boundaries(w, 10), (std::array<int64_t, 4>{0, 10, 10, 10}));
  // 0.5*5 = 2.5 rounds to 2 (half to even, as Python), the others 1 and 2: 0,2,3,5.
  EXPECT_EQ(split_boundaries(parse_split("50,20,30"), 5), (std::array<int64_t, 4>{0, 2, 3, 5}));
  // Rounding overshoot (1+1+1 = 3 > 2) is taken off every boundary after the first, as Megatron does.
  EXPECT_EQ(split_boundaries(parse_split("1,1,1"), 2), (std::array<int64_t, 4>{0, 0, 1, 2}));
  EXPECT_EQ(split_boundaries(parse_split("0.9/0.1"), 10), (std::array<int64_t, 4>{0, 9, 10, 10}));
  expect_runtime_error([] { parse_split("a,b"); }, {"data.split", "'a'"});
  expect_runtime_error([] { parse_split("0,0,0"); }, {"sum to zero"});
  expect_runtime_error([] { parse_split("1,-1"); }, {"-1"});
  expect_runtime_error([] { parse_split("1,1,1,1"); }, {"three"});
}

TEST(SampleOrder, PermutationIsBijectiveAndKeyed) {
  for (uint64_t n : {1ull, 2ull, 3ull, 7ull, 64ull, 1000ull, 4097ull}) {
    IndexPermutation p(n, 42);
    std::vector<int> seen(n, 0);
    for (uint64_t i = 0; i < n; ++i) ++seen[p(i)];
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), int64_t(n)) << n;
  }
  IndexPermutation a(1000, 1), b(1000, 2), a2(1000, 1);
  int same = 0, fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same += a(i) == b(i);
    fixed += a(i) == i;
    EXPECT_EQ(a(i), a2(i));
  }
  EXPECT_LT(same, 20);
  EXPECT_LT(fixed, 20);
  // Huge ranges need no storage.
  IndexPermutation huge(uint64_t(1) << 40, 7);
  EXPECT_LT(huge(123456789), uint64_t(1) << 40);
}

// Megatron's build_blending_indices, replayed directly.
std::vector<std::pair<size_t, int64_t>> megatron_blend(const std::vector<double>& weights, int64_t n) {
  double sum = 0;
  for (double w : weights) sum += w;
  std::vector<int64_t> current(weights.size(), 0);
  std::vector<std::pair<size_t, int64_t>> out;
  for (int64_t i = 0; i < n; ++i) {
    double at = std::max(double(i), 1.0);
    size_t best = 0;
    volatile double product0 = weights[0] / sum * at;
    double best_err = product0 - double(current[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      volatile double product = weights[d] / sum * at;  // no fused multiply-add, as in Megatron's build
      double err = product - double(current[d]);
      if (err > best_err) best_err = err, best = d;
    }
    out.push_back({best, current[best]++});
  }
  return out;
}

TEST(SampleOrder, BlendScheduleEqualsMegatronGreedy) {
  std::vector<double> w{0.7, 0.2, 0.1};
  BlendSchedule s(w);
  auto want = megatron_blend(w, 20000);
  // The first choices of Megatron's loop run in Python (i = 6 is an exact tie, won by the lower index).
  std::vector<size_t> python = {0, 1, 0, 2, 0, 0, 0, 1, 0};
  for (size_t i = 0; i < python.size(); ++i) EXPECT_EQ(want[i].first, python[i]) << i;
  // Out of order, as data-parallel ranks and resumption ask.
  for (int64_t i : {19999, 0, 1, 4095, 4096, 4097, 12345, 8191}) EXPECT_EQ(s.locate(i), want[i]) << i;
  for (int64_t i = 0; i < 20000; i += 7) ASSERT_EQ(s.locate(i), want[i]) << i;
  std::vector<int64_t> counts(3, 0);
  for (int64_t i = 0; i < 10000; ++i) ++counts[s.locate(i).first];
  EXPECT_NEAR(double(counts[0]) / 10000, 0.7, 1e-3);
  EXPECT_NEAR(double(counts[2]) / 10000, 0.1, 1e-3);
}

// A shard set whose token ids say where they come from: doc d, position t -> 1000 * d + t (EOD = the
// last id of a document is 999999, shared). vocab 10^6 so ids are stored as uint32.
constexpr uint32_t kEod = 999999;
std::vector<std::vector<uint32_t>> tagged_docs(int n_docs, int first_doc = 0) {
  std::vector<std::vector<uint32_t>> docs;
  for (int d = first_doc; d < first_doc + n_docs; ++d) {
    std::vector<uint32_t> doc;
    int len = 3 + (d * 37) % 40;
    for (int t = 0; t < len; ++t) doc.push_back(uint32_t(1000 * d + t));
    doc.push_back(kEod);
    docs.push_back(doc);
  }
  return docs;
}

std::string make_tagged_prefix(const TempDir& dir, const std::string& name, int n_docs, int per_shard) {
  std::string prefix = dir / name;
  ShardIndex ix;
  ix.tokenizer = "test";
  ix.tokenizer_hash = "h";
  ix.vocab_size = 1000000;
  ix.eod_id = kEod;
  for (int first = 0, k = 0; first < n_docs; first += per_shard, ++k) {
    auto docs = tagged_docs(std::min(per_shard, n_docs - first), first);
    write_docs_shard(shard_file_name(prefix, k), docs, 1000000, kEod, "test", "h");
    int64_t toks = 0;
    for (auto& d : docs) toks += int64_t(d.size());
    ix.shards.push_back({name + "_" + std::string(5 - std::to_string(k).size(), '0') + std::to_string(k) + ".h5",
                         int64_t(docs.size()), toks});
    ix.num_docs += int64_t(docs.size());
    ix.num_tokens += toks;
  }
  write_shard_index(prefix, ix);
  return prefix;
}

// Checks that the samples of one epoch are consecutive windows of one concatenation of whole, distinct
// documents from [doc_lo, doc_hi), covering it from the start except for < seq tokens at the end.
void check_epoch(const SampleSource& src, int64_t epoch, int64_t seq, int doc_lo, int doc_hi) {
  const int64_t n = src.size();
  std::vector<int32_t> s(seq + 1);
  std::set<std::vector<int32_t>> distinct;
  std::vector<std::vector<int32_t>> all;
  for (int64_t i = 0; i < n; ++i) {
    src.sample(epoch * n + i, s.data());
    all.push_back(s);
    distinct.insert(s);
  }
  ASSERT_EQ(int64_t(distinct.size()), n) << "epoch " << epoch << " repeats a sample";
  // Every window must be a piece of a concatenation of whole documents.
  std::set<int> docs_seen;
  for (const auto& w : all) {
    for (int64_t t = 0; t + 1 <= seq; ++t) {
      uint32_t a = uint32_t(w[t]), b = uint32_t(w[t + 1]);
      if (a != kEod) {
        ASSERT_GE(int(a / 1000), doc_lo);
        ASSERT_LT(int(a / 1000), doc_hi);
        docs_seen.insert(int(a / 1000));
        // inside a document: the next id is the next position or the document's EOD
        ASSERT_TRUE(b == a + 1 || b == kEod) << a << " -> " << b;
      } else {
        // after an EOD a document starts at position 0
        ASSERT_TRUE(b % 1000 == 0 && b != kEod) << "EOD -> " << b;
      }
    }
  }
  EXPECT_GE(int64_t(docs_seen.size()), int64_t(doc_hi - doc_lo) - seq / 4);
  // Every token position [0, seq) of all windows together is distinct and they number n * seq:
  // the windows tile the stream without overlap except their shared boundary token.
  std::set<uint32_t> body;
  int64_t eods = 0;
  for (const auto& w : all)
    for (int64_t t = 0; t < seq; ++t) {
      if (uint32_t(w[t]) == kEod) ++eods;
      else ASSERT_TRUE(body.insert(uint32_t(w[t])).second) << "token " << w[t] << " appears twice";
    }
  // All split documents' tokens appear except at most the last seq tokens of the stream.
  int64_t split_tokens = 0;
  for (auto& d : tagged_docs(doc_hi - doc_lo, doc_lo)) split_tokens += int64_t(d.size());
  EXPECT_EQ(int64_t(body.size()) + eods, n * seq);
  EXPECT_GE(n * seq, split_tokens - seq);
  EXPECT_EQ(n, (split_tokens - 1) / seq);
}

TEST(ShardSource, SamplesTileShuffledDocumentConcatenation) {
  TempDir dir;
  std::string prefix = make_tagged_prefix(dir, "tag", 100, 17);  // 6 shards
  const int64_t seq = 16;
  auto train = make_shard_source({prefix}, "train", "80,10,10", seq, 1234, "", 1000000);
  auto valid = make_shard_source({prefix}, "valid", "80,10,10", seq, 1234, "", 1000000);
  check_epoch(*train, 0, seq, 0, 80);
  check_epoch(*train, 1, seq, 0, 80);
  check_epoch(*valid, 0, seq, 80, 90);
  EXPECT_NE(train->describe().find("train split"), std::string::npos);

  // Documents really are shuffled: consecutive document ids are not the norm.
  std::vector<int32_t> s(seq + 1);
  int ascending = 0, pairs = 0;
  for (int64_t i = 0; i < train->size(); ++i) {
    train->sample(i, s.data());
    for (int64_t t = 0; t < seq; ++t)
      if (uint32_t(s[t]) == kEod && uint32_t(s[t + 1]) != kEod) {
        ++pairs;
        uint32_t before = t > 0 ? uint32_t(s[t - 1]) : 0;
        ascending += t > 0 && s[t + 1] / 1000 == int32_t(before / 1000) + 1;
      }
  }
  EXPECT_GT(pairs, 20);
  EXPECT_LT(ascending, pairs / 3);
}

TEST(ShardSource, DeterministicResumableAndReshuffledPerEpoch) {
  TempDir dir;
  std::string prefix = make_tagged_prefix(dir, "tag", 60, 25);
  const int64_t seq = 8;
  auto a = make_shard_source({prefix}, "train", "969,30,1", seq, 7, "test", 1000000);
  auto b = make_shard_source({prefix}, "train", "969,30,1", seq, 7, "test", 1000000);
  auto other_seed = make_shard_source({prefix}, "train", "969,30,1", seq, 8, "test", 1000000);
  const int64_t n = a->size();
  std::vector<int32_t> x(seq + 1), y(seq + 1);
  int differ_seed = 0, differ_epoch = 0;
  // b is asked in a scrambled order (a resumed run or another data-parallel rank): same samples.
  for (int64_t k = 0; k < 3 * n; ++k) {
    int64_t i = (k * 7919) % (3 * n);
    a->sample(i, x.data());
    b->sample(i, y.data());
    ASSERT_EQ(x, y) << i;
    other_seed->sample(i, y.data());
    differ_seed += x != y;
    if (i < n) {
      b->sample(i + n, y.data());
      differ_epoch += x != y;
    }
  }
  EXPECT_GT(differ_seed, 3 * n / 2);
  EXPECT_GT(differ_epoch, n / 2);
}

TEST(ShardSource, AllSplitAndMultiplePrefixesConcatenate) {
  TempDir dir;
  std::string p1 = make_tagged_prefix(dir, "one", 10, 10);
  // The second prefix lives in a directory with spaces in its name: a data spec entry is one path.
  std::filesystem::create_directories(dir / "my data  dir");
  std::string p2 = dir / "my data  dir/two";
  {
    // documents 10..19 in a second prefix, same tokenizer
    auto docs = tagged_docs(10, 10);
    write_docs_shard(shard_file_name(p2, 0), docs, 1000000, kEod, "test", "h");
    ShardIndex ix;
    ix.tokenizer = "test";
    ix.tokenizer_hash = "h";
    ix.vocab_size = 1000000;
    ix.eod_id = kEod;
    int64_t toks = 0;
    for (auto& d : docs) toks += int64_t(d.size());
    ix.shards = {{"two_00000.h5", 10, toks}};
    write_shard_index(p2, ix);
  }
  auto all = make_shard_source({p1, p2}, "all", "", 8, 1, "", 0);
  check_epoch(*all, 0, 8, 0, 20);
  auto listed = make_shard_source({" " + p1, p2 + "\t"}, "all", "ignored", 8, 1, "", 0);  // trimmed
  std::vector<int32_t> x(9), y(9);
  for (int64_t i = 0; i < all->size(); ++i) {
    all->sample(i, x.data());
    listed->sample(i, y.data());
    ASSERT_EQ(x, y);
  }
}

TEST(ShardSource, BlendFollowsWeightsAndEachPartsOrder) {
  TempDir dir;
  std::string a = make_tagged_prefix(dir, "a", 40, 40);
  std::string b = dir / "b";
  {
    auto docs = tagged_docs(40, 500);  // documents 500.. tell the parts apart
    write_docs_shard(shard_file_name(b, 0), docs, 1000000, kEod, "test", "h");
    ShardIndex ix;
    ix.tokenizer = "test";
    ix.tokenizer_hash = "h";
    ix.vocab_size = 1000000;
    ix.eod_id = kEod;
    int64_t toks = 0;
    for (auto& d : docs) toks += int64_t(d.size());
    ix.shards = {{"b_00000.h5", 40, toks}};
    write_shard_index(b, ix);
  }
  const int64_t seq = 8;
  auto blend = make_shard_source({"0.75", a, "0.25", b}, "train", "100,0,0", seq, 3, "test", 1000000);
  auto only_a = make_shard_source({a}, "train", "100,0,0", seq, 3, "test", 1000000);
  auto only_b = make_shard_source({b}, "train", "100,0,0", seq, 3, "test", 1000000);
  EXPECT_EQ(blend->size(), only_a->size() + only_b->size());
  EXPECT_NE(blend->describe().find("blend"), std::string::npos);
  auto want = megatron_blend({0.75, 0.25}, 2000);
  std::vector<int32_t> x(seq + 1), y(seq + 1);
  for (int64_t i = 0; i < 2000; ++i) {
    blend->sample(i, x.data());
    auto [d, j] = want[i];
    (d == 0 ? only_a : only_b)->sample(j, y.data());
    ASSERT_EQ(x, y) << i;
    int32_t tag = x[0] == int32_t(kEod) ? x[1] : x[0];
    EXPECT_EQ(tag / 1000 >= 500, d == 1);
  }
}

TEST(ShardSource, DataSpecParsing) {
  auto one = parse_data_spec({"data/a", "data/b.h5"});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].paths, (std::vector<std::string>{"data/a", "data/b.h5"}));
  auto two = parse_data_spec({"0.7 data/a 0.3", "data/b"});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_DOUBLE_EQ(two[0].weight, 0.7);
  EXPECT_EQ(two[1].paths, (std::vector<std::string>{"data/b"}));
  // An entry that does not start with a weight is one path, spaces and all (trimmed at its ends).
  auto spaced = parse_data_spec({" my data/part one ", "data/b"});
  ASSERT_EQ(spaced.size(), 1u);
  EXPECT_EQ(spaced[0].paths, (std::vector<std::string>{"my data/part one", "data/b"}));
  // Weights and spaced paths as separate entries; Megatron's one-string blend is split at whitespace.
  auto blend = parse_data_spec({"0.25", "my data/a", "0.75", "b c"});
  ASSERT_EQ(blend.size(), 2u);
  EXPECT_EQ(blend[0].paths, (std::vector<std::string>{"my data/a"}));
  EXPECT_EQ(blend[1].paths, (std::vector<std::string>{"b c"}));
  EXPECT_EQ(data_spec_words({"0.7 data/a\t0.3  data/b", "  ", "./2024 corpus"}),
            (std::vector<std::string>{"0.7", "data/a", "0.3", "data/b", "./2024 corpus"}));
  expect_runtime_error([] { parse_data_spec({"inf data/a"}); }, {"'inf'", "finite non-negative weight"});
  expect_runtime_error([] { parse_data_spec({"0.7 data/a 0.3"}); }, {"weight/path pairs"});
  expect_runtime_error([] { parse_data_spec({"data/a", "0.3", "data/b"}); }, {"unweighted", "0.3"});
  expect_runtime_error([] { parse_data_spec({"0.5 1.5"}); }, {"expected a path"});
  expect_runtime_error([] { parse_data_spec({"-1 data/a"}); }, {"non-negative"});
  expect_runtime_error([] { parse_data_spec({"0 a 0 b"}); }, {"sum to zero"});
  expect_runtime_error([] { parse_data_spec({}, "data.valid"); }, {"data.valid", "no data"});
}

}  // namespace
}  // namespace gpt
