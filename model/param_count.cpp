// Parameter counts of the GPT model (see model/param_count.h, whose count_parameters_in holds the formula:
// each term mirrors one group of tensors that model/embedding.cpp, model/transformer_block.cpp and
// model/gpt_model.cpp register), with the arguments checked.
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
  return count_parameters_in<int64_t>(m, vocab_rows);
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
