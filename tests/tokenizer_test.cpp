// Tokenizer tests: Unicode classes and UTF-8 decoding, the GPT-2 pre-tokenizer and BPE against cases
// produced by an independent Python implementation of OpenAI's encoder.py (tests/gpt2_bpe_reference.py,
// with the `regex` module), the real GPT-2 files when available, the byte tokenizer, SentencePiece
// training / loading, and the JSON reading used for .jsonl input and vocab.json.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include "data/gpt2_bpe.h"
#include "data/json_lines.h"
#include "data/tokenizer.h"
#include "data/unicode_class.h"
#include "tests/data_test_util.h"

namespace gpt {
namespace {

using testutil::expect_runtime_error;
using testutil::TempDir;
using testutil::write_text;

const std::string kTiny = std::string(GPT_SOURCE_DIR) + "/tests/data/gpt2_tiny";

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += char(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

TEST(Unicode, ClassesMatchRegexModule) {
  EXPECT_EQ(classify('a'), CharClass::Letter);
  EXPECT_EQ(classify('Z'), CharClass::Letter);
  EXPECT_EQ(classify('7'), CharClass::Number);
  EXPECT_EQ(classify(' '), CharClass::Space);
  EXPECT_EQ(classify('\n'), CharClass::Space);
  EXPECT_EQ(classify(0x1C), CharClass::Other);  // str.isspace() says yes, \s in `regex` says no
  EXPECT_EQ(classify('!'), CharClass::Other);
  EXPECT_EQ(classify(0xE9), CharClass::Letter);    // é
  EXPECT_EQ(classify(0x4E2D), CharClass::Letter);  // 中
  EXPECT_EQ(classify(0x0663), CharClass::Number);  // Arabic-Indic three
  EXPECT_EQ(classify(0x216B), CharClass::Number);  // Roman numeral twelve (Nl)
  EXPECT_EQ(classify(0xBD), CharClass::Number);    // ½ (No)
  EXPECT_EQ(classify(0xA0), CharClass::Space);
  EXPECT_EQ(classify(0x3000), CharClass::Space);
  EXPECT_EQ(classify(0x0301), CharClass::Other);   // combining acute (Mn)
  EXPECT_EQ(classify(0x1F600), CharClass::Other);  // 😀
}

TEST(Unicode, DecodeUtf8RejectsInvalidForms) {
  auto dec = [](const std::string& s) { return decode_utf8(s, 0); };
  EXPECT_EQ(dec("\xC3\xA9").code_point, 0xE9u);
  EXPECT_EQ(dec("\xC3\xA9").length, 2);
  EXPECT_EQ(dec("\xF0\x9F\x98\x80").code_point, 0x1F600u);
  EXPECT_EQ(dec("\xC0\xAF").length, 1);          // overlong
  EXPECT_EQ(dec("\xED\xA0\x80").length, 1);      // surrogate
  EXPECT_EQ(dec("\xF4\x90\x80\x80").length, 1);  // > U+10FFFF
  EXPECT_EQ(dec("\xE4\xB8").length, 1);          // truncated
  EXPECT_EQ(dec("\x80").code_point, 0xFFFDu);
  std::string s;
  append_utf8(0x1F600, s);
  EXPECT_EQ(s, "\xF0\x9F\x98\x80");
}

TEST(Gpt2Bpe, ByteToUnicodeMatchesEncoderPy) {
  const auto& t = gpt2_byte_to_unicode();
  EXPECT_EQ(t['!'], char32_t('!'));
  EXPECT_EQ(t[' '], char32_t(0x120));  // 'Ġ'
  EXPECT_EQ(t['\n'], char32_t(0x10A));  // 'Ċ'
  EXPECT_EQ(t[0], char32_t(0x100));
  EXPECT_EQ(t[0xAD], char32_t(0x143));
  EXPECT_EQ(t[0xFF], char32_t(0xFF));
}

// Every case of the Python reference: the same pre-tokens and the same ids.
TEST(Gpt2Bpe, MatchesPythonReferenceOnTinyVocab) {
  auto tok = make_gpt2_tokenizer(kTiny + "/vocab.json", kTiny + "/merges.txt");
  EXPECT_EQ(tok->name(), "gpt2");
  EXPECT_EQ(tok->vocab_size(), 454);
  EXPECT_EQ(tok->eod_id(), 453);
  std::ifstream in(kTiny + "/cases.tsv");
  ASSERT_TRUE(in) << "missing fixture; run tests/gpt2_bpe_reference.py";
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    auto fields = split(line, '\t');
    while (fields.size() < 3) fields.push_back("");
    std::string text = unhex(fields[0]);
    std::vector<std::string> want_pieces;
    for (const auto& p : split(fields[1], ',')) want_pieces.push_back(unhex(p));
    std::vector<int32_t> want_ids;
    std::istringstream ids(fields[2]);
    for (int32_t id; ids >> id;) want_ids.push_back(id);

    std::vector<std::string> pieces;
    gpt2_pretokenize(text, [&](std::string_view p) { pieces.emplace_back(p); });
    EXPECT_EQ(pieces, want_pieces) << "text hex " << fields[0];
    EXPECT_EQ(tok->encode(text), want_ids) << "text hex " << fields[0];
    EXPECT_EQ(tok->decode(want_ids), text);
    ++cases;
  }
  EXPECT_GT(cases, 200);
}

TEST(Gpt2Bpe, CacheGivesSameResultsAcrossThreads) {
  auto tok = make_gpt2_tokenizer(kTiny + "/vocab.json", kTiny + "/merges.txt");
  std::string text = "The quick brown fox jumps over the lazy dog. It's 1234 the end. ";
  std::string big;
  for (int k = 0; k < 50; ++k) big += text;
  auto want = tok->encode(big);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { ok[t] = tok->encode(big) == want; });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

// A tokenizer freed and another built in its place must not reuse the first one's per-thread cache.
TEST(Gpt2Bpe, CacheIsPerTokenizerInstance) {
  TempDir dir;
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    std::string sym;
    append_utf8(gpt2_byte_to_unicode()[b], sym);
    vocab += nlohmann::json(sym).dump() + ": " + std::to_string(b) + ", ";
  }
  vocab += "\"<|endoftext|>\": 256}";
  write_text(dir / "bytes_vocab.json", vocab);
  write_text(dir / "no_merges.txt", "#version: 0.2\n");
  for (int round = 0; round < 3; ++round) {
    {
      auto tiny = make_gpt2_tokenizer(kTiny + "/vocab.json", kTiny + "/merges.txt");
      EXPECT_EQ(tiny->encode("Hello world"), (std::vector<int32_t>{328, 450}));
    }
    auto plain = make_gpt2_tokenizer(dir / "bytes_vocab.json", dir / "no_merges.txt");
    EXPECT_EQ(plain->vocab_size(), 257);
    EXPECT_EQ(plain->encode("Hello world").size(), 11u);
  }
}

// The published GPT-2 files: "Hello world" -> 15496, 995 (Megatron's GPT2BPETokenizer does the same).
TEST(Gpt2Bpe, RealGpt2FilesHelloWorld) {
  const char* dir = std::getenv("GPT2_BPE_DIR");
  if (!dir || !std::filesystem::exists(std::string(dir) + "/vocab.json") ||
      !std::filesystem::exists(std::string(dir) + "/merges.txt"))
    GTEST_SKIP() << "the GPT-2 vocab.json / merges.txt are not on this machine; set GPT2_BPE_DIR to the directory "
                    "holding them to run this test";
  auto tok = make_gpt2_tokenizer(std::string(dir) + "/vocab.json", std::string(dir) + "/merges.txt");
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eod_id(), 50256);
  EXPECT_EQ(tok->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
}

TEST(Gpt2Bpe, MalformedFilesNameTheFile) {
  TempDir dir;
  write_text(dir / "bad.json", "{\"a\": 1,");
  expect_runtime_error([&] { make_gpt2_tokenizer(dir / "bad.json", kTiny + "/merges.txt"); },
                       {"bad.json", "not a JSON object"});
  write_text(dir / "noeod.json", "{\"a\": 0}");
  expect_runtime_error([&] { make_gpt2_tokenizer(dir / "noeod.json", kTiny + "/merges.txt"); },
                       {"noeod.json", "<|endoftext|>"});
  write_text(dir / "nobytes.json", "{\"a\": 0, \"<|endoftext|>\": 1}");
  expect_runtime_error([&] { make_gpt2_tokenizer(dir / "nobytes.json", kTiny + "/merges.txt"); },
                       {"nobytes.json", "byte symbol"});
  write_text(dir / "merges.txt", "#version: 0.2\na b c\n");
  expect_runtime_error([&] { make_gpt2_tokenizer(kTiny + "/vocab.json", dir / "merges.txt"); },
                       {"merges.txt", "line 2"});
  expect_runtime_error([&] { make_gpt2_tokenizer(dir / "absent.json", kTiny + "/merges.txt"); },
                       {"absent.json", "cannot be opened"});
}

TEST(ByteTokenizer, BytesAndEod) {
  auto tok = make_byte_tokenizer();
  EXPECT_EQ(tok->vocab_size(), 257);
  EXPECT_EQ(tok->eod_id(), 256);
  EXPECT_EQ(tok->encode("A\xC3\xA9"), (std::vector<int32_t>{65, 0xC3, 0xA9}));
  EXPECT_EQ(tok->decode({65, 0xC3, 0xA9, 256}), "A\xC3\xA9");
  EXPECT_EQ(tok->hash(), "bytes");
}

std::vector<std::string> spm_corpus() {
  std::vector<std::string> s;
  const char* lines[] = {"The quick brown fox jumps over the lazy dog.\n", "It's what they said: we'll see.\n",
                         "Hello world, hello again, hello there.\n", "Numbers 1234 and 5678 appear here.\n",
                         "Café résumé naïve — Ωmega.\n"};
  for (int k = 0; k < 40; ++k)
    for (const char* l : lines) s.push_back(l);
  return s;
}

TEST(SpmTokenizer, TrainedBpeRoundTripsAndReloads) {
  TempDir dir;
  train_spm_model(spm_corpus(), 400, 1, dir / "m.model");
  ASSERT_TRUE(std::filesystem::exists(dir / "m.model"));
  EXPECT_FALSE(std::filesystem::exists(dir / "m.model.tmp"));
  auto tok = make_spm_tokenizer(dir / "m.model");
  EXPECT_EQ(tok->name(), "spm");
  EXPECT_LE(tok->vocab_size(), 400);
  EXPECT_GT(tok->vocab_size(), 259);
  EXPECT_EQ(tok->eod_id(), 2);
  EXPECT_EQ(tok->hash().rfind("fnv1a64:", 0), 0u);
  // Text the model never saw (other scripts, control characters, emoji) survives through byte fallback.
  for (std::string text : {std::string("The quick brown fox.\nHello world"), std::string("  two  spaces\n\n"),
                           std::string("中文 😀 \t tab"), std::string("hello\x01\x7f")}) {
    auto ids = tok->encode(text);
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tok->vocab_size());
      EXPECT_NE(id, tok->eod_id());
    }
    EXPECT_EQ(tok->decode(ids), text);
  }
  // The trained BPE really merges: common words take fewer ids than bytes.
  EXPECT_LT(tok->encode("the quick brown fox").size(), std::string("the quick brown fox").size() / 2);
  auto again = make_spm_tokenizer(dir / "m.model");
  EXPECT_EQ(again->encode("Hello world"), tok->encode("Hello world"));
  EXPECT_EQ(again->hash(), tok->hash());
}

TEST(SpmTokenizer, BadInputs) {
  TempDir dir;
  write_text(dir / "junk.model", "not a model");
  expect_runtime_error([&] { make_spm_tokenizer(dir / "junk.model"); }, {"junk.model", "cannot be loaded"});
  expect_runtime_error([&] { train_spm_model(spm_corpus(), 100, 1, dir / "x.model"); }, {"vocab-size"});
}

TEST(Json, StringFieldOfJsonLines) {
  EXPECT_EQ(json_string_field(R"({"text": "hi"})", "text"), "hi");
  EXPECT_EQ(json_string_field(R"({"id": 3, "meta": {"a": [1, 2, {"text": "no"}]}, "text": "a\"b\\c\/d\n\t"})", "text"),
            "a\"b\\c/d\n\t");
  EXPECT_EQ(json_string_field(R"({"text": "\u00e9\u4e2d\ud83d\ude00"})", "text"), "\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80");
  EXPECT_EQ(json_string_field(R"({"text": "\ud83d x"})", "text"), "\xEF\xBF\xBD x");  // lone surrogate
  EXPECT_EQ(json_string_field(R"(  {"x": null, "y": true, "z": -1.5e3, "text": ""}  )", "text"), "");
  EXPECT_THROW(json_string_field(R"({"text": 5})", "text"), JsonError);
  EXPECT_THROW(json_string_field(R"({"other": "x"})", "text"), JsonError);
  EXPECT_THROW(json_string_field(R"({"text": "x")", "text"), JsonError);
  EXPECT_THROW(json_string_field(R"({"text": "x"} extra)", "text"), JsonError);
  EXPECT_THROW(json_string_field(R"(["text"])", "text"), JsonError);
  EXPECT_THROW(json_string_field("{\"text\": \"a\nb\"}", "text"), JsonError);  // raw control character
  // Text Python's json module writes from imperfect input reads as Python's "replace" would give it.
  EXPECT_EQ(json_string_field(R"({"text": "a\udc00b\ud800"})", "text"), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
  EXPECT_EQ(json_string_field(R"({"text": "\ud83d\u0041"})", "text"), "\xEF\xBF\xBD" "A");
  EXPECT_EQ(json_string_field("{\"text\": \"a\xFF\xC3" "b\"}", "text"), "a\xEF\xBF\xBD\xEF\xBF\xBD" "b");
  EXPECT_EQ(json_string_field(R"({"text": "\\ud83d"})", "text"), "\\ud83d");  // an escaped backslash
  EXPECT_EQ(json_string_field(R"({"text": "first", "text": "second"})", "text"), "first");
  EXPECT_EQ(json_string_field(R"({"body": "x"})", "body"), "x");
  auto message = [](std::string_view line) {
    try {
      json_string_field(line, "text");
    } catch (const JsonError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(R"({"text": 5})"), "field \"text\" is not a string but a number");
  EXPECT_EQ(message(R"({"text": ["a"]})"), "field \"text\" is not a string but an array");
  EXPECT_EQ(message(R"({"other": "x"})"), "no \"text\" field");
  EXPECT_EQ(message(R"("text")"), "expected a JSON object");
  EXPECT_NE(message(R"({"text": "x"} extra)").find("at byte"), std::string::npos) << message(R"({"text": "x"} extra)");
  EXPECT_EQ(message(R"({"text": "x"} extra)").find("json.exception"), std::string::npos);
}

}  // namespace
}  // namespace gpt
