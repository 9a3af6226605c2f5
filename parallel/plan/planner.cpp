// Layout planner: the enumeration and ranking of layouts (see planner.h).
#include "parallel/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace gpt {

PlanEntry evaluate_layout(const ModelDescription& m, const LayoutSpec& l, const HardwareSpec& hw, SendBuffers sends) {
  PlanEntry e;
  e.layout = l;
  e.memory = estimate_peak_memory(m, l, sends);
  e.time = estimate_time(m, l, hw);
  // A CPU's device memory is the host's: the checkpoint snapshot takes from it too.
  const int64_t host = hw.host_memory_is_device_memory ? e.memory.checkpoint_host : 0;
  e.fits = static_cast<double>(e.memory.total() + host) <= hw.usable_memory_bytes();
  return e;
}

namespace {
bool same_choice(const LayoutSpec& l, int tp, int pp, int dp, int cp) {
  return l.tp == tp && l.pp == pp && l.dp == dp && l.cp == cp;
}
}  // namespace

const PlanEntry* find_choice(const Plan& plan, int tp, int pp, int dp, int cp) {
  for (const PlanEntry& e : plan.layouts)
    if (same_choice(e.layout, tp, pp, dp, cp)) return &e;
  return nullptr;
}

int choice_rank(const Plan& plan, int tp, int pp, int dp, int cp, int* choices) {
  std::vector<const LayoutSpec*> seen;  // the first (fastest) variant of each distinct fitting choice
  int rank = 0;
  for (const PlanEntry& e : plan.layouts) {
    if (!e.fits) break;
    const LayoutSpec& l = e.layout;
    const bool known = std::any_of(seen.begin(), seen.end(), [&](const LayoutSpec* s) {
      return same_choice(*s, l.tp, l.pp, l.dp, l.cp);
    });
    if (known) continue;
    seen.push_back(&l);
    if (same_choice(l, tp, pp, dp, cp)) rank = static_cast<int>(seen.size());
  }
  if (choices) *choices = static_cast<int>(seen.size());
  return rank;
}

Plan make_plan(const ModelDescription& m, int64_t global_batch, const HardwareSpec& hw_in, const PlanOptions& o) {
  if (o.devices < 1) throw std::invalid_argument("plan: the number of devices must be at least 1");
  Plan plan;
  plan.hardware = hw_in;
  if (o.devices_per_node > 0) plan.hardware.devices_per_node = o.devices_per_node;
  plan.hardware.validate();
  check_overlaps_for_search(o.overlaps, o.sequence_parallel, !o.distributed_optimizer || *o.distributed_optimizer);
  plan.options = o;
  const HardwareSpec& hw = plan.hardware;
  const int N = o.devices, G = hw.devices_per_node;
  auto s = [](int64_t x) { return std::to_string(x); };
  std::vector<Recompute> modes = o.recompute ? std::vector<Recompute>{*o.recompute}
                                             : std::vector<Recompute>{Recompute::None, Recompute::Selective, Recompute::Full};
  for (int tp = 1; tp <= N; ++tp) {
    if (N % tp) continue;
    std::string why;
    if (tp > G || G % tp)
      why = "tensor " + s(tp) + " would cross nodes (" + s(G) + " devices per node): keep tensor parallelism inside a node";
    else if (m.heads % tp)
      why = "num_heads " + s(m.heads) + " is not divisible by tensor " + s(tp);
    else if (m.query_groups() % tp)
      why = "num_query_groups " + s(m.query_groups()) + " is not divisible by tensor " + s(tp) +
            ": each rank holds whole key/value groups";
    else if (m.ffn % tp)
      why = "ffn_hidden_size " + s(m.ffn) + " is not divisible by tensor " + s(tp);
    if (!why.empty()) {
      plan.rejected.push_back({tp, 0, 0, why});
      continue;
    }
    for (int cp = 1; cp <= std::max(1, o.max_context) && cp <= N / tp; ++cp) {
    if ((N / tp) % cp || m.seq_length % (2 * cp)) continue;
    for (int pp = 1; pp <= N / (tp * cp); ++pp) {
      if ((N / (tp * cp)) % pp) continue;
      const int dp = N / (tp * cp * pp);
      if (m.num_layers % pp) {
        if (cp == 1) plan.rejected.push_back({tp, pp, dp, "num_layers " + s(m.num_layers) + " is not divisible by pipeline " + s(pp)});
        continue;
      }
      if (global_batch % dp) {
        if (cp == 1) plan.rejected.push_back({tp, pp, dp, "global batch " + s(global_batch) + " is not divisible by data " + s(dp)});
        continue;
      }
      const int64_t per_replica = global_batch / dp;
      for (int64_t mb = 1; mb <= std::min(per_replica, o.max_micro_batch); ++mb) {
        if (per_replica % mb) continue;
        if (o.sequence_parallel && tp > 1 && (mb * m.seq_length / cp) % tp) continue;
        const int64_t mcount = per_replica / mb;
        for (int v = 1; v <= o.max_virtual_pipeline; ++v) {
          if (m.num_layers % (int64_t(pp) * v)) continue;
          if (v > 1 && (pp == 1 || mcount % pp)) continue;
          for (Recompute rc : modes)
            for (bool dist : {false, true}) {
              if (dist && dp * cp == 1) continue;
              if (o.distributed_optimizer && *o.distributed_optimizer != dist && dp * cp > 1) continue;
              LayoutSpec l;
              l.tp = tp, l.pp = pp, l.vpp = v, l.dp = dp, l.cp = cp;
              l.micro_batch = mb, l.global_batch = global_batch;
              l.sequence_parallel = o.sequence_parallel && tp > 1;
              l.distributed_optimizer = dist;
              l.recompute = rc;
              l.dtype = o.dtype;
              l.grad_dtype = o.grads_in_compute_dtype ? o.dtype : DType::F32;
              l.p2p_scatter_gather = o.p2p_scatter_gather;
              l.materialized_attention = o.materialized_attention;
              l.unfused_cross_entropy = o.unfused_cross_entropy;
              l.regather_sp_inputs = o.regather_sp_inputs;
              l.overlaps = applicable_overlaps(o.overlaps, l);
              l.tp_comm_overlap = l.overlaps.tp;  // overlapped tp collectives take the row-block path
              l.checkpoint_snapshot = o.checkpoint_snapshot;
              l.snapshot_optimizer_state = o.snapshot_optimizer_state;
              plan.layouts.push_back(evaluate_layout(m, l, hw, o.send_buffers));
            }
        }
      }
    }
    }
  }
  std::stable_sort(plan.layouts.begin(), plan.layouts.end(), [](const PlanEntry& a, const PlanEntry& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits) return a.time.step_s < b.time.step_s;
    return a.memory.total() < b.memory.total();
  });
  return plan;
}

}  // namespace gpt
