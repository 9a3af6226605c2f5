// Send-buffer release points (parallel/pipeline/send_release.h): checked against an independent reachability search
// over each step's event graph, for the rule that waits for downstream activations, for the bound on live
// buffers as the number of microbatches grows, and for malformed tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/pipeline/send_release.h"

using namespace gpt;

namespace {

// A send that rule 1 waits for right after the next action's receive: a forward activation to a higher
// rank, not on the rank's last action.
bool waited_at_next_action(const PipelineSchedule& t, int rank, int a) {
  const PipelineAction& x = t.actions[a];
  return x.send && x.kind == PassKind::Forward && x.send->rank > rank && a + 1 < static_cast<int>(t.actions.size());
}

// The reference: the step's events (rank, action) with edges for program order, for each transfer (its
// sending action to its receiving action) and for each rule-1 wait (the receiving action to the action
// after the send, which completes only once the receiver has taken it). A rule-2 send from (r, a) taken
// at (q, b) is releasable at the first action k > a of r that (q, b) reaches.
std::vector<std::vector<int>> reference_release(int p, int v, const std::vector<PipelineSchedule>& tables) {
  const int stages = p * v;
  std::vector<int> offset(p + 1, 0);
  for (int r = 0; r < p; ++r) offset[r + 1] = offset[r] + static_cast<int>(tables[r].actions.size());
  const int n = offset[p];
  std::vector<std::vector<int>> edges(n);
  int m = 0;
  for (const PipelineSchedule& t : tables)
    for (const PipelineAction& x : t.actions) m = std::max(m, x.microbatch + 1);
  std::vector<std::pair<int, int>> receiver_of_tag(2 * m * stages, {-1, -1});
  for (int q = 0; q < p; ++q)
    for (int b = 0; b < static_cast<int>(tables[q].actions.size()); ++b) {
      const PipelineAction& x = tables[q].actions[b];
      if (x.recv) receiver_of_tag.at(transfer_tag(x.kind, x.virtual_stage, x.microbatch, stages)) = {q, b};
    }
  auto receiver = [&](int r, int a) {
    const PipelineAction& x = tables[r].actions[a];
    return receiver_of_tag.at(transfer_tag(x.kind, x.send->virtual_stage, x.microbatch, stages));
  };
  for (int r = 0; r < p; ++r)
    for (int a = 0; a < static_cast<int>(tables[r].actions.size()); ++a) {
      if (a + 1 < static_cast<int>(tables[r].actions.size())) edges[offset[r] + a].push_back(offset[r] + a + 1);
      if (!tables[r].actions[a].send) continue;
      auto [q, b] = receiver(r, a);
      edges[offset[r] + a].push_back(offset[q] + b);
      if (waited_at_next_action(tables[r], r, a)) edges[offset[q] + b].push_back(offset[r] + a + 1);
    }
  std::vector<std::vector<int>> release(p);
  for (int r = 0; r < p; ++r) {
    const int size = static_cast<int>(tables[r].actions.size());
    release[r].assign(size, -1);
    for (int a = 0; a < size; ++a) {
      if (!tables[r].actions[a].send) continue;
      if (waited_at_next_action(tables[r], r, a)) {
        release[r][a] = a + 1;
        continue;
      }
      auto [q, b] = receiver(r, a);
      std::vector<char> seen(n, 0);
      std::deque<int> todo{offset[q] + b};
      seen[offset[q] + b] = 1;
      int first = size;
      while (!todo.empty()) {
        const int e = todo.front();
        todo.pop_front();
        if (e >= offset[r] + a + 1 && e < offset[r + 1]) first = std::min(first, e - offset[r]);
        for (int f : edges[e])
          if (!seen[f]) seen[f] = 1, todo.push_back(f);
      }
      release[r][a] = first;
    }
  }
  return release;
}

template <typename F>
void for_each_schedule(int max_p, int max_v, int max_m, F f) {
  for (int p = 1; p <= max_p; ++p)
    for (int v = 1; v <= max_v; ++v)
      for (int m = 1; m <= max_m; ++m) {
        if (v > 1 && (p == 1 || m % p)) continue;
        f(p, v, m);
      }
}

}  // namespace

TEST(SendRelease, MatchesReachabilityInTheEventGraph) {
  for (bool forward_only : {false, true})
    for_each_schedule(5, 3, 12, [&](int p, int v, int m) {
      const auto tables = step_tables(p, v, m, forward_only);
      EXPECT_EQ(send_release_points(p, v, tables), reference_release(p, v, tables))
          << "p=" << p << " v=" << v << " m=" << m << (forward_only ? " forward-only" : "");
    });
}

TEST(SendRelease, DownstreamActivationsAreWaitedForAtTheNextAction) {
  // Rule 1 is kept (its waits never deadlock) for every schedule tried, and every other send is freed
  // after it was posted and no later than the step's end.
  for (bool forward_only : {false, true})
    for_each_schedule(8, 4, 32, [&](int p, int v, int m) {
      const auto tables = step_tables(p, v, m, forward_only);
      const auto release = send_release_points(p, v, tables);
      for (int r = 0; r < p; ++r)
        for (int a = 0; a < static_cast<int>(tables[r].actions.size()); ++a) {
          const std::string what = "p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m) +
                                   " rank " + std::to_string(r) + " action " + std::to_string(a);
          if (!tables[r].actions[a].send) {
            EXPECT_EQ(release[r][a], -1) << what;
          } else if (waited_at_next_action(tables[r], r, a)) {
            EXPECT_EQ(release[r][a], a + 1) << what;
          } else {
            EXPECT_GT(release[r][a], a) << what;
            EXPECT_LE(release[r][a], static_cast<int>(tables[r].actions.size())) << what;
          }
        }
    });
}

TEST(SendRelease, LiveBuffersDoNotGrowWithTheMicrobatches) {
  for (int p = 2; p <= 8; ++p)
    for (int v = 1; v <= 3; ++v) {
      const auto few = *cached_send_release_points(p, v, 4 * p, false);
      const auto many = *cached_send_release_points(p, v, 16 * p, false);
      for (int r = 0; r < p; ++r) {
        const int held = max_live_send_buffers(many[r]);
        EXPECT_EQ(held, max_live_send_buffers(few[r])) << "p=" << p << " v=" << v << " rank " << r;
        EXPECT_LE(held, 2 * p) << "p=" << p << " v=" << v << " rank " << r;
      }
      // Evaluation: one activation in flight per rank with one chunk each.
      if (v == 1) {
        for (const auto& points : *cached_send_release_points(p, 1, 16 * p, true)) {
          EXPECT_LE(max_live_send_buffers(points), 1) << "p=" << p;
        }
      }
    }
}

TEST(SendRelease, CountsLiveBuffersFromSendToRelease) {
  EXPECT_EQ(max_live_send_buffers({}), 0);
  EXPECT_EQ(max_live_send_buffers({-1, -1}), 0);
  EXPECT_EQ(max_live_send_buffers({1, 2, 3}), 1);     // each freed at the next action
  EXPECT_EQ(max_live_send_buffers({3, 3, 3, -1}), 3);  // all three live until action 3
  EXPECT_EQ(max_live_send_buffers({4, -1, 4, -1}), 2);  // 4 = the step's end
}

TEST(SendRelease, RejectsTablesThatCannotRun) {
  auto tables = step_tables(2, 1, 2, false);
  EXPECT_THROW(send_release_points(2, 1, {tables[0]}), std::invalid_argument);
  tables[0].actions[0].send.reset();  // rank 1 now waits for an activation nobody sends
  try {
    send_release_points(2, 1, tables);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("never sent"), std::string::npos) << e.what();
  }
  tables = step_tables(2, 1, 2, false);
  tables[1].actions.push_back(tables[1].actions[0]);  // the same activation received twice
  EXPECT_THROW(send_release_points(2, 1, tables), std::invalid_argument);
  tables = step_tables(2, 1, 2, false);
  tables[0].actions[0].send->virtual_stage = 7;  // a stage the pipeline does not have
  EXPECT_THROW(send_release_points(2, 1, tables), std::invalid_argument);
}
