// Tests of the NCCL communicator and of the communicator factory, run on 2 ranks by ctest (and on one rank
// by scripts/gpu-check.sh on a one-GPU machine): every collective against values worked out by hand from
// rank-dependent inputs in F32 and BF16, all-gather / reduce-scatter, broadcast, tag-matched
// point-to-point received in a different order than sent (the stash), sends posted in both directions
// before any receive (which would hang with rendezvous sends), a wrongly sized receive reported without
// desynchronising the channel, an asynchronous all-reduce overlapping a kernel, a reduce-scatter of
// unequal blocks (a gradient bucket reduced to its owners), and the factory building
// NCCL groups (with p2p channels for the pipeline) from a process grid. NCCL cannot place two ranks on one
// GPU, so the tests skip unless every rank has its own device; every rank takes the same decision (an MPI
// reduction), so a skip cannot hang the others. The CPU half of the factory is checked everywhere.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "model/ops/backend.h"
#include "parallel/grid/communicator_factory.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/grid/process_grid.h"

#ifdef GPT_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "parallel/comm/nccl_communicator.h"
#endif

namespace gpt {
namespace {

[[maybe_unused]] int world_rank() {  // used only where NCCL is built in
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

TEST(CommunicatorFactory, HostBackendKeepsTheMpiGroups) {
  auto cpu = make_backend("cpu");
  const int n = world_size();
  ParallelState ps = make_parallel_state(GridLayout(n, n, 1), *cpu);
  ASSERT_TRUE(ps.tp);
  EXPECT_EQ(ps.tp->size(), n);
  if (n > 1) {
    EXPECT_NE(dynamic_cast<MpiCommunicator*>(ps.tp.get()), nullptr);
  } else {
    EXPECT_NE(dynamic_cast<SelfCommunicator*>(ps.tp.get()), nullptr);
  }
#ifdef GPT_HAVE_NCCL
  EXPECT_TRUE(nccl_built_in());
#else
  EXPECT_FALSE(nccl_built_in());
#endif
}

#ifdef GPT_HAVE_NCCL

// The CUDA backend when every rank of the world has a GPU of its own, else null with the reason; the
// same answer on every rank.
Backend* gpu_for_every_rank(std::string* why) {
  static std::unique_ptr<Backend> backend;
  static std::string reason;
  static bool decided = false;
  if (!decided) {
    decided = true;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      count = 0;
    }
    int ok = count >= world_size() ? 1 : 0;
    try {
      if (ok) backend = make_backend("cuda", world_rank());
    } catch (const std::exception& e) {
      ok = 0;
      reason = e.what();
    }
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
      backend.reset();
      if (reason.empty())
        reason = "NCCL needs one GPU per rank: " + std::to_string(world_size()) + " ranks, and some rank sees " +
                 std::to_string(count) + " device(s)";
    }
  }
  if (why) *why = reason;
  return backend.get();
}

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    be = gpu_for_every_rank(&why);
    if (!be) GTEST_SKIP() << why;
    rank = world_rank();
    size = world_size();
    std::unique_ptr<Communicator> host;
    if (size > 1)
      host = MpiCommunicator::dup(MPI_COMM_WORLD, "world");
    else
      host = std::make_unique<SelfCommunicator>("world");
    comm = std::make_unique<NcclCommunicator>(std::move(host), *be, true);
  }
  void TearDown() override {
    comm.reset();
    if (be) be->synchronize();
  }
  Tensor make(const std::vector<float>& v, DType dt = DType::F32) {
    Tensor t = be->empty({static_cast<int64_t>(v.size())}, dt);
    be->upload(v.data(), t);
    return t;
  }
  std::vector<float> host(const Tensor& t) {
    std::vector<float> v(t.numel());
    be->download(t, v.data());
    return v;
  }

  Backend* be = nullptr;
  std::unique_ptr<NcclCommunicator> comm;
  int rank = 0, size = 1;
};

TEST_F(NcclTest, AllReduceSumMaxMin) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t n = 1000;
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = float(rank + 1) + float(i % 7);
    Tensor s = make(v, dt), mx = make(v, dt), mn = make(v, dt);
    comm->all_reduce(s, ReduceOp::Sum);
    comm->all_reduce(mx, ReduceOp::Max);
    comm->all_reduce(mn, ReduceOp::Min);
    const auto hs = host(s), hmx = host(mx), hmn = host(mn);
    for (int64_t i = 0; i < n; ++i) {
      const float base = float(i % 7);
      ASSERT_EQ(hs[i], size * base + size * (size + 1) / 2.f) << dtype_name(dt) << " sum at " << i;
      ASSERT_EQ(hmx[i], base + size) << dtype_name(dt) << " max at " << i;
      ASSERT_EQ(hmn[i], base + 1) << dtype_name(dt) << " min at " << i;
    }
  }
  EXPECT_GT(comm->bytes_moved(), 0);
}

TEST_F(NcclTest, AllGatherReduceScatterBroadcast) {
  const int64_t n = 513;
  std::vector<float> mine(n);
  for (int64_t i = 0; i < n; ++i) mine[i] = float(rank * 1000 + i);
  Tensor in = make(mine), out = be->empty({n * size});
  comm->all_gather(in, out);
  const auto g = host(out);
  for (int r = 0; r < size; ++r)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(g[r * n + i], float(r * 1000 + i)) << "gather block " << r;

  std::vector<float> full(n * size);
  for (int64_t j = 0; j < n * size; ++j) full[j] = float(rank + j);
  Tensor fin = make(full), part = be->empty({n});
  comm->reduce_scatter(fin, part);
  const auto p = host(part);
  for (int64_t i = 0; i < n; ++i) {
    float expect = 0;
    for (int r = 0; r < size; ++r) expect += float(r + rank * n + i);
    ASSERT_EQ(p[i], expect) << "reduce-scatter element " << i;
  }

  const int root = size - 1;
  Tensor b = make(std::vector<float>(77, float(rank == root ? 42 : -1)), DType::BF16);
  comm->broadcast(b, root);
  for (float x : host(b)) ASSERT_EQ(x, 42.f);
  Tensor wrong = be->empty({n * size + 1});
  EXPECT_THROW(comm->all_gather(in, wrong), std::invalid_argument);
}

TEST_F(NcclTest, TaggedPointToPointOutOfOrderAndBothWays) {
  if (size < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  // Two messages to the next rank; the previous rank's are received in the opposite order (the first
  // goes to the stash).
  Tensor a = make(std::vector<float>(1000, float(rank)));
  Tensor b = make(std::vector<float>(3000, float(100 + rank)), DType::BF16);
  auto sa = comm->send_async(a, next, 7);
  auto sb = comm->send_async(b, next, 3);
  Tensor rb = be->empty({3000}, DType::BF16), ra = be->empty({1000});
  comm->recv(rb, prev, 3);
  comm->recv(ra, prev, 7);
  sa->wait();
  sb->wait();
  for (float x : host(ra)) ASSERT_EQ(x, float(prev));
  for (float x : host(rb)) ASSERT_EQ(x, float(100 + prev));
  // Both directions posted before any receive, with messages large enough to need several NCCL steps.
  const int64_t big = 3 << 20;
  Tensor to_next = make(std::vector<float>(big, 1.f + rank)), to_prev = make(std::vector<float>(big, -1.f - rank));
  auto s1 = comm->send_async(to_next, next, 11);
  auto s2 = comm->send_async(to_prev, prev, 12);
  Tensor from_prev = be->empty({big}), from_next = be->empty({big});
  comm->recv(from_next, next, 12);
  comm->recv(from_prev, prev, 11);
  s1.reset();  // destroying a pending send waits for it
  s2.reset();
  const auto fp = host(from_prev), fn = host(from_next);
  EXPECT_EQ(fp.front(), 1.f + prev);
  EXPECT_EQ(fp.back(), 1.f + prev);
  EXPECT_EQ(fn.front(), -1.f - next);
  EXPECT_EQ(fn.back(), -1.f - next);
}

TEST_F(NcclTest, WronglySizedReceiveIsReportedAndTheChannelStaysUsable) {
  if (size < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  Tensor ten = make(std::vector<float>(10, 1.f));
  comm->send(ten, next, 5);
  Tensor twelve = be->empty({12});
  EXPECT_THROW(comm->recv(twelve, prev, 5), std::runtime_error);
  Tensor again = make(std::vector<float>(4, float(rank)));
  comm->send(again, next, 6);
  Tensor got = be->empty({4});
  comm->recv(got, prev, 6);
  for (float x : host(got)) EXPECT_EQ(x, float(prev));
}

TEST_F(NcclTest, AsyncAllReduceOverlapsCompute) {
  const int64_t n = 1 << 22;
  Tensor grads = make(std::vector<float>(n, 1.f));
  Tensor other = make(std::vector<float>(n, 2.f));
  auto pending = comm->all_reduce_async(grads);
  be->scale(other, 3.f);  // queued on the compute stream while the all-reduce runs on its own
  pending->wait();
  be->scale(grads, 0.5f);  // ordered after the all-reduce by wait()
  const auto g = host(grads), o = host(other);
  EXPECT_EQ(g.front(), 0.5f * size);
  EXPECT_EQ(g.back(), 0.5f * size);
  EXPECT_EQ(o.front(), 6.f);
  EXPECT_GE(comm->seconds_spent(), 0.0);
}

// A gradient bucket reduced to the ranks owning its blocks: unequal blocks (one empty) go as grouped
// ncclReduce calls, equal ones as one in-place ncclReduceScatter; this rank's block holds the sums.
TEST_F(NcclTest, ReduceScatterOfUnequalBlocks) {
  for (bool equal : {false, true}) {
    std::vector<int64_t> counts(size);
    for (int r = 0; r < size; ++r) counts[r] = equal ? 700 : (r == 0 ? 0 : 1000 * r + 3);
    if (!equal && size == 1) counts[0] = 5;
    int64_t n = 0, begin = 0;
    for (int r = 0; r < size; ++r) {
      if (r < rank) begin += counts[r];
      n += counts[r];
    }
    std::vector<float> v(n);
    for (int64_t j = 0; j < n; ++j) v[j] = float(rank + j % 13);
    Tensor t = make(v);
    comm->reduce_scatter_blocks_async(t, counts)->wait();
    const auto got = host(t);
    for (int64_t j = begin; j < begin + counts[rank]; ++j)
      ASSERT_EQ(got[j], float(size * (size - 1) / 2 + size * (j % 13))) << (equal ? "equal" : "unequal") << " at " << j;
  }
}

TEST_F(NcclTest, FactoryBuildsDeviceGroupsFromTheGrid) {
  comm.reset();  // the factory makes its own communicators
  {
    ParallelState ps = make_parallel_state(GridLayout(size, size, 1), *be);
    if (size > 1) {
      EXPECT_NE(dynamic_cast<NcclCommunicator*>(ps.tp.get()), nullptr);
    }
    Tensor t = make(std::vector<float>(100, 1.f));
    ps.tp->all_reduce(t);
    for (float x : host(t)) ASSERT_EQ(x, float(size));
    // dp is a group of one here: a device-aware identity, gathers are device copies.
    Tensor in = make(std::vector<float>(5, 3.f)), out = be->empty({5});
    ps.dp->all_gather(in, out);
    for (float x : host(out)) ASSERT_EQ(x, 3.f);
    EXPECT_DOUBLE_EQ([&] {
      double v = 1.0;
      ps.world->all_reduce_host(&v, 1);
      return v;
    }(), double(size));
  }
  if (size > 1) {
    ParallelState ps = make_parallel_state(GridLayout(size, 1, size), *be);
    const int next = (ps.pp_rank() + 1) % size, prev = (ps.pp_rank() + size - 1) % size;
    Tensor act = make(std::vector<float>(256, float(ps.pp_rank())));
    auto s = ps.pp->send_async(act, next, 1);
    Tensor got = be->empty({256});
    ps.pp->recv(got, prev, 1);
    s->wait();
    for (float x : host(got)) ASSERT_EQ(x, float(prev));
  }
}

#endif  // GPT_HAVE_NCCL

}  // namespace
}  // namespace gpt
