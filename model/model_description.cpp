// Names, derived sizes and the model-only validity rules of ModelDescription (model/model_description.h).
#include "model/model_description.h"

#include <cmath>
#include <stdexcept>

namespace gpt {

namespace {
[[noreturn]] void reject(const std::string& message) { throw std::invalid_argument(message); }
}  // namespace

const char* position_embedding_name(PositionEmbedding p) {
  return p == PositionEmbedding::Rope ? "rope" : "learned_absolute";
}
const char* normalization_name(Normalization n) { return n == Normalization::RMSNorm ? "RMSNorm" : "LayerNorm"; }

PositionEmbedding parse_position_embedding(const std::string& name) {
  if (name == "learned_absolute") return PositionEmbedding::LearnedAbsolute;
  if (name == "rope") return PositionEmbedding::Rope;
  reject("model.position_embedding_type: unknown type '" + name + "' (expected learned_absolute or rope)");
}

Normalization parse_normalization(const std::string& name) {
  if (name == "LayerNorm") return Normalization::LayerNorm;
  if (name == "RMSNorm") return Normalization::RMSNorm;
  reject("model.normalization: unknown normalization '" + name + "' (expected LayerNorm or RMSNorm)");
}

int64_t ModelDescription::rotary_dims() const {
  if (position != PositionEmbedding::Rope) return 0;
  // Megatron-LM: int(kv_channels * rotary_percent).
  return static_cast<int64_t>(static_cast<double>(head_dim()) * rotary_percent);
}

int64_t ModelDescription::padded_vocab(int tp) const {
  const int64_t m = vocab_divisible_by * tp;
  return (vocab_size + m - 1) / m * m;
}

int64_t default_ffn_width(int64_t hidden, bool swiglu) {
  if (!swiglu) return 4 * hidden;
  return static_cast<int64_t>(4.0 * static_cast<double>(hidden) * 2.0 / 3.0 / 64.0) * 64;
}

void ModelDescription::validate() const {
  auto positive = [](const char* key, int64_t v) {
    if (v < 1) reject(std::string(key) + " must be >= 1, got " + std::to_string(v));
  };
  positive("model.num_layers", num_layers);
  positive("model.hidden_size", hidden);
  positive("model.num_heads", heads);
  positive("model.ffn_hidden_size", ffn);
  positive("model.seq_length", seq_length);
  positive("model.make_vocab_size_divisible_by", vocab_divisible_by);
  if (vocab_size < 2) reject("model.vocab_size must be >= 2, got " + std::to_string(vocab_size));
  if (hidden % heads != 0)
    reject("model.hidden_size (" + std::to_string(hidden) + ") must be divisible by model.num_heads (" +
           std::to_string(heads) + ")");
  if (num_query_groups < 0 || (num_query_groups > 0 && heads % num_query_groups != 0))
    reject("model.num_query_groups (" + std::to_string(num_query_groups) +
           ") must divide model.num_heads (" + std::to_string(heads) + "), or be 0 for multi-head attention");
  if (!(rotary_base > 0) || !std::isfinite(rotary_base))
    reject("model.rotary_base must be a positive number, got " + std::to_string(rotary_base));
  if (!(rotary_percent > 0 && rotary_percent <= 1))
    reject("model.rotary_percent must be in (0, 1], got " + std::to_string(rotary_percent));
  if (position == PositionEmbedding::Rope) {
    const int64_t r = rotary_dims();
    if (r < 2 || r % 2 != 0)
      reject("model.rotary_percent (" + std::to_string(rotary_percent) + ") of the head dimension (" +
             std::to_string(head_dim()) + ") gives " + std::to_string(r) +
             " rotary dims; RoPE rotates pairs, so it needs an even number >= 2");
  }
}

}  // namespace gpt
