// Discrete-time simulator for pipeline schedule tables (completion / deadlock check and measured bubble)
// and the printable form of a schedule. Each rank runs its table in order, one pass at a time; a pass
// starts as soon as its rank is free and its data dependency has finished; sends are buffered, so a rank
// only ever waits for its next pass's input. Pure functions.
#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>

#include "parallel/pipeline/pipeline_schedule.h"

namespace gpt {

namespace {

std::string str(int64_t x) { return std::to_string(x); }

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

const char* kind_name(PassKind k) { return k == PassKind::Forward ? "forward" : "backward"; }

// Dense index of the pass (kind, microbatch, virtual stage) into the finish-time table.
struct PassIndex {
  int stages;
  int microbatches;
  size_t operator()(PassKind kind, int microbatch, int stage) const {
    return (size_t(kind == PassKind::Backward) * microbatches + microbatch) * stages + stage;
  }
  size_t size() const { return size_t(2) * microbatches * stages; }
};

struct Dependency {
  PassKind kind;
  int microbatch;
  int stage;
};

// The pass whose output `a` consumes; nullopt for the forward of virtual stage 0 (input is the data).
std::optional<Dependency> dependency_of(const PipelineAction& a, int stages) {
  if (a.kind == PassKind::Forward) {
    if (a.virtual_stage == 0) return std::nullopt;
    return Dependency{PassKind::Forward, a.microbatch, a.virtual_stage - 1};
  }
  if (a.virtual_stage == stages - 1) return Dependency{PassKind::Forward, a.microbatch, a.virtual_stage};
  return Dependency{PassKind::Backward, a.microbatch, a.virtual_stage + 1};
}

void check_tables(int p, int v, const std::vector<PipelineSchedule>& tables, const PassIndex& index) {
  require(p >= 1 && v >= 1, "simulate: pipeline size (" + str(p) + ") and virtual pipeline size (" + str(v) +
                                ") must be at least 1");
  require(int(tables.size()) == p,
          "simulate: got " + str(int64_t(tables.size())) + " tables for pipeline size " + str(p));
  std::vector<char> seen(index.size(), 0);
  for (int r = 0; r < p; ++r) {
    const PipelineSchedule& t = tables[r];
    const std::string where = "simulate: table " + str(r);
    require(t.rank == r, where + " has rank " + str(t.rank));
    require(t.pipeline_size == p && t.virtual_size == v,
            where + " was built for p=" + str(t.pipeline_size) + " v=" + str(t.virtual_size));
    require(t.num_microbatches == index.microbatches,
            where + " has " + str(t.num_microbatches) + " microbatches, table 0 has " + str(index.microbatches));
    for (const PipelineAction& a : t.actions) {
      require(a.chunk >= 0 && a.chunk < v, where + ": chunk " + str(a.chunk) + " out of range");
      require(a.virtual_stage == a.chunk * p + r,
              where + ": " + format_action(a) + " has virtual stage " + str(a.virtual_stage));
      require(a.microbatch >= 0 && a.microbatch < index.microbatches,
              where + ": microbatch " + str(a.microbatch) + " out of range");
      char& s = seen[index(a.kind, a.microbatch, a.virtual_stage)];
      require(!s, where + ": " + format_action(a) + " appears more than once");
      s = 1;
    }
  }
}

}  // namespace

double SimResult::bubble_fraction(int rank) const {
  if (rank < 0 || rank >= int(busy.size()) || busy[rank] == 0) return 0.0;
  return double(idle[rank]) / double(busy[rank]);
}

std::string format_action(const PipelineAction& a) {
  std::string s(1, a.kind == PassKind::Forward ? 'F' : 'B');
  s += std::to_string(a.microbatch);
  s += '.';
  s += std::to_string(a.chunk);
  return s;
}

SimResult simulate_tables(int p, int v, const std::vector<PipelineSchedule>& tables, SimCost cost) {
  require(cost.forward >= 0 && cost.backward >= 0, "simulate: pass costs must be non-negative");
  const int m = tables.empty() ? 0 : tables[0].num_microbatches;
  require(m >= 1, "simulate: tables need at least one microbatch");
  const int stages = p * v;
  const PassIndex index{stages, m};
  check_tables(p, v, tables, index);

  std::vector<int64_t> finish_of(index.size(), -1);  // -1: not run yet
  std::vector<size_t> next(p, 0);
  std::vector<int64_t> free_at(p, 0);
  SimResult result;
  result.busy.assign(p, 0);

  size_t remaining = 0;
  for (const auto& t : tables) remaining += t.actions.size();

  // Each sweep advances every rank as far as its dependencies allow. Start times don't depend on the
  // sweep order (each pass starts at max(rank free, dependency finished)), so this is the as-soon-as-
  // possible timing of the tables; a sweep without progress means nothing can ever progress.
  while (remaining > 0) {
    bool progressed = false;
    for (int r = 0; r < p; ++r) {
      const auto& actions = tables[r].actions;
      while (next[r] < actions.size()) {
        const PipelineAction& a = actions[next[r]];
        int64_t ready = 0;
        if (auto dep = dependency_of(a, stages)) {
          ready = finish_of[index(dep->kind, dep->microbatch, dep->stage)];
          if (ready < 0) break;
        }
        const int64_t duration = a.kind == PassKind::Forward ? cost.forward : cost.backward;
        const int64_t start = std::max(free_at[r], ready);
        free_at[r] = start + duration;
        finish_of[index(a.kind, a.microbatch, a.virtual_stage)] = free_at[r];
        result.busy[r] += duration;
        ++next[r];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) break;
  }

  result.finish = free_at;
  result.makespan = *std::max_element(free_at.begin(), free_at.end());
  result.idle.resize(p);
  for (int r = 0; r < p; ++r) result.idle[r] = result.makespan - result.busy[r];
  if (remaining == 0) {
    result.completed = true;
    return result;
  }

  // Name what every blocked rank waits for, and whether any rank would ever run it.
  std::vector<char> scheduled(index.size(), 0);
  for (const auto& t : tables)
    for (const auto& a : t.actions) scheduled[index(a.kind, a.microbatch, a.virtual_stage)] = 1;
  std::ostringstream os;
  os << "pipeline schedule deadlock (p=" << p << " v=" << v << " m=" << m << "):";
  for (int r = 0; r < p; ++r) {
    if (next[r] == tables[r].actions.size()) continue;
    const PipelineAction& a = tables[r].actions[next[r]];
    auto dep = dependency_of(a, stages);  // present: a pass without dependency never blocks
    os << " rank " << r << " waits at " << format_action(a) << " for the " << kind_name(dep->kind)
       << " of microbatch " << dep->microbatch << " on virtual stage " << dep->stage << " (rank "
       << dep->stage % p << " chunk " << dep->stage / p << ")";
    if (!scheduled[index(dep->kind, dep->microbatch, dep->stage)]) os << ", which no rank runs";
    os << ";";
  }
  result.error = os.str();
  result.error.pop_back();
  return result;
}

SimResult simulate(int p, int v, int m, SimCost cost) {
  return simulate_tables(p, v, schedule_all_ranks(p, v, m), cost);
}

std::string format_schedule(int p, int v, int m) {
  const auto tables = schedule_all_ranks(p, v, m);
  const SimCost cost;
  const SimResult sim = simulate_tables(p, v, tables, cost);
  std::ostringstream os;
  os << (v == 1 ? "1F1B" : "interleaved 1F1B") << " schedule: p=" << p << " v=" << v << " m=" << m
     << " (pass microbatch.chunk; virtual stage = chunk * p + rank)\n";
  for (const auto& t : tables) {
    os << "rank " << t.rank << ":";
    for (const auto& a : t.actions) os << ' ' << format_action(a);
    os << '\n';
  }
  os << "warmup forwards per rank:";
  for (const auto& t : tables) os << ' ' << t.num_warmup;
  os << '\n';
  const double theory = double(p - 1) / double(v * m);
  os << "bubble (idle / compute): theory (p-1)/(v*m) = " << (p - 1) << "/" << v * m << " = " << theory;
  if (!sim.completed) {
    os << ", simulation failed: " << sim.error << '\n';
    return os.str();
  }
  const auto [lo, hi] = std::minmax_element(sim.idle.begin(), sim.idle.end());
  os << ", simulated " << sim.bubble_fraction(int(hi - sim.idle.begin()));
  os << " (F=" << cost.forward << ", B=" << cost.backward << " time units per chunk; makespan "
     << sim.makespan << ", compute " << sim.busy[0] << " per rank, idle ";
  if (*lo == *hi)
    os << *hi << " on every rank)\n";
  else
    os << *lo << ".." << *hi << " across ranks)\n";
  return os.str();
}

}  // namespace gpt
