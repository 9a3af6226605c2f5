// The one typed description of a GPT model's architecture: its shape (layers, width, heads, MLP width,
// sequence length, vocabulary) and its variant choices (position encoding, normalisation, MLP activation,
// query groups, tied or untied output layer, biases on linears), named after Megatron-LM's flags. It sits
// below app/: the model code (model/), the memory and time models and the planner (parallel/) and the
// config, convert and plan commands (app/) all read this struct, so the architecture is stated once.
// validate() holds the rules that depend on the model alone; the ones that depend on the layout (heads or
// query groups divisible by tensor parallelism, ...) live with the layout checks.
#pragma once
#include <cstdint>
#include <string>

namespace gpt {

enum class PositionEmbedding { LearnedAbsolute, Rope };
enum class Normalization { LayerNorm, RMSNorm };

// "learned_absolute" | "rope" and "LayerNorm" | "RMSNorm", the spellings of Megatron-LM's flags.
const char* position_embedding_name(PositionEmbedding p);
const char* normalization_name(Normalization n);
// Throw std::invalid_argument naming the key when the name is not one of the above.
PositionEmbedding parse_position_embedding(const std::string& name);
Normalization parse_normalization(const std::string& name);

struct ModelDescription {
  int64_t num_layers = 0, hidden = 0, heads = 0;
  int64_t ffn = 0;  // MLP inner width (per matrix: SwiGLU's gate and up projections are each this wide)
  int64_t seq_length = 0;
  int64_t vocab_size = 0;            // real vocabulary
  int64_t vocab_divisible_by = 128;  // padded vocabulary = a multiple of this * tp
  float eps = 1e-5f;                 // inside the normalisation
  float init_std = 0.02f;

  // ---- variants (defaults: the GPT-2 / GPT-3 model) ----
  PositionEmbedding position = PositionEmbedding::LearnedAbsolute;
  double rotary_base = 10000;   // RoPE: theta_i = base^(-2i/R)
  double rotary_percent = 1.0;  // RoPE: the share of each head's dims that rotate
  Normalization normalization = Normalization::LayerNorm;
  bool swiglu = false;              // MLP = fc2(silu(x W_gate) * (x W_up)) instead of fc2(gelu(fc1(x)))
  int64_t num_query_groups = 0;     // key/value heads; 0 = heads (multi-head attention)
  bool untie_embeddings = false;    // a separate output layer instead of the word embedding
  bool add_bias_linear = true;      // biases on the qkv, projection and MLP linears

  int64_t head_dim() const { return hidden / heads; }
  int64_t query_groups() const { return num_query_groups ? num_query_groups : heads; }
  // Width of the fused q|k|v projection: queries for every head, keys and values for every group.
  int64_t qkv_width() const { return (heads + 2 * query_groups()) * head_dim(); }
  // Width of the first MLP linear's output: [gate | up] for SwiGLU.
  int64_t fc1_width() const { return swiglu ? 2 * ffn : ffn; }
  // Rotated dims of each head under RoPE (0 without it).
  int64_t rotary_dims() const;
  bool has_position_table() const { return position == PositionEmbedding::LearnedAbsolute; }
  bool has_norm_bias() const { return normalization == Normalization::LayerNorm; }
  // Megatron's padding: the smallest multiple of vocab_divisible_by * tp that holds the vocabulary.
  int64_t padded_vocab(int tp) const;
  // The rules on the model alone. Throws std::invalid_argument naming the model.* key.
  void validate() const;
};

// Megatron-LM's MLP width when none is given: 4 * hidden, or for SwiGLU 2/3 of that rounded down to a
// multiple of 64 (so the three matrices hold about as many parameters as GELU's two).
int64_t default_ffn_width(int64_t hidden, bool swiglu);

}  // namespace gpt
