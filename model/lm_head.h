// LM head and loss: logits = x . W^T against the (tied) vocab-parallel word embedding, and the
// vocab-parallel softmax cross-entropy (max, target logit and sum of exponentials are all-reduced over
// the tensor-parallel group; the logits are never gathered). Forward and backward are fused: the loss is
// the end of the graph, so the gradient wrt x is computed at once and the logits are freed. The loss itself
// stays on the device: each call adds its mean token loss to an fp64 accumulator that the caller reads
// once (a training step downloads it with the gradient norms' sums).
#pragma once
#include "model/parameter.h"
#include "model/tp_mappings.h"

namespace gpt {

class LMHeadLoss {
 public:
  // `weight` is the word embedding (or its tied copy); gradients accumulate into `grad`.
  LMHeadLoss(Parameter* weight, Tensor grad, int64_t vocab_size, int64_t vocab_start);
  // x: the final layernorm's output, this rank's rows outside the tp region; targets I32 [N] for all N
  // rows. Adds the mean token loss of the N tokens to loss_sum (F64 [1]); dx (rows like x) receives
  // d(grad_scale * sum of token losses)/dx, and the weight gradient accumulates likewise.
  void forward_backward(LayerContext& ctx, const Tensor& x, const Tensor& targets, float grad_scale, Tensor& dx,
                        Tensor& loss_sum) const;
  // Loss only (evaluation), added to loss_sum likewise: no gradients touched.
  void forward(LayerContext& ctx, const Tensor& x, const Tensor& targets, Tensor& loss_sum) const;
  // F32 logits [N, padded vocabulary / tp] of this rank's vocabulary shard (generation); columns at or
  // past the real vocabulary are padding.
  Tensor logits(LayerContext& ctx, const Tensor& x) const;

 private:
  // Logits of all N rows and their softmax statistics (reduced over tp); adds the mean loss to loss_sum.
  void loss_pieces(LayerContext& ctx, const Tensor& x, const Tensor& targets, Tensor& logits, Tensor& row_max,
                   Tensor& sum_exp, Tensor& loss_sum) const;
  Parameter* weight_;
  Tensor grad_;
  int64_t vocab_size_, vocab_start_;
};

}  // namespace gpt
