// Closed-form parameter counts of the GPT model (see model/param_count.h); each term mirrors one group
// of tensors that model/embedding.cpp, model/transformer_block.cpp and model/gpt_model.cpp register.
#include "model/param_count.h"

#include <stdexcept>
#include <string>

namespace gpt {

ParamBreakdown count_gpt_parameters(const ModelDescription& m, int64_t vocab_rows) {
  if (m.num_layers < 0 || m.hidden <= 0 || m.heads <= 0 || m.ffn <= 0 || m.seq_length <= 0 || vocab_rows <= 0)
    throw std::invalid_argument("count_gpt_parameters: shape must be positive (layers " + std::to_string(m.num_layers) +
                                ", hidden " + std::to_string(m.hidden) + ", heads " + std::to_string(m.heads) +
                                ", ffn " + std::to_string(m.ffn) + ", seq " + std::to_string(m.seq_length) +
                                ", vocab " + std::to_string(vocab_rows) + ")");
  const int64_t h = m.hidden;
  const int64_t bias = m.add_bias_linear ? 1 : 0;
  ParamBreakdown p;
  p.word_embedding = vocab_rows * h;
  p.position_embedding = m.has_position_table() ? m.seq_length * h : 0;
  const int64_t norm = (m.has_norm_bias() ? 2 : 1) * h;                 // weight (+ bias)
  const int64_t qkv = m.qkv_width() * h + bias * m.qkv_width();          // fused q|k|v projection
  const int64_t attention_out = h * h + bias * h;                       // output projection
  const int64_t fc1 = m.fc1_width() * h + bias * m.fc1_width();         // [gate | up] for SwiGLU
  const int64_t fc2 = m.ffn * h + bias * h;
  p.per_layer = 2 * norm + qkv + attention_out + fc1 + fc2;
  p.per_layer_replicated = 2 * norm + 2 * bias * h;  // ln1, ln2 and the row-parallel biases of proj and fc2
  p.num_layers = m.num_layers;
  p.final_norm = norm;
  p.output_layer = m.untie_embeddings ? vocab_rows * h : 0;
  return p;
}

ParamBreakdown count_gpt_parameters(int64_t num_layers, int64_t hidden, int64_t ffn, int64_t seq_length,
                                    int64_t vocab) {
  ModelDescription m;
  m.num_layers = num_layers, m.hidden = hidden, m.heads = 1, m.ffn = ffn, m.seq_length = seq_length;
  m.vocab_size = vocab;
  return count_gpt_parameters(m, vocab);
}

ParamBreakdown count_gpt_parameters(const ModelSpec& spec) { return count_gpt_parameters(spec, spec.padded_vocab()); }

}  // namespace gpt
