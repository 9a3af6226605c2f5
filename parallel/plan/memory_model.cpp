// Memory model (see memory_model.h): static buffers from exact parameter counts, activations from an
// allocation ledger replayed over this rank's pipeline schedule.
#include "parallel/plan/memory_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "model/gpt_model.h"
#include "model/param_count.h"
#include "parallel/pipeline/pipeline_schedule.h"
#include "parallel/grid/process_grid.h"
#include "parallel/pipeline/send_release.h"

namespace gpt {

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

// Bytes live now and the most ever live, as tensors are allocated and released in program order.
struct Ledger {
  int64_t live = 0, peak = 0;
  void alloc(int64_t bytes) {
    live += bytes;
    peak = std::max(peak, live);
  }
  void free(int64_t bytes) { live -= bytes; }
};

// Sizes in bytes of the tensors one microbatch creates on one rank, for this model's variant.
// N = micro_batch * seq rows.
struct TensorSizes {
  bool sp = false;
  int64_t X = 0;      // [rows outside the tp region, h] compute dtype (the residual stream)
  int64_t Xf = 0;     // [N, h] compute dtype (full rows, inside the tp region)
  int64_t qkv = 0;    // [N, (heads + 2 groups) head_dim / tp]: queries, keys and values of the local heads
  int64_t att = 0;    // [N, h/tp]
  int64_t lse = 0;    // attention's softmax statistics [B, heads/tp, T] fp32
  int64_t fc1 = 0;    // [N, ffn/tp], or [N, 2 ffn/tp] for SwiGLU's gate | up (also its gradient dfc1)
  int64_t act = 0;    // [N, ffn/tp] (also its gradient dact)
  int64_t stats = 0;  // one norm's statistics, fp32 [rows outside]: mean and rstd (LayerNorm) or rstd (RMSNorm)
  int64_t logits = 0; // [N, padded vocab / tp], bf16 in bf16 runs, else fp32; their gradient is in place
  int64_t row = 0;    // [N] fp32
  int64_t batch = 0;  // tokens + targets, int32 [N] each
  // Context parallelism's ring attention (model/ring_attention.cpp), transients of one block's attention
  // beside qkv, att and lse: forward, the fp32 running outputs of both chunks, one block's output and
  // statistics, and the key/value blocks being used and received; backward, the fp32 dQ, the key/value
  // blocks, and the three fp32 dK/dV accumulators (this step's, the arriving and the leaving sum).
  int64_t ring_fwd = 0, ring_bwd = 0;
  bool swiglu = false;
  bool tp_overlap = false;  // parallel.tp_comm_overlap applies (sequence parallelism, tp > 1)
  bool regather = false;    // LayoutSpec::regather_sp_inputs applies (sequence parallelism, tp > 1)
  int64_t tp = 1, dtype_bytes = 4;
  int64_t sp_X() const { return sp ? X : 0; }
  int64_t out() const { return sp ? X : Xf; }  // a region exit's result: rows outside the region
  int64_t sp_Xf() const { return sp ? Xf : 0; }
  // A gathered norm output (ln1_full, ln2_full) as the cache keeps it: not at all when it is gathered
  // again in backward.
  int64_t kept_Xf() const { return regather ? 0 : sp_Xf(); }
  // What a block's cache keeps after forward, besides its input (the chunk's input for the first block, else
  // the sum its ln1 made of the previous block's pending residual).
  int64_t block_saved(Recompute r) const {
    int64_t all = 2 * stats + 3 * X + 2 * kept_Xf() + qkv + att + lse + fc1 + act;
    if (r == Recompute::Selective) return all - act;  // the activation's output
    if (r == Recompute::Full) return 0;
    return all;
  }
};

TensorSizes tensor_sizes(const ModelDescription& m, const LayoutSpec& l) {
  TensorSizes s;
  const int64_t d = static_cast<int64_t>(dtype_size(l.dtype));
  const int64_t N = l.micro_batch * m.seq_length / l.cp;  // this rank's tokens
  s.sp = l.sequence_parallel && l.tp > 1;
  s.tp_overlap = s.sp && l.tp_comm_overlap;
  s.regather = s.sp && l.regather_sp_inputs;
  s.swiglu = m.swiglu;
  s.tp = l.tp, s.dtype_bytes = d;
  const int64_t rows = s.sp ? N / l.tp : N;
  s.X = rows * m.hidden * d;
  s.Xf = N * m.hidden * d;
  s.qkv = N * (m.qkv_width() / l.tp) * d;
  s.att = N * (m.heads / l.tp) * m.head_dim() * d;
  s.lse = 4 * N * (m.heads / l.tp);
  s.fc1 = N * (m.fc1_width() / l.tp) * d;
  s.act = N * (m.ffn / l.tp) * d;
  s.stats = (m.normalization == Normalization::LayerNorm ? 2 : 1) * rows * 4;
  s.logits = (l.dtype == DType::BF16 ? 2 : 4) * N * (m.padded_vocab(l.tp) / l.tp);  // bf16 with bf16 weights
  s.row = 4 * N;
  s.batch = 2 * 4 * N;
  if (l.cp > 1) {
    const int64_t out32 = N * (m.heads / l.tp) * m.head_dim() * 4;
    const int64_t kv = N * 2 * (m.query_groups() / l.tp) * m.head_dim();  // elements
    s.ring_fwd = out32 + out32 / 2 + s.lse / 2 + 2 * kv * d;
    s.ring_bwd = out32 + 2 * kv * d + 3 * kv * 4;
  }
  return s;
}

// What a block's pending residual (model/norm.h) holds besides what the cache keeps: the MLP output (the
// fc2 partial sums themselves without sequence parallelism) and, under full recompute, h.
int64_t pending_residual(const TensorSizes& s, Recompute r) {
  return (s.sp ? s.X : s.Xf) + (r == Recompute::Full ? s.X : 0);
}

// A row-parallel linear's forward with the region's exit (RowParallelLinear::forward_with_exit), and a
// column-parallel linear's input gradient with the entry's backward (backward_with_entry): the full-row
// partial sums, then the rows outside the region, which stay live. Without sequence parallelism the
// all-reduce is in place (the partial sums are the result); with it the reduce-scatter's shard is new
// and the partial sums go. Overlapped (parallel.tp_comm_overlap), the partials are made a row block at a
// time: tp - 1 outgoing blocks and tp received ones (this rank's own among them), the fp32 sum and, for a
// 16-bit dtype, its rounded copy, all but the result released on return.
void region_exit(Ledger& L, const TensorSizes& s) {
  if (!s.tp_overlap) {
    L.alloc(s.Xf), L.alloc(s.sp_X());
    if (s.sp) L.free(s.Xf);
    return;
  }
  const int64_t blocks = (2 * s.tp - 1) * s.X, sum = s.X / s.dtype_bytes * 4, rounded = s.dtype_bytes < 4 ? s.X : 0;
  L.alloc(blocks), L.alloc(sum), L.alloc(rounded);
  L.free(blocks + (rounded ? sum : 0));
}

// TransformerBlock::forward: the cache it fills, its locals, and the pending residual it hands on. With
// `pending`, the input is the previous block's pending residual, which ln1 sums and releases; otherwise
// the input is a live tensor.
void block_forward(Ledger& L, const TensorSizes& s, Recompute r, bool pending) {
  if (pending) L.alloc(s.X);                           // the input, summed by ln1
  L.alloc(s.stats), L.alloc(s.X);                      // ln1 statistics, ln1
  if (pending) L.free(pending_residual(s, r));
  L.alloc(s.sp_Xf());                                  // ln1_full
  L.alloc(s.qkv);
  if (s.regather) L.free(s.sp_Xf());                   // gathered again in backward
  L.alloc(s.att), L.alloc(s.lse);
  L.alloc(s.ring_fwd), L.free(s.ring_fwd);             // context parallelism's ring
  region_exit(L, s);                                   // proj: the attention output
  L.alloc(s.X);                                        // h
  L.alloc(s.stats), L.alloc(s.X), L.alloc(s.sp_Xf());  // ln2 statistics, ln2, ln2_full
  L.alloc(s.fc1);                                      // fc1
  if (s.regather) L.free(s.sp_Xf());
  L.alloc(s.act);                                      // act
  region_exit(L, s);                                   // fc2: the MLP output
  L.free(s.block_saved(Recompute::None) - s.block_saved(r) - (r == Recompute::Full ? s.X : 0));  // h stays pending
  L.free(s.out());                                     // the attention output
}

// TransformerBlock::backward with the block's cache and dout live; leaves dx allocated and the cache
// (input included) released.
void block_backward(Ledger& L, const TensorSizes& s, Recompute r) {
  if (r == Recompute::Full) {
    block_forward(L, s, Recompute::None, false);   // reruns forward into the cache;
    L.free(pending_residual(s, Recompute::None));  // its output is dropped at once
  } else if (r == Recompute::Selective) {
    L.alloc(s.act);                        // the activation's output, recomputed
  }
  // The MLP's backward_through: dout gathered (released when fc2's backward returns), dact and dfc1.
  // GELU on the plain path runs the CPU's composed linear_dgelu_backward, dfc1 allocated before dact and
  // dact released inside it; SwiGLU, and GELU overlapped, finish fc2's backward (dact) first.
  L.alloc(s.sp_Xf());
  if (s.swiglu || s.tp_overlap) {
    L.alloc(s.act), L.free(s.sp_Xf()), L.alloc(s.fc1), L.free(s.act);
  } else {
    L.alloc(s.fc1), L.alloc(s.act), L.free(s.act), L.free(s.sp_Xf());
  }
  if (s.regather) L.alloc(s.sp_Xf());      // ln2_full gathered again for fc1's weight gradient
  region_exit(L, s);                       // fc1's input gradient: dln2
  L.alloc(s.X);                            // dh
  L.free(s.act + s.fc1 + s.X + s.sp_Xf());  // act, fc1, ln2, ln2_full
  L.alloc(s.sp_Xf()), L.alloc(s.att), L.free(s.sp_Xf());  // dh gathered for proj's backward, datt
  L.alloc(s.qkv);                          // dqkv
  L.alloc(s.ring_bwd), L.free(s.ring_bwd);  // context parallelism's ring
  L.free(s.lse + s.att);
  if (s.regather) L.alloc(s.sp_Xf());      // ln1_full gathered again for qkv's weight gradient
  region_exit(L, s);                       // qkv's input gradient: dln1
  L.alloc(s.X);                            // dx
  L.free(3 * s.X + s.sp_Xf() + s.qkv + 2 * s.stats);  // the rest of the cache: input, ln1, ln1_full, qkv, h
  L.free(s.fc1 + 2 * s.out() + s.X + s.att + s.qkv);  // the locals: dfc1, dln2, dln1, dh, datt, dqkv
}

struct ChunkShape {
  int64_t layers = 0;
  bool first = false, last = false;
};

// ModelChunk::forward (embedding, blocks, final layernorm and the fused LM head forward/backward).
// Starts with the chunk's input live (unless first); ends with the cache and the output live.
void chunk_forward(Ledger& L, const TensorSizes& s, const ChunkShape& c, Recompute r) {
  if (c.first) {
    L.alloc(s.Xf);  // embedding lookup, all rows
    if (s.sp) L.alloc(s.X), L.free(s.Xf);
  }
  for (int64_t i = 0; i < c.layers; ++i) block_forward(L, s, r, i > 0);
  const bool pending = c.layers > 0;
  if (pending) L.alloc(s.X);            // the last block's pending residual summed: output, or final_in
  if (!c.last) {
    if (pending) L.free(pending_residual(s, r));
    return;
  }
  L.alloc(s.stats), L.alloc(s.X);       // final layernorm statistics (kept) and output
  if (pending) L.free(pending_residual(s, r));
  L.alloc(s.sp_Xf());                   // output gathered for the head
  L.alloc(s.logits), L.alloc(s.row), L.alloc(s.row), L.alloc(s.row);  // logits, max, sum, target logit
  L.free(s.row);                        // target logit
  L.alloc(s.Xf), L.alloc(s.sp_X());     // dx over all rows, its row block (kept as head_dx)
  L.free(2 * s.row + s.logits + 2 * s.sp_Xf());  // the logits hold their gradient in place
  L.free(s.X);                          // final layernorm output
}

// What chunk_forward leaves allocated until the microbatch's backward: every block input (the chunk
// input included), the blocks' caches, and on the last chunk the final layernorm's input, statistics
// and head_dx. The output of a non-last chunk is not part of it: it goes to a send buffer.
int64_t chunk_cache(const TensorSizes& s, const ChunkShape& c, Recompute r) {
  int64_t bytes = c.layers * (s.X + s.block_saved(r));
  if (c.last) bytes += s.X + s.stats + s.X;
  return bytes;
}

// ModelChunk::backward with the cache live (and, on a non-last chunk, the received gradient, released
// by the caller). Ends with the cache released and, on a non-first chunk, the input gradient live.
void chunk_backward(Ledger& L, const TensorSizes& s, const ChunkShape& c, Recompute r) {
  bool dout_owned = false;
  if (c.last) L.alloc(s.X), dout_owned = true;  // final layernorm backward
  for (int64_t i = 0; i < c.layers; ++i) {
    block_backward(L, s, r);
    if (dout_owned) L.free(s.X);
    dout_owned = true;
  }
  if (c.last) L.free(s.X + s.stats + s.X);  // final_in, final statistics, head_dx
  if (c.first) {
    L.alloc(s.sp_Xf()), L.free(s.sp_Xf());  // embedding backward gathers the rows
    L.free(s.X);                            // the gradient ends here
  }
}

// Peak above the starting level and the net change of one procedure.
struct Effect {
  int64_t peak = 0, delta = 0;
};
template <typename F>
Effect measure(F&& f) {
  Ledger L;
  f(L);
  return {L.peak, L.live};
}

int64_t padded(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace


const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}

std::string LayoutSpec::str() const {
  return fmt::format("tp={}{} pp={} vpp={} dp={} mb={} recompute={} dist_opt={}{}{}{}{}{}{}{}", tp,
                     cp > 1 ? fmt::format(" cp={}", cp) : std::string(), pp, vpp, dp, micro_batch,
                     recompute_name(recompute), distributed_optimizer ? "on" : "off", sequence_parallel ? " sp" : "",
                     grad_dtype == DType::F32 ? "" : std::string(" grads=") + dtype_name(grad_dtype),
                     p2p_scatter_gather ? " p2p_scatter_gather" : "",
                     materialized_attention ? " materialized_attention" : "",
                     unfused_cross_entropy ? " unfused_cross_entropy" : "",
                     regather_sp_inputs && sequence_parallel ? " regather_sp_inputs" : "",
                     overlaps.any() ? " overlap=" + overlaps.str() : "");
}

void validate_layout(const ModelDescription& m, const LayoutSpec& l) {
  auto s = [](int64_t x) { return std::to_string(x); };
  require(l.tp >= 1 && l.pp >= 1 && l.vpp >= 1 && l.dp >= 1 && l.cp >= 1, "parallel degrees must be at least 1");
  require(m.seq_length % (2 * l.cp) == 0, "seq_length (" + s(m.seq_length) + ") is not divisible by 2 x context (" +
                                              s(2 * l.cp) + "): context parallelism cuts each sequence into 2 x context chunks");
  require(m.heads % l.tp == 0, "num_heads (" + s(m.heads) + ") is not divisible by tensor (" + s(l.tp) + ")");
  require(m.query_groups() % l.tp == 0, "num_query_groups (" + s(m.query_groups()) + ") is not divisible by tensor (" +
                                            s(l.tp) + "): each rank holds whole key/value groups");
  require(m.hidden % m.heads == 0, "hidden_size (" + s(m.hidden) + ") is not divisible by num_heads (" + s(m.heads) + ")");
  require(m.ffn % l.tp == 0, "ffn_hidden_size (" + s(m.ffn) + ") is not divisible by tensor (" + s(l.tp) + ")");
  require(m.num_layers % (l.pp * l.vpp) == 0, "num_layers (" + s(m.num_layers) + ") is not divisible by pipeline x virtual (" +
                                                  s(l.pp * l.vpp) + ")");
  require(l.micro_batch >= 1 && l.global_batch % (l.micro_batch * l.dp) == 0,
          "global batch (" + s(l.global_batch) + ") is not divisible by micro batch x data (" + s(l.micro_batch * l.dp) + ")");
  if (l.sequence_parallel)
    require((l.micro_batch * m.seq_length / l.cp) % l.tp == 0,
            "sequence parallelism needs micro batch x seq_length / context divisible by tensor");
  validate_schedule_args(l.pp, l.vpp, static_cast<int>(l.microbatches()));
}

std::vector<int64_t> chunk_parameter_counts(const ModelDescription& m, const LayoutSpec& l, int pp_rank) {
  const int64_t V = m.padded_vocab(l.tp);
  ParamBreakdown global = count_gpt_parameters(m, V);
  const int64_t replicated = global.per_layer_replicated;
  const int64_t per_layer = (global.per_layer - replicated) / l.tp + replicated;
  std::vector<int64_t> counts;
  for (int c = 0; c < l.vpp; ++c) {
    auto [begin, end] = chunk_layer_range(static_cast<int>(m.num_layers), l.pp, l.vpp, pp_rank, c);
    const bool first = pp_rank == 0 && c == 0, last = pp_rank == l.pp - 1 && c == l.vpp - 1;
    int64_t n = (end - begin) * per_layer;
    if (first) n += global.word_embedding / l.tp + global.position_embedding;
    // The last stage's LM head: the untied output layer, or the tied copy of the word embedding.
    if (last) n += global.final_norm + (m.untie_embeddings ? global.output_layer / l.tp
                                                           : (first ? 0 : global.word_embedding / l.tp));
    counts.push_back(n);
  }
  return counts;
}

std::vector<std::pair<PassKind, int>> schedule_passes(int p, int v, int m, int rank) {
  // Warm-up forwards, (forward, backward) pairs, cool-down backwards; the k-th pass of each kind runs
  // chunk (k / p) % v, counted from the end for backward (parallel/pipeline/pipeline_schedule.h).
  const int total = m * v, warmup = num_warmup_passes(p, v, m, rank);
  auto chunk = [&](PassKind kind, int k) { return kind == PassKind::Forward ? (k / p) % v : v - 1 - (k / p) % v; };
  std::vector<std::pair<PassKind, int>> passes;
  passes.reserve(2 * static_cast<size_t>(total));
  auto add = [&](PassKind kind, int k) { passes.emplace_back(kind, chunk(kind, k)); };
  for (int k = 0; k < warmup; ++k) add(PassKind::Forward, k);
  for (int k = 0; k + warmup < total; ++k) add(PassKind::Forward, k + warmup), add(PassKind::Backward, k);
  for (int k = std::max(0, total - warmup); k < total; ++k) add(PassKind::Backward, k);
  return passes;
}

MemoryEstimate estimate_memory(const ModelDescription& m, const LayoutSpec& l, int pp_rank, SendBuffers sends) {
  validate_layout(m, l);
  require(pp_rank >= 0 && pp_rank < l.pp, "pipeline rank out of range");
  MemoryEstimate e;
  e.pp_rank = pp_rank;
  const int64_t d = static_cast<int64_t>(dtype_size(l.dtype)), g = static_cast<int64_t>(dtype_size(l.grad_dtype));
  const int R = l.grad_group();  // the ranks that reduce (and, with ZeRO-1, shard) each gradient
  const bool sharded = l.distributed_optimizer && R > 1;
  int64_t optimizer_transient = 0, fp32_grad_copies = 0;
  for (int64_t n : chunk_parameter_counts(m, l, pp_rank)) {
    const int64_t buffer = padded(n, R);  // ParameterSet pads its flat buffers to a multiple of dp x cp
    e.parameters += n;
    e.weights += buffer * d;
    e.grads += buffer * g;
    // Adam state covers parameter elements only (not padding); dp rank 0's shard is the fullest.
    const int64_t covered = sharded ? std::min<int64_t>(n, buffer / R) : n;
    e.optimizer += covered * (8 + (l.dtype == DType::F32 ? 0 : 4));
    if (sharded) optimizer_transient = std::max(optimizer_transient, buffer / R * 4);  // reduce-scatter target
    else if (g != 4) fp32_grad_copies += covered * 4;  // the optimizer step's fp32 copies of 16-bit gradients
  }
  optimizer_transient = std::max(optimizer_transient, fp32_grad_copies);
  if (l.checkpoint_snapshot) {
    // What this rank saves: the optimizer segments' elements (dp rank 0's, the fullest), less the tied
    // copy of the word embedding on a last stage of its own, at 4 bytes for each stored kind.
    int64_t saved = 0;
    for (int64_t n : chunk_parameter_counts(m, l, pp_rank)) {
      const int64_t buffer = padded(n, R);
      saved += sharded ? std::min<int64_t>(n, buffer / R) : n;
    }
    if (pp_rank == l.pp - 1 && l.pp > 1 && !m.untie_embeddings)
      saved -= std::min<int64_t>(saved, m.padded_vocab(l.tp) / l.tp * m.hidden / (sharded ? R : 1));
    const int64_t kinds = 1 + (l.dtype == DType::F32 ? 0 : 1) + (l.snapshot_optimizer_state ? 2 : 0);
    e.checkpoint_host = saved * kinds * 4;
  }
  // The LM head's own gradient of the tied table when one stage holds both ends (an untied output layer
  // accumulates into its own gradient buffer).
  if (l.pp == 1 && !m.untie_embeddings) e.grads += m.padded_vocab(l.tp) / l.tp * m.hidden * g;

  // Replay this rank's schedule: per pass, peak = live + the pass's own peak; then apply its net effect.
  const TensorSizes s = tensor_sizes(m, l);
  const int p = l.pp, v = l.vpp, mbs = static_cast<int>(l.microbatches());
  std::vector<ChunkShape> shapes(v);
  std::vector<Effect> fwd(v), bwd(v);
  std::vector<int64_t> cache(v);
  for (int c = 0; c < v; ++c) {
    auto [begin, end] = chunk_layer_range(static_cast<int>(m.num_layers), p, v, pp_rank, c);
    shapes[c] = {end - begin, pp_rank == 0 && c == 0, pp_rank == p - 1 && c == v - 1};
    fwd[c] = measure([&](Ledger& L) { chunk_forward(L, s, shapes[c], l.recompute); });
    bwd[c] = measure([&](Ledger& L) { chunk_backward(L, s, shapes[c], l.recompute); });
    cache[c] = chunk_cache(s, shapes[c], l.recompute);
  }
  e.activation_cache = cache[0];
  const bool needs_data = pp_rank == 0 || pp_rank == p - 1;
  const bool freed_at_once = sends == SendBuffers::FreedOnDelivery;
  // This executor's release points (send_release.h): how many sends each pass frees after its receive.
  std::vector<int> released_by;
  if (!freed_at_once && p > 1) {
    const std::vector<int>& release_at = (*cached_send_release_points(p, v, mbs, false))[pp_rank];
    released_by.assign(release_at.size() + 1, 0);
    for (int k : release_at)
      if (k >= 0) ++released_by[k];
  }
  Ledger L;
  int64_t held = 0;
  int k = 0;
  for (const auto& [kind, c] : schedule_passes(p, v, mbs, pp_rank)) {
    const int stage = c * p + pp_rank;
    if (kind == PassKind::Forward) {
      if (needs_data && c == 0) L.alloc(s.batch);  // first pass of the microbatch here loads its tokens
      if (stage > 0) L.alloc(s.X);                 // received activation
    } else if (stage < p * v - 1) {
      L.alloc(s.X);                                // received gradient
    }
    if (!released_by.empty())
      for (int i = 0; i < released_by[k]; ++i) L.free(s.X);  // sends known received by now
    ++k;
    if (kind == PassKind::Forward) {
      L.peak = std::max(L.peak, L.live + fwd[c].peak);
      L.live += fwd[c].delta;                      // output stays alive in a send buffer, if sent
      if (stage < p * v - 1 && freed_at_once) L.free(s.X);
      e.in_flight = std::max(e.in_flight, ++held);
    } else {
      L.peak = std::max(L.peak, L.live + bwd[c].peak);
      L.live += bwd[c].delta;                      // releases the cache; a sent gradient stays alive
      if (stage < p * v - 1) L.free(s.X);          // the received gradient
      if (stage > 0 && freed_at_once) L.free(s.X);
      if (needs_data && c == 0) L.free(s.batch);
      --held;
    }
  }
  // The trainer's per-step sums (the loss and each parameter tensor's gradient square, F64 [1 + tensors
  // of the whole model]) live beside all of it.
  const int64_t step_sums = 8 * (1 + num_global_params(m));
  e.activations = step_sums + std::max(L.peak, optimizer_transient);
  return e;
}

MemoryEstimate estimate_peak_memory(const ModelDescription& m, const LayoutSpec& l, SendBuffers sends) {
  // Stage 0 holds the most microbatches in flight, stage 1 the most of the middle stages (which also keep
  // send buffers in both directions), the last stage the LM head.
  MemoryEstimate best;
  bool have = false;
  for (int r : {0, 1, l.pp - 1}) {
    if (r >= l.pp) continue;
    MemoryEstimate e = estimate_memory(m, l, r, sends);
    if (!have || e.total() > best.total()) best = e, have = true;
  }
  return best;
}

int64_t largest_forward_tensor(const ModelDescription& m, const LayoutSpec& l) {
  const TensorSizes s = tensor_sizes(m, l);
  return std::max(s.logits, s.fc1);
}

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

std::string format_memory_estimate(const ModelDescription& m, const LayoutSpec& l) {
  std::map<int, MemoryEstimate> stages;
  for (int r : {0, l.pp - 1}) stages.emplace(r, estimate_memory(m, l, r));
  MemoryEstimate peak = estimate_peak_memory(m, l);
  stages.emplace(peak.pp_rank, peak);
  std::string out;
  for (const auto& [r, e] : stages) {
    out += fmt::format(
        "{}predicted memory per rank, pipeline stage {} of {}: weights {} + grads {} + optimizer {} + activations {} "
        "(peak of the step; {} chunk pass(es) in flight, {} saved each) = {}{}",
        out.empty() ? "" : "\n", r, l.pp, format_bytes(e.weights), format_bytes(e.grads), format_bytes(e.optimizer),
        format_bytes(e.activations), e.in_flight, format_bytes(e.activation_cache), format_bytes(e.total()),
        e.checkpoint_host ? "; host memory for checkpoint snapshots " + format_bytes(e.checkpoint_host) : "");
  }
  return out;
}

}  // namespace gpt
