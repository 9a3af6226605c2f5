// Single-process resume tests: 20 steps straight vs 10 + resume 10, bit-identical in fp32, bf16 (master
// weights) and fp16 (loss-scaler state); early exits (training.exit_interval, exit_duration_mins) that
// checkpoint and continue; fine-tuning from another run's weights; weights-only checkpoints
// (checkpoint.save_optimizer false); keep_last pruning.
#include "tests/parallel/checkpoint/checkpoint_test_util.h"

using namespace gpt;
using namespace gpt::ckpt_test;

namespace {

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

// FP8: the scales and amax histories are part of the state (a resumed run that restarted them at 1 would
// differ from step 11 on); a history of 4 keeps entries rolling out of the window across the resume.
TEST(CheckpointResume, Fp8ScalingStateIsRestored) {
  for (const char* algo : {"max", "most_recent"}) {
    Config cfg = small_config();
    cfg.precision.dtype = "bf16";
    cfg.precision.fp8 = "hybrid";
    cfg.precision.fp8_amax_history_len = 4;
    cfg.precision.fp8_amax_compute_algo = algo;
    expect_resume_bit_identical(cfg);
  }
}

// Switching FP8 on when resuming a bf16 checkpoint (or off when resuming an FP8 one) loads: the entries
// are optional both ways, and the FP8 run's scales start at 1 as in a fresh run.
TEST(CheckpointResume, Fp8CanBeSwitchedOnAndOffAcrossAResume) {
  Config cfg = small_config();
  cfg.precision.dtype = "bf16";
  cfg.training.train_iters = cfg.optimizer.decay_iters = 6;
  ParallelState ps = single_process_state();
  const TempDir tmp("fp8-switch");
  cfg.checkpoint.dir = tmp.path;
  train_run(cfg, ps);
  Config on = cfg;
  on.precision.fp8 = "e4m3";
  on.training.train_iters = on.optimizer.decay_iters = 9;
  EXPECT_EQ(train_run(on, ps).losses.size(), 3u);
  Config off = cfg;
  off.training.train_iters = off.optimizer.decay_iters = 12;
  EXPECT_EQ(train_run(off, ps).losses.size(), 3u);
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

  // Roll back to iteration 4 by pointing `latest` at it and train on: iteration 5 is saved anew (the old
  // one is kept as iter_0000005.abandoned), then 6; keep_last 1 keeps only the newest of this lineage.
  write_file_durably(cfg.checkpoint.dir + "/latest", "iter_0000004\n");
  Config again = cfg;
  again.checkpoint.keep_last = 1;
  again.training.train_iters = 6;
  RunRecord r = train_run(again, ps);
  EXPECT_EQ(r.losses.size(), 2u);
  names.clear();
  for (const auto& e : fs::directory_iterator(cfg.checkpoint.dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"iter_0000005.abandoned", "iter_0000006", "latest"}));

  // A `latest` that names an older checkpoint of the lineage protects it from pruning.
  write_file_durably(cfg.checkpoint.dir + "/latest", "iter_0000006\n");
  again.training.train_iters = 7;
  again.checkpoint.keep_last = 0;
  train_run(again, ps);  // resumes 6, saves 7 (parent 6), prunes nothing
  write_file_durably(cfg.checkpoint.dir + "/latest", "iter_0000006\n");
  EXPECT_TRUE(prune_lineage(cfg.checkpoint.dir, "iter_0000007", 1).empty());
  EXPECT_TRUE(fs::exists(cfg.checkpoint.dir + "/iter_0000006"));
  EXPECT_TRUE(fs::exists(cfg.checkpoint.dir + "/iter_0000007"));
}

}  // namespace
