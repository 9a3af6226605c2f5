// Single-process checkpoint format tests: the element-run arithmetic against ShardSpec::global_index
// element by element; the metadata index round trip; and every kind of bad input (another model, missing,
// truncated or corrupted files, a damaged index or `latest`, numbers in the index out of range, an
// interrupted replacing save, an explicit load of nothing) giving a clear error.
#include <map>
#include <random>

#include "tests/parallel/checkpoint/checkpoint_test_util.h"

using namespace gpt;
using namespace gpt::ckpt_test;

namespace {

// ---- element runs ----

std::vector<int64_t> expand(const std::vector<ElementRun>& runs, int64_t begin) {
  std::vector<int64_t> g;
  int64_t next_local = begin;
  for (const ElementRun& r : runs) {
    EXPECT_EQ(r.local, next_local);  // runs cover the range in local order
    next_local += r.length;
    for (int64_t i = 0; i < r.length; ++i) g.push_back(r.global + i);
  }
  return g;
}

struct ShardCase {
  Shape global;
  ShardSpec shard;
};

std::vector<ShardCase> shard_cases() {
  return {{{7}, {}},
          {{12, 6}, {0, 1, 1, 0}},
          {{12, 6}, {0, 1, 2, 1}},
          {{12, 6}, {0, 1, 3, 2}},
          {{12, 6}, {0, 3, 2, 0}},  // fused q|k|v rows, tensor parallel 2
          {{12, 6}, {0, 3, 2, 1}},
          {{6, 12}, {1, 1, 3, 1}},  // row-parallel columns
          {{6, 12}, {1, 1, 4, 3}},
          {{4, 6, 6}, {1, 3, 2, 1}},
          {{16, 3}, {0, 3, 2, 1, {2, 1, 1}}},  // grouped-query q|k|v rows (heads : groups : groups = 2 : 1 : 1)
          {{16, 3}, {0, 3, 1, 0, {2, 1, 1}}},
          {{24}, {0, 3, 4, 3, {4, 1, 1}}}};
}

// Unequal blocks: piece `part` of each block, in proportion. Rows 0..7 of q, 8..11 of k, 12..15 of v;
// rank 1 of 2 holds q rows 4..7, k rows 10..11 and v rows 14..15.
TEST(ShardRuns, UnequalBlocksHoldThePieceOfEachBlock) {
  const ShardSpec s{0, 3, 2, 1, {2, 1, 1}};
  EXPECT_EQ(s.local_shape({16, 3}), (Shape{8, 3}));
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < 8; ++r) rows.push_back(s.global_index({16, 3}, r * 3) / 3);
  EXPECT_EQ(rows, (std::vector<int64_t>{4, 5, 6, 7, 10, 11, 14, 15}));
  EXPECT_THROW(s.local_shape({12, 3}), std::invalid_argument);  // 12 rows do not split into 4 units x 2 parts
  // The stored form round-trips, with the weights only when the blocks are unequal.
  EXPECT_EQ(s.to_ints(), (std::vector<int64_t>{0, 3, 2, 1, 2, 1, 1}));
  EXPECT_EQ(ShardSpec::from_ints(s.to_ints()).block_weights, s.block_weights);
  EXPECT_EQ((ShardSpec{0, 3, 2, 1}).to_ints().size(), 4u);
  EXPECT_THROW(ShardSpec::from_ints({0, 3, 2, 1, 2, 1}), std::invalid_argument);   // a weight missing
  EXPECT_THROW(ShardSpec::from_ints({0, 3, 2, 1, 2, 0, 1}), std::invalid_argument);  // a zero weight
  EXPECT_THROW(ShardSpec::from_ints({0, 1, 2, 2}), std::invalid_argument);         // part past parts
}

TEST(ShardRuns, MatchGlobalIndexElementByElement) {
  for (const ShardCase& c : shard_cases()) {
    const int64_t n = shape_numel(c.shard.local_shape(c.global));
    for (int64_t b = 0; b < n; b += 5)
      for (int64_t e = b + 1; e <= n; e += 7) {
        std::vector<int64_t> got = expand(shard_runs(c.global, c.shard, b, e), b);
        ASSERT_EQ(int64_t(got.size()), e - b);
        for (int64_t i = b; i < e; ++i)
          ASSERT_EQ(got[i - b], c.shard.global_index(c.global, i)) << shape_str(c.global) << " local " << i;
        ASSERT_EQ(count_below(c.global, c.shard, b, e, shape_numel(c.global) / 2),
                  std::count_if(got.begin(), got.end(), [&](int64_t g) { return g < shape_numel(c.global) / 2; }));
      }
  }
}

TEST(ShardRuns, IntersectionMovesExactlyTheCommonElements) {
  std::mt19937 rng(7);
  for (const ShardCase& a : shard_cases())
    for (const ShardCase& w : shard_cases()) {
      if (a.global != w.global) continue;
      const int64_t na = shape_numel(a.shard.local_shape(a.global)), nw = shape_numel(w.shard.local_shape(w.global));
      for (int trial = 0; trial < 5; ++trial) {
        int64_t ab = rng() % na, ae = ab + 1 + rng() % (na - ab), wb = rng() % nw, we = wb + 1 + rng() % (nw - wb);
        // Reference: global index -> stored offset, then look up every wanted element.
        std::map<int64_t, int64_t> stored;
        for (int64_t i = ab; i < ae; ++i) stored[a.shard.global_index(a.global, i)] = i - ab;
        std::map<int64_t, int64_t> expect;  // wanted offset -> stored offset
        for (int64_t i = wb; i < we; ++i) {
          auto it = stored.find(w.shard.global_index(w.global, i));
          if (it != stored.end()) expect[i - wb] = it->second;
        }
        std::map<int64_t, int64_t> got;
        for (const ElementCopy& c : intersect_runs(shard_runs(a.global, a.shard, ab, ae), ab,
                                                   shard_runs(w.global, w.shard, wb, we), wb))
          for (int64_t k = 0; k < c.length; ++k) EXPECT_TRUE(got.emplace(c.dst + k, c.src + k).second);
        EXPECT_EQ(got, expect) << shape_str(a.global);
      }
    }
}

TEST(ShardRuns, Crc32MatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32_bytes("123456789", 9), 0xcbf43926u);
}

// ---- metadata ----

// The resume check compares what the model is, not how it runs: a checkpoint saved before
// model.attention_backend existed, or under another attention path, resumes; a changed shape does not.
TEST(CheckpointMeta, AttentionBackendIsNotPartOfTheModelMatch) {
  const std::string saved = "model:\n  num_layers: 2\n  hidden_size: 64\n";
  EXPECT_TRUE(model_config_differences(saved, saved + "  attention_backend: cudnn\n").empty());
  EXPECT_TRUE(model_config_differences(saved + "  attention_backend: unfused\n", saved + "  attention_backend: auto\n")
                  .empty());
  const auto diff = model_config_differences(saved, "model:\n  num_layers: 3\n  hidden_size: 64\n");
  ASSERT_EQ(diff.size(), 1u);
  EXPECT_NE(diff[0].find("model.num_layers"), std::string::npos) << diff[0];
}

// A checkpoint saved before the model variant keys existed matches the default model, and only it.
TEST(CheckpointMeta, ModelKeysAnOlderCheckpointLacksTakeTheirDefaults) {
  const std::string saved = "model:\n  num_layers: 2\n  hidden_size: 64\n  ffn_hidden_size: 0\n";
  const std::string defaults = "model:\n  normalization: LayerNorm\n  swiglu: false\n";
  EXPECT_TRUE(model_config_differences(saved, saved + "  normalization: LayerNorm\n  swiglu: false\n", defaults).empty());
  const auto diff = model_config_differences(saved, saved + "  normalization: RMSNorm\n  swiglu: false\n", defaults);
  ASSERT_EQ(diff.size(), 1u);
  EXPECT_NE(diff[0].find("model.normalization: checkpoint LayerNorm, this run RMSNorm"), std::string::npos) << diff[0];
  // ffn_hidden_size 0 is compared as the width it stands for, which SwiGLU changes.
  const auto swiglu = model_config_differences(saved + "  swiglu: true\n", "model:\n  num_layers: 2\n  hidden_size: 64\n  ffn_hidden_size: 128\n  swiglu: true\n", defaults);
  EXPECT_TRUE(swiglu.empty()) << swiglu[0];
}

TEST(CheckpointMeta, YamlRoundTrip) {
  CheckpointMeta m;
  m.iteration = 42;
  m.consumed_samples = 672;
  m.optimizer_steps = 40;
  m.master_weights = true;
  m.dtype = "fp16";
  m.loss_scaler_dynamic = true;
  m.loss_scaler = {65536.0, 17, -1};
  m.layout = {2, 2, 2, 2, 8, true};
  m.vocab_size = 100;
  m.padded_vocab = 256;
  m.rng_seed = 987654321;
  m.tensors = {{"a.weight", {4, 6}}, {"b", {3}}};
  StoredFile f{"rank_00003.h5", 3, 12345, {}};
  f.pieces.push_back({"master", "a.weight", ShardSpec{0, 1, 2, 1}, 2, 12, DType::F32, 0xdeadbeef});
  f.pieces.push_back({"model", "b", ShardSpec{}, 0, 3, DType::F16, 7});
  m.files.push_back(f);
  m.config_yaml = "model:\n  hidden_size: 32\n";
  CheckpointMeta r = checkpoint_meta_from_yaml(checkpoint_meta_to_yaml(m), "test");
  EXPECT_EQ(r.iteration, 42);
  EXPECT_EQ(r.consumed_samples, 672);
  EXPECT_EQ(r.optimizer_steps, 40);
  EXPECT_TRUE(r.master_weights);
  EXPECT_EQ(r.dtype, "fp16");
  EXPECT_EQ(r.loss_scaler.scale, 65536.0);
  EXPECT_EQ(r.loss_scaler.growth_tracker, 17);
  EXPECT_EQ(r.loss_scaler.hysteresis_tracker, -1);
  EXPECT_TRUE(r.layout.distributed_optimizer);
  EXPECT_EQ(r.layout.virtual_pipeline, 2);
  EXPECT_EQ(r.tensors, m.tensors);
  EXPECT_EQ(r.rng_seed, 987654321);
  ASSERT_EQ(r.files.size(), 1u);
  ASSERT_EQ(r.files[0].pieces.size(), 2u);
  EXPECT_EQ(r.files[0].pieces[0].crc32, 0xdeadbeefu);
  EXPECT_EQ(r.files[0].pieces[0].shard.part, 1);
  EXPECT_EQ(r.files[0].pieces[1].shard.dim, -1);
  EXPECT_EQ(r.files[0].pieces[1].dtype, DType::F16);
  EXPECT_EQ(r.config_yaml, m.config_yaml);

  std::string broken = checkpoint_meta_to_yaml(m);
  broken.replace(broken.find("crc32: deadbeef"), 15, "crc32: nothex!");
  try {
    checkpoint_meta_from_yaml(broken, "idx");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "crc32")) << e.what();
  }
  EXPECT_THROW(checkpoint_meta_from_yaml("iteration: [", "idx"), CheckpointError);
}

// ---- bad input ----

class CheckpointErrors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    saved_ = new std::string(make_temp_dir("errors"));
    Config cfg = small_config();
    cfg.training.train_iters = 2;
    cfg.checkpoint.dir = *saved_;
    ParallelState ps = single_process_state();
    train_run(cfg, ps);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*saved_);
    delete saved_;
  }
  void SetUp() override { work_ = make_temp_dir("damaged"); copy_tree(*saved_, work_ + "/c"); }
  void TearDown() override { fs::remove_all(work_); }
  std::string dir() const { return work_ + "/c"; }
  std::string rank_file() const { return dir() + "/iter_0000002/rank_00000.h5"; }
  std::string error_loading(Config cfg) {
    cfg.checkpoint.load = dir();
    ParallelState ps = single_process_state();
    return resume_error(cfg, ps);
  }

  static std::string* saved_;
  std::string work_;
};
std::string* CheckpointErrors::saved_ = nullptr;

TEST_F(CheckpointErrors, IntactCheckpointLoads) { EXPECT_EQ(error_loading(small_config()), ""); }

TEST_F(CheckpointErrors, AnotherModelShapeNamesTheKeysAndTensors) {
  Config cfg = small_config();
  cfg.model.hidden_size = 64;
  std::string e = error_loading(cfg);
  EXPECT_TRUE(contains(e, "model.hidden_size: checkpoint 32, this run 64")) << e;
  EXPECT_TRUE(contains(e, "checkpoint shape [32], model shape [64]")) << e;
  cfg = small_config();
  cfg.model.num_layers = 4;
  e = error_loading(cfg);
  EXPECT_TRUE(contains(e, "model.num_layers: checkpoint 2, this run 4")) << e;
  EXPECT_TRUE(contains(e, "tensor layers.2.attention.proj.bias [32]: not in the checkpoint")) << e;
}

TEST_F(CheckpointErrors, DisagreeingModelConfigIsNamed) {
  Config cfg = small_config();
  cfg.model.layernorm_eps = 1e-6;
  std::string e = error_loading(cfg);
  EXPECT_TRUE(contains(e, "model.layernorm_eps")) << e;
  // Keys outside model.* may change (here: the optimizer and the run length).
  cfg = small_config();
  cfg.optimizer.lr = 1e-4;
  cfg.training.train_iters = 50;
  EXPECT_EQ(error_loading(cfg), "");
}

TEST_F(CheckpointErrors, MissingRankFile) {
  fs::remove(rank_file());
  std::string e = error_loading(small_config());
  EXPECT_TRUE(contains(e, "rank file rank_00000.h5 (written by rank 0) is missing")) << e;
}

TEST_F(CheckpointErrors, TruncatedFile) {
  fs::resize_file(rank_file(), fs::file_size(rank_file()) / 2);
  std::string e = error_loading(small_config());
  EXPECT_TRUE(contains(e, "rank_00000.h5")) << e;
  EXPECT_TRUE(contains(e, "truncated")) << e;
}

TEST_F(CheckpointErrors, CorruptedTensorDataFailsItsChecksum) {
  flip_byte(rank_file(), dataset_offset(rank_file(), "/adam_v/layers.1.mlp.fc1.weight") + 100);
  std::string e = error_loading(small_config());
  EXPECT_TRUE(contains(e, "rank_00000.h5")) << e;
  EXPECT_TRUE(contains(e, "layers.1.mlp.fc1.weight (adam_v)")) << e;
  EXPECT_TRUE(contains(e, "checksum mismatch")) << e;
}

TEST_F(CheckpointErrors, CorruptedFileStructureIsCaught) {
  flip_byte(rank_file(), 20);  // inside the superblock, which HDF5 1.10 checksums
  std::string e = error_loading(small_config());
  EXPECT_TRUE(contains(e, "rank_00000.h5")) << e;
  EXPECT_TRUE(contains(e, "corrupted")) << e;
}

TEST_F(CheckpointErrors, DamagedIndexAndDanglingLatest) {
  const std::string index = dir() + "/iter_0000002/metadata.yaml";
  std::string text = read_text_file(index);
  write_file_durably(index, text.substr(0, text.find("files:")));
  std::string e = error_loading(small_config());
  EXPECT_TRUE(contains(e, "metadata.yaml")) << e;
  EXPECT_TRUE(contains(e, "missing key 'files'")) << e;

  write_file_durably(dir() + "/latest", "iter_0000099\n");
  e = error_loading(small_config());
  EXPECT_TRUE(contains(e, "names iter_0000099")) << e;
}

// Each number of the index out of its range: the error names metadata.yaml and the key.
TEST_F(CheckpointErrors, OutOfRangeIndexNumbersNameTheKey) {
  const std::string index = dir() + "/iter_0000002/metadata.yaml";
  const std::string saved = read_text_file(index);
  // The saved index with the first line that starts with `line_start` (after a newline) replaced by `line`.
  auto with_line = [&](const std::string& line_start, const std::string& line) {
    const size_t at = saved.find("\n" + line_start);
    EXPECT_NE(at, std::string::npos) << line_start;
    if (at == std::string::npos) return saved;
    const size_t end = saved.find('\n', at + 1);
    return saved.substr(0, at + 1) + line + saved.substr(end);
  };
  const std::string layout = "layout: {tensor: {}, pipeline: {}, virtual_pipeline: {}, data: {}, world: {}, "
                             "distributed_optimizer: false}";
  auto layout_line = [&](int t, int p, int v, int d, int w) {
    std::string l = layout;
    for (int x : {t, p, v, d, w}) l.replace(l.find("{}"), 2, std::to_string(x));
    return l;
  };
  const std::string piece_start = "      - {kind: ";
  const size_t piece = saved.find("\n" + piece_start) + 1;
  const size_t range = saved.find("range: [", piece) + 8;
  const std::string bad_range = saved.substr(0, range) + "5, 3" + saved.substr(saved.find(']', range));
  const std::string negative_range = saved.substr(0, range) + "-1, " + saved.substr(saved.find(',', range) + 2);
  struct Case {
    std::string text, key;
  };
  const std::vector<Case> cases = {
      {with_line("iteration:", "iteration: -1"), "'iteration'"},
      {with_line("consumed_samples:", "consumed_samples: -8"), "'consumed_samples'"},
      {with_line("optimizer_steps:", "optimizer_steps: -1"), "'optimizer_steps'"},
      {with_line("optimizer_steps:", "optimizer_steps: 3"), "'optimizer_steps' is 3; it must be <= 2"},
      {with_line("  scale:", "  scale: 0"), "'loss_scaler.scale'"},
      {with_line("  scale:", "  scale: -4"), "'loss_scaler.scale'"},
      {with_line("  scale:", "  scale: .nan"), "'loss_scaler.scale'"},
      {with_line("  scale:", "  scale: .inf"), "'loss_scaler.scale'"},
      {with_line("  growth_tracker:", "  growth_tracker: -1"), "'loss_scaler.growth_tracker'"},
      {with_line("layout:", layout_line(0, 1, 1, 1, 1)), "'layout.tensor'"},
      {with_line("layout:", layout_line(1, -1, 1, 1, 1)), "'layout.pipeline'"},
      {with_line("layout:", layout_line(1, 1, 0, 1, 1)), "'layout.virtual_pipeline'"},
      {with_line("layout:", layout_line(1, 1, 1, 0, 1)), "'layout.data'"},
      {with_line("layout:", layout_line(1, 1, 1, 1, 0)), "'layout.world'"},
      {with_line("layout:", layout_line(1, 1, 1, 1, 2)), "'layout.world' is 2; it must equal tensor x pipeline"},
      {with_line("vocab_size:", "vocab_size: 0"), "'vocab_size'"},
      {with_line("padded_vocab:", "padded_vocab: 1"), "'padded_vocab'"},
      {with_line("  final_ln.weight:", "  final_ln.weight: [0]"), "'tensors.final_ln.weight'"},
      {with_line("  final_ln.weight:", "  final_ln.weight: [-32]"), "'tensors.final_ln.weight'"},
      {with_line("  final_ln.weight:", "  final_ln.weight: [4294967296, 4294967296, 4]"),
       "'tensors.final_ln.weight': the element count overflows"},
      {with_line("    rank:", "    rank: -1"), "'files[0].rank'"},
      {with_line("    rank:", "    rank: 1"), "'files[0].rank' is 1; it must be < layout.world (1)"},
      {with_line("    bytes:", "    bytes: -5"), "'files[0].bytes'"},
      {bad_range, "'files[0].pieces[0].range'"},
      {negative_range, "'files[0].pieces[0].range'"},
  };
  for (const Case& c : cases) {
    ASSERT_NE(c.text, saved) << c.key;
    write_file_durably(index, c.text);
    const std::string e = error_loading(small_config());
    EXPECT_TRUE(contains(e, "metadata.yaml")) << c.key << ": " << e;
    EXPECT_TRUE(contains(e, c.key)) << c.key << ": " << e;
  }
  write_file_durably(index, saved);
  EXPECT_EQ(error_loading(small_config()), "");
}

TEST_F(CheckpointErrors, ExplicitLoadOfNothingIsAnErrorAutoResumeIsNot) {
  const std::string empty = work_ + "/empty";
  fs::create_directories(empty);
  Config cfg = small_config();
  cfg.checkpoint.load = empty;
  ParallelState ps = single_process_state();
  EXPECT_TRUE(contains(resume_error(cfg, ps), "nothing to load")) << resume_error(cfg, ps);
  cfg.checkpoint.load.clear();
  cfg.checkpoint.dir = empty;
  auto be = make_backend("cpu");
  Trainer t(cfg, ps, *be);
  EXPECT_FALSE(t.resume());
}

TEST_F(CheckpointErrors, TheRunsOwnCheckpointComesBeforeCheckpointLoad) {
  ParallelState ps = single_process_state();
  auto be = make_backend("cpu");
  Config own = small_config();
  own.training.train_iters = 1;
  own.checkpoint.dir = work_ + "/own";
  train_run(own, ps);  // the run's own checkpoint, at iteration 1
  Config cfg = small_config();
  cfg.checkpoint.load = dir();  // iteration 2
  cfg.checkpoint.dir = work_ + "/own";
  {
    Trainer t(cfg, ps, *be);
    ASSERT_TRUE(t.resume());
    EXPECT_EQ(t.iteration(), 1);
  }
  cfg.checkpoint.dir = work_ + "/fresh";  // nothing saved there yet: start from checkpoint.load
  Trainer t(cfg, ps, *be);
  ASSERT_TRUE(t.resume());
  EXPECT_EQ(t.iteration(), 2);
}

}  // namespace
