// Parameter counts of the GPT model as this code builds it (learned position embeddings, pre-layernorm
// blocks with biases on every linear and layer norm, a final layer norm, the LM head tied to the word
// embedding so it is counted once), computed from the model's shape alone. The config tests compare them
// with the published sizes; the memory model and the planner use the per-part numbers.
#pragma once
#include <cstdint>

#include "model/gpt_model.h"

namespace gpt {

struct ParamBreakdown {
  int64_t word_embedding = 0;      // vocab x hidden, shared with the LM head
  int64_t position_embedding = 0;  // seq_length x hidden
  int64_t per_layer = 0;           // one transformer block: 2 layer norms, qkv, projection, 2 MLP linears
  int64_t num_layers = 0;
  int64_t final_layernorm = 0;
  int64_t layers() const { return per_layer * num_layers; }
  int64_t total() const { return word_embedding + position_embedding + layers() + final_layernorm; }
};

// Counts for a model of this shape. `vocab` is the number of embedding rows: the real vocabulary for the
// published figures, the padded one for what a run allocates.
ParamBreakdown count_gpt_parameters(int64_t num_layers, int64_t hidden, int64_t ffn, int64_t seq_length,
                                    int64_t vocab);
// The same for a ModelSpec, with its padded vocabulary (what ModelChunk allocates over all ranks).
ParamBreakdown count_gpt_parameters(const ModelSpec& spec);

}  // namespace gpt
