// Activation recomputation: selective (attention core) and full recomputation give bit-identical losses
// and weights to no recomputation, and cut the peak memory of a step (measured by the CPU backend's
// allocation counters), full more than selective.
#include <gtest/gtest.h>

#include "app/trainer.h"

using namespace gpt;

namespace {

struct Result {
  std::vector<double> losses;
  std::vector<std::pair<std::string, std::vector<float>>> weights;
  size_t step_peak = 0;  // bytes above what was allocated before the steps
};

Result run(const std::string& recompute) {
  Config cfg;
  cfg.model.num_layers = 4;
  cfg.model.hidden_size = 64;
  cfg.model.num_heads = 4;
  cfg.model.seq_length = 128;  // long enough that the [B, H, T, T] probabilities dominate
  cfg.model.vocab_size = 64;
  cfg.training.micro_batch_size = 4;
  cfg.training.global_batch_size = 4;
  cfg.training.train_iters = 4;
  cfg.training.recompute = recompute;
  cfg.data.synthetic = "pattern";
  cfg.logging.interval = 1000;
  auto be = make_backend("cpu");
  ParallelState ps = single_process_state();
  Trainer t(cfg, ps, *be);
  size_t base = be->memory_in_use();
  be->reset_memory_peak();
  Result r;
  for (auto& s : t.train()) r.losses.push_back(s.loss);
  r.step_peak = be->memory_peak() - base;
  r.weights = t.gather_global_params();
  return r;
}

}  // namespace

TEST(Recompute, SameResultsLessMemory) {
  Result none = run("none"), selective = run("selective"), full = run("full");
  EXPECT_EQ(selective.losses, none.losses);
  EXPECT_EQ(full.losses, none.losses);
  EXPECT_EQ(selective.weights, none.weights);
  EXPECT_EQ(full.weights, none.weights);
  EXPECT_LT(selective.step_peak, none.step_peak);
  EXPECT_LT(full.step_peak, selective.step_peak);
  std::printf("step peak above weights: none %.2f MB, selective %.2f MB, full %.2f MB\n", none.step_peak / 1e6,
              selective.step_peak / 1e6, full.step_peak / 1e6);
}
