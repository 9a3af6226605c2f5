// Multi-rank tests of the MPI communicator and the process groups, run on 8 ranks: every collective against
// values worked out by hand from rank-dependent inputs, bf16 / fp16 reductions against the exact result
// rounded once, reduce-scatter / all-gather round trips, a send/recv ring, batched and non-blocking
// exchanges in both directions with messages large enough to need a rendezvous (so a wrong ordering would
// deadlock), MPI errors turned into exceptions (the non-blocking reductions and the rings are in
// ring_reduce_test.cpp), group splits for several (tp, pp, dp) layouts checked
// against the layout formula, and start-up errors that every rank raises identically. Every test runs the
// same collectives on every rank, so a failure cannot hang it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <numeric>

#include "app/launch_env.h"
#include "model/ops/half.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/grid/process_grid.h"
#include "tests/parallel/comm/comm_test_util.h"

namespace gpt {
namespace {

// Every rank's string, for checking that all ranks report the same thing.
std::vector<std::string> gather_strings(const std::string& s) {
  constexpr int kWidth = 512;
  std::vector<char> mine(kWidth, 0), all(kWidth * world_size(), 0);
  std::memcpy(mine.data(), s.data(), std::min<size_t>(s.size(), kWidth - 1));
  MPI_Allgather(mine.data(), kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> out;
  for (int r = 0; r < world_size(); ++r) out.emplace_back(all.data() + r * kWidth);
  return out;
}

TEST_F(Comm, RankAndSize) {
  EXPECT_EQ(world->rank(), world_rank());
  EXPECT_EQ(world->size(), 8);
  EXPECT_EQ(world->name(), "world");
  EXPECT_NE(world->handle(), MPI_COMM_WORLD);  // a private duplicate
}

TEST_F(Comm, AllReduceSumMaxMin) {
  const int n = 5, r = world->rank();
  Tensor t = host_tensor(n);
  auto fill = [&] {
    for (int i = 0; i < n; ++i) t.f32()[i] = 10.0f * r + i;
  };
  fill();
  world->all_reduce(t, ReduceOp::Sum);
  for (int i = 0; i < n; ++i) EXPECT_EQ(t.f32()[i], 10.0f * 28 + 8 * i);  // sum of ranks 0..7 is 28
  fill();
  world->all_reduce(t, ReduceOp::Max);
  for (int i = 0; i < n; ++i) EXPECT_EQ(t.f32()[i], 70.0f + i);
  fill();
  world->all_reduce(t, ReduceOp::Min);
  for (int i = 0; i < n; ++i) EXPECT_EQ(t.f32()[i], float(i));
}

TEST_F(Comm, AllReduceHostDoubles) {
  double x[3] = {world->rank() * 0.5, -1.0 * world->rank(), 1e15};
  world->all_reduce_host(x, 3, ReduceOp::Sum);
  EXPECT_EQ(x[0], 14.0);
  EXPECT_EQ(x[1], -28.0);
  EXPECT_EQ(x[2], 8e15);
  double m = world->rank() == 5 ? 99.0 : world->rank();
  world->all_reduce_host(&m, 1, ReduceOp::Max);
  EXPECT_EQ(m, 99.0);
}

TEST_F(Comm, AllGatherF32Bf16I32) {
  const int n = 3, r = world->rank();
  Tensor in = host_tensor(n), out = host_tensor(8 * n);
  for (int i = 0; i < n; ++i) in.f32()[i] = 100.0f * r + i;
  world->all_gather(in, out);
  for (int q = 0; q < 8; ++q)
    for (int i = 0; i < n; ++i) EXPECT_EQ(out.f32()[q * n + i], 100.0f * q + i);

  Tensor hin = host_tensor(n, DType::BF16), hout = host_tensor(8 * n, DType::BF16);
  for (int i = 0; i < n; ++i) hin.data<uint16_t>()[i] = static_cast<uint16_t>(0x3f80 + 16 * r + i);
  world->all_gather(hin, hout);
  for (int q = 0; q < 8; ++q)
    for (int i = 0; i < n; ++i) EXPECT_EQ(hout.data<uint16_t>()[q * n + i], 0x3f80 + 16 * q + i);

  Tensor iin = host_tensor(1, DType::I32), iout = host_tensor(8, DType::I32);
  iin.i32()[0] = -r;
  world->all_gather(iin, iout);
  for (int q = 0; q < 8; ++q) EXPECT_EQ(iout.i32()[q], -q);
}

TEST_F(Comm, AllGatherInPlace) {
  // `in` is this rank's own block of `out`, as when a distributed optimizer gathers updated shards.
  const int n = 4, r = world->rank();
  Tensor out = host_tensor(8 * n);
  Tensor mine = out.slice_elems(r * n, {n});
  for (int i = 0; i < n; ++i) mine.f32()[i] = r * n + i;
  world->all_gather(mine, out);
  for (int i = 0; i < 8 * n; ++i) EXPECT_EQ(out.f32()[i], float(i));
}

TEST_F(Comm, ReduceScatterAndRoundTrip) {
  const int n = 6, r = world->rank();
  Tensor in = host_tensor(8 * n), out = host_tensor(n);
  for (int j = 0; j < 8 * n; ++j) in.f32()[j] = r + j;
  world->reduce_scatter(in, out);
  // Block r of the sum over ranks: sum_q (q + r*n + k) = 28 + 8 (r*n + k).
  for (int k = 0; k < n; ++k) EXPECT_EQ(out.f32()[k], 28.0f + 8 * (r * n + k));

  // reduce_scatter then all_gather equals all_reduce.
  Tensor gathered = host_tensor(8 * n), reduced = host_tensor(8 * n);
  world->all_gather(out, gathered);
  std::memcpy(reduced.raw(), in.raw(), in.bytes());
  world->all_reduce(reduced);
  for (int j = 0; j < 8 * n; ++j) EXPECT_EQ(gathered.f32()[j], reduced.f32()[j]);
}

TEST_F(Comm, ReduceScatterIntoOwnBlock) {
  const int n = 4, r = world->rank();
  Tensor buf = host_tensor(8 * n);
  for (int j = 0; j < 8 * n; ++j) buf.f32()[j] = 1.0f + r;
  Tensor shard = buf.slice_elems(r * n, {n});
  world->reduce_scatter(buf, shard);
  for (int k = 0; k < n; ++k) EXPECT_EQ(shard.f32()[k], 36.0f);  // sum of 1..8
}

// A 16-bit value for (rank, index), of either sign, with magnitude in [1/8, 2]: its last bit is worth at
// least 2^-13, so any sum of eight of them is exact in fp32 whatever the order, and the only rounding a
// correct reduction makes is the final one back to 16 bits.
uint16_t half_value(DType dtype, int rank, int64_t i) {
  uint32_t h = static_cast<uint32_t>(rank * 1000003 + i) * 2654435761u;
  h ^= h >> 15;
  const float mag = 0.125f + 1.875f * float(h & 0xffffff) / float(1 << 24);
  const float f = (h >> 31) ? -mag : mag;
  return dtype == DType::BF16 ? fp32_to_bf16(f) : fp32_to_fp16(f);
}
float half_to_float(DType dtype, uint16_t h) { return dtype == DType::BF16 ? bf16_to_fp32(h) : fp16_to_fp32(h); }
uint16_t float_to_half(DType dtype, float f) { return dtype == DType::BF16 ? fp32_to_bf16(f) : fp32_to_fp16(f); }

// What every rank's (rank, index) values reduce to: the exact result rounded once to nearest even.
uint16_t expected_half(DType dtype, int64_t i, ReduceOp op) {
  double acc = half_to_float(dtype, half_value(dtype, 0, i));
  for (int q = 1; q < 8; ++q) {
    const double v = half_to_float(dtype, half_value(dtype, q, i));
    acc = op == ReduceOp::Sum ? acc + v : op == ReduceOp::Max ? std::max(acc, v) : std::min(acc, v);
  }
  return float_to_half(dtype, static_cast<float>(acc));
}

TEST_F(Comm, AllReduce16BitIsTheExactResultRoundedOnce) {
  const int r = world->rank();
  for (DType dtype : {DType::BF16, DType::F16}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
      // Sums over 2^21 elements, so the reduction runs as several pieces with a ragged last one.
      const int64_t n = op == ReduceOp::Sum ? (int64_t(1) << 21) + 777 : 4096;
      Tensor t = host_tensor(n, dtype);
      for (int64_t i = 0; i < n; ++i) t.data<uint16_t>()[i] = half_value(dtype, r, i);
      world->all_reduce(t, op);
      int64_t wrong = 0, first = -1;
      for (int64_t i = 0; i < n; ++i)
        if (t.data<uint16_t>()[i] != expected_half(dtype, i, op)) wrong += 1, first = first < 0 ? i : first;
      EXPECT_EQ(wrong, 0) << dtype_name(dtype) << " op " << int(op) << ", first at " << first;
    }
  }
}

TEST_F(Comm, ReduceScatter16BitIsTheExactSumRoundedOnce) {
  // Blocks of over 2^18 elements: 8 of them run as two reduction pieces, the second ragged.
  const int64_t n = (int64_t(1) << 18) + 333;
  const int r = world->rank();
  for (DType dtype : {DType::BF16, DType::F16}) {
    Tensor in = host_tensor(8 * n, dtype), out = host_tensor(n, dtype);
    for (int64_t j = 0; j < 8 * n; ++j) in.data<uint16_t>()[j] = half_value(dtype, r, j);
    world->reduce_scatter(in, out);
    for (int64_t k = 0; k < n; ++k)
      ASSERT_EQ(out.data<uint16_t>()[k], expected_half(dtype, r * n + k, ReduceOp::Sum)) << dtype_name(dtype) << k;

    // Gathering the scattered sums gives what all_reduce gives, bit for bit.
    Tensor gathered = host_tensor(8 * n, dtype), reduced = host_tensor(8 * n, dtype);
    world->all_gather(out, gathered);
    std::memcpy(reduced.raw(), in.raw(), in.bytes());
    world->all_reduce(reduced);
    EXPECT_EQ(std::memcmp(gathered.raw(), reduced.raw(), reduced.bytes()), 0) << dtype_name(dtype);

    // Into this rank's own block of the input, as the distributed optimizer does.
    Tensor shard = in.slice_elems(r * n, {n});
    world->reduce_scatter(in, shard);
    EXPECT_EQ(std::memcmp(shard.raw(), out.raw(), out.bytes()), 0) << dtype_name(dtype);
  }
}

TEST_F(Comm, CollectivesSplitIntoPiecesGiveTheWholeResult) {
  // Large enough that every reduction and gather runs as several calls of at most 8 MiB, with a ragged
  // last piece: each element's sum is checked, so a piece placed at the wrong offset shows.
  const int64_t n = (int64_t(3) << 20) / 8 + 12345;  // per-rank block; 8 blocks are ~12.4 MiB of fp32
  const int r = world->rank();
  Tensor in = host_tensor(8 * n), out = host_tensor(n);
  for (int64_t j = 0; j < 8 * n; ++j) in.f32()[j] = float(r + (j % 1000));
  world->reduce_scatter(in, out);
  for (int64_t k = 0; k < n; ++k) ASSERT_EQ(out.f32()[k], 28.0f + 8 * ((r * n + k) % 1000)) << k;

  Tensor gathered = host_tensor(8 * n);
  world->all_gather(out, gathered);
  for (int64_t j = 0; j < 8 * n; ++j) ASSERT_EQ(gathered.f32()[j], 28.0f + 8 * (j % 1000)) << j;

  Tensor reduced = host_tensor(8 * n);
  std::memcpy(reduced.raw(), in.raw(), in.bytes());
  world->all_reduce(reduced);
  for (int64_t j = 0; j < 8 * n; ++j) ASSERT_EQ(reduced.f32()[j], 28.0f + 8 * (j % 1000)) << j;

  // In place: a shard reduced into this rank's block of the buffer, then gathered back over it.
  Tensor buf = host_tensor(8 * n);
  std::memcpy(buf.raw(), in.raw(), in.bytes());
  Tensor shard = buf.slice_elems(r * n, {n});
  world->reduce_scatter(buf, shard);
  for (int64_t k = 0; k < n; ++k) ASSERT_EQ(shard.f32()[k], 28.0f + 8 * ((r * n + k) % 1000)) << k;
  world->all_gather(shard, buf);
  for (int64_t j = 0; j < 8 * n; ++j) ASSERT_EQ(buf.f32()[j], 28.0f + 8 * (j % 1000)) << j;

  // 16-bit elements move as raw words, split the same way.
  const int64_t h = 2 * n;  // twice as many 2-byte elements to span the same number of pieces
  Tensor hin = host_tensor(h, DType::BF16), hout = host_tensor(8 * h, DType::BF16);
  for (int64_t i = 0; i < h; ++i) hin.data<uint16_t>()[i] = static_cast<uint16_t>(r * 4096 + i % 4096);
  world->all_gather(hin, hout);
  for (int64_t j = 0; j < 8 * h; ++j)
    ASSERT_EQ(hout.data<uint16_t>()[j], static_cast<uint16_t>((j / h) * 4096 + (j % h) % 4096)) << j;
}

TEST_F(Comm, BroadcastFromEveryRoot) {
  for (int root = 0; root < 8; ++root) {
    Tensor t = host_tensor(4), h = host_tensor(3, DType::F16);
    for (int i = 0; i < 4; ++i) t.f32()[i] = world->rank() == root ? 1000.0f * root + i : -1.0f;
    for (int i = 0; i < 3; ++i) h.data<uint16_t>()[i] = world->rank() == root ? 0x1000 * root + i : 0;
    world->broadcast(t, root);
    world->broadcast(h, root);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(t.f32()[i], 1000.0f * root + i);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(h.data<uint16_t>()[i], 0x1000 * root + i);
  }
}

TEST_F(Comm, SendRecvRing) {
  // Large enough to leave the eager protocol: a blocking send then blocks until the receive is posted.
  const int n = 1 << 18, r = world->rank(), next = (r + 1) % 8, prev = (r + 7) % 8;
  Tensor out = host_tensor(n), in = host_tensor(n);
  for (int i = 0; i < n; ++i) out.f32()[i] = r * 1e6f + i;
  if (r % 2 == 0) {
    world->send(out, next, 7);
    world->recv(in, prev, 7);
  } else {
    world->recv(in, prev, 7);
    world->send(out, next, 7);
  }
  EXPECT_EQ(in.f32()[0], prev * 1e6f);
  EXPECT_EQ(in.f32()[n - 1], prev * 1e6f + (n - 1));
}

TEST_F(Comm, BatchedExchangeBothDirectionsAtOnce) {
  // Every rank sends to and receives from both neighbours in one batch, with rendezvous-sized messages; a
  // sequence of blocking calls in this order would deadlock.
  const int n = 1 << 18, r = world->rank(), next = (r + 1) % 8, prev = (r + 7) % 8;
  Tensor to_next = host_tensor(n), to_prev = host_tensor(n), from_next = host_tensor(n), from_prev = host_tensor(n);
  for (int i = 0; i < n; ++i) to_next.f32()[i] = r + 0.5f, to_prev.f32()[i] = -r - 0.25f;
  world->exchange({P2POp::send(to_next, next, 1), P2POp::send(to_prev, prev, 2), P2POp::recv(from_prev, prev, 1),
                   P2POp::recv(from_next, next, 2)});
  EXPECT_EQ(from_prev.f32()[n - 1], prev + 0.5f);
  EXPECT_EQ(from_next.f32()[0], -next - 0.25f);

  // The same through the backend-independent entry point, including a transfer with this rank itself.
  Tensor self_out = host_tensor(2), self_in = host_tensor(2);
  self_out.f32()[0] = r, self_out.f32()[1] = 2 * r;
  exchange(*world, {P2POp::send(to_next, next, 3), P2POp::recv(from_prev, prev, 3), P2POp::send(self_out, r, 4),
                    P2POp::recv(self_in, r, 4)});
  EXPECT_EQ(from_prev.f32()[0], prev + 0.5f);
  EXPECT_EQ(self_in.f32()[1], 2.0f * r);
}

TEST_F(Comm, NonBlockingSendRecv) {
  const int n = 1 << 17, r = world->rank(), partner = r ^ 1;
  Tensor out = host_tensor(n), in = host_tensor(n, DType::F32);
  for (int i = 0; i < n; ++i) out.f32()[i] = r * 3.0f + (i % 7);
  std::vector<MpiRequest> reqs;
  reqs.push_back(world->isend(out, partner, 11));  // both partners send first: fine when non-blocking
  reqs.push_back(world->irecv(in, partner, 11));
  EXPECT_TRUE(reqs[0].pending());
  world->wait_all(reqs);
  EXPECT_FALSE(reqs[0].pending());
  for (int i : {0, 1, 6, n - 1}) EXPECT_EQ(in.f32()[i], partner * 3.0f + (i % 7));

  Tensor small = host_tensor(1);
  small.f32()[0] = r;
  MpiRequest s = world->isend(small, partner, 12);
  Tensor got = host_tensor(1);
  MpiRequest q = world->irecv(got, partner, 12);
  world->wait(q);
  world->wait(s);
  EXPECT_EQ(got.f32()[0], float(partner));
}

TEST_F(Comm, CountsBytesAndTime) {
  int64_t before = world->bytes_moved();
  Tensor t = host_tensor(100);
  std::fill(t.f32(), t.f32() + 100, 1.0f);
  world->all_reduce(t);
  Tensor out = host_tensor(800);
  world->all_gather(t, out);
  EXPECT_EQ(world->bytes_moved() - before, 800);
  EXPECT_GT(world->seconds_spent(), 0.0);
}

TEST_F(Comm, ArgumentErrors) {
  Tensor h = host_tensor(8, DType::I32), f = host_tensor(8), small = host_tensor(3);
  Tensor h64 = host_tensor(64, DType::BF16);
  EXPECT_THROW(world->all_reduce(h), std::invalid_argument);
  EXPECT_THROW(world->reduce_scatter(h, h), std::invalid_argument);
  EXPECT_THROW(world->reduce_scatter(h64, f), std::invalid_argument);  // dtypes differ
  EXPECT_THROW(world->all_gather(f, small), std::invalid_argument);
  EXPECT_THROW(world->reduce_scatter(small, f), std::invalid_argument);
  EXPECT_THROW(world->broadcast(f, 8), std::invalid_argument);
  EXPECT_THROW(world->send(f, 8, 0), std::invalid_argument);
  EXPECT_THROW(world->send(f, world->rank(), 0), std::invalid_argument);
  EXPECT_THROW(world->send(f, (world->rank() + 1) % 8, -1), std::invalid_argument);
  Tensor undefined;
  EXPECT_THROW(world->all_reduce(undefined), std::invalid_argument);
  try {
    world->all_reduce(h);
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("reductions need float tensors (fp32, bf16, fp16), got int32"), std::string::npos)
        << message;
  }
}

TEST_F(Comm, MpiErrorsBecomeExceptions) {
  // Rank pairs (0,1), (2,3), ...: the even rank sends 16 floats; the odd rank receives into 4 (MPI reports a
  // truncation) and then a 32-float buffer for a second 16-float message (our size check reports it).
  auto tp = MpiCommunicator::split(MPI_COMM_WORLD, world->rank() / 2, world->rank(), "tp");
  ASSERT_EQ(tp->size(), 2);
  Tensor big = host_tensor(16), tiny = host_tensor(4), roomy = host_tensor(32);
  std::string truncation, short_message;
  if (tp->rank() == 0) {
    tp->send(big, 1, 5);
    tp->send(big, 1, 6);
  } else {
    try {
      tp->recv(tiny, 0, 5);
    } catch (const std::runtime_error& e) {
      truncation = e.what();
    }
    try {
      tp->recv(roomy, 0, 6);
    } catch (const std::runtime_error& e) {
      short_message = e.what();
    }
  }
  if (tp->rank() == 1) {
    EXPECT_NE(truncation.find("MPI_Irecv (recv from rank 0 tag 5) failed on group 'tp' (rank 1 of 2, world rank " +
                              std::to_string(world->rank()) + ")"),
              std::string::npos)
        << truncation;
    EXPECT_NE(truncation.find("truncat"), std::string::npos) << truncation;  // MPI's own text
    EXPECT_NE(short_message.find("recv from rank 0 tag 6 got 64 bytes, expected 128"), std::string::npos)
        << short_message;
  }
  // The communicator still works afterwards.
  Tensor one = host_tensor(1);
  one.f32()[0] = 1;
  tp->all_reduce(one);
  EXPECT_EQ(one.f32()[0], 2.0f);
}

TEST_F(Comm, SplitWithNegativeColorGivesNoGroup) {
  auto evens = MpiCommunicator::split(MPI_COMM_WORLD, world->rank() % 2 == 0 ? 0 : -1, world->rank(), "evens");
  if (world->rank() % 2 == 0) {
    ASSERT_NE(evens, nullptr);
    EXPECT_EQ(evens->size(), 4);
    EXPECT_EQ(evens->rank(), world->rank() / 2);
  } else {
    EXPECT_EQ(evens, nullptr);
  }
}

// ---- process groups ----

// Global ranks of a group's members in group-rank order, learned through the group itself.
std::vector<int> members_via_gather(Communicator& c) {
  Tensor in = host_tensor(1, DType::I32), out = host_tensor(c.size(), DType::I32);
  in.i32()[0] = world_rank();
  c.all_gather(in, out);
  return std::vector<int>(out.i32(), out.i32() + c.size());
}

float sum_of(const std::vector<int>& v) { return static_cast<float>(std::accumulate(v.begin(), v.end(), 0)); }

class Groups : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(Groups, MembershipAndSumsFollowTheFormula) {
  auto [tp, pp, dp_arg] = GetParam();
  GridLayout layout(8, tp, pp, dp_arg);  // dp_arg 0: derived
  const int dp = layout.dp();
  ParallelState s = mpi_parallel_state(layout);
  int r = world_rank();
  EXPECT_EQ(s.rank, r);
  // The coordinates satisfy rank = tp + TP * (dp + DP * pp).
  EXPECT_EQ(s.tp_rank() + tp * (s.dp_rank() + dp * s.pp_rank()), r);
  EXPECT_EQ(s.world->size(), 8);
  EXPECT_EQ(s.tp->size(), tp);
  EXPECT_EQ(s.pp->size(), pp);
  EXPECT_EQ(s.dp->size(), dp);
  EXPECT_EQ(s.model_parallel->size(), tp * pp);
  EXPECT_EQ(s.tp->rank(), s.tp_rank());
  EXPECT_EQ(s.dp->rank(), s.dp_rank());
  EXPECT_EQ(s.pp->rank(), s.pp_rank());

  // Expected members straight from the formula.
  std::vector<int> tp_members, dp_members, pp_members, mp_members, emb_members;
  for (int t = 0; t < tp; ++t) tp_members.push_back(t + tp * (s.dp_rank() + dp * s.pp_rank()));
  for (int d = 0; d < dp; ++d) dp_members.push_back(s.tp_rank() + tp * (d + dp * s.pp_rank()));
  for (int p = 0; p < pp; ++p) pp_members.push_back(s.tp_rank() + tp * (s.dp_rank() + dp * p));
  for (int p = 0; p < pp; ++p)
    for (int t = 0; t < tp; ++t) mp_members.push_back(t + tp * (s.dp_rank() + dp * p));
  emb_members = pp == 1 ? std::vector<int>{r} : std::vector<int>{pp_members.front(), pp_members.back()};

  struct Case {
    Communicator* comm;
    std::vector<int> members;
  };
  std::vector<Case> cases = {{s.tp.get(), tp_members}, {s.dp.get(), dp_members}, {s.pp.get(), pp_members},
                             {s.model_parallel.get(), mp_members}, {s.world.get(), {0, 1, 2, 3, 4, 5, 6, 7}}};
  bool in_embedding = s.is_first_stage() || s.is_last_stage();
  EXPECT_EQ(s.embedding != nullptr, in_embedding);
  if (s.embedding) cases.push_back({s.embedding.get(), emb_members});

  // Every rank runs the collectives of its groups in the same order (embedding last), so they line up.
  for (auto& c : cases) {
    EXPECT_EQ(members_via_gather(*c.comm), c.members) << c.comm->name();
    Tensor t = host_tensor(2);
    t.f32()[0] = r;
    t.f32()[1] = 1;
    c.comm->all_reduce(t);
    EXPECT_EQ(t.f32()[0], sum_of(c.members)) << c.comm->name();
    EXPECT_EQ(t.f32()[1], float(c.members.size())) << c.comm->name();
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Groups,
                         ::testing::Values(std::tuple{2, 2, 2}, std::tuple{2, 1, 4}, std::tuple{1, 4, 2},
                                           std::tuple{8, 1, 1}, std::tuple{1, 8, 1}, std::tuple{4, 2, 0}));

TEST(GridStartup, MismatchedLayoutFailsIdenticallyOnAllRanks) {
  std::string message;
  try {
    GridLayout layout(world_size(), 3, 1, 3);
    mpi_parallel_state(layout);
  } catch (const GridError& e) {
    message = e.what();
  }
  EXPECT_EQ(message, "world size 8 does not equal tensor (3) x pipeline (1) x data (3) = 9");
  for (const auto& m : gather_strings(message)) EXPECT_EQ(m, message);

  // A valid layout for the wrong number of launched ranks: also the same error everywhere, and no hang.
  std::string launched;
  try {
    mpi_parallel_state(GridLayout(4, 2, 2, 1));
  } catch (const GridError& e) {
    launched = e.what();
  }
  EXPECT_EQ(launched, "the process grid needs 4 ranks (world 4 = tensor 2 x pipeline 2 x data 1) but 8 were launched");
  for (const auto& m : gather_strings(launched)) EXPECT_EQ(m, launched);
}

TEST(GridStartup, GroupsInsideAParentCommunicator) {
  // Two independent grids of four ranks, one per half of the world.
  auto half = MpiCommunicator::split(MPI_COMM_WORLD, world_rank() / 4, world_rank(), "half");
  ParallelState s = mpi_parallel_state(GridLayout(4, 2, 2, 1), *half);
  EXPECT_EQ(s.rank, world_rank() % 4);
  EXPECT_EQ(s.dp->size(), 1);
  EXPECT_EQ(s.dp->name(), "dp");
  Tensor t = host_tensor(1);
  t.f32()[0] = world_rank();
  s.pp->all_reduce(t);
  int base = world_rank() - world_rank() % 4;
  EXPECT_EQ(t.f32()[0], float(2 * base + 2 * (world_rank() % 2) + 2));  // e.g. ranks 0 + 2, 1 + 3, 4 + 6
}

// ---- launch environment under mpirun ----

TEST(Launch, DiscoversOpenMpiAndAgreesWithMpi) {
  LaunchEnv env = discover_launch_env();
  EXPECT_EQ(env.launcher, Launcher::OpenMPI);
  EXPECT_EQ(env.rank, world_rank());
  EXPECT_EQ(env.world_size, 8);
  LaunchInfo info = reconcile_with_mpi(env);
  ASSERT_EQ(info.hosts.size(), 8u);
  for (const auto& h : info.hosts) EXPECT_EQ(h, local_hostname());
  EXPECT_EQ(info.env.local_size, 8);
  EXPECT_EQ(info.env.local_rank, world_rank());
  EXPECT_EQ(info.env.node_rank, 0);
  std::string d = describe_layout(GridLayout(8, 2, 2, 2), info.hosts);
  EXPECT_NE(d.find("on 1 host(s)"), std::string::npos) << d;
}

TEST(Launch, UnknownLauncherTakesMpiValues) {
  LaunchEnv none;  // as if started by a launcher we do not recognise
  none.host = "h" + std::to_string(world_rank() / 3);
  LaunchInfo info = reconcile_with_mpi(none);
  EXPECT_EQ(info.env.rank, world_rank());
  EXPECT_EQ(info.env.world_size, 8);
  EXPECT_EQ(info.env.local_rank, world_rank() % 3);
  EXPECT_EQ(info.env.local_size, world_rank() < 6 ? 3 : 2);
  EXPECT_EQ(info.env.node_rank, world_rank() / 3);
  auto warnings = layout_warnings(GridLayout(8, 4, 1, 2), info.hosts);
  EXPECT_EQ(warnings.size(), 1u);
}

TEST(Launch, DisagreementThrowsTheSameErrorOnAllRanks) {
  LaunchEnv env = discover_launch_env();
  if (world_rank() == 3) env.rank = 5;  // as if rank 3 had inherited another launcher's variables
  std::string message;
  try {
    reconcile_with_mpi(env);
  } catch (const LaunchError& e) {
    message = e.what();
  }
  EXPECT_EQ(message.rfind("rank 3: the launcher (OpenMPI: OMPI_COMM_WORLD_RANK=3", 0), 0u) << message;
  EXPECT_NE(message.find("says rank 5 of 8 but MPI says rank 3 of 8"), std::string::npos) << message;
  for (const auto& m : gather_strings(message)) EXPECT_EQ(m, message);
}

}  // namespace
}  // namespace gpt
