// Closed-form parameter counts of the GPT model (see model/param_count.h); each term mirrors one group
// of tensors that model/embedding.cpp, model/transformer_block.cpp and model/gpt_model.cpp register.
#include "model/param_count.h"

#include <stdexcept>
#include <string>

namespace gpt {

ParamBreakdown count_gpt_parameters(int64_t num_layers, int64_t hidden, int64_t ffn, int64_t seq_length,
                                    int64_t vocab) {
  if (num_layers < 0 || hidden <= 0 || ffn <= 0 || seq_length <= 0 || vocab <= 0)
    throw std::invalid_argument("count_gpt_parameters: shape must be positive (layers " + std::to_string(num_layers) +
                                ", hidden " + std::to_string(hidden) + ", ffn " + std::to_string(ffn) +
                                ", seq " + std::to_string(seq_length) + ", vocab " + std::to_string(vocab) + ")");
  const int64_t h = hidden;
  ParamBreakdown p;
  p.word_embedding = vocab * h;
  p.position_embedding = seq_length * h;
  const int64_t layernorm = 2 * h;                   // weight + bias
  const int64_t qkv = 3 * h * h + 3 * h;             // fused query/key/value projection
  const int64_t attention_out = h * h + h;           // output projection
  const int64_t mlp = (h * ffn + ffn) + (ffn * h + h);  // fc1 + fc2
  p.per_layer = 2 * layernorm + qkv + attention_out + mlp;
  p.num_layers = num_layers;
  p.final_layernorm = layernorm;
  return p;
}

ParamBreakdown count_gpt_parameters(const ModelSpec& spec) {
  return count_gpt_parameters(spec.num_layers, spec.hidden, spec.ffn, spec.seq_length, spec.padded_vocab);
}

}  // namespace gpt
