// The Llama-style variant choices the tests put on a shape: rotary positions, RMSNorm, SwiGLU, `groups`
// key/value heads, an untied output layer and no biases on the linears; as a ModelDescription, or as the
// config keys that say the same.
#pragma once
#include <cstdint>

#include "app/config.h"
#include "model/model_description.h"

namespace gpt {

inline ModelDescription with_llama_variants(ModelDescription m, int64_t groups) {
  m.position = PositionEmbedding::Rope;
  m.normalization = Normalization::RMSNorm;
  m.swiglu = true;
  m.num_query_groups = groups;
  m.untie_embeddings = true;
  m.add_bias_linear = false;
  return m;
}

inline void set_llama_variant_keys(Config& cfg, int64_t groups, int64_t ffn) {
  cfg.model.position_embedding_type = "rope";
  cfg.model.normalization = "RMSNorm";
  cfg.model.swiglu = true;
  cfg.model.ffn_hidden_size = ffn;
  cfg.model.num_query_groups = groups;
  cfg.model.untie_embeddings_and_output_weights = true;
  cfg.model.add_bias_linear = false;
}

}  // namespace gpt
