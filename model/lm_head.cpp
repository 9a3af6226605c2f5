// Vocab-parallel LM head and cross-entropy, with the loss accumulated on the device.
#include "model/lm_head.h"

namespace gpt {

LMHeadLoss::LMHeadLoss(Parameter* weight, Tensor grad, int64_t vocab_size, int64_t vocab_start)
    : weight_(weight), grad_(std::move(grad)), vocab_size_(vocab_size), vocab_start_(vocab_start) {}

void LMHeadLoss::loss_pieces(LayerContext& ctx, const Tensor& x, const Tensor& targets, Tensor& logits,
                             Tensor& row_max, Tensor& sum_exp, Tensor& loss_sum) const {
  Backend& be = ctx.backend;
  const int64_t n = x.dim(0);
  // bf16 weights give bf16 logits (as Megatron's bf16 LM head; the cross-entropy reads them in fp32):
  // no fp32 [N, V/t] copy; fp16 and fp32 runs keep fp32 logits (fp16's range is narrow for the gradient).
  const DType ldt = weight_->value.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
  logits = be.empty({n, weight_->value.dim(0)}, ldt);
  be.linear_forward(x, weight_->value, nullptr, logits);  // x here spans all N rows
  // This shard's max, sum of exponentials and target logit in one read of the logits; across shards the
  // sums are brought to the common max before they are added.
  row_max = be.empty({n});
  sum_exp = be.empty({n});
  Tensor target_logit = be.empty({n});
  be.ce_row_stats(logits, targets, vocab_start_, vocab_size_, row_max, sum_exp, target_logit);
  if (ctx.tp.size() > 1) {
    Tensor shard_max = be.empty({n});
    be.copy(row_max, shard_max);
    ctx.tp.all_reduce(row_max, ReduceOp::Max);
    be.ce_rescale_sum_exp(shard_max, row_max, sum_exp);
    ctx.tp.all_reduce(sum_exp);
    ctx.tp.all_reduce(target_logit);
  }
  be.ce_loss_accumulate(row_max, sum_exp, target_logit, loss_sum);
}

void LMHeadLoss::forward(LayerContext& ctx, const Tensor& x, const Tensor& targets, Tensor& loss_sum) const {
  Tensor logits, row_max, sum_exp;
  loss_pieces(ctx, enter_tp_region(ctx, x), targets, logits, row_max, sum_exp, loss_sum);
}

Tensor LMHeadLoss::logits(LayerContext& ctx, const Tensor& x) const {
  Tensor x_full = enter_tp_region(ctx, x);
  Tensor out = ctx.backend.empty({x_full.dim(0), weight_->value.dim(0)});
  ctx.backend.linear_forward(x_full, weight_->value, nullptr, out);
  return out;
}

void LMHeadLoss::forward_backward(LayerContext& ctx, const Tensor& x, const Tensor& targets, float grad_scale,
                                  Tensor& dx, Tensor& loss_sum) const {
  Backend& be = ctx.backend;
  Tensor logits, row_max, sum_exp;
  Tensor x_full = enter_tp_region(ctx, x);
  loss_pieces(ctx, x_full, targets, logits, row_max, sum_exp, loss_sum);
  // [N, V/t] logits are the largest activation of the step. Their gradient overwrites them in place, in
  // their dtype (bf16 with bf16 weights: the precision the product reads it in).
  Tensor dlogits = logits;
  be.ce_backward(logits, row_max, sum_exp, targets, vocab_start_, vocab_size_, grad_scale, dlogits);
  logits = Tensor();
  Tensor dx_full = be.empty(x_full.shape(), x_full.dtype());
  Tensor grad = grad_;  // a handle onto the same storage
  be.linear_backward(dlogits, x_full, weight_->value, &dx_full, grad, nullptr);
  dx = enter_tp_region_backward(ctx, dx_full);
}

}  // namespace gpt
