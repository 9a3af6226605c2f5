// Layout planner: built-in hardware, the analytic time model and the enumeration (see planner.h).
#include "parallel/planner.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "parallel/pipeline_schedule.h"

namespace gpt {

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

std::vector<HardwareSpec> make_builtins() {
  // Data-sheet peaks (dense, no sparsity) and links; efficiencies as measured by GEMM, STREAM-like and
  // NCCL benchmarks on such machines (large GEMMs ~70% of peak end to end, NCCL bus bandwidth ~75% of
  // NVLink, ~80% of InfiniBand).
  HardwareSpec a100;
  a100.name = "a100-80g";
  a100.description = "NVIDIA A100 SXM4 80 GB, 8 per node (NVSwitch), one 200 Gb/s HDR InfiniBand link per GPU";
  a100.peak_tflops_16bit = 312;
  a100.peak_tflops_fp32 = 19.5;
  a100.matmul_efficiency = 0.7;
  a100.memory_gib = 80;
  a100.memory_reserved_gib = 2;
  a100.memory_bandwidth_gbs = 2039;
  a100.devices_per_node = 8;
  a100.intra_node_bandwidth_gbs = 300;
  a100.inter_node_bandwidth_gbs = 25;

  HardwareSpec h100 = a100;
  h100.name = "h100-80g";
  h100.description = "NVIDIA H100 SXM5 80 GB, 8 per node (NVSwitch), one 400 Gb/s NDR InfiniBand link per GPU";
  h100.peak_tflops_16bit = 989;
  h100.peak_tflops_fp32 = 67;
  h100.memory_gib = 79.6;
  h100.memory_bandwidth_gbs = 3350;
  h100.intra_node_bandwidth_gbs = 450;
  h100.inter_node_bandwidth_gbs = 50;

  HardwareSpec h200 = h100;
  h200.name = "h200";
  h200.description = "NVIDIA H200 SXM 141 GB, 8 per node (NVSwitch), one 400 Gb/s NDR InfiniBand link per GPU";
  h200.memory_gib = 140.4;
  h200.memory_bandwidth_gbs = 4800;
  return {a100, h100, h200};
}

const std::vector<HardwareSpec>& builtins() {
  static const std::vector<HardwareSpec> list = make_builtins();
  return list;
}

// A collective over n ranks placed `per_node` to a node: a ring inside the node, then a ring over the
// nodes on 1/per_node of the data each (every member uses its own network link). `ring_factor` is 2 for
// an all-reduce and 1 for an all-gather or a reduce-scatter; `bytes` is the full buffer.
double collective_seconds(double bytes, int n, int per_node, double ring_factor, const HardwareSpec& hw) {
  if (n <= 1) return 0;
  per_node = std::max(1, std::min(per_node, n));
  const int nodes = (n + per_node - 1) / per_node;
  const double intra_bw = hw.intra_node_bandwidth_gbs * 1e9 * hw.intra_node_efficiency;
  const double inter_bw = hw.inter_node_bandwidth_gbs * 1e9 * hw.inter_node_efficiency;
  double t = 0;
  if (per_node > 1)
    t += ring_factor * ((per_node - 1.0) / per_node * bytes / intra_bw + (per_node - 1) * hw.intra_node_latency_us * 1e-6);
  if (nodes > 1)
    t += ring_factor * ((nodes - 1.0) / nodes * bytes / per_node / inter_bw + (nodes - 1) * hw.inter_node_latency_us * 1e-6);
  return t;
}

double p2p_seconds(double bytes, bool inter_node, const HardwareSpec& hw) {
  if (inter_node) return bytes / (hw.inter_node_bandwidth_gbs * 1e9 * hw.inter_node_efficiency) + hw.inter_node_latency_us * 1e-6;
  return bytes / (hw.intra_node_bandwidth_gbs * 1e9 * hw.intra_node_efficiency) + hw.intra_node_latency_us * 1e-6;
}

// Per-device throughputs for one layout's compute dtype.
struct Rates {
  double matmul = 0, attention = 0, memory = 0;  // FLOP/s, FLOP/s, B/s
  double dsize = 4;
};

Rates rates_for(const HardwareSpec& hw, DType dtype) {
  Rates r;
  const double peak = (dtype == DType::F32 ? hw.peak_tflops_fp32 : hw.peak_tflops_16bit) * 1e12;
  r.matmul = peak * hw.matmul_efficiency;
  r.attention = peak * (hw.attention_efficiency > 0 ? hw.attention_efficiency : hw.matmul_efficiency);
  r.memory = hw.memory_bandwidth_gbs * 1e9 * hw.memory_efficiency;
  r.dsize = static_cast<double>(dtype_size(dtype));
  return r;
}

// y[M, N] = x[M, K] . w[N, K]^T as a roofline.
double gemm_seconds(double M, double N, double K, const Rates& r) {
  const double flops = 2 * M * N * K, bytes = (M * K + N * K + M * N) * r.dsize;
  return std::max(flops / r.matmul, bytes / r.memory);
}

// Times of one microbatch through the pieces of a stage, on one device.
struct PieceTimes {
  double layer_fwd = 0, layer_bwd = 0, layer_tp_fwd = 0, layer_tp_bwd = 0;  // one transformer block
  double embed_fwd = 0, embed_bwd = 0, embed_tp = 0;
  double head = 0, head_tp = 0;  // final layernorm + LM head + loss, forward and backward
};

PieceTimes piece_times(const ModelDims& m, const LayoutSpec& l, const HardwareSpec& hw) {
  const Rates r = rates_for(hw, l.dtype);
  const double t = l.tp, b = static_cast<double>(l.micro_batch), s = static_cast<double>(m.seq_length);
  const double h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn);
  const double N = b * s, V = static_cast<double>(m.padded_vocab(l.tp));
  const bool sp = l.sequence_parallel && l.tp > 1;
  const double rows = sp ? N / t : N;
  const double X = rows * h * r.dsize, Xf = N * h * r.dsize, F = N * f / t * r.dsize;

  const double gemms = gemm_seconds(N, 3 * h / t, h, r) + gemm_seconds(N, h, h / t, r) + gemm_seconds(N, f / t, h, r) +
                       gemm_seconds(N, h, f / t, r);
  // QK^T and PV for the local heads. Fused, q, k, v and the output cross memory once; materialised
  // (LayoutSpec::materialized_attention), the fp32 probabilities [b, a/t, s, s] are written and read too.
  const double probs = l.materialized_attention ? 4 * b * (static_cast<double>(m.heads) / t) * s * s : 0;
  const double attention =
      std::max(4 * b * s * s * h / t / r.attention, (2 * probs + 4 * N * h / t * r.dsize) / r.memory);
  // ln1 and ln2 (read, write), two residual adds (2 reads, 1 write), GELU (read, write).
  const double elementwise = (10 * X + 2 * F) / r.memory;
  PieceTimes p;
  const double fwd = gemms + attention + elementwise;
  p.layer_fwd = fwd;
  p.layer_bwd = 2 * fwd;
  if (!l.materialized_attention) p.layer_bwd += attention / 2;  // fused backward recomputes QK^T: 5 products to 2
  if (l.recompute == Recompute::Full) p.layer_bwd += fwd;
  if (l.recompute == Recompute::Selective)  // Megatron's: the attention core; this codebase's: the GELU output
    p.layer_bwd += l.materialized_attention ? attention : 2 * F / r.memory;
  const int per_node_tp = std::min(l.tp, hw.devices_per_node);  // TP groups are consecutive ranks
  const double ring = collective_seconds(Xf, l.tp, per_node_tp, 2, hw);  // all-reduce = all-gather + reduce-scatter
  p.layer_tp_fwd = 2 * ring;
  p.layer_tp_bwd = 2 * ring + (l.recompute == Recompute::Full ? 2 * ring : 0);

  p.embed_fwd = 2 * Xf / r.memory;
  p.embed_bwd = 2 * Xf / r.memory;
  p.embed_tp = ring;  // all-reduce of the lookup (reduce-scatter, then all-gather in backward, under SP)
  // Logits are fp32 [N, V/t]: written, read for the max, the sum and the backward (which overwrites them).
  const double logits = 4 * N * V / t;
  p.head = 3 * gemm_seconds(N, V / t, h, r) + 5 * logits / r.memory + 5 * X / r.memory;
  // Input gather (SP) and the reduction of dx; max, sum and target logit are three small all-reduces.
  p.head_tp = ring + 3 * collective_seconds(4 * N, l.tp, per_node_tp, 2, hw);
  return p;
}

int nodes_spanned(int ranks, int devices_per_node) { return (ranks + devices_per_node - 1) / devices_per_node; }

}  // namespace

double HardwareSpec::usable_memory_bytes() const { return (memory_gib - memory_reserved_gib) * GiB; }

void HardwareSpec::validate() const {
  auto need = [&](bool ok, const char* field, const std::string& what) {
    if (!ok) throw std::invalid_argument("hardware '" + name + "': " + field + " " + what);
  };
  need(peak_tflops_16bit > 0, "peak_tflops_16bit", "must be > 0");
  need(peak_tflops_fp32 > 0, "peak_tflops_fp32", "must be > 0");
  need(matmul_efficiency > 0 && matmul_efficiency <= 1, "matmul_efficiency", "must lie in (0, 1]");
  // Counted against the dense 4 b s^2 h FLOPs: a causal kernel that skips the masked half can reach 2.
  need(attention_efficiency >= 0 && attention_efficiency <= 2, "attention_efficiency", "must lie in [0, 2]");
  need(memory_gib > 0, "memory_gib", "must be > 0");
  need(memory_reserved_gib >= 0 && memory_reserved_gib < memory_gib, "memory_reserved_gib", "must lie in [0, memory_gib)");
  need(memory_bandwidth_gbs > 0, "memory_bandwidth_gbs", "must be > 0");
  need(memory_efficiency > 0 && memory_efficiency <= 1, "memory_efficiency", "must lie in (0, 1]");
  need(devices_per_node >= 1, "devices_per_node", "must be >= 1");
  need(intra_node_bandwidth_gbs > 0, "intra_node_bandwidth_gbs", "must be > 0");
  need(inter_node_bandwidth_gbs > 0, "inter_node_bandwidth_gbs", "must be > 0");
  need(intra_node_efficiency > 0 && intra_node_efficiency <= 1, "intra_node_efficiency", "must lie in (0, 1]");
  need(inter_node_efficiency > 0 && inter_node_efficiency <= 1, "inter_node_efficiency", "must lie in (0, 1]");
  need(intra_node_latency_us >= 0, "intra_node_latency_us", "must be >= 0");
  need(inter_node_latency_us >= 0, "inter_node_latency_us", "must be >= 0");
}

const HardwareSpec* builtin_hardware(const std::string& name) {
  for (const HardwareSpec& h : builtins())
    if (h.name == name) return &h;
  return nullptr;
}

std::vector<std::string> builtin_hardware_names() {
  std::vector<std::string> names;
  for (const HardwareSpec& h : builtins()) names.push_back(h.name);
  return names;
}

double megatron_flops_per_step(const ModelDims& m, const LayoutSpec& l) {
  const double s = static_cast<double>(m.seq_length), h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn);
  const double layer_gemm = 2 * s * (4 * h * h + 2 * h * f), layer_attention = 4 * s * s * h;  // forward, per sample
  double passes_gemm = 3, passes_attention = 3;  // forward + backward (2x)
  if (l.recompute == Recompute::Full) passes_gemm = passes_attention = 4;
  if (l.recompute == Recompute::Selective) passes_attention = 4;
  const double head = 6 * s * h * static_cast<double>(m.padded_vocab(l.tp));
  return static_cast<double>(l.global_batch) *
         (static_cast<double>(m.num_layers) * (passes_gemm * layer_gemm + passes_attention * layer_attention) + head);
}

double pipeline_step_seconds(int64_t microbatches, int vpp, const std::vector<double>& stage_seconds) {
  double max = 0, sum = 0;
  for (double t : stage_seconds) max = std::max(max, t), sum += t;
  return static_cast<double>(microbatches) * max + (sum - max) / vpp;
}

TimeEstimate estimate_time(const ModelDims& m, const LayoutSpec& l, const HardwareSpec& hw) {
  validate_layout(m, l);
  const PieceTimes pt = piece_times(m, l, hw);
  const int p = l.pp, v = l.vpp, G = hw.devices_per_node;
  const double mbs = static_cast<double>(l.microbatches());
  const Rates r = rates_for(hw, l.dtype);
  const bool sp = l.sequence_parallel && l.tp > 1;
  const double X = (sp ? l.micro_batch * m.seq_length / l.tp : l.micro_batch * m.seq_length) * m.hidden * r.dsize;
  // Pipeline neighbours are tp * dp ranks apart: once the pipeline spans nodes, some hop crosses one.
  const bool pp_inter = nodes_spanned(l.tp * l.dp * p, G) > 1;
  double recv = p2p_seconds(X, pp_inter, hw);
  if (l.p2p_scatter_gather && l.tp > 1 && !sp)  // 1/tp of it per rank, then an all-gather inside the node
    recv = p2p_seconds(X / l.tp, pp_inter, hw) + collective_seconds(X, l.tp, std::min(l.tp, G), 1, hw);

  // Per-microbatch time of every stage, split into compute, TP and p2p.
  double s_max = 0;
  std::vector<double> stage_seconds;
  TimeEstimate e;
  double max_compute = 0, max_tp = 0, max_p2p = 0;
  for (int rank = 0; rank < p; ++rank) {
    double compute = 0, tp = 0, p2p = 0;
    for (int c = 0; c < v; ++c) {
      auto [begin, end] = chunk_layer_range(static_cast<int>(m.num_layers), p, v, rank, c);
      const int stage = c * p + rank;
      const double layers = end - begin;
      compute += layers * (pt.layer_fwd + pt.layer_bwd);
      tp += layers * (pt.layer_tp_fwd + pt.layer_tp_bwd);
      if (stage == 0) compute += pt.embed_fwd + pt.embed_bwd, tp += pt.embed_tp;
      if (stage == p * v - 1) compute += pt.head, tp += pt.head_tp;
      if (stage > 0) p2p += recv;              // activation in
      if (stage < p * v - 1) p2p += recv;      // gradient in
    }
    const double total = compute + tp + p2p;
    stage_seconds.push_back(total);
    if (total > s_max) s_max = total, max_compute = compute, max_tp = tp, max_p2p = p2p;
  }
  const double pipeline = pipeline_step_seconds(l.microbatches(), v, stage_seconds);
  e.compute_s = mbs * max_compute;
  e.tp_comm_s = mbs * max_tp;
  e.pp_comm_s = mbs * max_p2p;
  e.bubble_s = pipeline - mbs * s_max;
  e.bubble_fraction = e.bubble_s / (mbs * s_max);

  // Data parallel: the group is dp ranks tp apart; tp | devices_per_node puts devices_per_node / tp of
  // them on each node (or all of them, when the group is smaller).
  double dp = 0, optimizer = 0, buffer_bytes = 0;
  int64_t stage_params = 0;
  for (int rank = 0; rank < p; ++rank) {
    int64_t n = 0;
    for (int64_t c : chunk_parameter_counts(m, l, rank)) n += c;
    stage_params = std::max(stage_params, n);
  }
  const double gsize = static_cast<double>(dtype_size(l.grad_dtype));
  buffer_bytes = gsize * static_cast<double>(stage_params);
  const int per_node_dp = std::max(1, std::min(l.dp, G / std::max(1, l.tp)));
  const bool sharded = l.distributed_optimizer && l.dp > 1;
  if (sharded) {
    dp = collective_seconds(buffer_bytes, l.dp, per_node_dp, 1, hw) +
         collective_seconds(buffer_bytes / gsize * r.dsize, l.dp, per_node_dp, 1, hw);
  } else {
    dp = collective_seconds(buffer_bytes, l.dp, per_node_dp, 2, hw);
  }
  if (p > 1) {  // tied word embedding: first and last stage, p * tp * dp ranks apart
    const double table = gsize * static_cast<double>(m.padded_vocab(l.tp) / l.tp * m.hidden);
    dp += collective_seconds(table, 2, nodes_spanned(l.tp * l.dp * p, G) > 1 ? 1 : 2, 2, hw);
  }
  // AdamW over this rank's shard: master, m, v read and written, gradient read; the cast back to the
  // compute dtype; zeroing, norm and clipping passes over the gradients.
  const double shard = static_cast<double>(stage_params) / (sharded ? l.dp : 1);
  optimizer = (shard * (28 + 4 + r.dsize + 4 + 8) + static_cast<double>(stage_params) * gsize) / r.memory;
  e.dp_comm_s = dp;
  e.optimizer_s = optimizer;
  e.step_s = pipeline + dp + optimizer;
  e.flops_per_step = megatron_flops_per_step(m, l);
  e.tflops_per_device = e.flops_per_step / e.step_s / l.world() / 1e12;
  return e;
}

PlanEntry evaluate_layout(const ModelDims& m, const LayoutSpec& l, const HardwareSpec& hw, SendBuffers sends) {
  PlanEntry e;
  e.layout = l;
  e.memory = estimate_peak_memory(m, l, sends);
  e.time = estimate_time(m, l, hw);
  e.fits = static_cast<double>(e.memory.total()) <= hw.usable_memory_bytes();
  return e;
}

Plan make_plan(const ModelDims& m, int64_t global_batch, const HardwareSpec& hw_in, const PlanOptions& o) {
  if (o.devices < 1) throw std::invalid_argument("plan: the number of devices must be at least 1");
  Plan plan;
  plan.hardware = hw_in;
  if (o.devices_per_node > 0) plan.hardware.devices_per_node = o.devices_per_node;
  plan.hardware.validate();
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
    else if (m.ffn % tp)
      why = "ffn_hidden_size " + s(m.ffn) + " is not divisible by tensor " + s(tp);
    if (!why.empty()) {
      plan.rejected.push_back({tp, 0, 0, why});
      continue;
    }
    for (int pp = 1; pp <= N / tp; ++pp) {
      if ((N / tp) % pp) continue;
      const int dp = N / (tp * pp);
      if (m.num_layers % pp) {
        plan.rejected.push_back({tp, pp, dp, "num_layers " + s(m.num_layers) + " is not divisible by pipeline " + s(pp)});
        continue;
      }
      if (global_batch % dp) {
        plan.rejected.push_back({tp, pp, dp, "global batch " + s(global_batch) + " is not divisible by data " + s(dp)});
        continue;
      }
      const int64_t per_replica = global_batch / dp;
      for (int64_t mb = 1; mb <= std::min(per_replica, o.max_micro_batch); ++mb) {
        if (per_replica % mb) continue;
        if (o.sequence_parallel && tp > 1 && (mb * m.seq_length) % tp) continue;
        const int64_t mcount = per_replica / mb;
        for (int v = 1; v <= o.max_virtual_pipeline; ++v) {
          if (m.num_layers % (int64_t(pp) * v)) continue;
          if (v > 1 && (pp == 1 || mcount % pp)) continue;
          for (Recompute rc : modes)
            for (bool dist : {false, true}) {
              if (dist && dp == 1) continue;
              if (o.distributed_optimizer && *o.distributed_optimizer != dist && dp > 1) continue;
              LayoutSpec l;
              l.tp = tp, l.pp = pp, l.vpp = v, l.dp = dp;
              l.micro_batch = mb, l.global_batch = global_batch;
              l.sequence_parallel = o.sequence_parallel && tp > 1;
              l.distributed_optimizer = dist;
              l.recompute = rc;
              l.dtype = o.dtype;
              l.grad_dtype = o.grads_in_compute_dtype ? o.dtype : DType::F32;
              l.p2p_scatter_gather = o.p2p_scatter_gather;
              l.materialized_attention = o.materialized_attention;
              plan.layouts.push_back(evaluate_layout(m, l, hw, o.send_buffers));
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
