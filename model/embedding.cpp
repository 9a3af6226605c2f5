// Vocab-parallel token embedding + learned positions (when the model has them; under context parallelism
// each of a rank's two chunks gets its own global positions, model/context_rows.h).
#include "model/embedding.h"

#include <stdexcept>
#include <string>

#include "model/context_rows.h"

namespace gpt {

GPTEmbedding::GPTEmbedding(ParameterSet& params, const EmbeddingSpec& s) {
  word_ = &params.add("embedding.word_embeddings.weight", {s.padded_vocab, s.hidden},
                      ShardSpec{0, 1, s.tp_size, s.tp_rank}, true, false);
  word_->init = {true, s.init_std, 0.f};
  if (s.positions) {
    position_ = &params.add("embedding.position_embeddings.weight", {s.seq_length, s.hidden}, {}, true, true);
    position_->init = {true, s.init_std, 0.f};
  }
  seq_length_ = s.seq_length;
  vocab_start_ = s.tp_rank * (s.padded_vocab / s.tp_size);
}

void GPTEmbedding::forward(LayerContext& ctx, const Tensor& ids, int64_t T, Tensor& out, DType dtype,
                           int64_t first_position) const {
  Tensor partial = ctx.backend.empty({ids.numel(), word_->value.dim(1)}, dtype);
  ctx.backend.embedding_forward(ids, word_->value, vocab_start_, partial);
  const int64_t positions = seq_length_;
  if (first_position < 0 || first_position + T > positions)
    throw std::invalid_argument("embedding: positions " + std::to_string(first_position) + ".." +
                                std::to_string(first_position + T - 1) + " are past the model's seq_length " +
                                std::to_string(positions));
  // Positions are added once, before the tp sum, so the row blocks of sequence parallelism get them too.
  if (position_ && ctx.tp.rank() == 0 && ctx.context_parallel()) {
    for_each_context_chunk(ctx, partial, T, [&](Tensor& rows, int64_t c, int64_t pos0) {
      ctx.backend.add_positions(position_->value.rows(pos0, pos0 + c), c, rows);
    });
  } else if (position_ && ctx.tp.rank() == 0) {
    const Tensor table = first_position == 0 ? position_->value : position_->value.rows(first_position, positions);
    ctx.backend.add_positions(table, T, partial);
  }
  out = exit_tp_region(ctx, partial);
}

void GPTEmbedding::backward(LayerContext& ctx, const Tensor& ids, const Tensor& dout, int64_t T) const {
  Tensor dfull = exit_tp_region_backward(ctx, dout);
  ctx.backend.embedding_backward(ids, dfull, vocab_start_, word_->grad);
  if (!position_) return;
  if (ctx.context_parallel()) {
    for_each_context_chunk(ctx, dfull, T, [&](Tensor& rows, int64_t c, int64_t pos0) {
      Tensor dpos = position_->grad.rows(pos0, pos0 + c);
      ctx.backend.add_positions_backward(rows, c, dpos);
    });
  } else {
    ctx.backend.add_positions_backward(dfull, T, position_->grad);
  }
}

}  // namespace gpt
