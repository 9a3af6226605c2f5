// Vocab-parallel token embedding + learned positions.
#include "model/embedding.h"

namespace gpt {

GPTEmbedding::GPTEmbedding(ParameterSet& params, const EmbeddingSpec& s) {
  word_ = &params.add("embedding.word_embeddings.weight", {s.padded_vocab, s.hidden},
                      ShardSpec{0, 1, s.tp_size, s.tp_rank}, true, false);
  word_->init = {true, s.init_std, 0.f};
  position_ = &params.add("embedding.position_embeddings.weight", {s.seq_length, s.hidden}, {}, true, true);
  position_->init = {true, s.init_std, 0.f};
  vocab_start_ = s.tp_rank * (s.padded_vocab / s.tp_size);
}

void GPTEmbedding::forward(LayerContext& ctx, const Tensor& ids, int64_t T, Tensor& out, DType dtype) const {
  out = ctx.backend.empty({ids.numel(), word_->value.dim(1)}, dtype);
  ctx.backend.embedding_forward(ids, word_->value, vocab_start_, out);
  reduce_from_tp_forward(ctx, out);
  ctx.backend.add_positions(position_->value, T, out);
}

void GPTEmbedding::backward(LayerContext& ctx, const Tensor& ids, const Tensor& dout, int64_t T) const {
  ctx.backend.embedding_backward(ids, dout, vocab_start_, word_->grad);
  ctx.backend.add_positions_backward(dout, T, position_->grad);
}

}  // namespace gpt
