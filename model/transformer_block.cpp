// Forward and backward of the pre-LN transformer block.
#include "model/transformer_block.h"

#include <stdexcept>

namespace gpt {

namespace {
LinearSpec linear(int64_t in, int64_t out, float std, const BlockSpec& s, int blocks = 1) {
  return LinearSpec{in, out, blocks, std, s.tp_size, s.tp_rank};
}
}  // namespace

TransformerBlock::TransformerBlock(ParameterSet& params, const std::string& prefix, const BlockSpec& s)
    : spec_(s),
      local_heads_(s.heads / s.tp_size),
      ln1_(params, prefix + ".ln1", s.hidden, s.eps),
      qkv_(params, prefix + ".attention.qkv", linear(s.hidden, 3 * s.hidden, s.init_std, s, 3)),
      proj_(params, prefix + ".attention.proj", linear(s.hidden, s.hidden, s.output_init_std, s)),
      ln2_(params, prefix + ".ln2", s.hidden, s.eps),
      fc1_(params, prefix + ".mlp.fc1", linear(s.hidden, s.ffn, s.init_std, s)),
      fc2_(params, prefix + ".mlp.fc2", linear(s.ffn, s.hidden, s.output_init_std, s)) {}

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  throw std::invalid_argument("training.recompute: unknown mode '" + name + "' (expected none, selective or full)");
}

void TransformerBlock::forward(LayerContext& ctx, const Tensor& x, int64_t B, int64_t T, Tensor& out, BlockCache& c,
                               Recompute recompute, const KvStep* kv) const {
  Backend& be = ctx.backend;
  const int64_t D = spec_.hidden / spec_.heads;
  c.input = x;
  // Attention branch: h = x + proj(attention(qkv(ln1(x))))
  ln1_.forward(ctx, x, c.ln1, c.ln1_stats);
  c.ln1_full = enter_tp_region(ctx, c.ln1);
  qkv_.forward(ctx, c.ln1_full, c.qkv);
  c.att = be.empty({B * T, local_heads_ * D}, x.dtype());
  c.lse = be.empty({B, local_heads_, T});
  if (!kv) {
    be.attention_forward(c.qkv, B, T, local_heads_, local_heads_, D, c.att, c.lse);
  } else {
    if (B != 1 || kv->past + T > kv->cache.dim(0))
      throw std::logic_error("TransformerBlock: a cached decoding step takes one sequence within the cache");
    Tensor slot = kv->cache.rows(kv->past, kv->past + T);
    be.copy(c.qkv, slot);
    be.attention_forward_last(kv->cache.rows(0, kv->past + T), 1, kv->past + T, T, local_heads_, local_heads_, D,
                              c.att, c.lse);
  }
  Tensor proj_partial;
  proj_.forward(ctx, c.att, proj_partial);
  Tensor attn_out = exit_tp_region(ctx, proj_partial);
  c.h = be.empty(x.shape(), x.dtype());
  be.add(x, attn_out, c.h);
  // MLP branch: out = h + fc2(gelu(fc1(ln2(h))))
  ln2_.forward(ctx, c.h, c.ln2, c.ln2_stats);
  c.ln2_full = enter_tp_region(ctx, c.ln2);
  fc1_.forward(ctx, c.ln2_full, c.fc1);
  c.act = be.empty(c.fc1.shape(), c.fc1.dtype());
  be.gelu_forward(c.fc1, c.act);
  Tensor fc2_partial;
  fc2_.forward(ctx, c.act, fc2_partial);
  Tensor mlp_out = exit_tp_region(ctx, fc2_partial);
  out = be.empty(x.shape(), x.dtype());
  be.add(c.h, mlp_out, out);
  if (recompute == Recompute::Selective) c.act = Tensor();
  if (recompute == Recompute::Full) {
    c = BlockCache();
    c.input = x;
  }
}

void TransformerBlock::backward(LayerContext& ctx, const Tensor& dout, int64_t B, int64_t T, BlockCache& c,
                                Tensor& dx, Recompute recompute) const {
  Backend& be = ctx.backend;
  const int64_t D = spec_.hidden / spec_.heads;
  if (recompute == Recompute::Full) {
    Tensor unused;
    Tensor input = c.input;
    forward(ctx, input, B, T, unused, c);
  } else if (recompute == Recompute::Selective) {
    c.act = be.empty(c.fc1.shape(), c.fc1.dtype());
    be.gelu_forward(c.fc1, c.act);
  }
  // MLP branch
  Tensor dout_full = exit_tp_region_backward(ctx, dout);
  Tensor dact, dln2_full, dh;
  fc2_.backward(ctx, dout_full, c.act, dact);
  Tensor dfc1 = be.empty(c.fc1.shape(), c.fc1.dtype());
  be.gelu_backward(dact, c.fc1, dfc1);
  fc1_.backward(ctx, dfc1, c.ln2_full, &dln2_full);
  Tensor dln2 = enter_tp_region_backward(ctx, dln2_full);
  ln2_.backward(ctx, dln2, c.h, c.ln2_stats, dh);
  be.accumulate(dout, dh);  // residual
  c.act = c.fc1 = c.ln2 = c.ln2_full = Tensor();
  // Attention branch
  Tensor dh_full = exit_tp_region_backward(ctx, dh);
  Tensor datt, dln1_full;
  proj_.backward(ctx, dh_full, c.att, datt);
  Tensor dqkv = be.empty(c.qkv.shape(), c.qkv.dtype());
  be.attention_backward(datt, c.qkv, c.att, c.lse, B, T, local_heads_, local_heads_, D, dqkv);
  c.lse = c.att = Tensor();
  qkv_.backward(ctx, dqkv, c.ln1_full, &dln1_full);
  Tensor dln1 = enter_tp_region_backward(ctx, dln1_full);
  ln1_.backward(ctx, dln1, c.input, c.ln1_stats, dx);
  be.accumulate(dh, dx);  // residual
  c = BlockCache();
}

}  // namespace gpt
