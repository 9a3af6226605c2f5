// Parameter counts of the GPT model as this code builds it, from its ModelDescription alone: the word
// embedding (the LM head tied to it is counted once), learned positions when the model has them, pre-norm
// blocks (LayerNorm with bias or RMSNorm without; fused q|k|v with grouped-query attention's smaller k
// and v; GELU's two MLP matrices or SwiGLU's three; biases on the linears unless disabled), the final
// norm, and an untied output layer. The config tests compare them with the published sizes; the memory
// model and the planner use the per-part numbers.
#pragma once
#include <cstdint>

#include "model/gpt_model.h"

namespace gpt {

// The counts in a number type N: int64_t for what the code allocates, a wider one (long double) for the
// config's overflow check (app/config_sizes.cpp), from the same formula.
template <class N>
struct ParamCounts {
  N word_embedding = 0;      // vocab x hidden (shared with the LM head when tied)
  N position_embedding = 0;  // seq_length x hidden, learned positions only
  N per_layer = 0;           // one transformer block
  N per_layer_replicated = 0;  // of which the same on every tensor-parallel rank (norms, row biases)
  N num_layers = 0;
  N final_norm = 0;
  N output_layer = 0;  // vocab x hidden when untied, else 0
  N layers() const { return per_layer * num_layers; }
  N total() const { return word_embedding + position_embedding + layers() + final_norm + output_layer; }
};
using ParamBreakdown = ParamCounts<int64_t>;

// The formula itself, every product in N (the widths too: q|k|v is (heads + 2 groups) x head_dim wide,
// fc1 ffn or SwiGLU's 2 ffn). No argument checks: see count_gpt_parameters.
template <class N>
ParamCounts<N> count_parameters_in(const ModelDescription& m, N vocab_rows) {
  const N h = N(m.hidden), bias = N(m.add_bias_linear ? 1 : 0), ffn = N(m.ffn);
  const N qkv_width = (N(m.heads) + N(2) * N(m.query_groups())) * N(m.head_dim());
  const N fc1_width = m.swiglu ? N(2) * ffn : ffn;
  ParamCounts<N> p;
  p.word_embedding = vocab_rows * h;
  p.position_embedding = m.has_position_table() ? N(m.seq_length) * h : N(0);
  const N norm = N(m.has_norm_bias() ? 2 : 1) * h;         // weight (+ bias)
  const N qkv = qkv_width * h + bias * qkv_width;           // fused q|k|v projection
  const N attention_out = h * h + bias * h;                 // output projection
  const N fc1 = fc1_width * h + bias * fc1_width;           // [gate | up] for SwiGLU
  const N fc2 = ffn * h + bias * h;
  p.per_layer = N(2) * norm + qkv + attention_out + fc1 + fc2;
  p.per_layer_replicated = N(2) * norm + N(2) * bias * h;  // ln1, ln2 and the row-parallel biases of proj and fc2
  p.num_layers = N(m.num_layers);
  p.final_norm = norm;
  p.output_layer = m.untie_embeddings ? vocab_rows * h : N(0);
  return p;
}

// Counts for this model with `vocab_rows` embedding rows: the real vocabulary for the published figures,
// the padded one for what a run allocates.
ParamBreakdown count_gpt_parameters(const ModelDescription& model, int64_t vocab_rows);
// The GPT-2/GPT-3 layout of this shape (learned positions, LayerNorm, GELU, tied, biases).
ParamBreakdown count_gpt_parameters(int64_t num_layers, int64_t hidden, int64_t ffn, int64_t seq_length,
                                    int64_t vocab);
// The same for a ModelSpec, with its padded vocabulary (what ModelChunk allocates over all ranks).
ParamBreakdown count_gpt_parameters(const ModelSpec& spec);

}  // namespace gpt
