// LM head and loss: logits = x . W^T against the (tied) vocab-parallel word embedding, and the
// vocab-parallel softmax cross-entropy (max, target logit and sum of exponentials are all-reduced over
// the tensor-parallel group; the logits are never gathered). Forward and backward are fused: the loss is
// the end of the graph, so the gradient wrt x is computed at once and the logits are freed.
#pragma once
#include "model/parameter.h"
#include "model/tp_mappings.h"

namespace gpt {

class LMHeadLoss {
 public:
  // `weight` is the word embedding (or its tied copy); gradients accumulate into `grad`.
  LMHeadLoss(Parameter* weight, Tensor grad, int64_t vocab_size, int64_t vocab_start);
  // x: the final layernorm's output, this rank's rows outside the tp region; targets I32 [N] for all N
  // rows. Returns the mean token loss of the N tokens; dx (rows like x) receives
  // d(grad_scale * sum of token losses)/dx, and the weight gradient accumulates likewise.
  double forward_backward(LayerContext& ctx, const Tensor& x, const Tensor& targets, float grad_scale,
                          Tensor& dx) const;
  // Loss only (evaluation): no gradients touched.
  double forward(LayerContext& ctx, const Tensor& x, const Tensor& targets) const;
  // F32 logits [N, padded vocabulary / tp] of this rank's vocabulary shard (generation); columns at or
  // past the real vocabulary are padding.
  Tensor logits(LayerContext& ctx, const Tensor& x) const;

 private:
  double loss_pieces(LayerContext& ctx, const Tensor& x, const Tensor& targets, Tensor& logits, Tensor& row_max,
                     Tensor& sum_exp) const;
  Parameter* weight_;
  Tensor grad_;
  int64_t vocab_size_, vocab_start_;
};

}  // namespace gpt
