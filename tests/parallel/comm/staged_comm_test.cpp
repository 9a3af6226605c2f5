// The host-staged communicator (parallel/comm/staged_communicator.h) on 8 ranks, over host memory: every
// collective, p2p and non-blocking operation gives bit for bit what the MPI communicator it wraps gives on
// the same tensors (fp32, bf16, fp16 and int32), and counts the same bytes; and a whole training run with
// every group staged reproduces the plain MPI run of the same layout exactly. On a GPU the same code stages
// device tensors (scripts/gpu-check.sh runs the layout test that way).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <random>

#include "app/trainer.h"
#include "model/ops/cpu/cpu_tensor_access.h"
#include "parallel/grid/communicator_factory.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/comm/staged_communicator.h"
#include "tests/tiny_model_config.h"

using namespace gpt;

namespace {

class StagedComm : public ::testing::Test {
 protected:
  void SetUp() override {
    plain = MpiCommunicator::dup(MPI_COMM_WORLD, "plain");
    staged = std::make_unique<HostStagedCommunicator>(MpiCommunicator::dup(MPI_COMM_WORLD, "staged"), *be);
  }
  // Random values of `dtype` (different on each rank), the same for both communicators.
  Tensor random(int64_t n, DType dtype, int salt) {
    std::mt19937 rng(1000 * plain->rank() + salt);
    std::normal_distribution<float> d;
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    Tensor t = be->empty({n}, dtype);
    if (dtype == DType::I32) {
      std::vector<int32_t> iv(n);
      for (int64_t i = 0; i < n; ++i) iv[i] = static_cast<int32_t>(v[i] * 1000);
      be->upload_i32(iv.data(), t);
    } else {
      be->upload(v.data(), t);
    }
    return t;
  }
  Tensor copy(const Tensor& t) {
    Tensor c = be->empty(t.shape(), t.dtype());
    std::memcpy(c.raw(), t.raw(), t.numel() * dtype_size(t.dtype()));
    return c;
  }
  static void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
    ASSERT_EQ(a.numel(), b.numel()) << what;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.numel() * dtype_size(a.dtype())), 0) << what;
  }
  std::unique_ptr<Backend> be = make_backend("cpu");
  std::unique_ptr<MpiCommunicator> plain;
  std::unique_ptr<HostStagedCommunicator> staged;
};

const DType kFloatTypes[] = {DType::F32, DType::BF16, DType::F16};

TEST_F(StagedComm, ReductionsMatchTheMpiCommunicatorBitForBit) {
  for (DType dt : kFloatTypes)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
      Tensor a = random(1001, dt, 1), b = copy(a);
      plain->all_reduce(a, op);
      staged->all_reduce(b, op);
      expect_same_bits(a, b, std::string("all_reduce ") + dtype_name(dt));
    }
  for (DType dt : kFloatTypes) {
    Tensor in = random(8 * 37, dt, 2);
    Tensor a = be->empty({37}, dt), b = be->empty({37}, dt);
    plain->reduce_scatter(in, a);
    staged->reduce_scatter(in, b);
    expect_same_bits(a, b, std::string("reduce_scatter ") + dtype_name(dt));
  }
  double x[3] = {1.0 * plain->rank(), 2.0, -1.0 * plain->rank()}, y[3] = {x[0], x[1], x[2]};
  plain->all_reduce_host(x, 3, ReduceOp::Sum);
  staged->all_reduce_host(y, 3, ReduceOp::Sum);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(x[i], y[i]);
}

TEST_F(StagedComm, GatherBroadcastAndPointToPointMoveTheSameValues) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32}) {
    Tensor in = random(53, dt, 3);
    Tensor a = be->empty({8 * 53}, dt), b = be->empty({8 * 53}, dt);
    plain->all_gather(in, a);
    staged->all_gather(in, b);
    expect_same_bits(a, b, std::string("all_gather ") + dtype_name(dt));
    Tensor c = random(29, dt, 4), d = copy(c);
    plain->broadcast(c, 3);
    staged->broadcast(d, 3);
    expect_same_bits(c, d, std::string("broadcast ") + dtype_name(dt));
  }
  // A ring: each rank sends to the next (blocking and non-blocking) and receives from the previous.
  const int r = plain->rank(), next = (r + 1) % 8, prev = (r + 7) % 8;
  Tensor mine = random(100, DType::BF16, 5);
  Tensor got_plain = be->empty({100}, DType::BF16), got_staged = be->empty({100}, DType::BF16);
  {
    auto s = plain->send_async(mine, next, 7);
    plain->recv(got_plain, prev, 7);
    s->wait();
  }
  {
    auto s = staged->send_async(mine, next, 7);
    staged->recv(got_staged, prev, 7);
    s->wait();
  }
  expect_same_bits(got_plain, got_staged, "ring");
  if (r % 2 == 0) {
    staged->send(mine, next, 9);
  } else {
    staged->recv(got_staged, prev, 9);
    Tensor expect = be->empty({100}, DType::BF16);
    plain->recv(expect, prev, 10);
    expect_same_bits(expect, got_staged, "blocking send");
  }
  if (r % 2 == 0) plain->send(mine, next, 10);
  EXPECT_EQ(staged->bytes_moved(), plain->bytes_moved());
}

TEST_F(StagedComm, NonBlockingReductionsWriteBackOnWait) {
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor a = random(640, dt, 6), b = copy(a);
    auto pa = plain->all_reduce_async(a, ReduceOp::Sum);
    auto pb = staged->all_reduce_async(b, ReduceOp::Sum);
    pb->progress();
    pa->wait();
    pb->wait();
    expect_same_bits(a, b, std::string("all_reduce_async ") + dtype_name(dt));
    const std::vector<int64_t> counts = {80, 0, 120, 80, 80, 100, 100, 80};
    Tensor c = random(640, dt, 7), d = copy(c);
    auto pc = plain->reduce_scatter_blocks_async(c, counts);
    auto pd = staged->reduce_scatter_blocks_async(d, counts);
    pc->wait();
    pd.reset();  // destroying an unfinished one waits for it
    int64_t begin = 0;
    for (int k = 0; k < plain->rank(); ++k) begin += counts[k];
    const int64_t n = counts[plain->rank()], es = dtype_size(dt);
    EXPECT_EQ(std::memcmp(static_cast<char*>(c.raw()) + begin * es, static_cast<char*>(d.raw()) + begin * es, n * es), 0)
        << "reduce_scatter_blocks_async " << dtype_name(dt);
  }
}

// A (2, 2, 2) run with ZeRO-1 and bf16, every group staged, against the same layout on plain MPI.
TEST(StagedLayout, TrainingWithStagedGroupsIsBitIdentical) {
  Config cfg = tiny_model_config("bf16");
  cfg.training.micro_batch_size = 2;
  cfg.training.global_batch_size = 16;
  cfg.training.train_iters = 4;
  cfg.parallel.tensor = cfg.parallel.pipeline = cfg.parallel.data = 2;
  cfg.parallel.distributed_optimizer = true;
  cfg.parallel.sequence_parallel = true;
  auto run = [&](bool staged) {
    auto be = make_backend("cpu");
    ParallelState ps = mpi_parallel_state(GridLayout(8, 2, 2, 2));
    if (staged) use_host_staged_communicators(ps, *be);
    Trainer t(cfg, ps, *be);
    std::vector<double> out;
    for (const StepStats& s : t.train()) out.push_back(s.loss), out.push_back(s.grad_norm);
    return out;
  };
  const std::vector<double> plain = run(false), staged = run(true);
  ASSERT_EQ(plain.size(), 8u);
  EXPECT_EQ(plain, staged);
}

}  // namespace
