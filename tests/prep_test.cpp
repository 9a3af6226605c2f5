// `gpt-train prep` end to end: shards hold exactly tokenizer(doc) + EOD for every document in input
// order (checked against the tokenizer directly), identical output for 1 and many workers, shard sizes,
// text separators, JSON lines, directories, a SentencePiece BPE trained on the corpus, stale-shard
// cleanup, no index after a failure, and the command line of prep_main (with --from-megatron's
// exclusion of --input).
#include <gtest/gtest.h>

#include <filesystem>

#include "app/cli.h"
#include "data/document_reader.h"
#include "data/prep_pipeline.h"
#include "data/shard_set.h"
#include "data/shard_source.h"
#include "tests/data_test_util.h"

namespace gpt {
namespace {

using testutil::expect_runtime_error;
using testutil::read_text;
using testutil::TempDir;
using testutil::write_text;

const std::string kTiny = std::string(GPT_SOURCE_DIR) + "/tests/data/gpt2_tiny";

std::vector<std::string> sample_docs(int n) {
  std::vector<std::string> docs;
  for (int k = 0; k < n; ++k) {
    std::string d = "Document " + std::to_string(k) + ": ";
    for (int w = 0; w < 5 + k % 17; ++w) d += (w % 3 ? "the quick fox " : "jumps over it's 42 dogs, ");
    if (k % 5 == 0) d += "caf\xC3\xA9 \xE4\xB8\xAD\n";
    docs.push_back(d);
  }
  return docs;
}

// All documents of a prefix, in order, as token vectors.
std::vector<std::vector<int32_t>> read_all_docs(const std::string& prefix) {
  ShardCorpus c({prefix});
  std::vector<std::vector<int32_t>> out;
  for (int64_t d = 0; d < c.num_docs(); ++d) {
    std::vector<int32_t> t(c.doc_length(d));
    c.read_doc(d, 0, int64_t(t.size()), t.data());
    out.push_back(t);
  }
  return out;
}

TEST(Prep, BytesShardsHoldEveryDocumentInOrder) {
  TempDir dir;
  auto docs = sample_docs(300);
  std::string text;
  for (const auto& d : docs) text += d + "\n%\n";
  write_text(dir / "in.txt", text);
  PrepOptions o;
  o.inputs = {dir / "in.txt"};
  o.output_prefix = dir / "out/bytes";
  o.doc_separator = "%";
  o.shard_tokens = 5000;
  o.workers = 3;
  int calls = 0;
  bool saw_done = false;
  auto r = run_prep(o, [&](const PrepProgress& p) {
    ++calls;
    saw_done |= p.done;
  });
  EXPECT_TRUE(saw_done);
  EXPECT_EQ(r.docs, 300);
  EXPECT_GT(r.shards.size(), 3u);
  EXPECT_EQ(r.bytes_in, int64_t(text.size()));
  auto tok = make_byte_tokenizer();
  auto got = read_all_docs(o.output_prefix);
  ASSERT_EQ(got.size(), docs.size());
  int64_t total = 0;
  for (size_t k = 0; k < docs.size(); ++k) {
    // The separator line ends a document; the document keeps its own trailing newline.
    auto want = tok->encode(docs[k] + "\n");
    want.push_back(256);
    ASSERT_EQ(got[k], want) << k;
    total += int64_t(want.size());
  }
  EXPECT_EQ(r.tokens, total);
  // Shards close at the first document boundary past shard_tokens.
  for (const auto& s : r.shards) {
    TokenShardReader rd(s);
    EXPECT_LT(rd.meta().num_tokens, 5000 + 1000);
  }
  for (const auto& e : std::filesystem::directory_iterator(dir / "out"))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  auto ix = read_shard_index(o.output_prefix);
  EXPECT_EQ(ix.num_docs, 300);
  EXPECT_GT(ix.unigram_perplexity, 1.0);
  EXPECT_LT(ix.unigram_perplexity, 257.0);
}

TEST(Prep, WorkerCountDoesNotChangeOutput) {
  TempDir dir;
  auto docs = sample_docs(2000);
  write_text(dir / "in.jsonl", [&] {
    std::string s;
    for (const auto& d : docs) {
      std::string esc;
      for (char c : d) esc += c == '\n' ? std::string("\\n") : c == '"' ? std::string("\\\"") : std::string(1, c);
      s += "{\"meta\": {\"k\": [1, 2]}, \"text\": \"" + esc + "\"}\n";
    }
    return s;
  }());
  auto run = [&](int workers, const std::string& name) {
    PrepOptions o;
    o.inputs = {dir / "in.jsonl"};
    o.output_prefix = dir / name;
    o.tokenizer = "gpt2";
    o.vocab_file = kTiny + "/vocab.json";
    o.merges_file = kTiny + "/merges.txt";
    o.workers = workers;
    o.shard_tokens = 20000;
    run_prep(o);
    return read_all_docs(o.output_prefix);
  };
  auto one = run(1, "w1"), many = run(4, "w4");
  ASSERT_EQ(one.size(), docs.size());
  EXPECT_EQ(one, many);
  auto tok = make_gpt2_tokenizer(kTiny + "/vocab.json", kTiny + "/merges.txt");
  for (size_t k = 0; k < docs.size(); k += 97) {
    auto want = tok->encode(docs[k]);
    want.push_back(int32_t(tok->eod_id()));
    EXPECT_EQ(one[k], want) << k;
  }
  auto info = read_shard_data_info({dir / "w4"});
  EXPECT_EQ(info.tokenizer, "gpt2");
  EXPECT_EQ(info.vocab_size, 454);
}

TEST(Prep, DirectoriesBlankLineSeparatorsAndWholeFiles) {
  TempDir dir;
  std::filesystem::create_directories(dir / "in");
  write_text(dir / "in/b.txt", "second file\n");
  write_text(dir / "in/a.txt", "para one\nline two\n\n\npara two\n");
  write_text(dir / "in/z.dat", std::string("bin\0ary", 7));
  std::filesystem::create_symlink(dir / "in/a.txt", dir / "in/link.txt");
  auto files = expand_inputs({dir / "in"});
  EXPECT_EQ(files, (std::vector<std::string>{dir / "in/a.txt", dir / "in/b.txt"}));

  DocumentReader whole(files, {});
  std::string d;
  ASSERT_TRUE(whole.next(d));
  EXPECT_EQ(d, "para one\nline two\n\n\npara two\n");
  ASSERT_TRUE(whole.next(d));
  EXPECT_EQ(d, "second file\n");
  EXPECT_FALSE(whole.next(d));

  DocumentReader paras(files, {std::string(""), "text"});
  std::vector<std::string> got;
  while (paras.next(d)) got.push_back(d);
  EXPECT_EQ(got, (std::vector<std::string>{"para one\nline two\n", "para two\n", "second file\n"}));
  EXPECT_EQ(paras.skipped_empty(), 1);
  expect_runtime_error([&] { expand_inputs({dir / "missing.txt"}); }, {"missing.txt", "does not exist"});
}

TEST(Prep, BadJsonLineNamesFileAndLine) {
  TempDir dir;
  write_text(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": 3}\n");
  PrepOptions o;
  o.inputs = {dir / "bad.jsonl"};
  o.output_prefix = dir / "out";
  expect_runtime_error([&] { run_prep(o); }, {"bad.jsonl", "line 2", "not a string"});
  EXPECT_FALSE(std::filesystem::exists(shard_index_path(o.output_prefix)));
  write_text(dir / "empty.txt", "%\n%\n");
  o.inputs = {dir / "empty.txt"};
  o.doc_separator = "%";
  expect_runtime_error([&] { run_prep(o); }, {"no documents"});
  o.tokenizer = "wordpiece";
  expect_runtime_error([&] { run_prep(o); }, {"wordpiece"});
  o.tokenizer = "gpt2";
  expect_runtime_error([&] { run_prep(o); }, {"--vocab-file"});
}

TEST(Prep, RerunRemovesStaleShardsAndReplacesIndex) {
  TempDir dir;
  auto docs = sample_docs(200);
  std::string text;
  for (const auto& d : docs) text += d + "\n%\n";
  write_text(dir / "in.txt", text);
  PrepOptions o;
  o.inputs = {dir / "in.txt"};
  o.output_prefix = dir / "p";
  o.doc_separator = "%";
  o.shard_tokens = 2000;
  auto first = run_prep(o);
  ASSERT_GT(first.shards.size(), 4u);
  o.shard_tokens = 1000000;
  auto second = run_prep(o);
  ASSERT_EQ(second.shards.size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(shard_file_name(o.output_prefix, 1)));
  EXPECT_EQ(read_shard_index(o.output_prefix).shards.size(), 1u);
  EXPECT_EQ(read_all_docs(o.output_prefix).size(), 200u);
}

TEST(Prep, TrainedSentencePieceBpe) {
  TempDir dir;
  auto docs = sample_docs(400);
  std::string text;
  for (const auto& d : docs) text += d + "\n%\n";
  write_text(dir / "in.txt", text);
  PrepOptions o;
  o.inputs = {dir / "in.txt"};
  o.output_prefix = dir / "spm";
  o.doc_separator = "%";
  o.tokenizer = "spm";
  o.vocab_size = 400;
  o.workers = 2;
  auto r = run_prep(o);
  EXPECT_EQ(r.tokenizer_model, o.output_prefix + ".spm.model");
  auto tok = make_spm_tokenizer(r.tokenizer_model);
  EXPECT_EQ(r.tokenizer_hash, tok->hash());
  auto got = read_all_docs(o.output_prefix);
  ASSERT_EQ(got.size(), docs.size());
  int64_t bytes = 0;
  for (size_t k = 0; k < docs.size(); ++k) {
    auto want = tok->encode(docs[k] + "\n");
    want.push_back(int32_t(tok->eod_id()));
    ASSERT_EQ(got[k], want);
    bytes += int64_t(docs[k].size()) + 1;
    std::vector<int32_t> body(got[k].begin(), got[k].end() - 1);
    EXPECT_EQ(tok->decode(body), docs[k] + "\n");
  }
  EXPECT_LT(r.tokens, bytes / 2);  // a real compression over bytes
  // Reusing the model file gives the same shards and hash.
  o.vocab_file = r.tokenizer_model;
  o.output_prefix = dir / "spm2";
  auto r2 = run_prep(o);
  EXPECT_EQ(r2.tokenizer_hash, r.tokenizer_hash);
  EXPECT_EQ(read_all_docs(o.output_prefix), got);
  // And training reads these shards with the spm tokenizer name.
  EXPECT_NO_THROW(make_shard_source({dir / "spm"}, "train", "969,30,1", 16, 1, "spm", 400));
}

// prep through its command line, as main runs it: 2 for a command line it refuses, else prep_main's status.
int run_prep_command(std::vector<std::string> words) {
  words.insert(words.begin(), "prep");
  try {
    return parse_command_line(words).run();
  } catch (const CliError&) {
    return 2;
  }
}

TEST(Prep, CommandLine) {
  TempDir dir;
  write_text(dir / "a.txt", "alpha beta\n");
  write_text(dir / "b.txt", "gamma\n");
  EXPECT_TRUE(parse_command_line({"prep", "--help"}).help);
  EXPECT_EQ(run_prep_command({"--input"}), 2);
  EXPECT_EQ(run_prep_command({"--output-prefix", dir / "x"}), 2);
  EXPECT_EQ(run_prep_command({"--input", dir / "a.txt", "--output-prefix", dir / "x", "--bogus", "1"}), 2);
  EXPECT_EQ(run_prep_command({"--input", dir / "a.txt", "--output-prefix", dir / "x", "--workers", "two"}), 2);
  EXPECT_EQ(run_prep_command({"--input", dir / "nope.txt", "--output-prefix", dir / "x"}), 1);
  // --from-megatron (tested end to end by megatron_import_test.py) excludes --input.
  EXPECT_EQ(run_prep_command({"--from-megatron", dir / "m", "--input", dir / "a.txt", "--output-prefix", dir / "x"}),
            2);
  EXPECT_EQ(run_prep_command({"--from-megatron", dir / "m", "--output-prefix", dir / "x"}), 1);
  PrepOptions both;
  both.inputs = {dir / "a.txt"};
  both.from_megatron = dir / "m";
  both.output_prefix = dir / "x";
  expect_runtime_error([&] { run_prep(both); }, {"--from-megatron", "--input"});
  both.inputs.clear();
  expect_runtime_error([&] { run_prep(both); }, {dir / "m.idx", "not found"});
  ASSERT_EQ(run_prep_command({"--input", dir / "a.txt", dir / "b.txt", "--output-prefix=" + (dir / "cli"), "--workers",
                              "2", "--tokenizer", "bytes", "--shard-mb", "1"}),
            0);
  auto docs = read_all_docs(dir / "cli");
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[1], (std::vector<int32_t>{'g', 'a', 'm', 'm', 'a', '\n', 256}));
}

}  // namespace
}  // namespace gpt
