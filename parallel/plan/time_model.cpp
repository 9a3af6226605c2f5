// The planner's time model (see time_model.h): per-GEMM costs by shape, the collectives of each
// parallelism, the overlap rule, and the per-step breakdown.
#include "parallel/plan/time_model.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "parallel/pipeline/pipeline_schedule.h"

namespace gpt {

namespace {

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

// Compute that runs beside communication is slowed by it (the communication kernels take SMs and memory
// bandwidth): by 18.9% on average over GPT and LLaMA layers on A100, H100, MI250 and MI210 (Lee et al.
// 2025, "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning",
// arXiv:2507.03114, abstract and sec. 5).
constexpr double kOverlapSlowdown = 0.189;

// The overlap rule: a transfer beside `compute` seconds of work costs what the work cannot cover, plus the
// slowdown of the work it does cover.
double exposed(double transfer, double compute, bool overlapped) {
  if (!overlapped) return transfer;
  return std::max(0.0, transfer - compute) + kOverlapSlowdown * std::min(transfer, compute);
}

// The part of a transfer that the overlap hides.
double covered(double transfer, double compute, bool overlapped) { return overlapped ? std::min(transfer, compute) : 0; }

int nodes_spanned(int ranks, int devices_per_node) { return (ranks + devices_per_node - 1) / devices_per_node; }

// Per-device throughputs for one layout's compute dtype.
struct Rates {
  double peak = 0, attention = 0, memory = 0;  // FLOP/s, FLOP/s, B/s
  double loss = 0, optimizer = 0;              // B/s of the cross-entropy and optimizer passes as charged
  double dsize = 4;
  const GemmEfficiencyTable* gemms = nullptr;
};

Rates rates_for(const HardwareSpec& hw, DType dtype) {
  Rates r;
  r.peak = (dtype == DType::F32 ? hw.peak_tflops_fp32 : hw.peak_tflops_16bit) * 1e12 * hw.in_step_compute_fraction;
  r.attention = r.peak * (hw.attention_efficiency > 0 ? hw.attention_efficiency : hw.gemm_efficiency.best());
  r.memory = hw.memory_bandwidth_gbs * 1e9 * hw.memory_efficiency;
  r.loss = hw.loss_bandwidth_gbs > 0 ? hw.loss_bandwidth_gbs * 1e9 : r.memory;
  r.optimizer = hw.optimizer_bandwidth_gbs > 0 ? hw.optimizer_bandwidth_gbs * 1e9 : r.memory;
  r.dsize = static_cast<double>(dtype_size(dtype));
  r.gemms = &hw.gemm_efficiency;
  return r;
}

// One product C[m, n] = A[m, k] . B[k, n] as a roofline.
struct Gemm {
  double m = 0, n = 0, k = 0, efficiency = 0, seconds = 0;
  double flops() const { return 2 * m * n * k; }
  std::string str() const { return fmt::format("{:.0f}x{:.0f}x{:.0f} at {:.0f}%", m, n, k, 100 * efficiency); }
};

Gemm gemm(double m, double n, double k, const Rates& r) {
  Gemm g{m, n, k, r.gemms->at(m, n, k), 0};
  g.seconds = std::max(2 * m * n * k / (r.peak * g.efficiency), (m * k + n * k + m * n) * r.dsize / r.memory);
  return g;
}

// y[rows, out] = x[rows, in] . W[out, in]^T: the forward, input-gradient and weight-gradient products.
struct Linear {
  Gemm fprop, dgrad, wgrad;
  double forward() const { return fprop.seconds; }
  double backward() const { return dgrad.seconds + wgrad.seconds; }
  double flops() const { return fprop.flops() + dgrad.flops() + wgrad.flops(); }
  std::string str() const {
    return "forward " + fprop.str() + ", input gradient " + dgrad.str() + ", weight gradient " + wgrad.str();
  }
};

Linear linear(double rows, double in, double out, const Rates& r) {
  return {gemm(rows, out, in, r), gemm(rows, in, out, r), gemm(out, in, rows, r)};
}

// A tensor-parallel collective and what the tp overlap runs it beside: Transformer Engine splits that
// GEMM into pieces so the transfer of one piece runs under the product of another (`split` seconds for
// the pieces together, more than the whole product when the pieces are small). split = 0: nothing can
// (an all-reduce waits for the product that makes its input).
struct Collective {
  double seconds = 0;
  double gemm = 0;   // the product it is paired with, unsplit
  double split = 0;  // the same product in Transformer Engine's pieces
  double slowdown = kOverlapSlowdown;  // of the product, over the part it covers (or all of it: whole)
  bool whole = false;   // the slowdown lasts the whole product (SMs reserved for it), not the transfer
  bool always = false;  // overlapped even without the tp overlap (Megatron's asynchronous re-gather)
  // Exposed time with the overlap: what the pieces cannot cover, what splitting costs them and the
  // slowdown of the part they cover.
  double overlapped() const {
    return std::max(0.0, seconds - split) + slowdown * (whole ? split : std::min(seconds, split)) + (split - gemm);
  }
  double hidden() const { return std::min(seconds, split); }
};

// The same product in `pieces` row blocks (Transformer Engine's ring exchange: one block per tp rank;
// its pipelined reduce-scatter: 4).
double split_seconds(const Gemm& g, int pieces, const Rates& r) {
  return pieces * gemm(g.m / pieces, g.n, g.k, r).seconds;
}

// One microbatch through one transformer block on one device.
struct LayerCosts {
  Linear qkv, proj, fc1, fc2;
  double attention_fwd = 0, attention_bwd = 0;
  double elementwise_fwd = 0, elementwise_bwd = 0;
  double recompute = 0;  // added to the backward: full reruns the forward, selective one piece of it
  std::vector<Collective> tp;  // forward, backward and recompute collectives in order
  // Context parallelism's ring: every K/V hop of forward (again for a full recompute) and backward, and
  // what the block attention running beside each hop leaves exposed (model/ring_attention.h).
  double cp_total = 0, cp_exposed = 0;
  double gemm_flops = 0;       // of the four linears, forward and backward, the recomputed forward included
  double gemms_fwd() const { return qkv.forward() + proj.forward() + fc1.forward() + fc2.forward(); }
  double fwd() const { return gemms_fwd() + attention_fwd + elementwise_fwd; }
  double bwd() const {
    return qkv.backward() + proj.backward() + fc1.backward() + fc2.backward() + attention_bwd + elementwise_bwd +
           recompute;
  }
  double tp_total() const {
    double t = 0;
    for (const Collective& c : tp) t += c.seconds;
    return t;
  }
  double tp_exposed(bool overlap) const {
    double t = 0;
    for (const Collective& c : tp) t += (overlap || c.always) && c.split > 0 ? c.overlapped() : c.seconds;
    return t;
  }
  double tp_hidden(bool overlap) const {
    double t = 0;
    for (const Collective& c : tp) t += (overlap || c.always) && c.split > 0 ? c.hidden() : 0;
    return t;
  }
};

LayerCosts layer_costs(const ModelDescription& m, const LayoutSpec& l, const HardwareSpec& hw, const Rates& r) {
  // s: this rank's positions of each sequence (all of them, or seq_length / cp under context parallelism),
  // whose queries meet all seq_length keys.
  const double t = l.tp, b = static_cast<double>(l.micro_batch), seq = static_cast<double>(m.seq_length);
  const double s = seq / l.cp;
  const double h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn);
  const double D = static_cast<double>(m.head_dim()), H = static_cast<double>(m.heads);
  const double G = static_cast<double>(m.query_groups());
  const double qkv_width = static_cast<double>(m.qkv_width()), fc1_width = static_cast<double>(m.fc1_width());
  const double N = b * s;
  const bool sp = l.sequence_parallel && l.tp > 1;
  const double rows = sp ? N / t : N;
  const double X = rows * h * r.dsize, Xf = N * h * r.dsize, F = N * f / t * r.dsize;
  const double F1 = N * fc1_width / t * r.dsize;  // fc1's output: [gate | up] for SwiGLU
  LayerCosts c;
  // q | k | v: H query heads and G key/value groups of width D; the MLP's first matrix is 2f wide for SwiGLU.
  c.qkv = linear(N, h, qkv_width / t, r);
  c.proj = linear(N, H * D / t, h, r);
  c.fc1 = linear(N, h, fc1_width / t, r);
  c.fc2 = linear(N, f / t, h, r);
  // QK^T and PV for the local heads. Fused, q, k, v and the output cross memory once, and the backward
  // recomputes QK^T (5 products to the forward's 2). Materialised (Megatron-LM's 2021 attention,
  // LayoutSpec::materialized_attention), every element of the [b, a/t, s, s] scores crosses memory in
  // the compute dtype: forward, QK^T writes the scores, the softmax reads them and writes the
  // probabilities, dropout reads those and writes the dropped probabilities and a one-byte mask, PV reads
  // them (6 d + 1 bytes); backward, PV's product writes their gradient, dropout's backward reads it and
  // the mask and writes the probabilities' gradient, the softmax backward reads it and the probabilities
  // and writes the scores' gradient, which the two products of QK^T's backward read, and PV's weight
  // gradient reads the dropped probabilities again (9 d + 1 bytes).
  const double qkvo = N * (qkv_width + H * D) / t * r.dsize;
  const double core_flops = 4 * b * s * seq * H * D / t;
  if (l.materialized_attention) {
    const double scores = b * (static_cast<double>(m.heads) / t) * s * seq;
    c.attention_fwd = std::max(core_flops / r.attention, (scores * (6 * r.dsize + 1) + qkvo) / r.memory);
    c.attention_bwd = std::max(2 * core_flops / r.attention, (scores * (9 * r.dsize + 1) + 2 * qkvo) / r.memory);
  } else {
    c.attention_fwd = std::max(core_flops / r.attention, qkvo / r.memory);
    c.attention_bwd = 2.5 * c.attention_fwd;
  }
  // ln1 and ln2 (read, write; LayerNorm and RMSNorm alike), two residual adds (2 reads, 1 write), the
  // activation (GELU reads fc1 and writes act; SwiGLU reads the gate and the up halves), the rotary
  // encoding in place on the rotated dims of q and k (read, write); backward twice.
  const double rope = 2 * N * (H + G) * static_cast<double>(m.rotary_dims()) / t * r.dsize;
  const double activation = F1 + F;
  c.elementwise_fwd = (10 * X + activation + rope) / r.memory;
  c.elementwise_bwd = 2 * c.elementwise_fwd;
  c.gemm_flops = c.qkv.flops() + c.proj.flops() + c.fc1.flops() + c.fc2.flops();
  if (l.recompute == Recompute::Full) {
    c.recompute = c.fwd();
    c.gemm_flops += c.qkv.fprop.flops() + c.proj.fprop.flops() + c.fc1.fprop.flops() + c.fc2.fprop.flops();
  }
  if (l.recompute == Recompute::Selective)  // Megatron's: the attention core; this codebase's: the activation
    c.recompute = l.materialized_attention ? c.attention_fwd : activation / r.memory;

  if (l.cp > 1) {
    // Each ring step sends this rank's keys and values (and in backward the fp32 dK/dV partial sums one
    // step behind) to the next rank of the group, tp ranks away, beside one step's block attention (1/cp of
    // the rank's attention work: every step is two full blocks). Forward: cp - 1 hops; backward: cp - 1
    // hops of both, and the last dK/dV hop with nothing beside it.
    const double kv = N * 2 * G * D / t, cp = l.cp;
    const bool inter = nodes_spanned(l.tp * l.cp, hw.devices_per_node) > 1;
    const double fwd_hop = p2p_seconds(kv * r.dsize, inter, hw), bwd_hop = p2p_seconds(kv * (r.dsize + 4), inter, hw);
    const double last_hop = p2p_seconds(kv * 4, inter, hw);
    const int forwards = l.recompute == Recompute::Full ? 2 : 1;
    c.cp_total = forwards * (cp - 1) * fwd_hop + (cp - 1) * bwd_hop + last_hop;
    c.cp_exposed = forwards * (cp - 1) * exposed(fwd_hop, c.attention_fwd / cp, true) +
                   (cp - 1) * exposed(bwd_hop, c.attention_bwd / cp, true) + last_hop;
  }

  if (l.tp > 1) {
    const int per_node = std::min(l.tp, hw.devices_per_node);  // TP groups are consecutive ranks
    if (sp) {
      // Each all-gather or reduce-scatter of the full rows, paired as Transformer Engine pairs them
      // (transformer_engine/pytorch/module/base.py, initialize_ub): all-gathers by ring exchange under the
      // qkv and fc1 forward and the proj and fc2 input-gradient products, split into tp row blocks;
      // reduce-scatters pipelined with the proj and fc2 forward products in 4 blocks, and in bulk with
      // the qkv and fc1 weight-gradient products.
      const double half = collective_seconds(Xf, l.tp, per_node, 1, hw);
      // With Transformer Engine's userbuffers a ring exchange runs on the copy engines and takes no SMs
      // from the GEMM (the copies' memory traffic is not charged); a pipelined or bulk transfer takes 16
      // SMs, so the GEMM beside it runs on the rest. Otherwise the average slowdown.
      const bool ub = l.overlaps.tp_userbuffers && hw.sm_count > 16;
      const double ring_slowdown = ub ? 0 : kOverlapSlowdown;
      const double sm_slowdown = ub ? 16 / (hw.sm_count - 16) : kOverlapSlowdown;
      auto ring = [&](const Gemm& g) {
        return Collective{half, g.seconds, split_seconds(g, l.tp, r), ring_slowdown, false, false};
      };
      auto pipelined = [&](const Gemm& g) {
        return Collective{half, g.seconds, split_seconds(g, 4, r), sm_slowdown, ub, false};
      };
      auto bulk = [&](const Gemm& g) { return Collective{half, g.seconds, g.seconds, sm_slowdown, ub, false}; };
      const std::vector<Collective> forward = {ring(c.qkv.fprop), pipelined(c.proj.fprop), ring(c.fc1.fprop),
                                               pipelined(c.fc2.fprop)};
      c.tp = forward;
      c.tp.insert(c.tp.end(), {ring(c.fc2.dgrad), bulk(c.fc1.wgrad), ring(c.proj.dgrad), bulk(c.qkv.wgrad)});
      // Megatron's re-gathered inputs of fc1 and qkv, in bulk beside their input-gradient products
      // (Transformer Engine's bulk dgrad overlap; without it Megatron starts the all-gather asynchronously
      // before the same product, LinearWithGradAccumulationAndAsyncCommunication, so it is always beside it).
      if (l.regather_sp_inputs) {
        for (const Gemm* g : {&c.fc1.dgrad, &c.qkv.dgrad}) {
          Collective regather = bulk(*g);
          if (!l.overlaps.tp) regather.slowdown = kOverlapSlowdown, regather.whole = false;
          regather.always = true;
          c.tp.push_back(regather);
        }
      }
      if (l.recompute == Recompute::Full) c.tp.insert(c.tp.end(), forward.begin(), forward.end());
    } else {
      // All-reduces of a GEMM's output: nothing runs beside them.
      const double ar = collective_seconds(Xf, l.tp, per_node, 2, hw);
      const int count = l.recompute == Recompute::Full ? 6 : 4;
      c.tp.assign(count, Collective{ar, 0, 0});
    }
  }
  return c;
}

// The embedding and the LM head with the loss, for one microbatch.
struct EndCosts {
  double embed_fwd = 0, embed_bwd = 0, embed_tp = 0;
  Linear head;
  double head_total = 0, head_tp = 0;  // final layernorm + LM head + loss, forward and backward
};

EndCosts end_costs(const ModelDescription& m, const LayoutSpec& l, const HardwareSpec& hw, const Rates& r) {
  const double t = l.tp, N = static_cast<double>(l.micro_batch * m.seq_length / l.cp), h = static_cast<double>(m.hidden);
  const double V = static_cast<double>(m.padded_vocab(l.tp));
  const bool sp = l.sequence_parallel && l.tp > 1;
  const double X = (sp ? N / t : N) * h * r.dsize, Xf = N * h * r.dsize;
  const int per_node = std::min(l.tp, hw.devices_per_node);
  const double ring = collective_seconds(Xf, l.tp, per_node, 2, hw);
  EndCosts e;
  e.embed_fwd = 2 * Xf / r.memory;
  e.embed_bwd = 2 * Xf / r.memory;
  e.embed_tp = ring;  // all-reduce of the lookup (reduce-scatter, then all-gather in backward, under SP)
  // Fused, the logits are fp32 [N, V/t]: written, read for the max, the sum and the backward (which
  // overwrites them), 20 bytes each. Megatron's unfused loss (LayoutSpec::unfused_cross_entropy) reads the
  // d-byte logits and writes them in fp32, reads them for the max, reads and writes them to subtract it,
  // to exponentiate and to divide by the sum, reads them for the sum (38 bytes in bf16); its backward
  // scales the softmax in place and casts it back to d bytes (14): 48 + 2d.
  const double loss_bytes = l.unfused_cross_entropy ? 48 + 2 * r.dsize : 20;
  e.head = linear(N, h, V / t, r);
  e.head_total = e.head.forward() + e.head.backward() + loss_bytes * N * V / t / r.loss + 5 * X / r.memory;
  // Input gather (SP) and the reduction of dx; max, sum and target logit are three small all-reduces.
  // Megatron's column-parallel output layer gathers its input again in backward (regather_sp_inputs),
  // beside its input-gradient product.
  e.head_tp = ring + 3 * collective_seconds(4 * N, l.tp, per_node, 2, hw);
  if (sp && l.regather_sp_inputs)
    e.head_tp += Collective{collective_seconds(Xf, l.tp, per_node, 1, hw), e.head.dgrad.seconds, e.head.dgrad.seconds}
                     .overlapped();
  return e;
}

// What the element-wise line of the breakdown covers: "memory traffic of LayerNorm, GELU, residual adds",
// "... of RMSNorm, SwiGLU, rotary encoding, residual adds".
std::string elementwise_note(const ModelDescription& m) {
  return fmt::format("memory traffic of {}, {}{}, residual adds", normalization_name(m.normalization),
                     m.swiglu ? "SwiGLU" : "GELU", m.position == PositionEmbedding::Rope ? ", rotary encoding" : "");
}

// One pipeline rank's work for one microbatch (all its chunks).
struct StageCosts {
  int layers = 0;
  bool first = false, last = false;
  double compute = 0, fwd_compute = 0, bwd_compute = 0;
  double tp = 0, tp_exposed = 0, tp_hidden = 0;
  double p2p = 0, p2p_exposed = 0, p2p_hidden = 0;
  double cp = 0, cp_exposed = 0;
  double total() const { return compute + tp_exposed + p2p_exposed + cp_exposed; }
};

// The data-parallel side of one pipeline rank: its gradient reduction and parameter gather.
struct StageDataParallel {
  double grad = 0, grad_exposed = 0, grad_hidden = 0, param = 0, param_exposed = 0, param_hidden = 0;
  double exposed() const { return grad_exposed + param_exposed; }
};

// Data-parallel transfers beside the pipeline schedule, as Megatron-Core runs them with
// --overlap-grad-reduce and --overlap-param-gather (megatron/core/distributed/distributed_data_parallel.py
// and megatron/core/pipeline_parallel/schedules.py, r0.8): only the first pipeline rank's first model
// chunk is split into buckets (bucket_size is None on later ranks and for later chunks), so its
// gradients reduce bucket by bucket during its last backward and its parameters gather bucket by bucket
// during its first forward, all but the bucket holding the word embedding, which is the last gradient
// bucket to complete and the first parameter bucket needed. Every other chunk is one transfer: its
// gradients reduce once its last backward is done, beside the backward still to run on the stage (in the
// interleaved schedule's cool-down the later chunks' last backwards come first: chunk c has c x p chunk
// passes after it, and rank r finishes r passes before rank 0, which the step waits for); its parameters
// gather before its first forward, beside the warm-up forwards before it (chunks 0 and 1 at the start of
// the step, chunk c + 1 from chunk c's first forward on).
// A transfer that may start at `start` and must be done by `deadline`, in seconds on the step's clock as
// the pipeline's first rank sees it: for a gather from the step's first forward (start <= deadline, both
// >= 0); for a reduction relative to the end of the backward (start <= deadline = 0). A later rank's
// extra window (rank passes) is the time it waits for the first rank, idle.
struct Transfer {
  double seconds = 0, start = 0, deadline = 0;
};

struct TransferCost {
  double exposed = 0, hidden = 0;
};

// Transfers one after another on one stream, in the order given; compute waits for each that misses its
// deadline, and what runs beside compute slows it (the overlap rule). Up to `idle` seconds of what hides
// ran while the rank had no compute (a later pipeline rank waiting for the first) and slows nothing.
TransferCost run_transfers(const std::vector<Transfer>& transfers, double idle) {
  double stream = -1e30, stall = 0, hidden = 0;
  for (const Transfer& t : transfers) {
    const double start = std::max(stream, t.start + stall);
    const double finish = start + t.seconds;
    const double late = std::max(0.0, finish - (t.deadline + stall));
    hidden += std::max(0.0, t.seconds - late);
    stall += late;
    stream = finish;
  }
  return {stall + kOverlapSlowdown * std::max(0.0, hidden - idle), hidden};
}

// A stage's parameters per model chunk (parameter counts, as doubles).
std::vector<double> stage_chunk_counts(const ModelDescription& m, const LayoutSpec& l, int rank) {
  std::vector<double> counts;
  for (int64_t c : chunk_parameter_counts(m, l, rank)) counts.push_back(static_cast<double>(c));
  return counts;
}

// Where a pipeline rank's data-parallel transfers sit: its rank of p, its v chunks, Megatron-Core's
// bucket size and the word embedding's parameters.
struct BucketLayout {
  int rank = 0, p = 1, v = 1;
  double bucket_params = 0, embedding_params = 0;
};

// `total` seconds of a stage's transfer shared over its chunks in proportion to their parameters.
std::vector<double> chunk_seconds(double total, const std::vector<double>& chunks) {
  double params = 0;
  for (double c : chunks) params += c;
  std::vector<double> out;
  for (double c : chunks) out.push_back(params > 0 ? total * c / params : 0);
  return out;
}

// The bucketed chunk's `seconds` split three ways: the bucket that holds the word embedding (at least all
// of it), the bucket next to it (the first layers', one bucket or what is left), and the rest.
struct BucketedChunk {
  double embedding = 0, next = 0, rest = 0;
};
BucketedChunk split_bucketed_chunk(double seconds, double chunk_params, const BucketLayout& b) {
  BucketedChunk out;
  if (chunk_params <= 0) return out;
  out.embedding = seconds * std::min(1.0, std::max(b.bucket_params, b.embedding_params) / chunk_params);
  out.next = std::min(seconds - out.embedding, seconds * std::min(1.0, b.bucket_params / chunk_params));
  out.rest = seconds - out.embedding - out.next;
  return out;
}

// Gradient reductions; `pass` is one chunk's backward of one microbatch. Launch order: the last chunk
// first. The embedding's bucket completes last and the first layers' bucket just before it: neither has
// compute left beside it.
std::vector<Transfer> grad_reduce_transfers(double total, const std::vector<double>& chunks, const BucketLayout& b,
                                            double pass) {
  const std::vector<double> seconds = chunk_seconds(total, chunks);
  std::vector<Transfer> out;
  for (int c = b.v - 1; c >= 0; --c) {
    if (b.rank == 0 && c == 0) {
      const BucketedChunk k = split_bucketed_chunk(seconds[c], chunks[c], b);
      out.push_back({k.rest, -pass, 0});
      out.push_back({k.next, 0, 0});
      out.push_back({k.embedding, 0, 0});
    } else {
      out.push_back({seconds[c], -(c * b.p + b.rank) * pass, 0});
    }
  }
  return out;
}

// Parameter gathers; `pass` is one chunk's forward of one microbatch. Launch order: the first chunk
// first. The embedding's bucket is needed first and the first layers' bucket at once after it.
std::vector<Transfer> param_gather_transfers(double total, const std::vector<double>& chunks, const BucketLayout& b,
                                             double pass) {
  const std::vector<double> seconds = chunk_seconds(total, chunks);
  std::vector<Transfer> out;
  for (int c = 0; c < b.v; ++c) {
    if (b.rank == 0 && c == 0) {
      const BucketedChunk k = split_bucketed_chunk(seconds[c], chunks[c], b);
      out.push_back({k.embedding, 0, 0});
      out.push_back({k.next, 0, 0});
      out.push_back({k.rest, 0, pass});
    } else {
      out.push_back({seconds[c], c <= 1 ? 0 : ((c - 1) * b.p + b.rank) * pass, (c * b.p + b.rank) * pass});
    }
  }
  return out;
}


}  // namespace

double megatron_flops_per_step(const ModelDescription& m, const LayoutSpec& l) {
  const double s = static_cast<double>(m.seq_length), h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn);
  const double q = static_cast<double>(m.heads * m.head_dim());  // query width
  // Forward, per sample: q|k|v, proj, fc1 (two f-wide matrices for SwiGLU) and fc2; QK^T and PV.
  const double widths = static_cast<double>(m.qkv_width() + m.fc1_width());
  const double layer_gemm = 2 * s * h * widths + 2 * s * q * h + 2 * s * f * h;
  const double layer_attention = 4 * s * s * q;
  double passes_gemm = 3, passes_attention = 3;  // forward + backward (2x)
  if (l.recompute == Recompute::Full) passes_gemm = passes_attention = 4;
  if (l.recompute == Recompute::Selective) passes_attention = 4;
  const double head = 6 * s * h * static_cast<double>(m.padded_vocab(l.tp));  // tied or untied alike
  return static_cast<double>(l.global_batch) *
         (static_cast<double>(m.num_layers) * (passes_gemm * layer_gemm + passes_attention * layer_attention) + head);
}

double model_flops_per_step(const ModelDescription& m, const LayoutSpec& l) {
  LayoutSpec plain = l;
  plain.recompute = Recompute::None;
  return megatron_flops_per_step(m, plain);
}

double pipeline_step_seconds(int64_t microbatches, int vpp, const std::vector<double>& stage_seconds) {
  double max = 0, sum = 0;
  for (double t : stage_seconds) max = std::max(max, t), sum += t;
  return static_cast<double>(microbatches) * max + (sum - max) / vpp;
}

TimeEstimate estimate_time(const ModelDescription& m, const LayoutSpec& l, const HardwareSpec& hw,
                           std::vector<CostLine>* details) {
  validate_layout(m, l);
  std::vector<std::string> why_not;
  if (!(applicable_overlaps(l.overlaps, l, &why_not) == l.overlaps))
    throw std::invalid_argument("layout " + l.str() + ": " +
                                (why_not.empty() ? std::string("its overlaps do not match the layout") : why_not.front()));
  const Rates r = rates_for(hw, l.dtype);
  const LayerCosts layer = layer_costs(m, l, hw, r);
  const EndCosts ends = end_costs(m, l, hw, r);
  const Overlaps& ov = l.overlaps;
  const int p = l.pp, v = l.vpp, G = hw.devices_per_node;
  const double mbs = static_cast<double>(l.microbatches());
  const bool sp = l.sequence_parallel && l.tp > 1;
  const int64_t tokens = l.micro_batch * m.seq_length / l.cp;  // this rank's, per microbatch
  const double X = static_cast<double>(sp ? tokens / l.tp : tokens) * static_cast<double>(m.hidden) * r.dsize;
  // Pipeline neighbours are tp * cp * dp ranks apart: once the pipeline spans nodes, some hop crosses one.
  const bool pp_inter = nodes_spanned(l.tp * l.cp * l.dp * p, G) > 1;
  double recv = p2p_seconds(X, pp_inter, hw);
  if (l.p2p_scatter_gather && l.tp > 1 && !sp)  // 1/tp of it per rank, then an all-gather inside the node
    recv = p2p_seconds(X / l.tp, pp_inter, hw) + collective_seconds(X, l.tp, std::min(l.tp, G), 1, hw);

  // Per-microbatch work of every pipeline rank.
  std::vector<StageCosts> stages(p);
  std::vector<double> stage_seconds;
  int slowest = 0;
  for (int rank = 0; rank < p; ++rank) {
    StageCosts& st = stages[rank];
    for (int c = 0; c < v; ++c) {
      auto [begin, end] = chunk_layer_range(static_cast<int>(m.num_layers), p, v, rank, c);
      const int stage = c * p + rank;
      const double layers = end - begin;
      double fwd = layers * layer.fwd(), bwd = layers * layer.bwd();
      st.layers += end - begin;
      st.tp += layers * layer.tp_total();
      st.tp_exposed += layers * layer.tp_exposed(ov.tp);
      st.tp_hidden += layers * layer.tp_hidden(ov.tp);
      st.cp += layers * layer.cp_total, st.cp_exposed += layers * layer.cp_exposed;
      if (stage == 0) {
        st.first = true;
        fwd += ends.embed_fwd, bwd += ends.embed_bwd;
        st.tp += ends.embed_tp, st.tp_exposed += ends.embed_tp;
      }
      if (stage == p * v - 1) {  // the executor runs the head's forward and backward with the loss
        st.last = true;
        fwd += ends.head_total;
        st.tp += ends.head_tp, st.tp_exposed += ends.head_tp;
      }
      if (stage > 0) {  // activation in
        st.p2p += recv, st.p2p_exposed += exposed(recv, fwd, ov.p2p), st.p2p_hidden += covered(recv, fwd, ov.p2p);
      }
      if (stage < p * v - 1) {  // gradient in
        st.p2p += recv, st.p2p_exposed += exposed(recv, bwd, ov.p2p), st.p2p_hidden += covered(recv, bwd, ov.p2p);
      }
      st.fwd_compute += fwd, st.bwd_compute += bwd;
    }
    st.compute = st.fwd_compute + st.bwd_compute;
    stage_seconds.push_back(st.total());
    if (st.total() > stages[slowest].total()) slowest = rank;
  }
  const StageCosts& worst = stages[slowest];
  const double pipeline = pipeline_step_seconds(l.microbatches(), v, stage_seconds);
  TimeEstimate e;
  e.compute_s = mbs * worst.compute;
  e.tp_comm_s = mbs * worst.tp_exposed;
  e.tp_comm_hidden_s = mbs * worst.tp_hidden;
  e.pp_comm_s = mbs * worst.p2p_exposed;
  e.cp_comm_s = mbs * worst.cp_exposed;
  e.cp_comm_hidden_s = mbs * (worst.cp - worst.cp_exposed);
  e.pp_comm_hidden_s = mbs * worst.p2p_hidden;
  e.bubble_s = pipeline - mbs * worst.total();
  e.bubble_fraction = e.bubble_s / (mbs * worst.total());

  // Data parallel: the group is dp x cp ranks tp apart (context ranks reduce their gradients with the
  // data-parallel ones); tp | devices_per_node puts devices_per_node / tp of them on each node (or all of
  // them, when the group is smaller). Every stage reduces its own gradients at once; the step waits for the
  // one with the most exposed.
  const double gsize = static_cast<double>(dtype_size(l.grad_dtype));
  const int R = l.grad_group();
  const int per_node_dp = std::max(1, std::min(R, G / std::max(1, l.tp)));
  const bool sharded = l.distributed_optimizer && R > 1;
  // Megatron-Core's gradient buckets (DistributedDataParallelConfig::bucket_size): max(40M, 1M x dp)
  // parameters; the bucket that holds the word embedding holds at least all of it.
  const double bucket_params = std::max(40e6, 1e6 * R);
  const double embedding_params = static_cast<double>(m.padded_vocab(l.tp) / l.tp * m.hidden);
  std::vector<StageDataParallel> dps(p);
  int dp_worst = 0;
  int64_t most_params = 0;
  for (int rank = 0; rank < p; ++rank) {
    int64_t n = 0;
    for (int64_t c : chunk_parameter_counts(m, l, rank)) n += c;
    most_params = std::max(most_params, n);
    const double params = static_cast<double>(n);
    StageDataParallel& d = dps[rank];
    if (sharded) {
      d.grad = collective_seconds(gsize * params, R, per_node_dp, 1, hw);       // reduce-scatter
      d.param = collective_seconds(r.dsize * params, R, per_node_dp, 1, hw);    // all-gather
    } else {
      d.grad = collective_seconds(gsize * params, R, per_node_dp, 2, hw);       // all-reduce
    }
    const std::vector<double> chunks = stage_chunk_counts(m, l, rank);
    const BucketLayout buckets{rank, p, v, bucket_params, embedding_params};
    const TransferCost grad = ov.grad_reduce ? run_transfers(grad_reduce_transfers(d.grad, chunks, buckets,
                                                                                   stages[rank].bwd_compute / v),
                                                             rank * stages[rank].bwd_compute / v)
                                             : TransferCost{d.grad, 0};
    const TransferCost param = ov.param_gather ? run_transfers(param_gather_transfers(d.param, chunks, buckets,
                                                                                      stages[rank].fwd_compute / v),
                                                               rank * stages[rank].fwd_compute / v)
                                               : TransferCost{d.param, 0};
    d.grad_exposed = grad.exposed, d.grad_hidden = grad.hidden;
    d.param_exposed = param.exposed, d.param_hidden = param.hidden;
    if (d.exposed() > dps[dp_worst].exposed()) dp_worst = rank;
  }
  const StageDataParallel& dpw = dps[dp_worst];
  double tied = 0;
  if (p > 1 && !m.untie_embeddings) {  // tied word embedding: first and last stage, p * tp * dp ranks apart
    const double table = gsize * static_cast<double>(m.padded_vocab(l.tp) / l.tp * m.hidden);
    tied = collective_seconds(table, 2, nodes_spanned(l.tp * l.cp * l.dp * p, G) > 1 ? 1 : 2, 2, hw);
  }
  // AdamW over this rank's shard: master, m, v read and written, gradient read; the cast back to the
  // compute dtype; zeroing, norm and clipping passes over the gradients.
  const double shard = static_cast<double>(most_params) / (sharded ? R : 1);
  e.optimizer_s = (shard * (28 + 4 + r.dsize + 4 + 8) + static_cast<double>(most_params) * gsize) / r.optimizer;
  e.dp_comm_s = dpw.exposed() + tied;
  e.dp_comm_hidden_s = dpw.grad_hidden + dpw.param_hidden;
  e.step_s = pipeline + e.dp_comm_s + e.optimizer_s;
  e.flops_per_step = megatron_flops_per_step(m, l);
  // Every device's GEMMs of one step: tp ranks and dp replicas, all layers and microbatches.
  e.gemm_flops_per_step = static_cast<double>(l.tp) * static_cast<double>(R) * mbs *
                          (static_cast<double>(m.num_layers) * layer.gemm_flops + ends.head.flops());
  e.tflops_per_device = e.flops_per_step / e.step_s / l.world() / 1e12;

  if (details) {
    std::vector<CostLine>& out = *details;
    out.clear();
    const double L = worst.layers * mbs;
    auto add = [&](const char* section, const char* label, double seconds, const std::string& note) {
      out.push_back({section, label, seconds, note});
    };
    const std::string stage_note = fmt::format("pipeline stage {} of {}, {} layers, {} microbatches", slowest, p,
                                               worst.layers, l.microbatches());
    add("compute", "GEMM qkv", L * (layer.qkv.forward() + layer.qkv.backward()), layer.qkv.str());
    add("compute", "GEMM proj", L * (layer.proj.forward() + layer.proj.backward()), layer.proj.str());
    add("compute", "GEMM fc1", L * (layer.fc1.forward() + layer.fc1.backward()), layer.fc1.str());
    add("compute", "GEMM fc2", L * (layer.fc2.forward() + layer.fc2.backward()), layer.fc2.str());
    add("compute", "attention core", L * (layer.attention_fwd + layer.attention_bwd),
        l.materialized_attention ? "materialised scores, softmax and dropout" : "fused");
    add("compute", "norms, activation, residual adds", L * (layer.elementwise_fwd + layer.elementwise_bwd),
        elementwise_note(m));
    add("compute", "recomputation", L * layer.recompute, recompute_name(l.recompute));
    add("compute", "embedding", worst.first ? mbs * (ends.embed_fwd + ends.embed_bwd) : 0, worst.first ? "" : "not on this stage");
    add("compute", "LM head and loss", worst.last ? mbs * ends.head_total : 0,
        worst.last ? ends.head.str() : "not on this stage");
    add("compute", "compute total", e.compute_s, stage_note);
    add("tensor parallel", "collectives", mbs * worst.tp,
        l.tp == 1 ? "tensor 1" : fmt::format("{} per layer and microbatch{}", layer.tp.size(), sp ? ", sequence parallel" : ""));
    add("tensor parallel", "hidden under GEMMs", e.tp_comm_hidden_s, ov.tp ? "tp overlap" : "no tp overlap");
    add("tensor parallel", "exposed", e.tp_comm_s,
        ov.tp ? "what the split GEMMs cannot cover, the cost of splitting them, their slowdown" : "");
    add("context parallel", "ring K/V and dK/dV hops", mbs * worst.cp,
        l.cp == 1 ? "context 1" : fmt::format("{} ranks, {} hops per layer and microbatch", l.cp,
                                              (l.recompute == Recompute::Full ? 3 : 2) * (l.cp - 1) + 1));
    add("context parallel", "hidden under block attention", e.cp_comm_hidden_s, l.cp == 1 ? "" : "always overlapped");
    add("context parallel", "exposed", e.cp_comm_s, l.cp == 1 ? "" : "what each step's block attention cannot cover, and the last dK/dV hop");
    add("pipeline", "receives", mbs * worst.p2p, p == 1 ? "pipeline 1" : fmt::format("{} per microbatch", v * 2 - (worst.first ? 1 : 0) - (worst.last ? 1 : 0)));
    add("pipeline", "hidden under chunk passes", e.pp_comm_hidden_s, ov.p2p ? "p2p overlap" : "no p2p overlap");
    add("pipeline", "exposed", e.pp_comm_s, ov.p2p ? "what the passes cannot cover, plus their slowdown" : "");
    add("pipeline", "bubble", e.bubble_s, fmt::format("{:.1f}% of the busy time", 100 * e.bubble_fraction));
    add("data parallel", "gradient reduction", dpw.grad,
        R == 1 ? "data 1" : sharded ? "reduce-scatter" : "all-reduce");
    add("data parallel", "hidden under the last backward", dpw.grad_hidden,
        ov.grad_reduce ? "grad-reduce overlap" : "no grad-reduce overlap");
    add("data parallel", "parameter all-gather", dpw.param, sharded ? "distributed optimizer" : "none");
    add("data parallel", "hidden under the first forward", dpw.param_hidden,
        ov.param_gather ? "param-gather overlap" : "no param-gather overlap");
    add("data parallel", "tied embedding all-reduce", tied,
        m.untie_embeddings ? "untied output layer" : p > 1 ? "first and last stage" : "one stage holds both");
    add("data parallel", "exposed", e.dp_comm_s,
        fmt::format("pipeline stage {}{}", dp_worst,
                    ov.grad_reduce || ov.param_gather ? "; what the passes cannot cover, plus their slowdown" : ""));
    add("optimizer", "AdamW, norm, clipping", e.optimizer_s, sharded ? "this rank's shard" : "all parameters");
    add("step", "step time", e.step_s, "");
  }
  return e;
}

}  // namespace gpt
