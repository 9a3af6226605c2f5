// Release points of pipeline send buffers, from vector clocks over the schedule tables (see send_release.h).
#include "parallel/pipeline/send_release.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

namespace gpt {

namespace {

struct Outstanding {
  int action;  // index of the sending action
  int peer;    // receiving rank
  int id;
};

std::string where(int rank, int action) {
  return "send_release_points: rank " + std::to_string(rank) + ", action " + std::to_string(action);
}

// Runs the tables as the executor does, in dependency order: a rank stops at a receive whose transfer has
// not been sent and, when `wait_downstream`, after the receive of the action that follows a forward send
// to a higher rank, until that send's receiver has posted its receive. Every other send is released where
// the vector clocks first show its receipt. Returns false on deadlock (release left partly filled).
bool run_tables(int p, int v, const std::vector<PipelineSchedule>& tables, bool wait_downstream,
                std::vector<std::vector<int>>& release, std::string& stuck) {
  const int stages = p * v;
  int m = 0;
  for (const PipelineSchedule& t : tables)
    for (const PipelineAction& a : t.actions) m = std::max(m, a.microbatch + 1);
  const size_t ids = static_cast<size_t>(2) * m * stages;
  std::vector<std::vector<int>> clock_of(ids);  // sender's clock, kept until the transfer is received
  // The receiver's clock as it takes a transfer whose sender waits for it (rule 1), kept until that wait.
  std::vector<std::vector<int>> receipt_clock(ids);
  std::vector<char> sent(ids, 0), awaited(ids, 0);
  std::vector<int> received_at(ids, -1);  // receiver's action index
  std::vector<std::vector<int>> clock(p, std::vector<int>(p, 0));  // clock[r][q]: q's actions r knows started
  std::vector<std::vector<Outstanding>> outstanding(p);
  std::vector<std::optional<Outstanding>> waiting(p);  // the forward send to wait for at the next action
  std::vector<size_t> next(p, 0);
  release.assign(p, {});
  for (int r = 0; r < p; ++r) release[r].assign(tables[r].actions.size(), -1);

  // The transfer's tag, checked to lie within the tables' microbatches and virtual stages.
  auto tag = [&](PassKind kind, int stage, int microbatch, int r, int k) {
    if (stage < 0 || stage >= stages || microbatch < 0)
      throw std::invalid_argument(where(r, k) + ": virtual stage " + std::to_string(stage) + " or microbatch " +
                                  std::to_string(microbatch) + " is out of range");
    return transfer_tag(kind, stage, microbatch, stages);
  };
  auto merge = [&](int r, const std::vector<int>& other) {
    for (int q = 0; q < p; ++q) clock[r][q] = std::max(clock[r][q], other[q]);
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      const std::vector<PipelineAction>& actions = tables[r].actions;
      for (; next[r] < actions.size(); ++next[r]) {
        const int k = static_cast<int>(next[r]);
        const PipelineAction& a = actions[k];
        // First the receive, which the executor posts (and completes) before anything else of the action.
        const int in = a.recv ? tag(a.kind, a.virtual_stage, a.microbatch, r, k) : -1;
        if (in >= 0 && received_at[in] != k) {
          if (!sent[in]) break;  // the sender has not reached it yet
          if (received_at[in] >= 0) throw std::invalid_argument(where(r, k) + ": transfer received twice");
          received_at[in] = k;
          merge(r, clock_of[in]);
          std::vector<int>().swap(clock_of[in]);
          clock[r][r] = k + 1;
          if (awaited[in]) receipt_clock[in] = clock[r];
          progress = true;
        }
        clock[r][r] = k + 1;
        if (waiting[r]) {
          const int id = waiting[r]->id;
          if (received_at[id] < 0) break;  // its receiver has not taken it yet
          release[r][waiting[r]->action] = k;
          merge(r, receipt_clock[id]);  // what the receiver knew when it took the transfer
          std::vector<int>().swap(receipt_clock[id]);
          waiting[r].reset();
        }
        // Sends whose receipt r now knows of are released here.
        auto& mine = outstanding[r];
        for (size_t i = 0; i < mine.size();) {
          const int b = received_at[mine[i].id];
          if (b >= 0 && clock[r][mine[i].peer] > b) {
            release[r][mine[i].action] = k;
            mine[i] = mine.back();
            mine.pop_back();
          } else {
            ++i;
          }
        }
        if (a.send) {
          if (a.send->rank < 0 || a.send->rank >= p) throw std::invalid_argument(where(r, k) + ": peer out of range");
          const int out = tag(a.kind, a.send->virtual_stage, a.microbatch, r, k);
          if (sent[out]) throw std::invalid_argument(where(r, k) + ": transfer sent twice");
          sent[out] = 1;
          clock_of[out] = clock[r];
          const Outstanding o{k, a.send->rank, out};
          const bool downstream = a.kind == PassKind::Forward && a.send->rank > r;  // not the wrap p-1 -> 0
          if (wait_downstream && downstream && k + 1 < static_cast<int>(actions.size())) waiting[r] = o, awaited[out] = 1;
          else outstanding[r].push_back(o);
        }
        progress = true;
      }
    }
  }
  stuck.clear();
  for (int r = 0; r < p; ++r) {
    if (next[r] < tables[r].actions.size())
      stuck += (stuck.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " at action " + std::to_string(next[r]) +
                                             " (" + format_action(tables[r].actions[next[r]]) + ")");
    for (const Outstanding& o : outstanding[r]) release[r][o.action] = static_cast<int>(tables[r].actions.size());
  }
  return stuck.empty();
}

}  // namespace

std::vector<std::vector<int>> send_release_points(int p, int v, const std::vector<PipelineSchedule>& tables) {
  if (p < 1 || v < 1 || static_cast<int>(tables.size()) != p)
    throw std::invalid_argument("send_release_points: need one table per rank of a pipeline of " + std::to_string(p));
  std::vector<std::vector<int>> release;
  std::string stuck;
  if (run_tables(p, v, tables, true, release, stuck)) return release;
  if (run_tables(p, v, tables, false, release, stuck)) return release;
  throw std::invalid_argument("send_release_points: the tables deadlock, waiting for transfers that are never sent: " +
                              stuck);
}

PipelineSchedule step_table(int p, int v, int m, int rank, bool forward_only) {
  PipelineSchedule t = schedule(p, v, m, rank);
  if (forward_only) std::erase_if(t.actions, [](const PipelineAction& a) { return a.kind == PassKind::Backward; });
  return t;
}

std::vector<PipelineSchedule> step_tables(int p, int v, int m, bool forward_only) {
  validate_schedule_args(p, v, m);
  std::vector<PipelineSchedule> tables;
  for (int r = 0; r < p; ++r) tables.push_back(step_table(p, v, m, r, forward_only));
  return tables;
}

std::shared_ptr<const std::vector<std::vector<int>>> cached_send_release_points(int p, int v, int m,
                                                                               bool forward_only) {
  using Key = std::tuple<int, int, int, bool>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const std::vector<std::vector<int>>>> cache;
  const Key key{p, v, m, forward_only};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  auto points = std::make_shared<const std::vector<std::vector<int>>>(
      send_release_points(p, v, step_tables(p, v, m, forward_only)));
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= 256) cache.clear();  // bounded: a planner sweep touches a few hundred (p, v, m)
  return cache.emplace(key, points).first->second;
}

int max_live_send_buffers(const std::vector<int>& release_points) {
  const int n = static_cast<int>(release_points.size());
  std::vector<int> delta(n + 2, 0);
  for (int a = 0; a < n; ++a) {
    if (release_points[a] < 0) continue;
    ++delta[a];
    --delta[std::max(release_points[a], a + 1)];
  }
  int live = 0, most = 0;
  for (int a = 0; a < n; ++a) most = std::max(most, live += delta[a]);
  return most;
}

}  // namespace gpt
