// The Llama-style variant choices the memory and planner tests put on a shape: rotary positions, RMSNorm,
// SwiGLU, `groups` key/value heads, an untied output layer and no biases on the linears.
#pragma once
#include <cstdint>

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

}  // namespace gpt
