// Context parallelism's numerical contract, on 8 ranks: the same tiny model (GPT-2 shaped, and Llama
// shaped: rope, RMSNorm, SwiGLU, grouped-query attention) split over context groups of 2 and 4 ranks,
// alone and with tensor parallelism (and sequence parallelism), interleaved pipelines, data parallelism
// and the distributed optimizer, against the single-process run in the same dtype:
//  - the first step's loss and every parameter's gradient (reduced over data x context), fp32, within
//    1e-6 relative (a context layout only reorders fp32 sums: the ring merges per-block softmax results
//    and adds dK/dV block by block, and the data-parallel reduction adds the ranks' token shares);
//  - a 6-step training run's losses, eval loss and final weights, in fp32, bf16 and fp16, within the
//    tolerances layout_test.cpp argues for the other layouts (below).
//  - a checkpoint saved at context 4 resumes at context 2 and 1, and one saved at context 1 resumes at
//    context 4 (context is not a storage dimension), continuing the uninterrupted run's losses.
// The references run on every rank without MPI; each layout runs on groups of tp*cp*pp*dp ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "app/trainer.h"
#include "tests/parallel/checkpoint/checkpoint_test_util.h"
#include "data/batch_loader.h"
#include "tests/llama_variants.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/grid/communicator_factory.h"
#include "parallel/data_parallel/grad_sync.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/pipeline/pipeline_executor.h"

using namespace gpt;

namespace {

Config tiny_config(const std::string& dtype, bool llama) {
  Config cfg;
  cfg.precision.dtype = dtype;
  cfg.model.num_layers = 4;  // divisible by pipeline 2 x virtual 2
  cfg.model.hidden_size = 32;
  cfg.model.num_heads = 4;
  cfg.model.seq_length = 32;  // 8 chunks of 4 at context 4
  cfg.model.vocab_size = 100;
  cfg.training.micro_batch_size = 2;
  cfg.training.global_batch_size = 8;
  cfg.training.train_iters = 6;
  cfg.optimizer.lr = 2e-3;
  cfg.optimizer.min_lr = 2e-4;
  cfg.optimizer.warmup_iters = 2;
  cfg.optimizer.clip_grad = 1.0;
  cfg.logging.interval = 1000;
  cfg.data.synthetic = "pattern";
  cfg.parallel.overlap_grad_reduce = false;
  if (llama) set_llama_variant_keys(cfg, 2, 64);
  return cfg;
}

struct Layout {
  int cp, tp = 1, pp = 1, dp = 1, vpp = 1;
  bool zero1 = false, sequence_parallel = false;
  int size() const { return cp * tp * pp * dp; }
};

std::string name(const Layout& l) {
  return "cp" + std::to_string(l.cp) + "_tp" + std::to_string(l.tp) + "_pp" + std::to_string(l.pp) + "_dp" +
         std::to_string(l.dp) + "_vpp" + std::to_string(l.vpp) + (l.zero1 ? "_zero1" : "") +
         (l.sequence_parallel ? "_sp" : "");
}

Config layout_config(const Layout& l, const std::string& dtype, bool llama) {
  Config cfg = tiny_config(dtype, llama);
  cfg.parallel.context = l.cp;
  cfg.parallel.tensor = l.tp;
  cfg.parallel.pipeline = l.pp;
  cfg.parallel.data = l.dp;
  cfg.parallel.virtual_pipeline = l.vpp;
  cfg.parallel.distributed_optimizer = l.zero1;
  cfg.parallel.sequence_parallel = l.sequence_parallel;
  return cfg;
}

using Tensors = std::vector<std::pair<std::string, std::vector<float>>>;

// GPT_TEST_BACKEND=cuda runs every layout on the GPU (all ranks on one device, the groups host-staged over
// MPI, as layout_test.cpp does); the default is the CPU.
std::unique_ptr<Backend> test_backend(ParallelState& ps) {
  const char* b = std::getenv("GPT_TEST_BACKEND");
  int local_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &local_rank);
  auto be = make_backend(b && *b ? b : "cpu", local_rank);
  if (be->device() != Device::CPU) use_device_communicators(ps, *be, "mpi");
  return be;
}

struct FirstStep {
  double loss = 0;
  Tensors grads;
};

// The first step's forward and backward and the gradient reductions, without the update (the pieces of
// Trainer::step; the distributed optimizer is off, so every rank holds the reduced gradients).
FirstStep first_step(const Config& cfg, ParallelState& ps) {
  auto be = test_backend(ps);
  Trainer t(cfg, ps, *be);
  auto chunks = t.chunks();
  for (ModelChunk* c : chunks) c->params().zero_grad(*be);
  auto source = t.make_source("train");
  BatchLoader loader(*source, cfg.model.seq_length, cfg.training.micro_batch_size, cfg.training.global_batch_size,
                     ps.layout.dp(), ps.coord.dp, cfg.model.vocab_size, ps.cp_size(), ps.cp_rank());
  const float grad_scale = static_cast<float>(1.0 / double(cfg.training.global_batch_size * cfg.model.seq_length));
  LayerContext ctx{*be, *ps.tp, cfg.parallel.sequence_parallel, ps.cp.get()};
  Tensor loss_sum = be->zeros({1}, DType::F64);
  run_pipeline_step(ps, ctx, chunks, loader, 0, grad_scale, loss_sum);
  reduce_tied_embedding(ps, *be, chunks);
  if (cfg.parallel.sequence_parallel) reduce_sequence_parallel_grads(ps, chunks);
  t.optimizer().reduce_gradients();
  FirstStep r;
  be->download_f64(loss_sum, &r.loss);
  r.loss = (ps.is_last_stage() && ps.tp_rank() == 0) ? r.loss : 0.0;
  ps.world->all_reduce_host(&r.loss, 1);
  r.loss /= double(loader.microbatches_per_rank() * ps.dp_size());
  r.grads = t.gather_global_params(true);
  return r;
}

struct RunResult {
  std::vector<double> losses;
  std::vector<bool> skipped;
  double eval_loss = 0;
  Tensors weights;
};

RunResult train(const Config& cfg, ParallelState& ps) {
  auto be = test_backend(ps);
  Trainer trainer(cfg, ps, *be);
  if (cfg.precision.dtype == "fp16") trainer.loss_scaler().set_state({4096.0, 0, 2});  // as layout_test
  RunResult r;
  for (auto& s : trainer.train()) {
    r.losses.push_back(s.loss);
    r.skipped.push_back(s.skipped);
  }
  r.weights = trainer.gather_global_params();
  r.eval_loss = trainer.evaluate(*trainer.make_source("valid"), 2);
  return r;
}

// The reference of each (dtype, shape), computed once per process.
template <class R, class F>
const R& cached(std::map<std::string, R>& cache, const std::string& key, F make) {
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make()).first;
  return it->second;
}

// Runs `f(cfg, ps)` on this rank's group of l.size() consecutive world ranks; an exception on one rank
// aborts the job (the group's other ranks would wait in their next collective).
template <class F>
auto on_group(const Layout& l, const Config& cfg, const std::string& what, F f) {
  int world_rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world % l.size() != 0) {
    std::fprintf(stderr, "run with a world size divisible by %d\n", l.size());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  auto group = MpiCommunicator::split(MPI_COMM_WORLD, world_rank / l.size(), world_rank % l.size(), "layout");
  ParallelState ps = mpi_parallel_state(GridLayout(l.size(), l.tp, l.pp, l.dp, l.cp), *group);
  try {
    return f(cfg, ps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s: %s\n", world_rank, what.c_str(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  throw std::logic_error("unreachable");
}

// Relative l2 distance of a tensor's real elements (the padded vocabulary rows depend on tp and are skipped).
double relative_distance(const Config& cfg, const std::string& nm, const std::vector<float>& w,
                         const std::vector<float>& ref) {
  const bool vocab_rows = nm == "embedding.word_embeddings.weight" || nm == "output_layer.weight";
  const size_t n = vocab_rows ? size_t(cfg.model.vocab_size * cfg.model.hidden_size) : ref.size();
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += double(w[i] - ref[i]) * (w[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void check_gradients(const Layout& l, bool llama) {
  static std::map<std::string, FirstStep> refs;
  const std::string what = name(l) + (llama ? " llama" : "");
  const FirstStep& ref = cached(refs, llama ? "llama" : "gpt", [&] {
    ParallelState ps = single_process_state();
    return first_step(tiny_config("fp32", llama), ps);
  });
  const Config cfg = layout_config(l, "fp32", llama);
  const FirstStep r = on_group(l, cfg, what, first_step);
  EXPECT_NEAR(r.loss, ref.loss, 1e-6 * ref.loss) << what;
  ASSERT_EQ(r.grads.size(), ref.grads.size());
  double worst = 0;
  for (size_t k = 0; k < r.grads.size(); ++k) {
    ASSERT_EQ(r.grads[k].first, ref.grads[k].first);
    const double e = relative_distance(cfg, r.grads[k].first, r.grads[k].second, ref.grads[k].second);
    worst = std::max(worst, e);
    EXPECT_LE(e, 1e-6) << what << " gradient of " << r.grads[k].first;
  }
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (world_rank == 0)
    std::printf("%s: loss %.9g (one rank %.9g), worst gradient relative l2 distance %.2e over %zu tensors\n",
                what.c_str(), r.loss, ref.loss, worst, r.grads.size());
}

// As layout_test.cpp argues: fp32 runs differ in the order of their sums (1e-5 relative after the run),
// bf16 and fp16 ones also round at different points (the ring rounds the merged attention output once,
// like the single-rank kernel, but its blocks' products and the tensor-parallel partial sums round
// elsewhere), within u for the losses and 64u for each weight tensor (u = 2^-9 for bf16, 2^-12 for fp16).
struct Tolerance {
  double loss, weight;
};
Tolerance tolerance(const std::string& dtype) {
  if (dtype == "fp32") return {1e-5, 1e-5};
  const double u = std::ldexp(1.0, dtype == "bf16" ? -9 : -12);
  return {u, 64 * u};
}

void check_training(const Layout& l, const std::string& dtype, bool llama) {
  static std::map<std::string, RunResult> refs;
  const std::string what = name(l) + " " + dtype + (llama ? " llama" : "");
  const RunResult& ref = cached(refs, dtype + (llama ? " llama" : ""), [&] {
    ParallelState ps = single_process_state();
    return train(tiny_config(dtype, llama), ps);
  });
  const Config cfg = layout_config(l, dtype, llama);
  const RunResult r = on_group(l, cfg, what, train);
  const Tolerance tol = tolerance(dtype);
  ASSERT_EQ(r.losses.size(), ref.losses.size());
  for (size_t i = 0; i < r.losses.size(); ++i) {
    EXPECT_EQ(r.skipped[i], ref.skipped[i]) << what << " step " << i + 1;
    EXPECT_NEAR(r.losses[i], ref.losses[i], tol.loss * ref.losses[i]) << what << " step " << i + 1;
  }
  EXPECT_NEAR(r.eval_loss, ref.eval_loss, tol.loss * ref.eval_loss) << what;
  ASSERT_EQ(r.weights.size(), ref.weights.size());
  for (size_t k = 0; k < r.weights.size(); ++k) {
    const auto& [nm, w] = r.weights[k];
    ASSERT_EQ(nm, ref.weights[k].first);
    // The key third of the qkv bias has a zero true gradient: Adam turns its rounding noise into steps of
    // up to lr (layout_test.cpp), so it is left out of the distance and bounded by lr per step.
    std::vector<float> a = w, b = ref.weights[k].second;
    if (nm.find("attention.qkv.bias") != std::string::npos) {
      const size_t h = cfg.model.hidden_size;
      for (size_t i = h; i < 2 * h; ++i) {
        EXPECT_LE(std::abs(a[i] - b[i]), 2 * cfg.optimizer.lr * cfg.training.train_iters) << what << " " << nm;
        a[i] = b[i] = 0.f;
      }
    }
    EXPECT_LE(relative_distance(cfg, nm, a, b), tol.weight) << what << " " << nm;
  }
}

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {2},                                  // context 2 alone
      {4},                                  // context 4 alone
      {2, 2, 1, 1, 1, false, true},         // with tensor 2 and sequence parallelism
      {2, 1, 2, 1, 2},                      // with an interleaved pipeline of 2 x 2
      {2, 1, 1, 2, 1, true},                // with data 2 and the distributed optimizer
      {4, 2},                               // context 4 with tensor 2
      {2, 2, 2, 1, 2},                      // tensor 2, interleaved pipeline 2
      {2, 2, 1, 2, 1, true, true},          // tensor 2 (sequence parallel), data 2, ZeRO-1
  };
  return all;
}

// A directory every rank agrees on.
std::string shared_temp_dir(const std::string& tag) {
  char buf[512] = {};
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::snprintf(buf, sizeof buf, "%s", ckpt_test::make_temp_dir(tag).c_str());
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

// Resumes `load` in layout l for steps 4..6 and checks them against the uninterrupted one-rank run.
void expect_resumed(const Layout& l, const std::string& load, const RunResult& whole, const std::string& what) {
  Config cfg = layout_config(l, "fp32", false);
  cfg.checkpoint.load = load;
  const RunResult r = l.size() == 1 ? [&] {
    ParallelState ps = single_process_state();
    return train(cfg, ps);
  }()
                                    : on_group(l, cfg, what, train);
  ASSERT_EQ(r.losses.size(), 3u) << what;
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(r.losses[i], whole.losses[3 + i], 1e-5 * whole.losses[3 + i]) << what << " step " << 4 + i;
  EXPECT_NEAR(r.eval_loss, whole.eval_loss, 1e-5 * whole.eval_loss) << what;
}

class ContextGradients : public ::testing::TestWithParam<bool> {};
class ContextTraining : public ::testing::TestWithParam<std::tuple<bool, std::string>> {};

}  // namespace

TEST_P(ContextGradients, MatchOneRank) {
  for (Layout l : layouts()) {
    l.zero1 = false;  // the reduced gradients are whole on every rank only without it
    check_gradients(l, GetParam());
  }
}

TEST_P(ContextTraining, MatchesOneRank) {
  for (const Layout& l : layouts()) check_training(l, std::get<1>(GetParam()), std::get<0>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Shapes, ContextGradients, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "Llama" : "GPT"); });
INSTANTIATE_TEST_SUITE_P(Shapes, ContextTraining,
                         ::testing::Combine(::testing::Values(false, true), ::testing::Values("fp32", "bf16", "fp16")),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "Llama_" : "GPT_") + std::get<1>(info.param);
                         });

TEST(ContextCheckpoint, ResumesAtAnotherContextSize) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string dir = shared_temp_dir("context");
  ParallelState one = single_process_state();
  const RunResult whole = train(tiny_config("fp32", false), one);

  // Saved at context 4 (x tensor 2, all 8 ranks) after 3 of the 6 steps.
  const Layout cp4{4, 2};
  Config cfg = layout_config(cp4, "fp32", false);
  cfg.training.train_iters = 3;
  cfg.checkpoint.dir = dir + "/cp4";
  cfg.checkpoint.save_interval = 3;
  on_group(cp4, cfg, "save at context 4", train);
  expect_resumed({2}, dir + "/cp4/iter_0000003", whole, "context 4 -> context 2");
  expect_resumed({1}, dir + "/cp4/iter_0000003", whole, "context 4 -> one rank");

  // Saved by one rank, resumed at context 4.
  if (rank == 0) {
    Config c1 = tiny_config("fp32", false);
    c1.training.train_iters = 3;
    c1.checkpoint.dir = dir + "/cp1";
    c1.checkpoint.save_interval = 3;
    ParallelState ps = single_process_state();
    train(c1, ps);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_resumed(cp4, dir + "/cp1/iter_0000003", whole, "one rank -> context 4");
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}
