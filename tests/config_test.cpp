// Tests for the config loader (app/config.cpp, app/config_schema.cpp): defaults, the shipped
// configs/tiny-cpu.yaml, unknown keys and type errors with the key, file and line in the message, every
// validation rule, --set overrides of each type, and dump -> load -> dump round trips.
#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "app/config.h"
#include "app/config_paths.h"
#include "app/config_schema.h"

namespace gpt {
namespace {

// Runs `body`, expects a ConfigError whose message contains every one of `parts`.
void expect_config_error(const std::function<void()>& body, const std::vector<std::string>& parts) {
  try {
    body();
  } catch (const ConfigError& e) {
    std::string message = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "message: " << message << "\nmissing: " << part;
    return;
  }
  ADD_FAILURE() << "no ConfigError; expected one mentioning " << (parts.empty() ? "" : parts[0]);
}

Config from_yaml(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return load_config_string(yaml, "test.yaml", overrides);
}

std::filesystem::path temp_dir() {
  auto dir = std::filesystem::temp_directory_path() / ("gpt_config_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(ConfigTable, KeysAreUniqueGroupedAndPointAtDistinctFields) {
  Config c;
  std::set<std::string> paths;
  std::set<const void*> fields;
  std::set<std::string> closed_sections;
  std::string current;
  for (const ConfigKey& key : config_keys()) {
    std::string path = key.path;
    EXPECT_TRUE(paths.insert(path).second) << "duplicate key " << path;
    EXPECT_LE(std::count(path.begin(), path.end(), '.'), 1) << path;
    std::string section = path.find('.') == std::string::npos ? "" : path.substr(0, path.find('.'));
    if (section != current) {
      EXPECT_FALSE(closed_sections.count(section)) << "section " << section << " is split in the table";
      closed_sections.insert(current);
      current = section;
    }
    const void* field = std::visit([](auto* p) -> const void* { return p; }, key.field(c));
    EXPECT_TRUE(fields.insert(field).second) << path << " points at the same field as another key";
    auto offset = static_cast<const char*>(field) - reinterpret_cast<const char*>(&c);
    EXPECT_TRUE(offset >= 0 && offset < static_cast<std::ptrdiff_t>(sizeof(Config))) << path;
    EXPECT_NE(std::string(key.help), "") << path;
    if (!key.choices.empty()) {
      EXPECT_TRUE(std::holds_alternative<std::string*>(key.field(c))) << path;
    }
  }
  EXPECT_NE(find_config_key("model.hidden_size"), nullptr);
  EXPECT_EQ(find_config_key("model"), nullptr);
  EXPECT_TRUE(is_config_section("model"));
  EXPECT_FALSE(is_config_section("mod"));
  EXPECT_FALSE(is_config_section("backend"));
}

TEST(ConfigDefaults, EmptyDocumentGivesStructDefaultsAndValidates) {
  Config c = from_yaml("");
  Config d;
  EXPECT_EQ(dump_config(c), dump_config(d));
  EXPECT_EQ(c.source, "test.yaml");
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.optimizer.lr, 6e-4);
  EXPECT_EQ(c.training.recompute, "none");
  EXPECT_TRUE(c.data.train.empty());
  EXPECT_NO_THROW(validate_config(d));
  // A comment-only file and an empty section are also all defaults.
  EXPECT_EQ(dump_config(from_yaml("# nothing\n")), dump_config(d));
  EXPECT_EQ(dump_config(from_yaml("model:\nlogging:\n")), dump_config(d));
}

TEST(ConfigFile, LoadsTinyCpuYaml) {
  std::string path = std::string(GPT_SOURCE_DIR) + "/configs/tiny-cpu.yaml";
  Config c = load_config(path);
  EXPECT_EQ(c.source, path);
  EXPECT_EQ(c.backend, "cpu");
  EXPECT_EQ(c.model.num_layers, 2);
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.num_heads, 4);
  EXPECT_EQ(c.model.seq_length, 64);
  EXPECT_EQ(c.model.vocab_size, 256);
  EXPECT_EQ(c.training.micro_batch_size, 4);
  EXPECT_EQ(c.training.global_batch_size, 8);
  EXPECT_EQ(c.training.train_iters, 50);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.optimizer.warmup_iters, 5);
  EXPECT_TRUE(c.data.train.empty());
  EXPECT_EQ(c.logging.metrics_file, "runs/tiny-cpu/metrics.jsonl");
  // Overrides apply on top of the file.
  Config o = load_config(path, {"model.num_layers=4", "training.train_iters=3"});
  EXPECT_EQ(o.model.num_layers, 4);
  EXPECT_EQ(o.training.train_iters, 3);
}

TEST(ConfigFile, MissingFileAndBadYamlNameTheFile) {
  expect_config_error([] { load_config("/nonexistent/dir/x.yaml"); }, {"config /nonexistent/dir/x.yaml", "cannot open"});
  expect_config_error([] { from_yaml("model: [1, 2\n"); }, {"config test.yaml", "invalid YAML", "line"});
  expect_config_error([] { from_yaml("- a\n- b\n"); }, {"config test.yaml", "must be a map"});
}

TEST(ConfigFile, ReadsNestedValuesOfEveryType) {
  Config c = from_yaml(
      "backend: cuda\n"
      "model: {num_layers: 4, hidden_size: 128, num_heads: 8, init_std: 0.01}\n"
      "parallel:\n  sequence_parallel: true\n  distributed_optimizer: yes\n"
      "optimizer:\n  lr: 3e-4\n  min_lr: 0\n  eps: 1.0e-6\n"
      "data:\n  train: [a/shard_0.h5, b/shard_1.h5]\n  valid: v/shard.h5\n  tokenizer: \"bytes\"\n"
      "logging:\n  metrics_file:\n");
  EXPECT_EQ(c.backend, "cuda");
  EXPECT_EQ(c.model.num_layers, 4);
  EXPECT_EQ(c.model.hidden_size, 128);
  EXPECT_DOUBLE_EQ(c.model.init_std, 0.01);
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_TRUE(c.parallel.distributed_optimizer);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"a/shard_0.h5", "b/shard_1.h5"}));
  EXPECT_EQ(c.data.valid, (std::vector<std::string>{"v/shard.h5"}));  // a single string is a one-element list
  EXPECT_EQ(c.data.tokenizer, "bytes");
  EXPECT_EQ(c.logging.metrics_file, "");  // null = empty string
}

TEST(ConfigErrors, UnknownKeysNameFileLineAndSuggestion) {
  expect_config_error([] { from_yaml("model:\n  hiden_size: 32\n"); },
                      {"config test.yaml: unknown key 'model.hiden_size'", "did you mean 'model.hidden_size'", "line 2"});
  expect_config_error([] { from_yaml("modle:\n  hidden_size: 32\n"); }, {"unknown key 'modle'", "did you mean 'model'"});
  expect_config_error([] { from_yaml("training:\n  lr: 0.1\n"); }, {"unknown key 'training.lr'", "'optimizer.lr'"});
  expect_config_error([] { from_yaml("completely_unrelated_thing: 1\n"); }, {"unknown key 'completely_unrelated_thing'"});
  expect_config_error([] { from_yaml("model:\n  layers:\n    n: 2\n"); }, {"unknown key 'model.layers'"});
  expect_config_error([] { from_yaml("model:\n  num_layers: 2\n  num_layers: 4\n"); }, {"'model.num_layers' is given twice"});
}

TEST(ConfigErrors, WrongTypesNameKeyExpectedTypeAndValue) {
  expect_config_error([] { from_yaml("model:\n  hidden_size: abc\n"); },
                      {"config test.yaml", "'model.hidden_size'", "expects int", "'abc'", "line 2"});
  expect_config_error([] { from_yaml("model:\n  hidden_size: 1.5\n"); }, {"'model.hidden_size'", "int", "'1.5'"});
  expect_config_error([] { from_yaml("model:\n  hidden_size: \"64\"\n"); }, {"'model.hidden_size'", "int", "quoted string"});
  expect_config_error([] { from_yaml("model:\n  hidden_size: 99999999999999999999\n"); }, {"'model.hidden_size'", "int"});
  expect_config_error([] { from_yaml("model:\n  hidden_size:\n"); }, {"'model.hidden_size'", "int", "null"});
  expect_config_error([] { from_yaml("optimizer:\n  lr: fast\n"); }, {"'optimizer.lr'", "expects float", "'fast'"});
  expect_config_error([] { from_yaml("parallel:\n  sequence_parallel: maybe\n"); },
                      {"'parallel.sequence_parallel'", "expects bool", "'maybe'"});
  expect_config_error([] { from_yaml("parallel:\n  sequence_parallel: 1\n"); }, {"'parallel.sequence_parallel'", "bool"});
  expect_config_error([] { from_yaml("backend: [cpu]\n"); }, {"'backend'", "expects string", "a sequence"});
  expect_config_error([] { from_yaml("data:\n  train: {a: 1}\n"); }, {"'data.train'", "list of strings", "a map"});
  expect_config_error([] { from_yaml("data:\n  train: [[a]]\n"); }, {"'data.train'", "list of strings"});
  expect_config_error([] { from_yaml("data:\n  train: [a, \"\"]\n"); }, {"'data.train'", "empty entry"});
  expect_config_error([] { from_yaml("model: 3\n"); }, {"section 'model' must be a map", "'3'"});
}

// One rule per row: the overrides that break it and the key names the message must contain.
struct RuleCase {
  std::vector<std::string> overrides;
  std::vector<std::string> must_mention;
};

TEST(ConfigValidation, EveryRuleNamesItsKeysAndTheSource) {
  const std::vector<RuleCase> cases = {
      {{"model.hidden_size=66"}, {"model.hidden_size", "model.num_heads", "divisible"}},
      {{"model.num_layers=0"}, {"model.num_layers", ">= 1"}},
      {{"model.hidden_size=0"}, {"model.hidden_size", ">= 1"}},
      {{"model.num_heads=0"}, {"model.num_heads", ">= 1"}},
      {{"model.seq_length=0"}, {"model.seq_length", ">= 1"}},
      {{"model.vocab_size=1"}, {"model.vocab_size", ">= 2"}},
      {{"model.ffn_hidden_size=-1"}, {"model.ffn_hidden_size", ">= 1"}},
      {{"model.make_vocab_size_divisible_by=0"}, {"model.make_vocab_size_divisible_by"}},
      {{"model.layernorm_eps=0"}, {"model.layernorm_eps", "> 0"}},
      {{"model.init_std=-0.1"}, {"model.init_std"}},
      {{"training.micro_batch_size=0"}, {"training.micro_batch_size", ">= 1"}},
      {{"training.global_batch_size=0"}, {"training.global_batch_size", ">= 1"}},
      {{"training.global_batch_size=12", "training.micro_batch_size=8"},
       {"training.global_batch_size (12)", "training.micro_batch_size (8)", "divisible"}},
      {{"training.train_iters=0"}, {"training.train_iters"}},
      {{"training.threads=-1"}, {"training.threads"}},
      {{"training.recompute=some"}, {"training.recompute", "none, selective, full", "'some'"}},
      {{"precision.dtype=fp8"}, {"precision.dtype", "fp32, bf16, fp16", "'fp8'"}},
      {{"precision.fp8=e5m2"}, {"precision.fp8", "off, e4m3, hybrid", "'e5m2'"}},
      {{"precision.fp8_amax_compute_algo=mean"}, {"precision.fp8_amax_compute_algo", "max, most_recent", "'mean'"}},
      {{"precision.fp8_amax_history_len=0"}, {"precision.fp8_amax_history_len", ">= 1"}},
      {{"precision.fp8_margin=-1"}, {"precision.fp8_margin", ">= 0"}},
      {{"precision.fp8_margin=31"}, {"precision.fp8_margin", "<= 30"}},
      {{"backend=tpu"}, {"backend", "cpu, cuda", "'tpu'"}},
      {{"optimizer.lr=-1"}, {"optimizer.lr", ">= 0"}},
      {{"optimizer.lr=.nan"}, {"optimizer.lr"}},
      {{"optimizer.min_lr=0.01"}, {"optimizer.min_lr", "optimizer.lr", "<="}},
      {{"optimizer.beta1=1"}, {"optimizer.beta1", "[0, 1)"}},
      {{"optimizer.beta2=-0.5"}, {"optimizer.beta2", "[0, 1)"}},
      {{"optimizer.eps=0"}, {"optimizer.eps", "> 0"}},
      {{"optimizer.clip_grad=-1"}, {"optimizer.clip_grad", ">= 0"}},
      {{"optimizer.warmup_iters=-1"}, {"optimizer.warmup_iters", ">= 0"}},
      {{"optimizer.decay_iters=-1"}, {"optimizer.decay_iters"}},
      {{"optimizer.weight_decay=-0.1"}, {"optimizer.weight_decay"}},
      {{"optimizer.lr_decay_style=step"}, {"optimizer.lr_decay_style", "inverse-square-root"}},
      {{"training.exit_interval=-1"}, {"training.exit_interval", ">= 0"}},
      {{"checkpoint.finetune=true"}, {"checkpoint.finetune", "checkpoint.load is empty"}},
      {{"training.exit_duration_mins=-5"}, {"training.exit_duration_mins"}},
      {{"parallel.tensor=0"}, {"parallel.tensor", ">= 1"}},
      {{"parallel.pipeline=0"}, {"parallel.pipeline", ">= 1"}},
      {{"parallel.virtual_pipeline=0"}, {"parallel.virtual_pipeline", ">= 1"}},
      {{"parallel.data=-1"}, {"parallel.data", ">= 0"}},
      {{"parallel.bucket_size_mb=0"}, {"parallel.bucket_size_mb"}},
      {{"parallel.data=3"}, {"training.global_batch_size", "parallel.data"}},
      {{"model.num_layers=3", "parallel.pipeline=2"},
       {"model.num_layers (3)", "parallel.pipeline", "parallel.virtual_pipeline"}},
      {{"model.num_layers=4", "parallel.pipeline=2", "parallel.virtual_pipeline=3"},
       {"model.num_layers (4)", "(2 * 3)"}},
      {{"parallel.tensor=3"}, {"model.num_heads (4)", "parallel.tensor (3)"}},
      {{"model.ffn_hidden_size=101", "parallel.tensor=2"}, {"model.ffn_hidden_size (101)", "parallel.tensor (2)"}},
      {{"model.seq_length=66", "parallel.tensor=4", "parallel.sequence_parallel=true"},
       {"model.seq_length (66)", "parallel.tensor", "sequence_parallel"}},
      {{"model.seq_length=66", "parallel.context=2"}, {"model.seq_length (66)", "2 x parallel.context (2 x 2)"}},
      {{"parallel.context=0"}, {"parallel.context", ">= 1"}},
      {{"model.seq_length=36", "parallel.context=2", "parallel.tensor=4", "parallel.sequence_parallel=true"},
       {"model.seq_length / parallel.context (36 / 2)", "parallel.tensor (4)", "sequence_parallel"}},
      {{"logging.interval=0"}, {"logging.interval", ">= 1"}},
      {{"logging.level=loud"}, {"logging.level", "'loud'"}},
      {{"logging.peak_tflops=-1"}, {"logging.peak_tflops"}},
      {{"data.synthetic=noise"}, {"data.synthetic", "random, pattern", "'noise'"}},
      {{"data.split=1,2"}, {"data.split", "three", "'1,2'"}},
      {{"data.split=1,2,3,4"}, {"data.split", "three"}},
      {{"data.split=1,2,"}, {"data.split"}},
      {{"data.split=1,-1,0"}, {"data.split", "non-negative", "'-1'"}},
      {{"data.split=a,b,c"}, {"data.split", "'a'"}},
      {{"data.split=0,0,0"}, {"data.split", "zero"}},
      {{"checkpoint.save_interval=-1"}, {"checkpoint.save_interval"}},
      {{"checkpoint.save_interval=10"}, {"checkpoint.save_interval", "checkpoint.dir"}},
      {{"checkpoint.keep_last=-1"}, {"checkpoint.keep_last"}},
      {{"eval.interval=-1"}, {"eval.interval"}},
      {{"eval.interval=10", "eval.iters=0"}, {"eval.iters", ">= 1"}},
  };
  for (const RuleCase& rule : cases) {
    SCOPED_TRACE(rule.overrides.back());
    std::vector<std::string> parts = rule.must_mention;
    parts.push_back("config test.yaml: ");
    expect_config_error([&] { from_yaml("", rule.overrides); }, parts);
  }
  // Values on the right side of each boundary pass.
  EXPECT_NO_THROW(from_yaml("", {"model.ffn_hidden_size=6", "model.vocab_size=2", "optimizer.lr=0", "optimizer.min_lr=0",
                                 "optimizer.beta1=0", "optimizer.clip_grad=0", "optimizer.warmup_iters=0",
                                 "data.split=0,0,1", "data.split= 0.9 , 0.1 ,0", "parallel.data=2",
                                 "model.num_layers=4", "parallel.pipeline=2", "parallel.virtual_pipeline=2",
                                 "parallel.tensor=2", "parallel.sequence_parallel=true", "checkpoint.dir=ckpt",
                                 "checkpoint.save_interval=5", "eval.interval=0", "eval.iters=0"}));
}

TEST(ConfigValidation, FileRuleErrorsNameTheFile) {
  auto path = temp_dir() / "bad_heads.yaml";
  std::ofstream(path) << "model:\n  hidden_size: 100\n  num_heads: 3\n";
  expect_config_error([&] { load_config(path.string()); },
                      {"config " + path.string() + ": model.hidden_size (100) must be divisible by model.num_heads (3)"});
  // validate_config on a hand-built Config uses its source.
  Config c;
  c.source = "hand-built";
  c.optimizer.eps = -1;
  expect_config_error([&] { validate_config(c); }, {"config hand-built: optimizer.eps"});
  std::filesystem::remove_all(path.parent_path());
}

TEST(ConfigOverrides, SetTypesEachKindLikeTheKey) {
  Config c = from_yaml("data:\n  train: [x]\n",
                       {"model.hidden_size=128", "model.num_heads=8", "optimizer.lr=2.5e-4", "optimizer.min_lr=1e-5",
                        "parallel.sequence_parallel=true", "logging.all_ranks=on", "backend=cuda",
                        "logging.metrics_file=runs/a b/m.jsonl", "data.valid=[v1.h5, \"v 2.h5\"]",
                        "data.train=single.h5", "checkpoint.load=\"quoted: yes\"", "training.seed=-7"});
  EXPECT_EQ(c.model.hidden_size, 128);
  EXPECT_EQ(c.model.num_heads, 8);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2.5e-4);
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_TRUE(c.logging.all_ranks);
  EXPECT_EQ(c.backend, "cuda");
  EXPECT_EQ(c.logging.metrics_file, "runs/a b/m.jsonl");
  EXPECT_EQ(c.data.valid, (std::vector<std::string>{"v1.h5", "v 2.h5"}));
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"single.h5"}));
  EXPECT_EQ(c.checkpoint.load, "quoted: yes");
  EXPECT_EQ(c.training.seed, -7);
  // Later overrides win; an empty value clears a list or a string.
  Config d = from_yaml("data:\n  train: [x]\n", {"model.num_layers=4", "model.num_layers=6", "data.train=",
                                                 "logging.metrics_file=", "data.valid=[]"});
  EXPECT_EQ(d.model.num_layers, 6);
  EXPECT_TRUE(d.data.train.empty());
  EXPECT_TRUE(d.data.valid.empty());
  EXPECT_EQ(d.logging.metrics_file, "");
  // An integer is a valid float.
  EXPECT_EQ(from_yaml("", {"optimizer.clip_grad=2"}).optimizer.clip_grad, 2.0);
}

TEST(ConfigOverrides, BadSetNamesSetKeyAndValue) {
  expect_config_error([] { from_yaml("", {"model.hiden_size=3"}); },
                      {"config test.yaml: --set: unknown key 'model.hiden_size'", "'model.hidden_size'"});
  expect_config_error([] { from_yaml("", {"model=3"}); }, {"--set", "'model' is a section"});
  expect_config_error([] { from_yaml("", {"model.hidden_size"}); }, {"--set", "key.path=value"});
  expect_config_error([] { from_yaml("", {"=3"}); }, {"--set", "key.path=value"});
  expect_config_error([] { from_yaml("", {"model.hidden_size=big"}); },
                      {"--set model.hidden_size=big", "'model.hidden_size'", "expects int", "'big'"});
  expect_config_error([] { from_yaml("", {"training.train_iters=1e3"}); }, {"--set", "training.train_iters", "int"});
  expect_config_error([] { from_yaml("", {"parallel.sequence_parallel=2"}); }, {"--set", "bool"});
  expect_config_error([] { from_yaml("", {"data.train=[a"}); }, {"--set data.train=[a", "cannot parse"});
  // apply_overrides alone does not validate; load_config_string does.
  Config c;
  apply_overrides(c, {"model.hidden_size=66"});
  EXPECT_EQ(c.model.hidden_size, 66);
  expect_config_error([] { from_yaml("", {"model.hidden_size=66"}); }, {"model.hidden_size"});
}

// A config with a non-default value in every key, including strings YAML would otherwise misread.
Config unusual_config() {
  Config c = from_yaml("",
                       {"backend=cuda", "model.num_layers=12", "model.hidden_size=768", "model.num_heads=12",
                        "model.ffn_hidden_size=3072", "model.seq_length=1024", "model.vocab_size=50257",
                        "model.make_vocab_size_divisible_by=64", "model.layernorm_eps=1e-12", "model.init_std=0.1",
                        "parallel.tensor=2", "parallel.pipeline=3", "parallel.virtual_pipeline=2", "parallel.data=4",
                        "parallel.sequence_parallel=true", "parallel.distributed_optimizer=true",
                        "parallel.bucket_size_mb=40", "training.micro_batch_size=2", "training.global_batch_size=512",
                        "training.train_iters=12345", "training.seed=-1", "training.recompute=selective",
                        "training.threads=3", "optimizer.lr=0.1", "optimizer.min_lr=3.0000000000000004e-05",
                        "optimizer.warmup_iters=7", "optimizer.decay_iters=9000", "optimizer.weight_decay=0",
                        "optimizer.beta1=0.85", "optimizer.beta2=0.999", "optimizer.eps=1e-08",
                        "optimizer.clip_grad=0.5", "precision.dtype=bf16"});
  // (A path key's leading ~ is the home directory, so YAML's null spelling "~" is tried on the tokenizer.)
  c.data.train = {"a.h5", "with space.h5", "x/~", "null", "true", "a: b", "#hash", "[x]", "quote\"s", "ünï"};
  c.data.valid = {"1"};
  c.data.split = "98,1.5,0.5";
  c.data.tokenizer = "~";
  c.data.synthetic = "pattern";
  c.checkpoint.dir = "runs/ck: pt";
  c.checkpoint.save_interval = 100;
  c.checkpoint.keep_last = 0;
  c.checkpoint.load = "'single'";
  c.eval.interval = 50;
  c.eval.iters = 3;
  c.logging.interval = 10;
  c.logging.metrics_file = "m.jsonl";
  c.logging.level = "debug";
  c.logging.all_ranks = true;
  c.logging.peak_tflops = 989.5;
  return c;
}

TEST(ConfigDump, ListsEveryKeyNested) {
  Config c;
  std::string text = dump_config(c);
  YAML::Node root = YAML::Load(text);
  for (const ConfigKey& key : config_keys()) {
    std::string path = key.path;
    size_t dot = path.find('.');
    YAML::Node node = dot == std::string::npos ? root[path] : root[path.substr(0, dot)][path.substr(dot + 1)];
    EXPECT_TRUE(node.IsDefined()) << path << " missing from dump:\n" << text;
  }
  EXPECT_NE(text.find("model:\n  num_layers: 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  lr: 6.0e-04\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  clip_grad: 1.0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  train: []\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  metrics_file: \"\"\n"), std::string::npos) << text;
  std::string annotated = dump_config(c, true);
  EXPECT_NE(annotated.find("# width of the residual stream"), std::string::npos) << annotated;
}

TEST(ConfigDump, RoundTripsThroughLoad) {
  for (const Config& original : {Config{}, unusual_config()}) {
    std::string first = dump_config(original);
    Config reloaded = load_config_string(first, "dump.yaml");
    EXPECT_EQ(dump_config(reloaded), first);
    EXPECT_EQ(dump_config(load_config_string(dump_config(original, true), "dump.yaml")), first);
  }
  // Spot-check that values survived, not only that the text is stable.
  Config u = unusual_config();
  Config r = load_config_string(dump_config(u), "dump.yaml");
  EXPECT_EQ(r.data.train, u.data.train);
  EXPECT_EQ(r.data.valid, u.data.valid);
  EXPECT_EQ(r.data.tokenizer, "~");
  EXPECT_EQ(r.checkpoint.dir, u.checkpoint.dir);
  EXPECT_EQ(r.checkpoint.load, u.checkpoint.load);
  EXPECT_EQ(r.optimizer.min_lr, u.optimizer.min_lr);  // bit-exact
  EXPECT_EQ(r.model.layernorm_eps, 1e-12);
  EXPECT_EQ(r.training.seed, -1);
  EXPECT_TRUE(r.parallel.distributed_optimizer);
  EXPECT_EQ(r.logging.peak_tflops, 989.5);
}

// ---- non-finite floats, sizes that overflow, paths -------------------------------------------------

TEST(ConfigValidation, EveryFloatKeyRejectsInfinityAndNan) {
  Config probe;
  int float_keys = 0;
  for (const ConfigKey& key : config_keys()) {
    if (!std::holds_alternative<double*>(key.field(probe))) continue;
    ++float_keys;
    const std::string path = key.path;
    const size_t dot = path.find('.');
    for (const char* value : {"inf", "-inf", "+inf", "infinity", "nan", "NaN", ".inf", "-.inf", ".nan"}) {
      SCOPED_TRACE(path + "=" + value);
      expect_config_error([&] { from_yaml("", {path + "=" + value}); },
                          {"config test.yaml: " + path + " must be a finite number"});
      expect_config_error([&] { from_yaml(path.substr(0, dot) + ":\n  " + path.substr(dot + 1) + ": " + value + "\n"); },
                          {"config test.yaml: " + path + " must be a finite number"});
    }
  }
  EXPECT_GE(float_keys, 10);
}

TEST(ConfigValidation, HugeSizesNameTheirKeysInsteadOfOverflowing) {
  const std::string max = "9223372036854775807";  // 2^63 - 1
  struct SizeCase {
    std::vector<std::string> overrides;
    std::vector<std::string> must_mention;
  };
  const std::vector<SizeCase> cases = {
      {{"model.vocab_size=" + max}, {"padded vocabulary", "overflows", "model.vocab_size = " + max}},
      {{"model.vocab_size=4611686018427387904"}, {"word embedding", "model.vocab_size = 4611686018427387904",
                                                  "model.hidden_size = 64"}},
      {{"model.make_vocab_size_divisible_by=" + max, "parallel.tensor=2"},
       {"model.make_vocab_size_divisible_by = " + max, "parallel.tensor = 2", "overflows"}},
      {{"model.hidden_size=" + max}, {"4 x model.hidden_size", "model.hidden_size = " + max}},
      {{"model.hidden_size=3037000500", "model.num_heads=4"}, {"one layer", "model.hidden_size = 3037000500"}},
      {{"model.ffn_hidden_size=" + max}, {"model.ffn_hidden_size = " + max, "overflows"}},
      {{"model.seq_length=" + max}, {"model.seq_length = " + max, "overflows"}},
      {{"model.seq_length=4611686018427387"}, {"activation bytes", "model.seq_length = 4611686018427387"}},
      {{"model.num_layers=" + max}, {"model.num_layers must be <= 2147483647"}},
      {{"model.num_layers=1099511627776"}, {"model.num_layers must be <= 2147483647"}},
      {{"model.num_heads=" + max}, {"model.num_heads = " + max, "overflows"}},
      {{"training.global_batch_size=" + max}, {"microbatch count per step", "training.global_batch_size = " + max}},
      {{"training.global_batch_size=9223372036854775800", "training.micro_batch_size=4611686018427387900"},
       {"activation bytes", "training.global_batch_size = 9223372036854775800"}},
      {{"training.micro_batch_size=8589934592", "training.global_batch_size=17179869184", "parallel.data=2147483647"},
       {"training.micro_batch_size = 8589934592", "parallel.data = 2147483647", "overflows"}},
      {{"training.train_iters=" + max}, {"token count of the run", "training.train_iters = " + max}},
      {{"eval.iters=" + max}, {"token count of one evaluation", "eval.iters = " + max}},
      {{"parallel.bucket_size_mb=" + max}, {"parallel.bucket_size_mb = " + max, "overflows"}},
      {{"parallel.pipeline=4294967296"}, {"parallel.pipeline must be <= 2147483647"}},
      {{"parallel.pipeline=65536", "parallel.virtual_pipeline=65536", "model.num_layers=65536"},
       {"model chunk count", "parallel.pipeline = 65536", "parallel.virtual_pipeline = 65536"}},
      {{"parallel.tensor=65536", "parallel.pipeline=65536", "model.num_heads=65536", "model.hidden_size=65536"},
       {"world size", "parallel.tensor = 65536", "parallel.pipeline = 65536"}},
      {{"training.threads=" + max}, {"training.threads must be <= 2147483647"}},
  };
  for (const SizeCase& size_case : cases) {
    SCOPED_TRACE(size_case.overrides.front());
    std::vector<std::string> parts = size_case.must_mention;
    parts.push_back("config test.yaml: ");
    expect_config_error([&] { from_yaml("", size_case.overrides); }, parts);
    try {
      from_yaml("", size_case.overrides);
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).find("negative"), std::string::npos) << e.what();
    }
  }
  // The shipped configs' sizes, and a long context, are nowhere near the limits.
  EXPECT_NO_THROW(from_yaml("", {"model.num_layers=96", "model.hidden_size=12288", "model.num_heads=96",
                                 "model.seq_length=131072", "model.vocab_size=256000", "parallel.tensor=8",
                                 "parallel.pipeline=16", "training.micro_batch_size=1",
                                 "training.global_batch_size=4096", "training.train_iters=1000000"}));
}

// Sets HOME for the test's scope and puts the previous value back.
class HomeDirectory {
 public:
  explicit HomeDirectory(const char* value) {
    if (const char* old = std::getenv("HOME")) saved_ = old, had_ = true;
    if (value) setenv("HOME", value, 1);
    else unsetenv("HOME");
  }
  ~HomeDirectory() {
    if (had_) setenv("HOME", saved_.c_str(), 1);
    else unsetenv("HOME");
  }

 private:
  std::string saved_;
  bool had_ = false;
};

TEST(ConfigPaths, LeadingTildeIsTheHomeDirectoryInEveryPathKey) {
  const std::string home = (temp_dir() / "home").string();
  HomeDirectory scoped(home.c_str());
  Config c = from_yaml("data:\n  train: [~/a, \"~/my data/b\"]\n  valid: 0.3 ~/v 0.7 ~/w\n"
                       "checkpoint:\n  dir: ~/ckpt\n",
                       {"checkpoint.load='~'", "logging.metrics_file=~/runs/m.jsonl", "logging.hardware=~/hw.yaml"});
  EXPECT_EQ(c.data.train, (std::vector<std::string>{home + "/a", home + "/my data/b"}));
  EXPECT_EQ(c.data.valid, (std::vector<std::string>{"0.3", home + "/v", "0.7", home + "/w"}));
  EXPECT_EQ(c.checkpoint.dir, home + "/ckpt");
  EXPECT_EQ(c.checkpoint.load, home);
  EXPECT_EQ(c.logging.metrics_file, home + "/runs/m.jsonl");
  EXPECT_EQ(c.logging.hardware, home + "/hw.yaml");
  // Only a leading ~ is special, and only in path keys.
  Config d = from_yaml("", {"checkpoint.dir=runs/~/x", "data.tokenizer='~'"});
  EXPECT_EQ(d.checkpoint.dir, "runs/~/x");
  EXPECT_EQ(d.data.tokenizer, "~");
  EXPECT_EQ(from_yaml("", {"checkpoint.load=~"}).checkpoint.load, "");  // a bare ~ is YAML's null
  EXPECT_EQ(expand_home("~/", "/h/"), "/h/");
  EXPECT_EQ(expand_home("~", "/h/"), "/h/");
  EXPECT_EQ(expand_home("~/x", "/h/"), "/h/x");
  // ~user is refused rather than made into a directory named "~user".
  expect_config_error([] { from_yaml("", {"checkpoint.dir=~bob/ckpt"}); },
                      {"config test.yaml: checkpoint.dir", "'~bob/ckpt'", "not ~user"});
  expect_config_error([] { from_yaml("", {"data.train=[0.5, ~bob/a, 0.5, b]"}); }, {"data.train", "'~bob/a'"});
}

TEST(ConfigPaths, TildeWithoutHomeIsAnError) {
  HomeDirectory scoped(nullptr);
  expect_config_error([] { from_yaml("", {"logging.metrics_file=~/m.jsonl"}); },
                      {"config test.yaml: logging.metrics_file", "HOME is not set"});
  EXPECT_EQ(from_yaml("", {"logging.metrics_file=m.jsonl"}).logging.metrics_file, "m.jsonl");
}

TEST(ConfigPaths, DataPathsKeepTheirSpaces) {
  // A list element or a single string is one path, quoted or not; weights are separate words.
  Config c = from_yaml("data:\n  train:\n    - my corpus/part one\n    - \"other data/x\"\n  valid: held out/v\n");
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"my corpus/part one", "other data/x"}));
  EXPECT_EQ(c.data.valid, (std::vector<std::string>{"held out/v"}));
  Config d = from_yaml("", {"data.train=[my corpus/a, 'b c']", "data.valid=[0.5, my dir/v, 0.5, w]"});
  EXPECT_EQ(d.data.train, (std::vector<std::string>{"my corpus/a", "b c"}));
  EXPECT_EQ(d.data.valid, (std::vector<std::string>{"0.5", "my dir/v", "0.5", "w"}));
  // Megatron's blend string is stored as its words; the dump reloads to the same list.
  Config e = from_yaml("data:\n  train: \"0.7 data/a 0.3 data/b\"\n");
  EXPECT_EQ(e.data.train, (std::vector<std::string>{"0.7", "data/a", "0.3", "data/b"}));
  EXPECT_EQ(load_config_string(dump_config(d), "dump.yaml").data.valid, d.data.valid);
}

}  // namespace
}  // namespace gpt
