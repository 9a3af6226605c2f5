// Builds the per-rank schedule tables (plain and interleaved 1F1B), their point-to-point endpoints, the
// argument and layer-layout validation, and the chunk-to-layer mapping. Pure functions; the simulator and
// the printer live in schedule_simulate.cpp.
#include "parallel/pipeline/pipeline_schedule.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gpt {

namespace {

std::string str(int x) { return std::to_string(x); }

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

void require_rank(int p, int rank) {
  require(rank >= 0 && rank < p,
          "pipeline rank (" + str(rank) + ") must lie in [0, pipeline size (" + str(p) + "))");
}

void require_chunk(int v, int chunk) {
  require(chunk >= 0 && chunk < v,
          "model chunk (" + str(chunk) + ") must lie in [0, virtual pipeline size (" + str(v) + "))");
}

PeerEndpoint endpoint(int p, int rank, int chunk) { return {rank, chunk, chunk * p + rank}; }

// A pass with the transfers its position in the virtual pipeline implies.
PipelineAction make_action(int p, int v, int rank, PassKind kind, int microbatch, int chunk) {
  PipelineAction a;
  a.kind = kind;
  a.microbatch = microbatch;
  a.chunk = chunk;
  a.virtual_stage = chunk * p + rank;
  auto prev = previous_virtual_stage(p, v, rank, chunk);
  auto next = next_virtual_stage(p, v, rank, chunk);
  if (kind == PassKind::Forward) {
    a.recv = prev;
    a.send = next;
  } else {
    a.recv = next;
    a.send = prev;
  }
  return a;
}

// The k-th forward (or backward) pass of a rank in the interleaved schedule. Microbatches are taken in
// groups of p: the group runs through chunks 0..v-1 in forward order (v-1..0 in backward order) before the
// next group starts, so each chunk still sees microbatches in increasing order.
int interleaved_microbatch(int p, int v, int k) { return (k / (p * v)) * p + k % p; }
int interleaved_chunk(int p, int v, int k, PassKind kind) {
  int c = (k / p) % v;
  return kind == PassKind::Forward ? c : v - 1 - c;
}

}  // namespace

void validate_schedule_args(int p, int v, int m) {
  require(p >= 1, "pipeline size (" + str(p) + ") must be at least 1");
  require(v >= 1, "virtual pipeline size (" + str(v) + ") must be at least 1");
  require(m >= 1, "number of microbatches (" + str(m) + ") must be at least 1");
  if (v > 1) {
    require(p > 1, "interleaved schedule (virtual pipeline size " + str(v) +
                       ") needs pipeline size > 1, got " + str(p));
    require(m % p == 0, "interleaved schedule needs microbatches (" + str(m) +
                            ") divisible by pipeline size (" + str(p) + ")");
  }
}

void validate_pipeline_layout(int num_layers, int p, int v) {
  require(p >= 1, "pipeline size (" + str(p) + ") must be at least 1");
  require(v >= 1, "virtual pipeline size (" + str(v) + ") must be at least 1");
  require(num_layers >= 1, "number of layers (" + str(num_layers) + ") must be at least 1");
  require(num_layers % (p * v) == 0, "number of layers (" + str(num_layers) +
                                         ") must be divisible by pipeline size * virtual pipeline size (" +
                                         str(p) + " * " + str(v) + " = " + str(p * v) + ")");
}

int num_warmup_passes(int p, int v, int m, int rank) {
  validate_schedule_args(p, v, m);
  require_rank(p, rank);
  if (v == 1) return std::min(p - rank - 1, m);
  // Every rank runs (v - 1) p forwards, enough for the first group of p microbatches to reach its last
  // chunk, plus two per stage between it and the last rank: the first backward it can run has to travel
  // forward to the last rank and back, one pass each way per stage.
  return std::min(2 * (p - rank - 1) + (v - 1) * p, m * v);
}

std::optional<PeerEndpoint> next_virtual_stage(int p, int v, int rank, int chunk) {
  require_rank(p, rank);
  require_chunk(v, chunk);
  if (rank < p - 1) return endpoint(p, rank + 1, chunk);
  if (chunk < v - 1) return endpoint(p, 0, chunk + 1);
  return std::nullopt;
}

std::optional<PeerEndpoint> previous_virtual_stage(int p, int v, int rank, int chunk) {
  require_rank(p, rank);
  require_chunk(v, chunk);
  if (rank > 0) return endpoint(p, rank - 1, chunk);
  if (chunk > 0) return endpoint(p, p - 1, chunk - 1);
  return std::nullopt;
}

PipelineSchedule schedule(int p, int v, int m, int rank) {
  validate_schedule_args(p, v, m);
  require_rank(p, rank);
  PipelineSchedule s;
  s.pipeline_size = p;
  s.virtual_size = v;
  s.num_microbatches = m;
  s.rank = rank;
  s.num_warmup = num_warmup_passes(p, v, m, rank);

  // Both schedules are "warmup forwards, steady (F k + warmup, B k) pairs, cooldown backwards" over
  // m v forward and m v backward passes; they differ only in which (microbatch, chunk) the k-th pass runs.
  const int total = m * v;
  auto pass = [&](PassKind kind, int k) {
    if (v == 1) return make_action(p, v, rank, kind, k, 0);
    return make_action(p, v, rank, kind, interleaved_microbatch(p, v, k), interleaved_chunk(p, v, k, kind));
  };
  s.actions.reserve(2 * total);
  const int warmup = s.num_warmup;
  for (int k = 0; k < warmup; ++k) s.actions.push_back(pass(PassKind::Forward, k));
  for (int k = 0; k < total - warmup; ++k) {
    s.actions.push_back(pass(PassKind::Forward, k + warmup));
    s.actions.push_back(pass(PassKind::Backward, k));
  }
  for (int k = total - warmup; k < total; ++k) s.actions.push_back(pass(PassKind::Backward, k));
  return s;
}

int transfer_tag(PassKind kind, int receiving_stage, int microbatch, int total_stages) {
  return ((microbatch * total_stages + receiving_stage) << 1) | (kind == PassKind::Backward ? 1 : 0);
}

std::vector<PipelineSchedule> schedule_all_ranks(int p, int v, int m) {
  validate_schedule_args(p, v, m);
  std::vector<PipelineSchedule> all;
  all.reserve(p);
  for (int r = 0; r < p; ++r) all.push_back(schedule(p, v, m, r));
  return all;
}

std::pair<int, int> chunk_layer_range(int num_layers, int p, int v, int rank, int chunk) {
  validate_pipeline_layout(num_layers, p, v);
  require_rank(p, rank);
  require_chunk(v, chunk);
  const int per_chunk = num_layers / (p * v);
  const int stage = chunk * p + rank;
  return {stage * per_chunk, (stage + 1) * per_chunk};
}

}  // namespace gpt
