// Mixed precision on the CPU backend, where bf16 and fp16 are real 16-bit storage formats: bf16 training
// tracks fp32 within a stated tolerance; fp16's dynamic loss scaler skips overflowing steps and backs
// off (Megatron's rules: start 2^32, hysteresis 2, halve, grow after a clean window); a step whose loss or
// gradients are Inf/NaN never changes the weights.
#include <gtest/gtest.h>

#include <cmath>

#include "app/trainer.h"
#include "model/loss_scaler.h"
#include "parallel/data_parallel/data_parallel.h"
#include "tests/tiny_model_config.h"

using namespace gpt;

namespace {

Config tiny(const std::string& dtype) {
  Config cfg = tiny_model_config(dtype);
  cfg.training.train_iters = 40;
  cfg.optimizer.lr = 3e-3;
  cfg.optimizer.warmup_iters = 5;
  return cfg;
}

std::vector<float> all_values(Trainer& t) {
  std::vector<float> out;
  for (auto& [name, v] : t.gather_global_params()) out.insert(out.end(), v.begin(), v.end());
  return out;
}

}  // namespace

TEST(LossScaler, FollowsMegatronRules) {
  LossScaler s(true, 1024.0, 1.0, 3, 2);
  EXPECT_FALSE(s.update(true));  // first overflow: hysteresis absorbs it
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_FALSE(s.update(true));  // second: halve
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_FALSE(s.update(true));  // hysteresis exhausted: halve again
  EXPECT_EQ(s.scale(), 256.0);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 256.0);
  EXPECT_TRUE(s.update(false));  // a clean window of 3: double, hysteresis restored
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 512.0);
  LossScaler floor(true, 2.0, 1.0, 1000, 1);
  floor.update(true);
  floor.update(true);
  floor.update(true);
  EXPECT_EQ(floor.scale(), 1.0);  // never below min_scale
  EXPECT_FALSE(LossScaler::constant().update(true));
  EXPECT_TRUE(LossScaler::constant().update(false));
}

TEST(MixedPrecision, Bf16TracksFp32) {
  auto be = make_backend("cpu");
  ParallelState ps = single_process_state();
  Trainer fp32(tiny("fp32"), ps, *be), bf16(tiny("bf16"), ps, *be);
  auto a = fp32.train(), b = bf16.train();
  ASSERT_EQ(a.size(), b.size());
  // Stated tolerance: bf16 keeps 8 mantissa bits, so per-step losses agree to a few percent.
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i].loss, a[i].loss, 0.05 * a[i].loss + 0.02) << "step " << i + 1;
  EXPECT_LT(b.back().loss, 0.5 * b.front().loss);  // and it learns
  for (auto& s : b) EXPECT_FALSE(s.skipped);
}

TEST(MixedPrecision, Fp16OverflowSkipsAndBacksOff) {
  auto be = make_backend("cpu");
  ParallelState ps = single_process_state();
  Config cfg = tiny("fp16");
  cfg.training.train_iters = 60;
  Trainer t(cfg, ps, *be);
  EXPECT_EQ(t.loss_scaler().scale(), 4294967296.0);
  std::vector<float> before = all_values(t);
  StepStats first = t.step();
  // 2^32 times the gradient cannot be held in fp16: the step is skipped and the weights are untouched.
  EXPECT_TRUE(first.skipped);
  EXPECT_EQ(all_values(t), before);
  auto rest = t.train();
  int64_t skipped = first.skipped;
  for (auto& s : rest) skipped += s.skipped;
  EXPECT_GT(skipped, 2);
  EXPECT_LT(t.loss_scaler().scale(), 4294967296.0);
  EXPECT_FALSE(rest.back().skipped);
  EXPECT_LT(rest.back().loss, first.loss);
}

TEST(MixedPrecision, NonFiniteLossNeverReachesWeights) {
  auto be = make_backend("cpu");
  ParallelState ps = single_process_state();
  Trainer t(tiny("fp32"), ps, *be);
  t.step();
  // Poison one weight of the final layernorm: every logit becomes NaN.
  for (auto& p : t.chunks()[0]->params().params())
    if (p->name == "final_ln.weight") {
      std::vector<float> w(p->value.numel());
      be->download(p->value, w.data());
      w[0] = std::numeric_limits<float>::infinity();
      be->upload(w.data(), p->value);
    }
  std::vector<float> before = all_values(t);
  std::vector<std::vector<float>> moments;
  for (auto& s : t.optimizer().adam().segments()) {
    std::vector<float> m(s.m.numel());
    be->download(s.m, m.data());
    moments.push_back(m);
  }
  StepStats s = t.step();
  EXPECT_FALSE(std::isfinite(s.loss));
  EXPECT_TRUE(s.skipped);
  std::vector<float> after = all_values(t);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i)
    if (std::isfinite(before[i])) {
      EXPECT_EQ(after[i], before[i]) << i;
    }
  size_t k = 0;
  for (auto& seg : t.optimizer().adam().segments()) {
    std::vector<float> m(seg.m.numel());
    be->download(seg.m, m.data());
    EXPECT_EQ(m, moments[k++]);
  }
}
