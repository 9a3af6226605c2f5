// Learning-rate schedules (app/lr_schedule.h) at hand-computed points: lr 1, min_lr 0.1, 10 warm-up
// steps, decay until step 110, for each of Megatron-LM's decay styles. Then the convention through the
// trainer, against hand-computed rates: iteration k runs at the rate for the optimizer steps applied
// before it (k - 1 without skips, so iteration 1 runs at warm-up rate 0), a skipped step (gradients not
// finite, or an fp16 overflow) does not advance the schedule, a resumed run continues from the applied
// steps, and the rate logged (step stats and the metrics file) is the one applied.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/lr_schedule.h"
#include "app/trainer.h"
#include "parallel/data_parallel/data_parallel.h"
#include "tests/tiny_model_config.h"

using namespace gpt;

namespace {

LrSchedule schedule_of(LrDecayStyle style, int64_t warmup = 10, int64_t decay = 110) {
  return LrSchedule{1.0, 0.1, warmup, decay, style};
}

}  // namespace

TEST(LrSchedule, WarmupIsLinearFromZeroForEveryStyle) {
  for (auto style : {LrDecayStyle::Cosine, LrDecayStyle::Linear, LrDecayStyle::Constant,
                     LrDecayStyle::InverseSquareRoot}) {
    EXPECT_EQ(schedule_of(style).at(0), 0.0);  // before any step: Megatron's first iteration
    EXPECT_DOUBLE_EQ(schedule_of(style).at(1), 0.1);
    EXPECT_DOUBLE_EQ(schedule_of(style).at(5), 0.5);
    EXPECT_DOUBLE_EQ(schedule_of(style).at(10), 1.0);
  }
}

TEST(LrSchedule, WithoutWarmupTheFirstStepRunsAtThePeak) {
  EXPECT_DOUBLE_EQ(schedule_of(LrDecayStyle::Cosine, 0, 100).at(0), 1.0);  // r = 0
  EXPECT_DOUBLE_EQ(schedule_of(LrDecayStyle::Linear, 0, 100).at(0), 1.0);
  EXPECT_DOUBLE_EQ(schedule_of(LrDecayStyle::Linear, 0, 100).at(25), 0.775);  // r = 0.25
  EXPECT_DOUBLE_EQ(schedule_of(LrDecayStyle::InverseSquareRoot, 0, 100).at(0), 1.0);  // sqrt(1 / max(0, 1))
}

TEST(LrSchedule, CosineHalvesTheRangeAtMidpoint) {
  const LrSchedule s = schedule_of(LrDecayStyle::Cosine);
  EXPECT_DOUBLE_EQ(s.at(11), 0.1 + 0.9 * (1 + std::cos(M_PI / 100)) / 2);  // first step past warm-up: r = 0.01
  EXPECT_DOUBLE_EQ(s.at(60), 0.55);  // r = 0.5: 0.1 + 0.9 * (1 + cos(pi / 2)) / 2
  EXPECT_NEAR(s.at(35), 0.1 + 0.9 * (1 + std::sqrt(0.5)) / 2, 1e-15);  // r = 0.25: cos(pi / 4)
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(1000), 0.1);
}

TEST(LrSchedule, LinearFallsInEqualSteps) {
  const LrSchedule s = schedule_of(LrDecayStyle::Linear);
  EXPECT_DOUBLE_EQ(s.at(35), 0.775);  // r = 0.25
  EXPECT_DOUBLE_EQ(s.at(85), 0.325);  // r = 0.75
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(111), 0.1);
}

TEST(LrSchedule, ConstantKeepsThePeakPastTheDecay) {
  const LrSchedule s = schedule_of(LrDecayStyle::Constant);
  EXPECT_DOUBLE_EQ(s.at(11), 1.0);
  EXPECT_DOUBLE_EQ(s.at(5000), 1.0);
}

TEST(LrSchedule, InverseSquareRootFromTheEndOfWarmup) {
  const LrSchedule s = schedule_of(LrDecayStyle::InverseSquareRoot, 10, 100000);
  EXPECT_DOUBLE_EQ(s.at(40), 0.5);    // sqrt(10 / 40)
  EXPECT_DOUBLE_EQ(s.at(250), 0.2);   // sqrt(10 / 250)
  EXPECT_DOUBLE_EQ(s.at(4000), 0.1);  // sqrt(10 / 4000) = 0.05, floored at min_lr
  EXPECT_DOUBLE_EQ(schedule_of(LrDecayStyle::InverseSquareRoot, 10, 110).at(111), 0.1);  // past the decay
  EXPECT_DOUBLE_EQ(schedule_of(LrDecayStyle::InverseSquareRoot, 0, 1000).at(4), 0.5);   // no warm-up: sqrt(1 / 4)
}

TEST(LrSchedule, ParsesMegatronNamesAndRejectsOthers) {
  EXPECT_EQ(parse_lr_decay_style("cosine"), LrDecayStyle::Cosine);
  EXPECT_EQ(parse_lr_decay_style("linear"), LrDecayStyle::Linear);
  EXPECT_EQ(parse_lr_decay_style("constant"), LrDecayStyle::Constant);
  EXPECT_EQ(parse_lr_decay_style("inverse-square-root"), LrDecayStyle::InverseSquareRoot);
  try {
    parse_lr_decay_style("step");
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.lr_decay_style"), std::string::npos) << e.what();
  }
}

// ---- the convention through the trainer ----------------------------------------------------------------

namespace {

namespace fs = std::filesystem;

// A tiny model with lr 8e-3, 4 warm-up steps and linear decay to 0 at step 12 (train_iters), so the rate
// after n applied steps is 2e-3 n up to n = 4 and 1e-3 (12 - n) after.
Config tiny(const std::string& dtype = "fp32") {
  Config cfg = tiny_model_config(dtype);
  cfg.training.train_iters = 12;
  cfg.optimizer.lr = 8e-3;
  cfg.optimizer.min_lr = 0;
  cfg.optimizer.warmup_iters = 4;
  cfg.optimizer.lr_decay_style = "linear";
  return cfg;
}

// Hand-computed rate of iteration k of tiny() when no step is skipped: the rate for k - 1 applied steps.
const std::vector<double> kRateOfIteration = {0,     2e-3,  4e-3,  6e-3,  8e-3,  7e-3,
                                              6e-3,  5e-3,  4e-3,  3e-3,  2e-3,  1e-3};

std::vector<float> all_values(Trainer& t) {
  std::vector<float> out;
  for (auto& [name, v] : t.gather_global_params()) out.insert(out.end(), v.begin(), v.end());
  return out;
}

fs::path fresh_dir(const std::string& tag) {
  fs::path dir = fs::temp_directory_path() / ("gpt_lr_test_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The "lr" of every line of a metrics file that has one.
std::vector<double> logged_rates(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    size_t at = line.find("\"lr\":");
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + 5)));
  }
  return out;
}

// Sets one element of a named parameter (on this single-process run every tensor is whole).
void set_param_element(Trainer& t, Backend& be, const std::string& name, float value, float* old = nullptr) {
  for (ModelChunk* c : t.chunks())
    for (auto& p : c->params().params())
      if (p->name == name && !p->tied_copy) {
        std::vector<float> w(p->value.numel());
        be.download(p->value, w.data());
        if (old) *old = w[0];
        w[0] = value;
        be.upload(w.data(), p->value);
      }
}

}  // namespace

TEST(LrScheduleInTrainer, IterationOneRunsAtWarmupRateZero) {
  auto be = make_backend("cpu");
  ParallelState ps = single_process_state();
  Trainer t(tiny(), ps, *be);
  std::vector<float> before = all_values(t);
  StepStats first = t.step();
  EXPECT_EQ(first.iteration, 1);
  EXPECT_EQ(first.lr, 0.0);
  EXPECT_FALSE(first.skipped);
  EXPECT_EQ(all_values(t), before);  // AdamW at rate 0 (decoupled decay included) leaves the weights
  EXPECT_EQ(t.optimizer().adam().steps_taken(), 1);  // but the step counts: iteration 2 runs at 2e-3
  EXPECT_DOUBLE_EQ(t.step().lr, 2e-3);
}

TEST(LrScheduleInTrainer, LoggedRatesAreTheHandComputedAppliedOnes) {
  auto dir = fresh_dir("logged");
  Config cfg = tiny();
  cfg.logging.interval = 1;
  cfg.logging.metrics_file = (dir / "metrics.jsonl").string();
  auto be = make_backend("cpu");
  ParallelState ps = single_process_state();
  std::vector<StepStats> stats;
  {
    Trainer t(cfg, ps, *be);
    stats = t.train();
  }
  ASSERT_EQ(stats.size(), kRateOfIteration.size());
  std::vector<double> logged = logged_rates(cfg.logging.metrics_file);
  ASSERT_EQ(logged.size(), kRateOfIteration.size());
  for (size_t k = 0; k < stats.size(); ++k) {
    EXPECT_NEAR(stats[k].lr, kRateOfIteration[k], 1e-15) << "iteration " << k + 1;
    EXPECT_NEAR(logged[k], kRateOfIteration[k], 1e-12) << "iteration " << k + 1;
  }
  fs::remove_all(dir);
}

TEST(LrScheduleInTrainer, ASkippedStepDoesNotAdvanceTheSchedule) {
  auto be = make_backend("cpu");
  ParallelState ps = single_process_state();
  Trainer t(tiny(), ps, *be);
  for (int k = 0; k < 3; ++k) EXPECT_DOUBLE_EQ(t.step().lr, kRateOfIteration[k]);
  // An infinite final layernorm weight makes the loss and every gradient non-finite: iteration 4 is skipped.
  float saved = 0;
  set_param_element(t, *be, "final_ln.weight", INFINITY, &saved);
  StepStats skipped = t.step();
  EXPECT_TRUE(skipped.skipped);
  EXPECT_DOUBLE_EQ(skipped.lr, 6e-3);  // the rate it would have applied: 3 steps so far
  EXPECT_EQ(t.optimizer().adam().steps_taken(), 3);
  set_param_element(t, *be, "final_ln.weight", saved);
  // Iteration 5 runs at the rate iteration 4 would have had, and so on one iteration late.
  for (int k = 5; k <= 8; ++k) {
    StepStats s = t.step();
    EXPECT_EQ(s.iteration, k);
    EXPECT_FALSE(s.skipped);
    EXPECT_DOUBLE_EQ(s.lr, kRateOfIteration[k - 2]) << "iteration " << k;
  }
}

TEST(LrScheduleInTrainer, Fp16OverflowSkipsHoldTheScheduleAndAResumeContinuesIt) {
  auto dir = fresh_dir("fp16");
  Config cfg = tiny("fp16");
  cfg.training.train_iters = 40;
  cfg.optimizer.decay_iters = 12;
  cfg.checkpoint.dir = (dir / "ckpt").string();
  auto be = make_backend("cpu");
  ParallelState ps = single_process_state();
  // tiny()'s rate after n applied steps, by hand.
  auto rate = [](int64_t n) { return n <= 4 ? 2e-3 * double(n) : n <= 12 ? 1e-3 * double(12 - n) : 0.0; };
  int64_t applied = 0, first_applied = 0;
  StepStats next;
  {
    Trainer t(cfg, ps, *be);
    // The loss scale starts at 2^32: the first steps overflow and are skipped, all at rate 0; the first
    // applied step runs at 0 too, the next at 2e-3.
    for (int k = 1; k <= 20; ++k) {
      StepStats s = t.step();
      EXPECT_NEAR(s.lr, rate(applied), 1e-15) << "iteration " << k;
      if (!s.skipped && !first_applied) first_applied = k;
      applied += !s.skipped;
      EXPECT_EQ(t.optimizer().adam().steps_taken(), applied);
    }
    ASSERT_GT(first_applied, 1) << "the first fp16 step should overflow at scale 2^32";
    ASSERT_GE(applied, 5);
    ASSERT_LT(applied, 20);
    // The checkpoint holds the applied steps, so a resumed run takes up the schedule where this one is.
    t.save_checkpoint();
    next = t.step();
  }
  Trainer resumed(cfg, ps, *be);
  ASSERT_TRUE(resumed.resume());
  EXPECT_EQ(resumed.iteration(), 20);
  const StepStats again = resumed.step();
  EXPECT_EQ(again.iteration, 21);
  EXPECT_NEAR(again.lr, rate(applied), 1e-15);
  EXPECT_EQ(again.lr, next.lr);
  EXPECT_EQ(again.skipped, next.skipped);
  fs::remove_all(dir);
}
