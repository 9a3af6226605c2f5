// Tests for the pipeline schedule tables (parallel/pipeline/pipeline_schedule.h): argument and layout validation
// messages, hand-checked golden tables, and for every p <= 8, v <= 4, m <= 32 the structural properties
// the executor relies on (each pass once, backward after forward, Megatron's warmup counts and pass order
// rebuilt independently from Megatron-Core's schedule-table construction, send/recv pairing and FIFO order,
// deadlock freedom by a topological sort over the transfer graph) and the simulated bubble against the
// (p - 1) / (v m) formula.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <map>
#include <queue>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/pipeline/pipeline_schedule.h"

namespace gpt {
namespace {

constexpr int kMaxP = 8, kMaxV = 4, kMaxM = 32;

// Expects `fn` to throw std::invalid_argument whose message contains `fragment`.
template <class Fn>
void expect_invalid(Fn fn, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "expected std::invalid_argument containing '" << fragment << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message '" << e.what() << "' lacks '" << fragment << "'";
  }
}

bool valid_combo(int p, int v, int m) { return v == 1 || (p > 1 && m % p == 0); }

std::string joined(const PipelineSchedule& s) {
  std::string out;
  for (const auto& a : s.actions) {
    if (!out.empty()) out += ' ';
    out += format_action(a);
  }
  return out;
}

// Megatron's warmup rule, written out from its source independently of the library.
int megatron_warmup(int p, int v, int m, int rank) {
  if (v == 1) return std::min(p - rank - 1, m);
  int w = (p - rank - 1) * 2 + (v - 1) * p;
  return w >= m * v ? m * v : w;
}

// Megatron-Core's get_schedule_table with microbatch_group_size_per_vp_stage = p: (microbatch, chunk) of
// each forward, in order; backwards use the same table with the chunk mirrored.
std::vector<std::pair<int, int>> megatron_schedule_table(int p, int v, int m) {
  std::vector<std::pair<int, int>> table;
  for (int first = 0; first < m; first += p) {
    int end = std::min(first + p, m);
    for (int c = 0; c < v; ++c)
      for (int mb = first; mb < end; ++mb) table.emplace_back(mb, c);
  }
  return table;
}

TEST(ScheduleValidation, RejectsBadArgumentsNamingTheRule) {
  expect_invalid([] { schedule(0, 1, 4, 0); }, "pipeline size (0) must be at least 1");
  expect_invalid([] { schedule(2, 0, 4, 0); }, "virtual pipeline size (0) must be at least 1");
  expect_invalid([] { schedule(2, 1, 0, 0); }, "number of microbatches (0) must be at least 1");
  expect_invalid([] { schedule(2, 1, 4, 2); }, "pipeline rank (2) must lie in [0, pipeline size (2))");
  expect_invalid([] { schedule(2, 1, 4, -1); }, "pipeline rank (-1)");
  expect_invalid([] { schedule(1, 2, 4, 0); }, "interleaved schedule (virtual pipeline size 2) needs pipeline size > 1");
  expect_invalid([] { schedule(4, 2, 6, 0); },
                 "interleaved schedule needs microbatches (6) divisible by pipeline size (4)");
  expect_invalid([] { schedule_all_ranks(3, 3, 4); },
                 "interleaved schedule needs microbatches (4) divisible by pipeline size (3)");
  expect_invalid([] { simulate(4, 2, 6); }, "divisible by pipeline size (4)");
  expect_invalid([] { format_schedule(4, 2, 6); }, "divisible by pipeline size (4)");
  // Plain 1F1B accepts any microbatch count, including fewer microbatches than stages.
  EXPECT_NO_THROW(schedule(4, 1, 3, 0));
}

TEST(ScheduleValidation, LayerLayout) {
  EXPECT_NO_THROW(validate_pipeline_layout(8, 2, 2));
  EXPECT_NO_THROW(validate_pipeline_layout(12, 3, 1));
  expect_invalid([] { validate_pipeline_layout(12, 4, 2); },
                 "number of layers (12) must be divisible by pipeline size * virtual pipeline size (4 * 2 = 8)");
  expect_invalid([] { validate_pipeline_layout(0, 1, 1); }, "number of layers (0) must be at least 1");
  expect_invalid([] { validate_pipeline_layout(4, 0, 1); }, "pipeline size (0)");
  expect_invalid([] { validate_pipeline_layout(4, 1, 0); }, "virtual pipeline size (0)");
  expect_invalid([] { chunk_layer_range(12, 4, 2, 0, 0); }, "divisible by pipeline size * virtual pipeline size");
  expect_invalid([] { chunk_layer_range(8, 2, 2, 2, 0); }, "pipeline rank (2)");
  expect_invalid([] { chunk_layer_range(8, 2, 2, 0, 2); }, "model chunk (2) must lie in [0, virtual pipeline size (2))");
}

TEST(ScheduleLayout, ChunkLayerRangesGolden) {
  // 8 layers, p = 2, v = 2: virtual stages 0..3 hold two layers each, stage = chunk * p + rank.
  EXPECT_EQ(chunk_layer_range(8, 2, 2, 0, 0), std::make_pair(0, 2));
  EXPECT_EQ(chunk_layer_range(8, 2, 2, 1, 0), std::make_pair(2, 4));
  EXPECT_EQ(chunk_layer_range(8, 2, 2, 0, 1), std::make_pair(4, 6));
  EXPECT_EQ(chunk_layer_range(8, 2, 2, 1, 1), std::make_pair(6, 8));
  EXPECT_EQ(chunk_layer_range(6, 3, 1, 2, 0), std::make_pair(4, 6));
}

TEST(ScheduleLayout, ChunkRangesTileTheModelInVirtualStageOrder) {
  for (int p = 1; p <= kMaxP; ++p)
    for (int v = 1; v <= kMaxV; ++v)
      for (int per = 1; per <= 3; ++per) {
        const int layers = p * v * per;
        int expected_first = 0;
        for (int stage = 0; stage < p * v; ++stage) {
          const int r = stage % p, c = stage / p;
          auto [first, last] = chunk_layer_range(layers, p, v, r, c);
          EXPECT_EQ(first, expected_first);
          EXPECT_EQ(last - first, per);
          // Megatron's offset: chunk * (L / v) + rank * (L / v / p).
          EXPECT_EQ(first, c * (layers / v) + r * (layers / v / p));
          expected_first = last;
        }
        EXPECT_EQ(expected_first, layers);
      }
}

TEST(ScheduleLayout, VirtualStageNeighbours) {
  EXPECT_EQ(next_virtual_stage(4, 2, 3, 0), (PeerEndpoint{0, 1, 4}));
  EXPECT_EQ(next_virtual_stage(4, 2, 1, 1), (PeerEndpoint{2, 1, 6}));
  EXPECT_EQ(next_virtual_stage(4, 2, 3, 1), std::nullopt);
  EXPECT_EQ(previous_virtual_stage(4, 2, 0, 1), (PeerEndpoint{3, 0, 3}));
  EXPECT_EQ(previous_virtual_stage(4, 2, 0, 0), std::nullopt);
  EXPECT_EQ(next_virtual_stage(1, 1, 0, 0), std::nullopt);
}

TEST(ScheduleGolden, Plain1F1BTwoStagesFourMicrobatches) {
  auto r0 = schedule(2, 1, 4, 0), r1 = schedule(2, 1, 4, 1);
  EXPECT_EQ(joined(r0), "F0.0 F1.0 B0.0 F2.0 B1.0 F3.0 B2.0 B3.0");
  EXPECT_EQ(joined(r1), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0");
  EXPECT_EQ(r0.num_warmup, 1);
  EXPECT_EQ(r1.num_warmup, 0);
  // Rank 0 forwards send to rank 1 and backwards receive from it; rank 1 is the last stage.
  const PipelineAction& f0 = r0.actions[0];
  EXPECT_EQ(f0.recv, std::nullopt);
  EXPECT_EQ(f0.send, (PeerEndpoint{1, 0, 1}));
  const PipelineAction& b0 = r0.actions[2];
  EXPECT_EQ(b0.recv, (PeerEndpoint{1, 0, 1}));
  EXPECT_EQ(b0.send, std::nullopt);
  EXPECT_EQ(r1.actions[0].recv, (PeerEndpoint{0, 0, 0}));
  EXPECT_EQ(r1.actions[0].send, std::nullopt);
  EXPECT_EQ(r1.actions[1].recv, std::nullopt);
  EXPECT_EQ(r1.actions[1].send, (PeerEndpoint{0, 0, 0}));

  const std::string expected =
      "1F1B schedule: p=2 v=1 m=4 (pass microbatch.chunk; virtual stage = chunk * p + rank)\n"
      "rank 0: F0.0 F1.0 B0.0 F2.0 B1.0 F3.0 B2.0 B3.0\n"
      "rank 1: F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0\n"
      "warmup forwards per rank: 1 0\n"
      "bubble (idle / compute): theory (p-1)/(v*m) = 1/4 = 0.25, simulated 0.25 (F=1, B=2 time units per "
      "chunk; makespan 15, compute 12 per rank, idle 3 on every rank)\n";
  EXPECT_EQ(format_schedule(2, 1, 4), expected);
}

TEST(ScheduleGolden, InterleavedTwoStagesTwoChunksFourMicrobatches) {
  // Forward k runs microbatch (k / 4) * 2 + k % 2 on chunk (k / 2) % 2; backward mirrors the chunk.
  // Rank 0 warms up with 2 * 1 + 1 * 2 = 4 forwards, rank 1 with 0 + 2 = 2.
  auto r0 = schedule(2, 2, 4, 0), r1 = schedule(2, 2, 4, 1);
  EXPECT_EQ(joined(r0), "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(joined(r1), "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(r0.num_warmup, 4);
  EXPECT_EQ(r1.num_warmup, 2);
  // Rank 0 chunk 1 (virtual stage 2) receives from rank 1 chunk 0 and sends to rank 1 chunk 1.
  const PipelineAction& f01 = r0.actions[2];
  EXPECT_EQ(f01.virtual_stage, 2);
  EXPECT_EQ(f01.recv, (PeerEndpoint{1, 0, 1}));
  EXPECT_EQ(f01.send, (PeerEndpoint{1, 1, 3}));
  // Rank 1 chunk 1 is the last virtual stage: its forward ends in the loss, its backward starts there.
  const PipelineAction& f11 = r1.actions[2];
  EXPECT_EQ(f11.virtual_stage, 3);
  EXPECT_EQ(f11.recv, (PeerEndpoint{0, 1, 2}));
  EXPECT_EQ(f11.send, std::nullopt);
  const PipelineAction& b11 = r1.actions[3];
  EXPECT_EQ(b11.recv, std::nullopt);
  EXPECT_EQ(b11.send, (PeerEndpoint{0, 1, 2}));
  // Rank 1 chunk 0 sends its activation to rank 0 chunk 1.
  EXPECT_EQ(r1.actions[0].send, (PeerEndpoint{0, 1, 2}));

  const std::string text = format_schedule(2, 2, 4);
  EXPECT_NE(text.find("interleaved 1F1B schedule: p=2 v=2 m=4"), std::string::npos) << text;
  EXPECT_NE(text.find("theory (p-1)/(v*m) = 1/8 = 0.125, simulated 0.125"), std::string::npos) << text;
  EXPECT_NE(text.find("makespan 27, compute 24 per rank, idle 3 on every rank"), std::string::npos) << text;
}

TEST(ScheduleGolden, SingleStageIsForwardBackwardLoop) {
  EXPECT_EQ(joined(schedule(1, 1, 3, 0)), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0");
  for (const auto& a : schedule(1, 1, 3, 0).actions) {
    EXPECT_EQ(a.recv, std::nullopt);
    EXPECT_EQ(a.send, std::nullopt);
  }
  SimResult sim = simulate(1, 1, 3);
  ASSERT_TRUE(sim.completed);
  EXPECT_EQ(sim.idle[0], 0);
}

// Per-rank properties: each pass once, F before B, Megatron's warmup, phase structure and pass order.
void check_rank_table(int p, int v, int m, const PipelineSchedule& s) {
  SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m) +
               " rank=" + std::to_string(s.rank));
  const int total = m * v;
  ASSERT_EQ(int(s.actions.size()), 2 * total);
  EXPECT_EQ(s.pipeline_size, p);
  EXPECT_EQ(s.virtual_size, v);
  EXPECT_EQ(s.num_microbatches, m);

  std::map<std::tuple<PassKind, int, int>, int> position;
  for (int i = 0; i < int(s.actions.size()); ++i) {
    const PipelineAction& a = s.actions[i];
    ASSERT_GE(a.chunk, 0);
    ASSERT_LT(a.chunk, v);
    ASSERT_GE(a.microbatch, 0);
    ASSERT_LT(a.microbatch, m);
    EXPECT_EQ(a.virtual_stage, a.chunk * p + s.rank);
    EXPECT_TRUE(position.emplace(std::make_tuple(a.kind, a.microbatch, a.chunk), i).second)
        << format_action(a) << " appears twice";
  }
  ASSERT_EQ(int(position.size()), 2 * total);  // with the range checks: every pass exactly once
  for (int mb = 0; mb < m; ++mb)
    for (int c = 0; c < v; ++c)
      EXPECT_LT(position.at({PassKind::Forward, mb, c}), position.at({PassKind::Backward, mb, c}));

  // Warmup forwards, then strictly alternating F, B, then only backwards.
  const int w = megatron_warmup(p, v, m, s.rank);
  EXPECT_EQ(s.num_warmup, w);
  EXPECT_EQ(num_warmup_passes(p, v, m, s.rank), w);
  for (int i = 0; i < 2 * total; ++i) {
    PassKind expected;
    if (i < w)
      expected = PassKind::Forward;
    else if (i < w + 2 * (total - w))
      expected = (i - w) % 2 == 0 ? PassKind::Forward : PassKind::Backward;
    else
      expected = PassKind::Backward;
    EXPECT_EQ(s.actions[i].kind, expected) << "position " << i;
  }

  // The k-th forward / backward matches Megatron-Core's schedule table (backward chunk mirrored).
  const auto table = megatron_schedule_table(p, v, m);
  ASSERT_EQ(int(table.size()), total);
  int kf = 0, kb = 0;
  for (const PipelineAction& a : s.actions) {
    if (a.kind == PassKind::Forward) {
      EXPECT_EQ(std::make_pair(a.microbatch, a.chunk), table[kf]) << "forward " << kf;
      ++kf;
    } else {
      EXPECT_EQ(std::make_pair(a.microbatch, v - 1 - a.chunk), table[kb]) << "backward " << kb;
      ++kb;
    }
  }

  // Each chunk sees its microbatches in increasing order in both directions (FIFO activation stash).
  std::vector<int> next_f(v, 0), next_b(v, 0);
  for (const PipelineAction& a : s.actions) {
    int& expected = a.kind == PassKind::Forward ? next_f[a.chunk] : next_b[a.chunk];
    EXPECT_EQ(a.microbatch, expected) << format_action(a);
    expected = a.microbatch + 1;
  }

  // The implied transfers follow the virtual-stage chain.
  const int last = p * v - 1;
  for (const PipelineAction& a : s.actions) {
    const bool fwd = a.kind == PassKind::Forward;
    const int from = fwd ? a.virtual_stage - 1 : a.virtual_stage + 1;
    const int to = fwd ? a.virtual_stage + 1 : a.virtual_stage - 1;
    if (from < 0 || from > last)
      EXPECT_EQ(a.recv, std::nullopt) << format_action(a);
    else
      EXPECT_EQ(a.recv, (PeerEndpoint{from % p, from / p, from})) << format_action(a);
    if (to < 0 || to > last)
      EXPECT_EQ(a.send, std::nullopt) << format_action(a);
    else
      EXPECT_EQ(a.send, (PeerEndpoint{to % p, to / p, to})) << format_action(a);
  }
}

// A transfer as seen from either end: (kind, microbatch, sending rank, receiving rank, receiving stage).
using Message = std::tuple<PassKind, int, int, int, int>;

// Cross-rank properties: every send has exactly one matching recv (and vice versa), transfers between a
// pair of ranks of one kind arrive in the order they were sent, and the graph "program order on each
// rank + send -> matching recv" is acyclic, i.e. the tables cannot deadlock when sends are buffered.
void check_transfers(int p, int v, int m, const std::vector<PipelineSchedule>& tables) {
  SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m));
  std::map<Message, std::pair<int, int>> sent, received;  // message -> (rank, action index)
  std::map<std::tuple<int, int, PassKind>, std::vector<Message>> send_order, recv_order;
  for (const auto& t : tables)
    for (int i = 0; i < int(t.actions.size()); ++i) {
      const PipelineAction& a = t.actions[i];
      if (a.send) {
        Message msg{a.kind, a.microbatch, t.rank, a.send->rank, a.send->virtual_stage};
        EXPECT_TRUE(sent.emplace(msg, std::make_pair(t.rank, i)).second) << "duplicate send " << format_action(a);
        send_order[{t.rank, a.send->rank, a.kind}].push_back(msg);
      }
      if (a.recv) {
        Message msg{a.kind, a.microbatch, a.recv->rank, t.rank, a.virtual_stage};
        EXPECT_TRUE(received.emplace(msg, std::make_pair(t.rank, i)).second)
            << "duplicate recv " << format_action(a);
        recv_order[{a.recv->rank, t.rank, a.kind}].push_back(msg);
        // The recv names the sender's chunk correctly.
        const PipelineSchedule& peer = tables[a.recv->rank];
        bool found = false;
        for (const auto& b : peer.actions)
          if (b.kind == a.kind && b.microbatch == a.microbatch && b.virtual_stage == a.recv->virtual_stage)
            found = b.send && b.send->rank == t.rank && b.send->chunk == a.chunk;
        EXPECT_TRUE(found) << "rank " << t.rank << " " << format_action(a) << " has no matching send";
      }
    }
  ASSERT_EQ(sent.size(), received.size());
  for (const auto& [msg, where] : sent) EXPECT_TRUE(received.count(msg)) << "send without recv";
  // Each microbatch crosses p v - 1 stage boundaries forward and as many backward.
  EXPECT_EQ(int(sent.size()), 2 * m * (p * v - 1));
  EXPECT_EQ(send_order, recv_order);

  // Kahn's algorithm over all passes of all ranks.
  std::vector<int> base(p + 1, 0);
  for (int r = 0; r < p; ++r) base[r + 1] = base[r] + int(tables[r].actions.size());
  const int nodes = base[p];
  std::vector<std::vector<int>> out(nodes);
  std::vector<int> indegree(nodes, 0);
  auto edge = [&](int a, int b) {
    out[a].push_back(b);
    ++indegree[b];
  };
  for (int r = 0; r < p; ++r)
    for (int i = 1; i < int(tables[r].actions.size()); ++i) edge(base[r] + i - 1, base[r] + i);
  for (const auto& [msg, from] : sent) {
    auto it = received.find(msg);
    if (it != received.end()) edge(base[from.first] + from.second, base[it->second.first] + it->second.second);
  }
  // The last virtual stage's backward consumes its own forward; that is ordered on one rank already
  // (checked in check_rank_table), so program order covers it.
  std::queue<int> ready;
  for (int n = 0; n < nodes; ++n)
    if (indegree[n] == 0) ready.push(n);
  int done = 0;
  while (!ready.empty()) {
    int n = ready.front();
    ready.pop();
    ++done;
    for (int b : out[n])
      if (--indegree[b] == 0) ready.push(b);
  }
  EXPECT_EQ(done, nodes) << "transfer graph has a cycle: the schedule can deadlock";
}

void check_simulation(int p, int v, int m, SimCost cost) {
  SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m) +
               " tf=" + std::to_string(cost.forward) + " tb=" + std::to_string(cost.backward));
  SimResult sim = simulate(p, v, m, cost);
  ASSERT_TRUE(sim.completed) << sim.error;
  ASSERT_EQ(int(sim.busy.size()), p);
  const int64_t compute = int64_t(v) * m * (cost.forward + cost.backward);
  const int64_t bubble = int64_t(p - 1) * (cost.forward + cost.backward);
  EXPECT_EQ(sim.makespan, compute + bubble);
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(sim.busy[r], compute);
    EXPECT_EQ(sim.idle[r], bubble) << "rank " << r;
    // idle / compute = (p - 1) / (v m), compared exactly in integers.
    EXPECT_EQ(sim.idle[r] * v * m, sim.busy[r] * (p - 1)) << "rank " << r;
    EXPECT_DOUBLE_EQ(sim.bubble_fraction(r), double(p - 1) / double(v * m));
  }
}

TEST(ScheduleExhaustive, AllCombinations) {
  int valid = 0, rejected = 0;
  for (int p = 1; p <= kMaxP; ++p)
    for (int v = 1; v <= kMaxV; ++v)
      for (int m = 1; m <= kMaxM; ++m) {
        if (!valid_combo(p, v, m)) {
          ++rejected;
          const std::string rule =
              p == 1 ? "needs pipeline size > 1"
                     : "interleaved schedule needs microbatches (" + std::to_string(m) +
                           ") divisible by pipeline size (" + std::to_string(p) + ")";
          for (int r = 0; r < p; ++r) expect_invalid([&] { schedule(p, v, m, r); }, rule);
          expect_invalid([&] { simulate(p, v, m); }, rule);
          continue;
        }
        ++valid;
        const auto tables = schedule_all_ranks(p, v, m);
        ASSERT_EQ(int(tables.size()), p);
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(tables[r].rank, r);
          check_rank_table(p, v, m, tables[r]);
        }
        check_transfers(p, v, m, tables);
        check_simulation(p, v, m, SimCost{1, 2});
        if (::testing::Test::HasFailure()) return;  // one failing combination is enough to read
      }
  EXPECT_EQ(valid + rejected, kMaxP * kMaxV * kMaxM);
  EXPECT_GT(valid, 0);
}

// The bubble identity idle = (p - 1) (tf + tb) is not tied to tb = 2 tf in this model.
TEST(ScheduleExhaustive, BubbleHoldsForOtherCostModels) {
  for (SimCost cost : {SimCost{1, 1}, SimCost{2, 3}, SimCost{1, 3}})
    for (int p = 1; p <= kMaxP; ++p)
      for (int v = 1; v <= kMaxV; ++v)
        for (int m = 1; m <= kMaxM; ++m)
          if (valid_combo(p, v, m)) check_simulation(p, v, m, cost);
}

TEST(ScheduleSimulation, DetectsDeadlockInsteadOfLooping) {
  // Rank 0 runs B0 before F1, but rank 1 needs F1 before it will run B0.
  auto tables = schedule_all_ranks(2, 1, 2);
  tables[0].actions = {schedule(2, 1, 2, 0).actions[0], schedule(2, 1, 2, 0).actions[2],
                       schedule(2, 1, 2, 0).actions[1], schedule(2, 1, 2, 0).actions[3]};
  ASSERT_EQ(joined(tables[0]), "F0.0 B0.0 F1.0 B1.0");
  tables[1].actions = {tables[1].actions[0], tables[1].actions[2], tables[1].actions[1], tables[1].actions[3]};
  ASSERT_EQ(joined(tables[1]), "F0.0 F1.0 B0.0 B1.0");
  SimResult sim = simulate_tables(2, 1, tables);
  EXPECT_FALSE(sim.completed);
  EXPECT_NE(sim.error.find("rank 0 waits at B0.0 for the backward of microbatch 0 on virtual stage 1"),
            std::string::npos)
      << sim.error;
  EXPECT_NE(sim.error.find("rank 1 waits at F1.0 for the forward of microbatch 1 on virtual stage 0"),
            std::string::npos)
      << sim.error;
  // The independent graph check sees the same cycle.
  EXPECT_NONFATAL_FAILURE(check_transfers(2, 1, 2, tables), "transfer graph has a cycle");
}

TEST(ScheduleSimulation, ReportsPassThatNoRankRuns) {
  auto tables = schedule_all_ranks(2, 1, 2);
  tables[0].actions.erase(tables[0].actions.begin() + 1);  // drop F1.0 on rank 0
  SimResult sim = simulate_tables(2, 1, tables);
  EXPECT_FALSE(sim.completed);
  EXPECT_NE(sim.error.find("rank 1 waits at F1.0"), std::string::npos) << sim.error;
  EXPECT_NE(sim.error.find("which no rank runs"), std::string::npos) << sim.error;
}

TEST(ScheduleSimulation, RejectsMalformedTables) {
  auto tables = schedule_all_ranks(2, 2, 2);
  expect_invalid([&] { simulate_tables(3, 2, tables); }, "got 2 tables for pipeline size 3");
  auto dup = tables;
  dup[1].actions.push_back(dup[1].actions.front());
  expect_invalid([&] { simulate_tables(2, 2, dup); }, "F0.0 appears more than once");
  auto wrong_stage = tables;
  wrong_stage[0].actions[0].virtual_stage = 1;
  expect_invalid([&] { simulate_tables(2, 2, wrong_stage); }, "has virtual stage 1");
  auto swapped = tables;
  std::swap(swapped[0], swapped[1]);
  expect_invalid([&] { simulate_tables(2, 2, swapped); }, "table 0 has rank 1");
  expect_invalid([&] { simulate(2, 1, 4, SimCost{-1, 2}); }, "pass costs must be non-negative");
}

}  // namespace
}  // namespace gpt
