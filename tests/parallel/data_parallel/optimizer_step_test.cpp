// The training step's optimizer path, on 2 ranks, against the per-parameter path it replaced, bit for
// bit: per segment a sum of squares downloaded for the global norm, an in-place scaling of the gradients
// by the unscale and clipping factor, a single-tensor AdamW step and a copy of the fp32 master weights
// into the compute-dtype values. That reference is written out here on a second trainer of the same
// layout (reduce_gradients, then the old steps on its optimizer segments); the trainer under test runs
// its own step(): device-side per-parameter squares in one call per flat range, one download per step,
// and one flat AdamW call per range with the factor and the master-to-value store fused. After 4 steps
// every norm and loss, and every value, master weight and moment, must be identical, in fp32, bf16 and
// fp16, without and with the distributed optimizer, and for tensor- and pipeline-parallel layouts (the
// norm skips tensor-parallel replicas and the tied copy).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>

#include "app/trainer.h"
#include "data/batch_loader.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/grad_sync.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/pipeline/pipeline_executor.h"

using namespace gpt;

namespace {

Config tiny_config(const std::string& dtype) {
  Config cfg;
  cfg.precision.dtype = dtype;
  cfg.model.num_layers = 4;
  cfg.model.hidden_size = 32;
  cfg.model.num_heads = 4;
  cfg.model.seq_length = 16;
  cfg.model.vocab_size = 100;
  cfg.training.micro_batch_size = 2;
  cfg.training.global_batch_size = 8;
  cfg.training.train_iters = 4;
  cfg.optimizer.lr = 2e-3;
  cfg.optimizer.warmup_iters = 1;
  cfg.optimizer.clip_grad = 0.05;  // below the norms of this run: every step is clipped
  cfg.logging.interval = 1000;
  cfg.data.synthetic = "pattern";
  cfg.parallel.overlap_grad_reduce = false;
  return cfg;
}

struct Record {
  std::vector<double> losses, norms;
};

// One step of `t` the way the optimizer ran before the flat kernels (see the file comment).
void reference_step(Trainer& t, SampleSource& source, int64_t consumed, double lr, Record& out) {
  const Config& cfg = t.config();
  ParallelState& ps = t.parallel_state();
  Backend& be = t.backend();
  DataParallelOptimizer& opt = t.optimizer();
  auto chunks = t.chunks();
  for (ModelChunk* c : chunks) c->params().zero_grad(be);
  BatchLoader loader(source, cfg.model.seq_length, cfg.training.micro_batch_size, cfg.training.global_batch_size,
                     ps.dp_size(), ps.dp_rank(), cfg.model.vocab_size);
  const double loss_scale = t.loss_scaler().scale();
  const float grad_scale =
      static_cast<float>(loss_scale / double(cfg.training.global_batch_size * cfg.model.seq_length));
  LayerContext ctx{be, *ps.tp, cfg.parallel.sequence_parallel};
  Tensor loss_sum = be.zeros({1}, DType::F64);
  run_pipeline_step(ps, ctx, chunks, loader, consumed, grad_scale, loss_sum);
  reduce_tied_embedding(ps, be, chunks);
  if (cfg.parallel.sequence_parallel) reduce_sequence_parallel_grads(ps, chunks);
  opt.reduce_gradients();
  // The norm: one sum_squares (one download) per segment, summed per global parameter.
  std::vector<double> squares(num_global_params(t.spec()), 0.0);
  for (OptimizerSegment& s : opt.adam().segments()) {
    if (s.param->tied_copy || (s.param->tp_replicated && ps.tp_rank() != 0)) continue;
    squares.at(s.param->global_id) += be.sum_squares(s.grad);
  }
  ps.model_parallel->all_reduce_host(squares.data(), static_cast<int64_t>(squares.size()));
  if (opt.distributed()) ps.dp->all_reduce_host(squares.data(), static_cast<int64_t>(squares.size()));
  double total = 0;
  for (double v : squares) total += v;
  const double norm = std::sqrt(total) / loss_scale;
  // Unscale and clip in place, then AdamW per segment and the master weights copied into the values.
  double coeff = 1.0 / loss_scale;
  if (cfg.optimizer.clip_grad > 0 && cfg.optimizer.clip_grad / (norm + 1e-6) < 1.0)
    coeff *= cfg.optimizer.clip_grad / (norm + 1e-6);
  if (coeff != 1.0)
    for (OptimizerSegment& s : opt.adam().segments()) be.scale(s.grad, static_cast<float>(coeff));
  const int64_t step = opt.adam().steps_taken() + 1;
  opt.adam().set_steps_taken(step);
  for (OptimizerSegment& s : opt.adam().segments()) {
    const float wd = s.param->weight_decay ? static_cast<float>(cfg.optimizer.weight_decay) : 0.f;
    be.adamw_step(s.master, s.grad, s.m, s.v, static_cast<float>(lr), static_cast<float>(cfg.optimizer.beta1),
                  static_cast<float>(cfg.optimizer.beta2), static_cast<float>(cfg.optimizer.eps), wd, step);
    if (s.master.raw() != s.value.raw()) be.copy(s.master, s.value);
  }
  opt.all_gather_values();
  double loss = 0;
  be.download_f64(loss_sum, &loss);
  loss = (ps.is_last_stage() && ps.tp_rank() == 0) ? loss : 0.0;
  ps.world->all_reduce_host(&loss, 1);
  out.losses.push_back(loss / double(loader.microbatches_per_rank() * ps.dp_size()));
  out.norms.push_back(norm);
}

std::vector<uint32_t> bits(Backend& be, const Tensor& t) {
  std::vector<float> v(t.numel());
  be.download(t, v.data());
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  bool zero1 = false, overlap = false;
};

void check(const Layout& l, const std::string& dtype) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const int size = l.tp * l.pp * l.dp;
  const std::string what = "tp" + std::to_string(l.tp) + " pp" + std::to_string(l.pp) + " dp" + std::to_string(l.dp) +
                           (l.zero1 ? " zero1" : "") + (l.overlap ? " overlap" : "") + " " + dtype;
  Config cfg = tiny_config(dtype);
  cfg.parallel.tensor = l.tp;
  cfg.parallel.pipeline = l.pp;
  cfg.parallel.data = l.dp;
  cfg.parallel.distributed_optimizer = l.zero1;
  cfg.parallel.overlap_grad_reduce = l.overlap;
  auto group = MpiCommunicator::split(MPI_COMM_WORLD, world_rank / size, world_rank % size, "layout");
  ParallelState ps = mpi_parallel_state(GridLayout(size, l.tp, l.pp, l.dp), *group);
  auto be_flat = make_backend("cpu"), be_ref = make_backend("cpu");
  Trainer flat(cfg, ps, *be_flat);
  Config ref_cfg = cfg;
  ref_cfg.parallel.overlap_grad_reduce = false;
  Trainer ref(ref_cfg, ps, *be_ref);
  for (Trainer* t : {&flat, &ref})
    if (dtype == "fp16") t->loss_scaler().set_state({4096.0, 0, 2});
  auto source = ref.make_source("train");
  Record got, want;
  for (int64_t i = 0; i < cfg.training.train_iters; ++i) {
    const StepStats s = flat.step();
    ASSERT_FALSE(s.skipped) << what;
    got.losses.push_back(s.loss);
    got.norms.push_back(s.grad_norm);
    reference_step(ref, *source, i * cfg.training.global_batch_size, s.lr, want);
    if (ref.loss_scaler().dynamic()) ref.loss_scaler().set_state(flat.loss_scaler().state());
  }
  EXPECT_EQ(got.losses, want.losses) << what;
  EXPECT_EQ(got.norms, want.norms) << what;
  for (double n : got.norms) EXPECT_GT(n, cfg.optimizer.clip_grad) << what << ": the clipping path is not exercised";
  auto& a = flat.optimizer().adam().segments();
  auto& b = ref.optimizer().adam().segments();
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    const std::string name = what + " " + a[k].param->name;
    EXPECT_EQ(bits(*be_flat, a[k].master), bits(*be_ref, b[k].master)) << name << " master";
    EXPECT_EQ(bits(*be_flat, a[k].m), bits(*be_ref, b[k].m)) << name << " m";
    EXPECT_EQ(bits(*be_flat, a[k].v), bits(*be_ref, b[k].v)) << name << " v";
  }
  auto fc = flat.chunks(), rc = ref.chunks();
  for (size_t c = 0; c < fc.size(); ++c)
    EXPECT_EQ(bits(*be_flat, fc[c]->params().value_buffer()), bits(*be_ref, rc[c]->params().value_buffer()))
        << what << " values of chunk " << c;
}

class OptimizerStep : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(OptimizerStep, OneRankMatchesPerSegmentPath) { check({1, 1, 1}, GetParam()); }
TEST_P(OptimizerStep, Data2MatchesPerSegmentPath) { check({1, 1, 2}, GetParam()); }
TEST_P(OptimizerStep, Data2Zero1MatchesPerSegmentPath) { check({1, 1, 2, true}, GetParam()); }
TEST_P(OptimizerStep, Data2Zero1OverlappedMatchesPerSegmentPath) { check({1, 1, 2, true, true}, GetParam()); }
TEST_P(OptimizerStep, Tensor2MatchesPerSegmentPath) { check({2, 1, 1}, GetParam()); }
TEST_P(OptimizerStep, Pipeline2MatchesPerSegmentPath) { check({1, 2, 1}, GetParam()); }

INSTANTIATE_TEST_SUITE_P(Dtypes, OptimizerStep, ::testing::Values("fp32", "bf16", "fp16"),
                         [](const auto& info) { return info.param; });
