// GPT input embedding: vocab-parallel token embedding (rows of the padded vocabulary split over the
// tensor-parallel group; each rank looks up the ids it holds and the partial results are summed) plus,
// with learned absolute positions, a position embedding replicated on every rank.
#pragma once
#include "model/parameter.h"
#include "model/tp_mappings.h"

namespace gpt {

struct EmbeddingSpec {
  int64_t padded_vocab = 0, hidden = 0, seq_length = 0;
  bool positions = true;  // a learned position table (false: positions are encoded in the blocks, rope)
  float init_std = 0.02f;
  int tp_size = 1, tp_rank = 0;
};

class GPTEmbedding {
 public:
  GPTEmbedding(ParameterSet& params, const EmbeddingSpec& spec);
  // ids I32 [B*T] -> out: this rank's rows outside the tp region (all B*T, or a row block under SP).
  // The sequences' first token is at position `first_position` (non-zero when decoding after a cache).
  void forward(LayerContext& ctx, const Tensor& ids, int64_t T, Tensor& out, DType dtype,
               int64_t first_position = 0) const;
  // Accumulates the word and position embedding gradients from dout (same rows as forward's out).
  void backward(LayerContext& ctx, const Tensor& ids, const Tensor& dout, int64_t T) const;
  Parameter* word() const { return word_; }
  int64_t vocab_start() const { return vocab_start_; }

 private:
  Parameter* word_;
  Parameter* position_ = nullptr;
  int64_t seq_length_;
  int64_t vocab_start_;
};

}  // namespace gpt
