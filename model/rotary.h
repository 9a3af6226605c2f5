// Rotary position embedding (model.position_embedding_type: rope), the blocks' position encoding when the
// model has no learned position table: rotates each query and key head of the packed qkv projection in
// place, by its token's position, before attention; backward rotates the q and k gradients back. The
// rotate-half convention (Megatron-LM's default, and Hugging Face Llama's layout): the first rotary_dims
// of a head are pairs (i, i + rotary_dims/2), rotated by position * base^(-2i/rotary_dims).
#pragma once
#include "model/model_description.h"
#include "model/ops/backend.h"

namespace gpt {

class RotaryEmbedding {
 public:
  explicit RotaryEmbedding(const ModelDescription& model)
      : rotary_dims_(model.rotary_dims()), base_(static_cast<float>(model.rotary_base)) {}
  // qkv [B*T, (H + 2G)*D] of H local query heads and G local key/value groups; row b*T + t is at position
  // pos0 + t.
  void forward(Backend& be, Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, int64_t pos0) const {
    be.rope_forward(qkv, B, T, H, G, D, rotary_dims_, base_, pos0);
  }
  void backward(Backend& be, Tensor& dqkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                int64_t pos0 = 0) const {
    be.rope_backward(dqkv, B, T, H, G, D, rotary_dims_, base_, pos0);
  }

 private:
  int64_t rotary_dims_;
  float base_;
};

}  // namespace gpt
