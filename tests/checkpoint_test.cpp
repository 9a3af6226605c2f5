// Single-process checkpoint tests: the element-run arithmetic against ShardSpec::global_index element by
// element; the metadata index round trip; 20 steps straight vs 10 + resume 10 bit-identical in fp32,
// bf16 (master weights) and fp16 (loss-scaler state); keep_last pruning; every kind of bad input giving a
// clear error; a real `gpt-train` run killed with SIGKILL in the middle of a save and resumed; `eval
// --load`; and `convert` export/import, with the exported safetensors file read by an independent NumPy
// GPT-2 (Hugging Face layout) that must reproduce our loss.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <thread>

#include "app/convert.h"
#include "checkpoint_test_util.h"

using namespace gpt;
using namespace gpt::ckpt_test;

extern char** environ;

namespace {

// Two layers are enough on one process (the 8-layer tiny config is for pipeline 4 x virtual 2).
Config small_config() {
  Config cfg = tiny_config();
  cfg.model.num_layers = 2;
  return cfg;
}

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
          {{4, 6, 6}, {1, 3, 2, 1}}};
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

// ---- resume ----

// `total` steps straight vs `split` steps, a save, and a fresh trainer that resumes and runs the rest.
// Returns the run after the resume.
RunRecord expect_resume_bit_identical(Config cfg, int total = 20, int split = 10) {
  cfg.training.train_iters = cfg.optimizer.decay_iters = total;
  ParallelState ps = single_process_state();
  const RunRecord straight = train_run(cfg, ps);
  const TempDir tmp("resume");
  const std::string& dir = tmp.path;
  cfg.checkpoint.dir = dir;
  Config first = cfg;
  first.training.train_iters = split;
  const RunRecord a = train_run(first, ps);
  EXPECT_TRUE(fs::exists(dir + "/" + iteration_dir_name(split) + "/metadata.yaml"));
  const RunRecord b = train_run(cfg, ps);  // auto-resumes from `latest`
  EXPECT_EQ(a.losses.size(), size_t(split));
  EXPECT_EQ(b.losses.size(), size_t(total - split));
  for (int i = 0; i < total && a.losses.size() == size_t(split) && b.losses.size() == size_t(total - split); ++i) {
    const double got = i < split ? a.losses[i] : b.losses[i - split];
    const double scale = i < split ? a.scales[i] : b.scales[i - split];
    EXPECT_EQ(got, straight.losses[i]) << cfg.precision.dtype << " step " << i + 1;
    EXPECT_EQ(scale, straight.scales[i]) << cfg.precision.dtype << " step " << i + 1;
  }
  return b;
}

TEST(CheckpointResume, Fp32TenPlusTenIsBitIdenticalToTwenty) { expect_resume_bit_identical(small_config()); }

TEST(CheckpointResume, Bf16WithMasterWeightsIsBitIdentical) {
  Config cfg = small_config();
  cfg.precision.dtype = "bf16";
  expect_resume_bit_identical(cfg);
}

TEST(CheckpointResume, Fp16LossScalerStateIsRestored) {
  // The scaler starts at 2^32 and halves on each overflow, so the first ten or so steps are skipped:
  // resume late enough that weights, moments and a reduced scale all matter.
  Config cfg = small_config();
  cfg.precision.dtype = "fp16";
  const RunRecord after = expect_resume_bit_identical(cfg, 24, 14);
  EXPECT_LT(after.scales.front(), 4294967296.0);
  EXPECT_LT(after.skipped, int64_t(after.losses.size()));
}

// training.exit_interval and training.exit_duration_mins (Megatron-LM's --exit-interval and
// --exit-duration-in-mins) end a run early with a checkpoint of its last step; the next run resumes
// from it, and the steps match an uninterrupted run bit for bit.
TEST(CheckpointResume, ExitIntervalStopsWithACheckpointAndTheNextRunContinues) {
  Config cfg = small_config();
  cfg.training.train_iters = cfg.optimizer.decay_iters = 20;
  ParallelState ps = single_process_state();
  Config straight = cfg;
  straight.training.train_iters = 6;  // the same schedule (decay_iters 20), first 6 steps
  const RunRecord reference = train_run(straight, ps);
  const TempDir tmp("exit_interval");
  cfg.checkpoint.dir = tmp.path;
  cfg.training.exit_interval = 3;
  const RunRecord a = train_run(cfg, ps);
  ASSERT_EQ(a.losses.size(), 3u);
  EXPECT_TRUE(fs::exists(tmp.path + "/" + iteration_dir_name(3) + "/metadata.yaml"));
  const RunRecord b = train_run(cfg, ps);  // resumes at 3, stops after 6
  ASSERT_EQ(b.losses.size(), 3u);
  EXPECT_TRUE(fs::exists(tmp.path + "/" + iteration_dir_name(6) + "/metadata.yaml"));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(i < 3 ? a.losses[i] : b.losses[i - 3], reference.losses[i]) << "step " << i + 1;
}

TEST(CheckpointResume, ExitDurationStopsAfterTheFirstStepPastTheLimit) {
  Config cfg = small_config();
  cfg.training.train_iters = 20;
  const TempDir tmp("exit_duration");
  cfg.checkpoint.dir = tmp.path;
  cfg.training.exit_duration_mins = 1e-9;  // past after the first step
  ParallelState ps = single_process_state();
  EXPECT_EQ(train_run(cfg, ps).losses.size(), 1u);
  EXPECT_TRUE(fs::exists(tmp.path + "/" + iteration_dir_name(1) + "/metadata.yaml"));
  cfg.training.exit_duration_mins = 0;  // off: the rest of the run
  EXPECT_EQ(train_run(cfg, ps).losses.size(), 19u);
}

// checkpoint.finetune (Megatron-LM's --finetune): the weights of checkpoint.load, and nothing else of its
// state: iteration 0, zero Adam moments and step count; a restart then resumes the run's own checkpoint.
TEST(CheckpointResume, FinetuneTakesTheWeightsOnly) {
  const TempDir pre("finetune_from"), own("finetune_dir");
  Config cfg = small_config();
  cfg.precision.dtype = "bf16";  // bf16 weights with fp32 master copies
  cfg.training.train_iters = 5;
  cfg.checkpoint.dir = pre.path;
  ParallelState ps = single_process_state();
  const RunRecord pretrained = train_run(cfg, ps, true);

  Config ft = cfg;
  ft.checkpoint.dir = own.path;
  ft.checkpoint.load = pre.path;
  ft.checkpoint.finetune = true;
  ft.optimizer.lr = 1e-4;
  ft.training.train_iters = 3;
  {
    auto be = make_backend("cpu");
    Trainer t(ft, ps, *be);
    ASSERT_TRUE(t.resume());
    EXPECT_EQ(t.iteration(), 0);
    EXPECT_EQ(t.consumed_samples(), 0);
    EXPECT_EQ(t.optimizer().adam().steps_taken(), 0);
    for (OptimizerSegment& seg : t.optimizer().adam().segments())
      for (const Tensor* state : {&seg.m, &seg.v}) {
        const float* x = state->f32();
        for (int64_t i = 0; i < state->numel(); ++i) ASSERT_EQ(x[i], 0.f) << seg.param->name;
      }
    const auto loaded = t.gather_global_params();
    ASSERT_EQ(loaded.size(), pretrained.weights.size());
    for (size_t i = 0; i < loaded.size(); ++i) EXPECT_EQ(loaded[i], pretrained.weights[i]) << loaded[i].first;
  }
  EXPECT_EQ(train_run(ft, ps).losses.size(), 3u);  // iterations 1-3 of the fine-tuning run
  ft.training.train_iters = 5;
  EXPECT_EQ(train_run(ft, ps).losses.size(), 2u);  // restart: resumes its own checkpoint at 3, not the load
}

// checkpoint.save_optimizer false (Megatron-LM's --no-save-optim): weights and fp32 masters only. The
// checkpoint is under half the size (6 of 14 bytes per parameter in bf16), it loads the same weights, and
// the moments restart at zero.
TEST(CheckpointResume, WeightsOnlyCheckpointIsSmallerAndLoadsTheSameWeights) {
  const TempDir full("full"), lean("weights_only");
  Config cfg = small_config();
  cfg.precision.dtype = "bf16";
  cfg.training.train_iters = 4;
  ParallelState ps = single_process_state();
  cfg.checkpoint.dir = full.path;
  const RunRecord trained = train_run(cfg, ps, true);
  cfg.checkpoint.dir = lean.path;
  cfg.checkpoint.save_optimizer = false;
  train_run(cfg, ps);  // the same four steps, saved without moments
  auto bytes_of = [](const std::string& dir) {
    int64_t n = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.is_regular_file()) n += static_cast<int64_t>(e.file_size());
    return n;
  };
  const int64_t with = bytes_of(full.path), without = bytes_of(lean.path);
  EXPECT_LT(without, with * 6 / 10) << with << " vs " << without;

  Config load = cfg;
  load.checkpoint.dir.clear();
  load.checkpoint.load = lean.path;
  auto be = make_backend("cpu");
  Trainer t(load, ps, *be);
  ASSERT_TRUE(t.resume());
  EXPECT_EQ(t.iteration(), 4);
  for (OptimizerSegment& seg : t.optimizer().adam().segments()) {
    const float* m = seg.m.f32();
    for (int64_t i = 0; i < seg.m.numel(); ++i) ASSERT_EQ(m[i], 0.f) << seg.param->name;
  }
  EXPECT_EQ(t.gather_global_params(), trained.weights);
}

TEST(CheckpointResume, KeepLastPrunesOldOnesButNeverTheLatest) {
  Config cfg = small_config();
  cfg.training.train_iters = 5;
  const TempDir tmp("prune");
  cfg.checkpoint.dir = tmp.path;
  cfg.checkpoint.save_interval = 1;
  cfg.checkpoint.keep_last = 2;
  ParallelState ps = single_process_state();
  train_run(cfg, ps);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(cfg.checkpoint.dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"iter_0000004", "iter_0000005", "latest"}));
  EXPECT_EQ(read_text_file(cfg.checkpoint.dir + "/latest"), "iter_0000005\n");

  // Roll back to iteration 4 by pointing `latest` at it and train on: iteration 5 is saved anew
  // (replacing the old one), then 6; keep_last 1 keeps only the newest, which `latest` names.
  write_file_durably(cfg.checkpoint.dir + "/latest", "iter_0000004\n");
  Config again = cfg;
  again.checkpoint.keep_last = 1;
  again.training.train_iters = 6;
  RunRecord r = train_run(again, ps);
  EXPECT_EQ(r.losses.size(), 2u);
  names.clear();
  for (const auto& e : fs::directory_iterator(cfg.checkpoint.dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"iter_0000006", "latest"}));

  // A `latest` that names an older iteration protects it from pruning.
  write_file_durably(cfg.checkpoint.dir + "/latest", "iter_0000006\n");
  fs::copy(cfg.checkpoint.dir + "/iter_0000006", cfg.checkpoint.dir + "/iter_0000009", fs::copy_options::recursive);
  prune_checkpoints(cfg.checkpoint.dir, 1);
  EXPECT_TRUE(fs::exists(cfg.checkpoint.dir + "/iter_0000006"));
  EXPECT_TRUE(fs::exists(cfg.checkpoint.dir + "/iter_0000009"));
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

TEST_F(CheckpointErrors, AReplacingSaveCutBetweenItsRenamesLeavesTheOldCopyLoadable) {
  fs::rename(dir() + "/iter_0000002", dir() + "/iter_0000002.replaced");
  EXPECT_EQ(resolve_checkpoint(dir()), dir() + "/iter_0000002.replaced");
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

// ---- the gpt-train binary ----

// Runs gpt-train as a child process (stdout and stderr to `log`) without the MPI environment of this
// singleton test process, which would make the child join our job instead of starting its own.
pid_t spawn_gpt_train(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string v = *e;
    bool mpi = v.rfind("OMPI_", 0) == 0 || v.rfind("PMIX_", 0) == 0 || v.rfind("OPAL_", 0) == 0;
    if (!mpi || v.rfind("OMPI_ALLOW_RUN_AS_ROOT", 0) == 0) env.push_back(v);
  }
  std::vector<std::string> argv_s = {GPT_TRAIN_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  pid_t pid = fork();
  if (pid == 0) {
    std::FILE* out = std::fopen(log.c_str(), "w");
    if (out) {
      dup2(fileno(out), 1);
      dup2(fileno(out), 2);
    }
    std::vector<char*> argv, envp;
    for (auto& s : argv_s) argv.push_back(s.data());
    for (auto& s : env) envp.push_back(s.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

int run_gpt_train(const std::vector<std::string>& args, const std::string& log) {
  int status = 0;
  waitpid(spawn_gpt_train(args, log), &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(CheckpointCrash, SigkillDuringSaveLeavesThePreviousCheckpointLoadable) {
  const TempDir tmp("crash");
  const std::string& dir = tmp.path;
  // Large enough that a save (values + Adam moments, ~60 MB) takes a while, small enough to step quickly.
  Config cfg = tiny_config();
  cfg.model.num_layers = 2;
  cfg.model.hidden_size = 512;
  cfg.model.num_heads = 8;
  cfg.model.seq_length = 32;
  cfg.model.vocab_size = 256;
  cfg.training.micro_batch_size = 1;
  cfg.training.global_batch_size = 1;
  cfg.training.train_iters = 1000;
  cfg.checkpoint.dir = dir + "/c";
  cfg.checkpoint.save_interval = 1;
  cfg.checkpoint.keep_last = 2;
  cfg.logging.interval = 1;
  cfg.logging.metrics_file = dir + "/metrics.jsonl";
  write_text(dir + "/cfg.yaml", dump_config(cfg));

  pid_t pid = spawn_gpt_train({"train", "--config", dir + "/cfg.yaml"}, dir + "/train.log");
  // Wait for a complete checkpoint, then for the next save's rank file to appear, and kill.
  bool killed_mid_save = false;
  std::string staging;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && !killed_mid_save) {
    if (fs::exists(cfg.checkpoint.dir + "/latest")) {
      for (const auto& e : fs::directory_iterator(cfg.checkpoint.dir)) {
        const std::string name = e.path().filename().string();
        if (name.ends_with(".tmp") && fs::exists(e.path() / "rank_00000.h5")) {
          kill(pid, SIGKILL);
          killed_mid_save = true;
          staging = e.path().string();
          break;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (!killed_mid_save) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(killed_mid_save) << "no save in progress was seen; log: " << read_text_file(dir + "/train.log");
  ASSERT_TRUE(WIFSIGNALED(status));

  // The interrupted save is still a staging directory without an index; `latest` names a complete one.
  ASSERT_TRUE(fs::exists(staging)) << "the save finished before the kill landed";
  EXPECT_FALSE(fs::exists(staging + "/metadata.yaml"));
  std::string latest = read_text_file(cfg.checkpoint.dir + "/latest");
  latest.pop_back();
  const int64_t saved_iteration = std::stoll(latest.substr(5));
  ASSERT_TRUE(fs::exists(cfg.checkpoint.dir + "/" + latest + "/metadata.yaml"));
  EXPECT_EQ(staging, cfg.checkpoint.dir + "/" + iteration_dir_name(saved_iteration + 1) + ".tmp");

  // Resume here; the next step's loss is the one the killed run logged for it.
  std::map<int64_t, double> logged;
  std::ifstream metrics(cfg.logging.metrics_file);
  for (std::string line; std::getline(metrics, line);) {
    auto it = line.find("\"iteration\":"), lo = line.find("\"loss\":");
    if (it == std::string::npos || lo == std::string::npos || line.find("\"train\"") == std::string::npos) continue;
    logged[std::stoll(line.substr(it + 12))] = std::stod(line.substr(lo + 7));
  }
  ASSERT_TRUE(logged.count(saved_iteration + 1));
  cfg.training.train_iters = saved_iteration + 1;
  cfg.logging.metrics_file.clear();
  ParallelState ps = single_process_state();
  RunRecord r = train_run(cfg, ps);
  ASSERT_EQ(r.losses.size(), 1u);
  EXPECT_NEAR(r.losses[0], logged[saved_iteration + 1], 1e-6 * logged[saved_iteration + 1]);
  // That save completed and cleared the leftover staging directory.
  EXPECT_FALSE(fs::exists(staging));
  EXPECT_EQ(read_text_file(cfg.checkpoint.dir + "/latest"), iteration_dir_name(saved_iteration + 1) + "\n");
}

TEST(CheckpointCli, EvalLoadsTheCheckpointOrFailsClearly) {
  const TempDir tmp("evalcli");
  const std::string& dir = tmp.path;
  Config cfg = small_config();
  cfg.training.train_iters = 3;
  cfg.checkpoint.dir = dir + "/c";
  ParallelState ps = single_process_state();
  auto be = make_backend("cpu");
  double expected = 0;
  {
    Trainer t(cfg, ps, *be);
    t.train();
    expected = t.evaluate(*t.make_source("valid"), 2);
  }
  cfg.checkpoint.dir.clear();
  write_text(dir + "/cfg.yaml", dump_config(cfg));
  const std::string base = dir + "/cfg.yaml";
  ASSERT_EQ(run_gpt_train({"eval", "--config", base, "--load", dir + "/c", "--iters", "2",
                           "--set", "logging.metrics_file=" + dir + "/eval.jsonl"}, dir + "/eval.log"), 0)
      << read_text_file(dir + "/eval.log");
  const std::string log = read_text_file(dir + "/eval.log");
  EXPECT_TRUE(contains(log, "loaded checkpoint " + dir + "/c/iter_0000003")) << log;
  const std::string m = read_text_file(dir + "/eval.jsonl");
  auto lo = m.find("\"loss\":");
  ASSERT_NE(lo, std::string::npos) << m;
  EXPECT_NEAR(std::stod(m.substr(lo + 7)), expected, 1e-6 * expected);

  fs::create_directories(dir + "/empty");
  EXPECT_EQ(run_gpt_train({"eval", "--config", base, "--load", dir + "/empty"}, dir + "/fail.log"), 1);
  const std::string fail = read_text_file(dir + "/fail.log");
  EXPECT_TRUE(contains(fail, "nothing to load")) << fail;
}

// ---- convert ----

// An independent reader of the exported file: JSON header + NumPy, Hugging Face GPT-2 names, Conv1D
// [in, out] weights, tied output embedding; prints the mean next-token loss of the given token rows.
const char* kNumpyGpt2 = R"PY(
import json, struct, sys
import numpy as np
path, tokens_path = sys.argv[1], sys.argv[2]
data = open(path, 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
assert (8 + n) % 8 == 0
header = json.loads(data[8:8 + n])
meta = header.pop('__metadata__')
L, C, H = int(meta['n_layer']), int(meta['n_embd']), int(meta['n_head'])
V, T, F = int(meta['vocab_size']), int(meta['n_positions']), int(meta['n_inner'])
eps = float(meta['layer_norm_epsilon'])
want = {'transformer.wte.weight': (V, C), 'transformer.wpe.weight': (T, C),
        'transformer.ln_f.weight': (C,), 'transformer.ln_f.bias': (C,)}
for i in range(L):
    p = 'transformer.h.%d.' % i
    want.update({p + 'ln_1.weight': (C,), p + 'ln_1.bias': (C,), p + 'attn.c_attn.weight': (C, 3 * C),
                 p + 'attn.c_attn.bias': (3 * C,), p + 'attn.c_proj.weight': (C, C), p + 'attn.c_proj.bias': (C,),
                 p + 'ln_2.weight': (C,), p + 'ln_2.bias': (C,), p + 'mlp.c_fc.weight': (C, F),
                 p + 'mlp.c_fc.bias': (F,), p + 'mlp.c_proj.weight': (F, C), p + 'mlp.c_proj.bias': (C,)})
assert set(header) == set(want), sorted(set(header) ^ set(want))
w, end = {}, 0
for k, e in header.items():
    assert e['dtype'] == 'F32' and tuple(e['shape']) == want[k], k
    b, s = e['data_offsets']
    w[k] = np.frombuffer(data[8 + n + b:8 + n + s], dtype='<f4').reshape(e['shape']).astype(np.float64)
    end = max(end, s)
assert 8 + n + end == len(data)
tok = np.fromfile(tokens_path, dtype='<i4').reshape(-1, T + 1)
x, y = tok[:, :-1], tok[:, 1:]
B, D = x.shape[0], C // H
def ln(h, g, b):
    m = h.mean(-1, keepdims=True)
    return (h - m) / np.sqrt(((h - m) ** 2).mean(-1, keepdims=True) + eps) * g + b
def gelu(h):
    return 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
def heads(t):
    return t.reshape(B, T, H, D).transpose(0, 2, 1, 3)
h = w['transformer.wte.weight'][x] + w['transformer.wpe.weight'][:T]
future = np.triu(np.ones((T, T), bool), 1)
for i in range(L):
    p = 'transformer.h.%d.' % i
    a = ln(h, w[p + 'ln_1.weight'], w[p + 'ln_1.bias']) @ w[p + 'attn.c_attn.weight'] + w[p + 'attn.c_attn.bias']
    q, k, v = (heads(t) for t in np.split(a, 3, axis=-1))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    s[:, :, future] = -np.inf
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    o = (s @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    h = h + o @ w[p + 'attn.c_proj.weight'] + w[p + 'attn.c_proj.bias']
    m = gelu(ln(h, w[p + 'ln_2.weight'], w[p + 'ln_2.bias']) @ w[p + 'mlp.c_fc.weight'] + w[p + 'mlp.c_fc.bias'])
    h = h + m @ w[p + 'mlp.c_proj.weight'] + w[p + 'mlp.c_proj.bias']
logits = ln(h, w['transformer.ln_f.weight'], w['transformer.ln_f.bias']) @ w['transformer.wte.weight'].T
logits -= logits.max(-1, keepdims=True)
logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
print(repr(-np.take_along_axis(logp, y[..., None], -1).mean()))
)PY";

std::string run_python(const std::string& script, const std::vector<std::string>& args) {
  std::string cmd = "/usr/bin/python3 " + script;
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (p && std::fgets(buf, sizeof buf, p)) out += buf;
  int rc = p ? pclose(p) : -1;
  return rc == 0 ? out : "FAILED(" + std::to_string(rc) + "): " + out;
}

TEST(CheckpointConvert, ExportIsReadByNumpyGpt2AndImportRoundTripsBitExactly) {
  const TempDir tmp("convert");
  const std::string& dir = tmp.path;
  Config cfg = small_config();
  cfg.training.train_iters = 30;  // far enough from the uniform loss that wrong weights show
  cfg.optimizer.decay_iters = 30;
  cfg.data.synthetic = "pattern";
  cfg.checkpoint.dir = dir + "/trained";
  ParallelState ps = single_process_state();
  auto be = make_backend("cpu");
  Trainer trained(cfg, ps, *be);
  trained.train();
  const auto weights = trained.gather_global_params();
  // The batch the NumPy model scores: the first global batch of the validation stream.
  auto source = trained.make_source("valid");
  const double loss = trained.evaluate(*source, 1);
  std::vector<int32_t> tokens(cfg.training.global_batch_size * (cfg.model.seq_length + 1));
  for (int64_t i = 0; i < cfg.training.global_batch_size; ++i)
    source->sample(i, tokens.data() + i * (cfg.model.seq_length + 1));
  std::ofstream(dir + "/tokens.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 4));

  // Export through the command line, as a user would.
  ASSERT_EQ(run_gpt_train({"convert", "--from", cfg.checkpoint.dir, "--to", dir + "/model.safetensors"},
                          dir + "/convert.log"), 0)
      << read_text_file(dir + "/convert.log");
  write_text(dir + "/gpt2.py", kNumpyGpt2);
  const std::string out = run_python(dir + "/gpt2.py", {dir + "/model.safetensors", dir + "/tokens.bin"});
  ASSERT_EQ(out.rfind("FAILED", 0), std::string::npos) << out;
  EXPECT_NEAR(std::stod(out), loss, 1e-5 * loss) << out;
  EXPECT_LT(loss, 0.8 * std::log(double(cfg.model.vocab_size)));

  // Import into a fresh checkpoint; a new run loads it and holds exactly the trained weights.
  import_hf_gpt2(dir + "/model.safetensors", cfg, dir + "/imported");
  Config load = cfg;
  load.checkpoint.dir.clear();
  load.checkpoint.load = dir + "/imported";
  Trainer fresh(load, ps, *be);
  ASSERT_TRUE(fresh.resume());
  EXPECT_EQ(fresh.iteration(), 0);
  const auto back = fresh.gather_global_params();
  ASSERT_EQ(back.size(), weights.size());
  for (size_t k = 0; k < weights.size(); ++k) {
    ASSERT_EQ(back[k].first, weights[k].first);
    size_t n = weights[k].first == "embedding.word_embeddings.weight" ? size_t(cfg.model.vocab_size * cfg.model.hidden_size)
                                                                      : weights[k].second.size();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[k].second[i], weights[k].second[i]) << weights[k].first << " " << i;
  }
  EXPECT_NEAR(fresh.evaluate(*source, 1), loss, 1e-6 * loss);

  // Exporting the imported checkpoint gives the same tensor bytes.
  export_hf_gpt2(dir + "/imported", dir + "/again.safetensors");
  const std::string a = read_text_file(dir + "/model.safetensors"), b = read_text_file(dir + "/again.safetensors");
  uint64_t na = 0, nb = 0;
  std::memcpy(&na, a.data(), 8);
  std::memcpy(&nb, b.data(), 8);
  EXPECT_EQ(a.substr(8 + na), b.substr(8 + nb));

  // Import errors name the tensor and what is wrong.
  Config wrong = cfg;
  wrong.model.hidden_size = 64;
  try {
    import_hf_gpt2(dir + "/model.safetensors", wrong, dir + "/bad");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "transformer.wte.weight has shape [100, 32]")) << e.what();
  }
  fs::resize_file(dir + "/again.safetensors", fs::file_size(dir + "/again.safetensors") - 100);
  try {
    import_hf_gpt2(dir + "/again.safetensors", cfg, dir + "/bad");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "do not fit")) << e.what();
  }
}

}  // namespace
