// Forward and backward of the pre-LN transformer block.
#include "model/transformer_block.h"

#include "model/context_rows.h"
#include "model/ring_attention.h"

#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

namespace gpt {

namespace {
LinearSpec linear(int64_t in, int64_t out, float std, const BlockSpec& s, int blocks = 1,
                  std::vector<int64_t> block_weights = {}) {
  LinearSpec l;
  l.in = in, l.out = out, l.blocks = blocks, l.block_weights = std::move(block_weights);
  l.bias = s.model.add_bias_linear;
  l.init_std = std, l.tp_size = s.tp_size, l.tp_rank = s.tp_rank;
  l.fp8 = s.fp8;
  return l;
}
// Megatron's scaled init of the layers that write into the residual stream (proj and fc2).
float output_init_std(const ModelDescription& m) {
  return static_cast<float>(m.init_std / std::sqrt(2.0 * static_cast<double>(m.num_layers)));
}
// q | k | v as heads : groups : groups, or three equal blocks for multi-head attention (the layout
// checkpoints of such models have always had).
std::vector<int64_t> qkv_block_weights(const ModelDescription& m) {
  if (m.query_groups() == m.heads) return {};
  return {m.heads / m.query_groups(), 1, 1};
}
}  // namespace

TransformerBlock::TransformerBlock(ParameterSet& params, const std::string& prefix, const BlockSpec& s)
    : spec_(s),
      local_heads_(s.model.heads / s.tp_size),
      local_groups_(s.model.query_groups() / s.tp_size),
      head_dim_(s.model.head_dim()),
      activation_(s.model.swiglu),
      ln1_(params, prefix + ".ln1", s.model.hidden, s.model.eps, s.model.normalization),
      qkv_(params, prefix + ".attention.qkv",
           linear(s.model.hidden, s.model.qkv_width(), s.model.init_std, s, 3, qkv_block_weights(s.model))),
      proj_(params, prefix + ".attention.proj", linear(s.model.hidden, s.model.hidden, output_init_std(s.model), s)),
      ln2_(params, prefix + ".ln2", s.model.hidden, s.model.eps, s.model.normalization),
      fc1_(params, prefix + ".mlp.fc1",
           linear(s.model.hidden, s.model.fc1_width(), s.model.init_std, s, s.model.swiglu ? 2 : 1)),
      fc2_(params, prefix + ".mlp.fc2", linear(s.model.ffn, s.model.hidden, output_init_std(s.model), s)) {
  if (s.model.position == PositionEmbedding::Rope) rope_.emplace(s.model);
}

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  throw std::invalid_argument("training.recompute: unknown mode '" + name + "' (expected none, selective or full)");
}

void TransformerBlock::forward(LayerContext& ctx, Residual x, int64_t B, int64_t T, Residual& out, BlockCache& c,
                               Recompute recompute, const KvStep* kv) const {
  Backend& be = ctx.backend;
  const int64_t H = local_heads_, G = local_groups_, D = head_dim_;
  // Attention branch: h = x + proj(attention(rope(qkv(ln1(x))))), x summed from the pending residual by ln1
  ln1_.forward_residual(ctx, std::move(x), c.input, c.ln1, c.ln1_stats);
  const DType dtype = c.input.dtype();
  qkv_.forward_with_entry(ctx, c.ln1, c.ln1_full, c.qkv);
  if (ctx.context_parallel()) {
    if (kv) throw std::logic_error("TransformerBlock: cached decoding runs without context parallelism");
    if (rope_)
      for_each_context_chunk(ctx, c.qkv, T, [&](Tensor& rows, int64_t Tc, int64_t pos0) {
        rope_->forward(be, rows, B, Tc, H, G, D, pos0);
      });
    ring_attention_forward(be, *ctx.cp, c.qkv, RingShape{B, T / 2, H, G, D}, c.att, c.lse);
  } else {
    if (rope_) rope_->forward(be, c.qkv, B, T, H, G, D, kv ? kv->past : 0);
    c.att = be.empty({B * T, H * D}, dtype);
    c.lse = be.empty({B, H, T});
    if (!kv) {
      be.attention_forward(c.qkv, B, T, H, G, D, c.att, c.lse);
    } else {
      if (B != 1 || kv->past + T > kv->cache.dim(0))
        throw std::logic_error("TransformerBlock: a cached decoding step takes one sequence within the cache");
      Tensor slot = kv->cache.rows(kv->past, kv->past + T);
      be.copy(c.qkv, slot);
      be.attention_forward_last(kv->cache.rows(0, kv->past + T), 1, kv->past + T, T, H, G, D, c.att, c.lse);
    }
  }
  Tensor attn_out = proj_.forward_with_exit(ctx, c.att);
  // MLP branch: out = h + fc2(act(fc1(ln2(h)))), h = x + attention (the add runs with ln2)
  ln2_.forward_add(ctx, c.input, attn_out, c.h, c.ln2, c.ln2_stats);
  activation_.forward_through(ctx, fc1_, c.ln2, c.ln2_full, c.fc1, c.act);
  out = Residual{c.h, fc2_.forward_with_exit(ctx, c.act)};  // the add waits for the next norm
  if (recompute == Recompute::Selective) c.act = Tensor();
  if (recompute == Recompute::Full) {
    Tensor input = c.input;
    c = BlockCache();
    c.input = input;
  }
}

void TransformerBlock::backward(LayerContext& ctx, const Tensor& dout, int64_t B, int64_t T, BlockCache& c,
                                Tensor& dx, Recompute recompute) const {
  Backend& be = ctx.backend;
  const int64_t H = local_heads_, G = local_groups_, D = head_dim_;
  if (recompute == Recompute::Full) {
    Residual unused;
    forward(ctx, Residual{c.input, Tensor()}, B, T, unused, c);
  } else if (recompute == Recompute::Selective) {
    activation_.forward(be, c.fc1, c.act);
  }
  // MLP branch
  Tensor dfc1, dh;
  activation_.backward_through(ctx, fc2_, dout, c.act, c.fc1, dfc1);
  Tensor dln2 = fc1_.backward_with_entry(ctx, dfc1, c.ln2_full);
  ln2_.backward_add(ctx, dln2, c.h, c.ln2_stats, dout, dh);  // dh = ln2's gradient + the residual's
  c.act = c.fc1 = c.ln2 = c.ln2_full = Tensor();
  // Attention branch
  Tensor datt;
  proj_.backward_with_exit(ctx, dh, c.att, datt);
  Tensor dqkv = be.empty(c.qkv.shape(), c.qkv.dtype());
  if (ctx.context_parallel()) {
    ring_attention_backward(be, *ctx.cp, datt, c.qkv, c.att, c.lse, RingShape{B, T / 2, H, G, D}, dqkv);
    if (rope_)
      for_each_context_chunk(ctx, dqkv, T, [&](Tensor& rows, int64_t Tc, int64_t pos0) {
        rope_->backward(be, rows, B, Tc, H, G, D, pos0);
      });
  } else {
    be.attention_backward(datt, c.qkv, c.att, c.lse, B, T, H, G, D, dqkv);
    if (rope_) rope_->backward(be, dqkv, B, T, H, G, D);
  }
  c.lse = c.att = Tensor();
  Tensor dln1 = qkv_.backward_with_entry(ctx, dqkv, c.ln1_full);
  ln1_.backward_add(ctx, dln1, c.input, c.ln1_stats, dh, dx);  // dx = ln1's gradient + the residual's
  c = BlockCache();
}

}  // namespace gpt
