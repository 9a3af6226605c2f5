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

struct ParamBreakdown {
  int64_t word_embedding = 0;      // vocab x hidden (shared with the LM head when tied)
  int64_t position_embedding = 0;  // seq_length x hidden, learned positions only
  int64_t per_layer = 0;           // one transformer block
  int64_t per_layer_replicated = 0;  // of which the same on every tensor-parallel rank (norms, row biases)
  int64_t num_layers = 0;
  int64_t final_norm = 0;
  int64_t output_layer = 0;  // vocab x hidden when untied, else 0
  int64_t layers() const { return per_layer * num_layers; }
  int64_t total() const { return word_embedding + position_embedding + layers() + final_norm + output_layer; }
};

// Counts for this model with `vocab_rows` embedding rows: the real vocabulary for the published figures,
// the padded one for what a run allocates.
ParamBreakdown count_gpt_parameters(const ModelDescription& model, int64_t vocab_rows);
// The GPT-2/GPT-3 layout of this shape (learned positions, LayerNorm, GELU, tied, biases).
ParamBreakdown count_gpt_parameters(int64_t num_layers, int64_t hidden, int64_t ffn, int64_t seq_length,
                                    int64_t vocab);
// The same for a ModelSpec, with its padded vocabulary (what ModelChunk allocates over all ranks).
ParamBreakdown count_gpt_parameters(const ModelSpec& spec);

}  // namespace gpt
