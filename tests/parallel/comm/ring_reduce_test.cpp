// Multi-rank tests of the MPI communicator's non-blocking reductions and its own rings, on 8 ranks: ring
// all-reduces and ring reduce-scatters (blocks of any sizes) in groups of 2, 3 and 8, several in flight at
// once and waited out of order, more rings than tag slots, and Open MPI's non-blocking collectives below
// the ring's threshold; every element is checked against its exact sum. Every test runs the same
// collectives on every rank, and checks after its waits, so a failure cannot hang it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <vector>

#include "model/ops/half.h"
#include "parallel/comm/mpi_communicator.h"
#include "tests/parallel/comm/comm_test_util.h"

namespace gpt {
namespace {

// fp32 sums of 1 MiB and more run as the communicator's own ring (reduce-scatter, then all-gather, over
// MPI_Isend/MPI_Irecv), blocking or not. Groups of 2, 3 and 8 ranks; sizes at the threshold, not divisible
// by the group, and large enough that a block travels in several of the ring's 1 MiB pieces. Integer
// values give exact sums to check each element; random values must come out identical on every rank of a
// group and within rounding of the double-precision sum.
TEST_F(Comm, RingAllReduceOfLargeTensors) {
  for (int group_size : {2, 3, 8}) {
    auto group = split_world(group_size, "ring" + std::to_string(group_size));
    if (!group) continue;
    const int g = group->rank();
    const int64_t threshold = MpiCommunicator::kRingMinBytes / 4;
    const int64_t big = group_size * MpiCommunicator::kReduceChunkElems + 2 * MpiCommunicator::kReduceChunkElems / 3 + 7;
    for (int64_t n : {threshold, threshold + 5, big}) {
      Tensor t = host_tensor(n);
      for (int64_t j = 0; j < n; ++j) t.f32()[j] = float(g + 1 + (j % 997));
      group->all_reduce(t);
      const float ranks_sum = float(group_size * (group_size + 1) / 2);
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(t.f32()[j], ranks_sum + float(group_size * (j % 997))) << "group " << group_size << " n " << n << " j " << j;
    }
    // Non-blocking: three rings in flight at once (their messages between the same neighbours must not
    // mix), nudged with progress() and waited in another order than they started.
    {
      const int64_t n = 2 * MpiCommunicator::kReduceChunkElems + 3 * threshold + 1;
      std::vector<Tensor> ts;
      std::vector<std::unique_ptr<PendingSend>> pending;
      for (int k = 0; k < 3; ++k) {
        ts.push_back(host_tensor(n));
        for (int64_t j = 0; j < n; ++j) ts[k].f32()[j] = float((k + 1) * (g + 1) + (j % 101));
        pending.push_back(group->all_reduce_async(ts[k]));
      }
      for (auto& one : pending) one->progress();
      pending[2]->wait();
      pending[0]->wait();
      pending[1]->wait();
      const float ranks_sum = float(group_size * (group_size + 1) / 2);
      for (int k = 0; k < 3; ++k)
        for (int64_t j = 0; j < n; ++j)
          ASSERT_EQ(ts[k].f32()[j], float(k + 1) * ranks_sum + float(group_size * (j % 101))) << k << " " << j;
    }
    // Random values: the same bits everywhere, close to the exact sum.
    const int64_t n = threshold * 3 + 11;
    Tensor t = host_tensor(n);
    auto value = [](int rank, int64_t j) {
      uint64_t x = (uint64_t(rank) << 40) ^ uint64_t(j) * 0x9E3779B97F4A7C15ull;
      x ^= x >> 29;
      x *= 0xBF58476D1CE4E5B9ull;
      x ^= x >> 32;
      return float(double(x % 2000001) / 1000000.0 - 1.0);
    };
    for (int64_t j = 0; j < n; ++j) t.f32()[j] = value(g, j);
    group->all_reduce(t);
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0;
      for (int k = 0; k < group_size; ++k) exact += value(k, j);
      ASSERT_NEAR(t.f32()[j], exact, 1e-6 * group_size) << j;
    }
    Tensor first = host_tensor(n);
    std::memcpy(first.raw(), t.raw(), t.bytes());
    group->broadcast(first, 0);
    ASSERT_EQ(std::memcmp(first.raw(), t.raw(), t.bytes()), 0) << "group of " << group_size << ": rank " << g
                                                             << " differs from rank 0";
  }
}

// Non-blocking reduce-scatters of 1 MiB and more run as the communicator's own ring, in place, with blocks
// of any sizes: all in one rank's block (a distributed-optimizer bucket inside one shard, which streams
// round the ring over several columns at once; the other blocks empty), equal, ragged. Groups of 2, 3 and 8;
// each owner's block is checked element by element against its exact sum, and a mix of reduce-scatters
// and all-reduces in flight together is waited in reverse order.
TEST_F(Comm, RingReduceScatterOfBlocksOfAnySize) {
  for (int group_size : {2, 3, 8}) {
    auto group = split_world(group_size, "scatter" + std::to_string(group_size));
    if (!group) continue;
    const int g = group->rank(), p = group_size;
    const int64_t piece = MpiCommunicator::kRingMinBytes / 4;
    const int64_t n = 3 * piece + 123;
    std::vector<std::vector<int64_t>> layouts;
    for (int owner = 0; owner < p; ++owner) {  // everything in one block
      layouts.emplace_back(p, 0);
      layouts.back()[owner] = n;
    }
    layouts.emplace_back(p, n / p);  // equal, the remainder in the last block
    layouts.back()[p - 1] += n % p;
    layouts.emplace_back(p, 0);  // ragged: empty blocks, one of a single element, the rest in the last
    layouts.back()[0] = piece + 1;
    if (p > 2) layouts.back()[1] = 1;
    layouts.back()[p - 1] = n - piece - 1 - (p > 2 ? 1 : 0);
    std::vector<Tensor> ts, sums;
    std::vector<std::unique_ptr<PendingSend>> pending;
    for (size_t k = 0; k < layouts.size(); ++k) {
      ts.push_back(host_tensor(n));
      for (int64_t j = 0; j < n; ++j) ts.back().f32()[j] = float((g + 1) * int64_t(k + 1) + (j % 1009));
      pending.push_back(group->reduce_scatter_blocks_async(ts.back(), layouts[k]));
      sums.push_back(host_tensor(n + 7));  // an all-reduce in flight between them
      for (int64_t j = 0; j < n + 7; ++j) sums.back().f32()[j] = float(g + (j % 13));
      pending.push_back(group->all_reduce_async(sums.back()));
      pending.back()->progress();
    }
    for (auto it = pending.rbegin(); it != pending.rend(); ++it) (*it)->wait();
    const float ranks_sum = float(p * (p + 1) / 2), ranks_sum0 = float(p * (p - 1) / 2);
    for (size_t k = 0; k < layouts.size(); ++k) {
      int64_t begin = 0;
      for (int b = 0; b < g; ++b) begin += layouts[k][b];
      for (int64_t j = begin; j < begin + layouts[k][g]; ++j)
        ASSERT_EQ(ts[k].f32()[j], ranks_sum * float(k + 1) + float(p * (j % 1009)))
            << "group " << p << " layout " << k << " rank " << g << " element " << j;
      for (int64_t j = 0; j < n + 7; ++j) ASSERT_EQ(sums[k].f32()[j], ranks_sum0 + float(p * (j % 13))) << j;
    }
  }
}

// More rings in flight than the communicator has tag slots for (MpiCommunicator::kRingTags / 8): a ring
// that needs a busy slot first completes the ring on it, so two rings in flight never share tags (their
// messages could otherwise match each other's receives once they are at different steps). Over all 8
// ranks: ring 0 is complete as soon as the ring after the last free slot has started, and every ring,
// waited newest first, holds its sum.
TEST_F(Comm, MoreRingsInFlightThanTagSlots) {
  const int r = world->rank(), slots = MpiCommunicator::kRingTags / 8, rings = slots + 2;
  const int64_t n = MpiCommunicator::kRingMinBytes / 4 + 3;
  auto expected = [](int k, int64_t j) { return float(36 * k + 8 * (j % 31)); };
  std::vector<Tensor> ts;
  std::vector<std::unique_ptr<PendingSend>> pending;
  int64_t ring0_wrong = -1;  // checked after the waits, so a failure on one rank cannot leave rings hanging
  for (int k = 0; k < rings; ++k) {
    ts.push_back(host_tensor(n));
    for (int64_t j = 0; j < n; ++j) ts.back().f32()[j] = float(k * (r + 1) + (j % 31));
    pending.push_back(world->all_reduce_async(ts.back()));
    if (k == slots)
      for (int64_t j = 0; j < n && ring0_wrong < 0; ++j)
        if (ts[0].f32()[j] != expected(0, j)) ring0_wrong = j;
  }
  for (auto it = pending.rbegin(); it != pending.rend(); ++it) (*it)->wait();
  ASSERT_EQ(ring0_wrong, -1) << "ring 0 was not complete when ring " << slots << " took its slot";
  for (int k = 0; k < rings; ++k)
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(ts[k].f32()[j], expected(k, j)) << k << " " << j;
}

// The non-blocking reductions of gradient buckets: several in flight at once and completed out of order,
// large enough to run as several MPI requests each (8 MiB pieces, a ragged last one), reduce-scatter
// blocks of unequal and empty sizes crossing piece boundaries, each element checked against its sum.
TEST_F(Comm, NonBlockingReductionsOfBuckets) {
  const int64_t n = (int64_t(5) << 20) + 4321;  // fp32 elements: three pieces
  const int r = world->rank();
  Tensor a = host_tensor(n), b = host_tensor(n);
  for (int64_t j = 0; j < n; ++j) a.f32()[j] = float(r + (j % 1000)), b.f32()[j] = float(2 * r + (j % 7));
  // Blocks of every size: empty ones, one spanning a piece boundary, a 1-element one.
  const std::vector<int64_t> counts = {0, 3, (int64_t(5) << 19), 1, 0, 100000, 7, 0};
  std::vector<int64_t> begin(8, 0);
  for (int k = 1; k < 8; ++k) begin[k] = begin[k - 1] + counts[k - 1];
  const int64_t rest = n - begin[7];
  std::vector<int64_t> blocks = counts;
  blocks[7] = rest;
  auto sum_a = world->all_reduce_async(a);
  auto scatter_b = world->reduce_scatter_blocks_async(b, blocks);
  scatter_b->progress();
  sum_a->progress();
  scatter_b->wait();  // the second one first
  sum_a->wait();
  sum_a->wait();      // a second wait is a no-op
  for (int64_t j = 0; j < n; ++j) ASSERT_EQ(a.f32()[j], 28.0f + 8 * (j % 1000)) << j;
  for (int64_t j = begin[r]; j < begin[r] + blocks[r]; ++j) ASSERT_EQ(b.f32()[j], 56.0f + 8 * (j % 7)) << j;
  // Equal blocks: the distributed optimizer's whole-buffer case.
  Tensor c = host_tensor(8 * 1000);
  for (int64_t j = 0; j < 8 * 1000; ++j) c.f32()[j] = float(r * j);
  world->reduce_scatter_blocks_async(c, std::vector<int64_t>(8, 1000))->wait();
  for (int64_t j = r * 1000; j < (r + 1) * 1000; ++j) ASSERT_EQ(c.f32()[j], float(28 * j)) << j;
  // 16-bit tensors reduce at once, as the blocking all_reduce does.
  Tensor h = host_tensor(1000, DType::BF16), hb = host_tensor(1000, DType::BF16);
  for (int64_t j = 0; j < 1000; ++j) h.data<uint16_t>()[j] = hb.data<uint16_t>()[j] = fp32_to_bf16(float(r + j % 5));
  world->all_reduce_async(h)->wait();
  world->all_reduce(hb);
  EXPECT_EQ(std::memcmp(h.raw(), hb.raw(), h.bytes()), 0);
  EXPECT_THROW(world->reduce_scatter_blocks_async(c, std::vector<int64_t>(7, 1000)), std::invalid_argument);
  EXPECT_THROW(world->reduce_scatter_blocks_async(c, std::vector<int64_t>(8, 999)), std::invalid_argument);
  std::vector<int64_t> negative(8, 1000);
  negative[0] = -5, negative[1] = 1005;
  EXPECT_THROW(world->reduce_scatter_blocks_async(c, negative), std::invalid_argument);
}

}  // namespace
}  // namespace gpt
