// The tensor-parallel communication overlap (parallel.tp_comm_overlap, model/tp_overlap.h) on 8 ranks.
//  - The two pipelined collectives against the plain ones over groups of 2, 4 and 8 ranks, in fp32 and
//    bf16: the gather gives all_gather's bytes and runs its op once per row block, its own block first;
//    the reduce-scatter gives MpiCommunicator::reduce_scatter's bits (both add in rank order in fp32),
//    runs `meanwhile` once, and rejects rows that do not split over the group.
//  - Training: the same run with the overlap on and off, at tp 2 and 4 with sequence parallelism (with
//    data and pipeline parallelism beside them, full recomputation, and the Llama-shaped variant whose
//    MLP is SwiGLU without biases; and FP8 hybrid and E4M3 layers), gives the same losses, gradient norms and final weights bit for bit
//    in fp32 and in bf16: the overlap changes when the row blocks travel, never the arithmetic, since
//    each oneDNN product row depends on its own input row only and the sums keep their order.
//    GPT_TEST_BACKEND=cuda runs the training cases on the GPU (all ranks on one device, the groups
//    host-staged over MPI), where cuBLAS may pick other kernels for a row block than for the whole
//    product and the overlapped GELU backward is not cuBLASLt's epilogue: there the runs agree within
//    the layout test's tolerances instead (fp32 1e-5 relative; bf16 2^-9 for losses, 64 x 2^-9 per
//    tensor for weights).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "app/trainer.h"
#include "model/tp_overlap.h"
#include "parallel/comm/mpi_communicator.h"
#include "tests/parallel/comm/comm_test_util.h"
#include "tests/same_weights.h"
#include "parallel/grid/communicator_factory.h"
#include "tests/error_of.h"
#include "tests/llama_variants.h"

using namespace gpt;

namespace {

Tensor random_tensor(Backend& be, int64_t rows, int64_t cols, DType dtype, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> host(static_cast<size_t>(rows * cols));
  for (float& v : host) v = dist(gen);
  Tensor f = be.empty({rows, cols});
  be.upload(host.data(), f);
  if (dtype == DType::F32) return f;
  Tensor t = be.empty({rows, cols}, dtype);
  be.copy(f, t);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

class Collectives : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(Collectives, MatchThePlainCollectives) {
  const auto [size, dtype] = GetParam();
  auto tp = split_world(size, "tp");
  auto be = make_backend("cpu");
  LayerContext ctx{*be, *tp, true};
  ctx.tp_comm_overlap = true;
  ASSERT_TRUE(tp_overlap_applies(ctx) == (size > 1));
  const int64_t n = 5, cols = 7, rank = tp->rank();

  Tensor shard = random_tensor(*be, n, cols, dtype, 100 + unsigned(world_rank()));
  Tensor expected = be->empty({n * size, cols}, dtype);
  tp->all_gather(shard, expected);
  std::vector<int64_t> order;
  Tensor gathered = gather_rows_overlapped(ctx, shard, [&](int64_t r0, int64_t r1, const Tensor& rows) {
    EXPECT_EQ(r1 - r0, n);
    EXPECT_EQ(rows.dim(0), n);
    // The block it is given has arrived already.
    EXPECT_TRUE(same_bytes(rows, expected.rows(r0, r1))) << "block at row " << r0;
    order.push_back(r0 / n);
  });
  EXPECT_TRUE(same_bytes(gathered, expected));
  ASSERT_EQ(order.size(), size_t(size));
  EXPECT_EQ(order[0], rank);  // its own block first, then the ring's
  std::vector<bool> seen(size_t(size), false);
  for (int64_t k : order) seen[size_t(k)] = true;
  for (bool s : seen) EXPECT_TRUE(s);

  // Partial sums of a [size * n, cols] tensor, block by block.
  Tensor partial = random_tensor(*be, n * size, cols, dtype, 200 + unsigned(world_rank()));
  Tensor plain = be->empty({n, cols}, dtype);
  tp->reduce_scatter(partial, plain);
  int meanwhile_calls = 0;
  Tensor overlapped = reduce_scatter_rows_overlapped(
      ctx, n * size, cols, dtype, [&](int64_t r0, int64_t r1, Tensor& block) { be->copy(partial.rows(r0, r1), block); },
      [&] { ++meanwhile_calls; });
  EXPECT_EQ(meanwhile_calls, 1);
  EXPECT_TRUE(same_bytes(overlapped, plain)) << "reduce-scatter over " << size << " ranks";

  if (size > 1) {
    const std::string err = error_of([&] {
      reduce_scatter_rows_overlapped(ctx, n * size + 1, cols, dtype, [](int64_t, int64_t, Tensor&) {});
    });
    EXPECT_NE(err.find("do not split over tensor-parallel size " + std::to_string(size)), std::string::npos) << err;
  }
}

INSTANTIATE_TEST_SUITE_P(Groups, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 4, 8), ::testing::Values(DType::F32, DType::BF16)),
                         [](const auto& info) {
                           return "tp" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == DType::F32 ? "_fp32" : "_bf16");
                         });

std::string training_backend() {
  const char* b = std::getenv("GPT_TEST_BACKEND");
  return b && *b ? b : "cpu";
}

struct Layout {
  int tp, pp, dp;
  bool llama = false;
  std::string recompute = "none";
  std::string fp8 = "off";  // precision.fp8
};

struct Run {
  std::vector<double> losses, norms;
  GlobalWeights weights;
  int64_t overlapped_row_blocks = 0;  // how many row blocks went through model/tp_overlap.h
};

Run train(const Layout& l, const std::string& dtype, bool overlap) {
  const int size = l.tp * l.pp * l.dp;
  Config cfg;
  cfg.precision.dtype = dtype;
  cfg.precision.fp8 = l.fp8;
  cfg.model.num_layers = 4;
  cfg.model.hidden_size = 64;
  cfg.model.num_heads = 4;
  cfg.model.seq_length = 16;
  cfg.model.vocab_size = 96;
  cfg.training.micro_batch_size = 2;
  cfg.training.global_batch_size = 8;
  cfg.training.train_iters = 3;
  cfg.training.recompute = l.recompute;
  cfg.optimizer.lr = 2e-3;
  cfg.optimizer.warmup_iters = 1;
  cfg.optimizer.clip_grad = 1.0;
  cfg.logging.interval = 1000;
  cfg.data.synthetic = "pattern";
  if (l.llama) set_llama_variant_keys(cfg, 4, 128);  // query groups split over tp 4
  cfg.parallel.tensor = l.tp;
  cfg.parallel.pipeline = l.pp;
  cfg.parallel.data = l.dp;
  cfg.parallel.sequence_parallel = true;
  cfg.parallel.tp_comm_overlap = overlap;
  validate_config(cfg);
  auto group = MpiCommunicator::split(MPI_COMM_WORLD, world_rank() / size, world_rank() % size, "layout");
  ParallelState ps = mpi_parallel_state(GridLayout(size, l.tp, l.pp, l.dp), *group);
  auto be = make_backend(training_backend(), world_rank());
  if (be->device() != Device::CPU) use_device_communicators(ps, *be, "mpi");
  Trainer trainer(cfg, ps, *be);
  Run r;
  const int64_t blocks_before = tp_overlap_row_blocks();
  for (auto& s : trainer.train()) {
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
  }
  r.overlapped_row_blocks = tp_overlap_row_blocks() - blocks_before;
  r.weights = trainer.gather_global_params();
  return r;
}

void check(const Layout& l, const std::string& dtype) {
  const std::string what = "tp" + std::to_string(l.tp) + " pp" + std::to_string(l.pp) + " dp" + std::to_string(l.dp) +
                           (l.llama ? " llama" : "") + " recompute " + l.recompute + " fp8 " + l.fp8 + " " + dtype;
  Run without, with;
  try {
    without = train(l, dtype, false);
    with = train(l, dtype, true);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", what.c_str(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);  // the other ranks would wait forever in their next collective
  }
  ASSERT_EQ(without.losses.size(), 3u) << what;
  ASSERT_EQ(with.losses.size(), without.losses.size()) << what;
  ASSERT_EQ(with.weights.size(), without.weights.size()) << what;
  if (training_backend() == "cpu") {
    EXPECT_EQ(with.losses, without.losses) << what;
    EXPECT_EQ(with.norms, without.norms) << what;
    expect_same_weights(with.weights, without.weights, what);
  } else {
    const double u = dtype == "fp32" ? 1e-5 : std::ldexp(1.0, -9), weight_tol = dtype == "fp32" ? 1e-5 : 64 * u;
    for (size_t i = 0; i < with.losses.size(); ++i)
      EXPECT_NEAR(with.losses[i], without.losses[i], u * std::abs(without.losses[i])) << what << " step " << i + 1;
    for (size_t k = 0; k < with.weights.size(); ++k) {
      const auto& a = with.weights[k].second;
      const auto& b = without.weights[k].second;
      ASSERT_EQ(a.size(), b.size()) << what << " " << with.weights[k].first;
      double num = 0, den = 0;
      for (size_t i = 0; i < a.size(); ++i) num += double(a[i] - b[i]) * (a[i] - b[i]), den += double(b[i]) * b[i];
      EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), weight_tol) << what << " " << with.weights[k].first;
    }
  }
  // The overlapped path ran, and only with the option on.
  EXPECT_GT(with.overlapped_row_blocks, 0) << what;
  EXPECT_EQ(without.overlapped_row_blocks, 0) << what;
  // The runs learn (the comparison is not between two untouched initialisations).
  EXPECT_LT(without.losses.back(), without.losses.front()) << what;
}

class Training : public ::testing::TestWithParam<std::string> {};

TEST_P(Training, Tensor2Data2Pipeline2) { check({2, 2, 2}, GetParam()); }
TEST_P(Training, Tensor4Data2) { check({4, 1, 2}, GetParam()); }
TEST_P(Training, Tensor4Pipeline2Llama) { check({4, 2, 1, true}, GetParam()); }
TEST_P(Training, Tensor2Data4FullRecompute) { check({2, 1, 4, false, "full"}, GetParam()); }
// FP8 layers overlap as well: delayed scaling casts each row block at the step's fixed scale.
TEST_P(Training, Tensor2Pipeline2Data2Fp8Hybrid) { check({2, 2, 2, false, "none", "hybrid"}, GetParam()); }
TEST_P(Training, Tensor4Data2LlamaFp8E4m3) { check({4, 1, 2, true, "none", "e4m3"}, GetParam()); }

INSTANTIATE_TEST_SUITE_P(Dtypes, Training, ::testing::Values("fp32", "bf16"), [](const auto& info) { return info.param; });

TEST(TpOverlapConfig, NeedsSequenceParallelism) {
  Config cfg;
  cfg.parallel.tp_comm_overlap = true;
  const std::string err = error_of([&] { validate_config(cfg); });
  EXPECT_NE(err.find("parallel.tp_comm_overlap needs parallel.sequence_parallel"), std::string::npos) << err;
  cfg.parallel.sequence_parallel = true;
  EXPECT_NO_THROW(validate_config(cfg));
}

}  // namespace
